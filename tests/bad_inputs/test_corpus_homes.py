"""The bad-input corpus, round two (issue 20): the journal home. A journal from a newer pilotrun, a damaged
journal, a home below a file, a read-only home, a full disk: through the real CLI each is exit 2 naming the
path, with no traceback, and nothing half-written left behind (test_reliability_journal.py and
test_reliability_disk.py hold the deeper checks)."""

from __future__ import annotations

import sqlite3
import subprocess

import pytest
from conftest import simple_records, tiny_causal_campaign
from test_corpus import _no_traces

from pilotrun.journal import Journal


def _base(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))


def _journal_with(home, fn):
    Journal(home).add_note("kept")
    path = home / "journal.sqlite"
    fn(path)
    return path


def _stamp_newer(path):
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=42")
    db.commit()
    db.close()


JOURNAL_CASES = [
    ("journal-from-a-newer-version", _stamp_newer, "the journal has schema version 42, newer than this pilotrun"),
    ("journal-truncated-to-its-header", lambda p: p.write_bytes(p.read_bytes()[:100]), "the journal is damaged"),
    ("journal-cut-short", lambda p: p.write_bytes(p.read_bytes()[:40]), "not an SQLite database"),
    ("journal-overwritten-by-text", lambda p: p.write_text("x" * 5000), "not an SQLite database"),
    ("journal-pages-garbled", lambda p: p.write_bytes(p.read_bytes()[:100] + b"\xa5" * (p.stat().st_size - 100)),
     "the journal is damaged"),
]


@pytest.mark.parametrize("case, damage, words", JOURNAL_CASES, ids=[c[0] for c in JOURNAL_CASES])
@pytest.mark.parametrize("verb", ["train", "runs"])
def test_journal_case(cli, tmp_path, case, damage, words, verb):
    path = _base(tmp_path)
    home = tmp_path / "home"
    journal = _journal_with(home, damage)
    before = journal.read_bytes()
    args = (verb, path) if verb == "train" else (verb,)
    r = cli(*args, "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert words in r.err and str(journal) in r.err and "Traceback" not in r.err and "fix" in r.err, r.err
    assert journal.read_bytes() == before
    assert not (home / "runs").exists()


def test_home_below_a_file(cli, tmp_path):
    path = _base(tmp_path)
    (tmp_path / "afile").write_text("x")
    r = cli("train", path, "--home", tmp_path / "afile" / "home")
    assert r.code == 2 and f"{tmp_path / 'afile'} is a file" in r.err and "Traceback" not in r.err, r.err


def test_read_only_home(cli, tmp_path):
    path = _base(tmp_path)
    home = tmp_path / "home"
    Journal(home).add_note("kept")
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "--bind", str(home), str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount a folder here (needs root)")
    try:
        if subprocess.run(["mount", "-o", "remount,bind,ro", str(ro)], capture_output=True).returncode != 0:
            pytest.skip("cannot remount read-only here")
        r = cli("train", path, "--home", ro)
        assert r.code == 2 and "is on a read-only file system" in r.err and "Traceback" not in r.err, r.err
        assert not (ro / "runs").exists()
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_disk_full_while_exporting(cli, tmp_path, monkeypatch):
    path = _base(tmp_path)
    monkeypatch.setenv("PILOTRUN_TEST_ENOSPC_AT", "artifact")
    home = tmp_path / "home"
    r = cli("train", path, "--home", home)
    assert r.code == 2 and "no space left on device while writing" in r.err and "Traceback" not in r.err, r.err
    (run,) = Journal(home).list_runs()
    assert run["status"] == "interrupted"
    assert not [p for p in home.rglob("*") if ".tmp-" in p.name]
    assert not (home / "runs" / run["run_id"] / "artifact").exists()


def test_clean_home_case(cli, tmp_path):
    """The clean case: the same journal, untouched, lists its note."""
    home = tmp_path / "home"
    Journal(home).add_note("kept")
    r = cli("runs", "--home", home)
    assert r.code == 0, r.err
    _no_traces(home)
