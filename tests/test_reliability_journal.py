"""The journal across versions and faults (issue 20): a newer journal is refused and left byte-for-byte
unchanged by every verb; an older one is backed up and migrated; a damaged one is exit 2 naming the file
and the recovery; a home below a file, or on a read-only file system, is exit 2 for writing verbs while
reading verbs still answer."""

from __future__ import annotations

import sqlite3
import subprocess
from pathlib import Path

import pytest
from conftest import stamp_journal, trained_once

from pilotrun.journal.store import SCHEMA_VERSION, Journal


def _user_version(path: Path) -> int:
    db = sqlite3.connect(path)
    try:
        return db.execute("PRAGMA user_version").fetchone()[0]
    finally:
        db.close()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real journal with one finished train run (built once), copied by each test."""
    return trained_once(tmp_path_factory)


def test_a_new_journal_is_stamped(tmp_path):
    Journal(tmp_path / "home")
    assert _user_version(tmp_path / "home" / "journal.sqlite") == SCHEMA_VERSION == 4


def _verbs(path: Path, run_id: str, tmp: Path):
    return [
        ("runs",), ("show", run_id), ("note", "a note"), ("note", "n", "--run", run_id),
        ("report", "--out", tmp / "r.html"), ("verify", run_id), ("archive", run_id, "--out", tmp / "a.tar.gz"),
        ("train", path), ("overfit", path), ("pilot", path), ("sweep", path), ("resume", path),
        ("sheet", path), ("fit", path, "--memory-limit", "1GiB"), ("all", path),
        ("export", run_id, "--to", "wandb"), ("export", path, "--to", "mlflow"),
    ]


def test_a_newer_journal_is_unchanged_after_every_verb(cli, trained, tmp_path):
    src, path, run_id = trained
    home = src / "home"
    journal = home / "journal.sqlite"
    stamp_journal(journal, SCHEMA_VERSION + 98)
    try:
        before = journal.read_bytes()
        listing = sorted(p.name for p in home.iterdir())
        for verb in _verbs(path, run_id, tmp_path):
            r = cli(*verb, "--home", home)
            assert r.code == 2, (verb, r.code, r.err)
            assert f"the journal has schema version {SCHEMA_VERSION + 98}, newer than this pilotrun knows" in r.err
            assert str(journal) in r.err and "Traceback" not in r.err
            assert journal.read_bytes() == before, f"{verb[0]} changed the journal"
            assert sorted(p.name for p in home.iterdir()) == listing, f"{verb[0]} left a file beside it"
        assert not (tmp_path / "r.html").exists() and not (tmp_path / "a.tar.gz").exists()
    finally:
        stamp_journal(journal, SCHEMA_VERSION)


def test_the_header_lagging_behind_the_log_is_not_trusted(tmp_path):
    """A stamp still in the write-ahead log (another process holds the journal open) is seen too."""
    Journal(tmp_path / "home").add_note("x")
    path = tmp_path / "home" / "journal.sqlite"
    holder = sqlite3.connect(path)  # keeps the log from being folded back into the file
    holder.execute("SELECT 1 FROM runs").fetchall()
    writer = sqlite3.connect(path)
    writer.execute("PRAGMA user_version=5")
    writer.commit()
    writer.close()
    try:
        assert path.read_bytes()[60:64] == SCHEMA_VERSION.to_bytes(4, "big")  # the header alone would pass
        with pytest.raises(Exception, match="schema version 5, newer than"):
            Journal(tmp_path / "home")
    finally:
        holder.close()


def test_an_older_journal_is_backed_up_and_migrated(cli, trained, tmp_path):
    src, path, run_id = trained
    home = tmp_path / "home"
    home.mkdir()
    db = sqlite3.connect(src / "home" / "journal.sqlite")
    dst = sqlite3.connect(home / "journal.sqlite")
    db.backup(dst)
    db.close()
    dst.execute("PRAGMA user_version=0")  # as journals were written before the stamp
    dst.commit()
    dst.close()
    r = cli("runs", "--home", home, "--json")
    assert r.code == 0 and r.json["data"]["runs"][0]["run_id"] == run_id
    assert _user_version(home / "journal.sqlite") == SCHEMA_VERSION
    backup = home / "journal.sqlite.bak-v0"
    assert _user_version(backup) == 0
    b = sqlite3.connect(backup)
    assert b.execute("SELECT run_id FROM runs").fetchall() == [(run_id,)]
    b.close()


@pytest.mark.parametrize("damage, words", [
    (lambda b: b[:50], "not an SQLite database"),
    (lambda b: b"not a journal at all\n" * 10, "not an SQLite database"),
    (lambda b: b[:8192], "the journal is damaged"),
    (lambda b: b[:100] + b"\xff" * (len(b) - 100), "the journal is damaged"),
])
@pytest.mark.parametrize("verb", [("runs",), ("note", "x")])
def test_a_damaged_journal_names_the_file_and_the_recovery(cli, trained, tmp_path, damage, words, verb):
    src = trained[0] / "home" / "journal.sqlite"
    home = tmp_path / "home"
    home.mkdir()
    (home / "journal.sqlite").write_bytes(damage(src.read_bytes()))
    before = (home / "journal.sqlite").read_bytes()
    r = cli(*verb, "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert words in r.err and str(home / "journal.sqlite") in r.err and ".recover" in r.err, r.err
    assert "Traceback" not in r.err
    assert (home / "journal.sqlite").read_bytes() == before


@pytest.mark.parametrize("column, value", [("summary_json", "{"), ("config_json", "[" * 100_000 + "]" * 100_000)])
def test_a_run_row_whose_json_was_changed_outside_pilotrun_is_exit_2(cli, trained, tmp_path, column, value):
    # the triggers keep a run's config immutable to pilotrun; sqlite3 by hand is not pilotrun: runs, show, report
    # and archive were exit 3 on such a row (a JSONDecodeError, or a RecursionError for the deep one)
    import shutil

    home = tmp_path / "home"
    shutil.copytree(trained[0] / "home", home)
    db = sqlite3.connect(home / "journal.sqlite")
    db.execute("DROP TRIGGER runs_immutable")
    db.execute(f"UPDATE runs SET {column}=? WHERE run_id=?", (value, trained[2]))
    db.commit()
    db.close()
    for verb in (("runs",), ("show", trained[2]), ("report", "--out", tmp_path / "r.html")):
        r = cli(*verb, "--home", home)
        assert r.code == 2, (verb, r.code, r.err)
        assert f"{home / 'journal.sqlite'}: the journal is damaged: run {trained[2]}'s {column} is not JSON" in r.err
        assert "fix: restore a backup of the journal" in r.err and "Traceback" not in r.err


@pytest.mark.parametrize("verb", [("runs",), ("note", "x")])
def test_a_home_below_a_file(cli, tmp_path, monkeypatch, verb):
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("PILOTRUN_HOME", str(tmp_path / "afile" / "home"))
    r = cli(*verb)
    assert r.code == 2, (r.code, r.err)
    assert str(tmp_path / "afile") in r.err and "Traceback" not in r.err
    assert (tmp_path / "afile").read_text() == "x"


def test_a_home_that_is_a_file(cli, tmp_path, monkeypatch):
    (tmp_path / "home").write_text("x")
    monkeypatch.setenv("PILOTRUN_HOME", str(tmp_path / "home"))
    r = cli("note", "x")
    assert r.code == 2 and str(tmp_path / "home") in r.err and "is a file" in r.err, r.err
    assert "Traceback" not in r.err


def _mount_read_only(src: Path, dest: Path) -> bool:
    dest.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(dest)], capture_output=True).returncode != 0:
        return False
    if subprocess.run(["mount", "-o", "remount,bind,ro", str(dest)], capture_output=True).returncode != 0:
        subprocess.run(["umount", str(dest)], capture_output=True)
        return False
    return True


def test_a_home_on_a_read_only_file_system(cli, trained, tmp_path):
    src, path, run_id = trained
    ro = tmp_path / "ro"
    if not _mount_read_only(src / "home", ro):
        pytest.skip("cannot bind-mount a read-only folder here (needs root and mount)")
    try:
        r = cli("runs", "--home", ro, "--json")
        assert r.code == 0 and r.json["data"]["runs"][0]["run_id"] == run_id, r.err
        r = cli("show", run_id, "--home", ro)
        assert r.code == 0, r.err
        r = cli("report", "--home", ro, "--out", tmp_path / "report.html")
        assert r.code == 0 and (tmp_path / "report.html").is_file(), r.err
        r = cli("report", "--home", ro)  # the default --out is inside the read-only home
        assert r.code == 2 and f"cannot write {ro / 'report.html'}: Read-only file system" in r.err, r.err
        for verb in (("note", "x"), ("train", path)):
            r = cli(*verb, "--home", ro)
            assert r.code == 2, (verb, r.code, r.err)
            assert "is on a read-only file system; this verb writes to the journal" in r.err and str(ro) in r.err
            assert "Traceback" not in r.err
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)


def test_a_home_copied_with_rows_only_in_the_wal_then_mounted_read_only_shows_them(cli, tmp_path):
    """Issue 44, item 4: a home copied while committed rows were still only in journal.sqlite-wal, then mounted
    read-only, was opened ``immutable`` (SQLite skips the WAL there): ``runs`` and ``show`` exit 0 without them.
    Here a run ended and a note on it are only in the WAL (the issue's was a note alone): both are shown, and the
    private copy that read the log is gone from the temp folder. The clean case: the same home writable."""
    import glob
    import shutil
    import tempfile

    from pilotrun.journal.runs import create_run

    home, copy, ro = tmp_path / "home", tmp_path / "copy", tmp_path / "ro"
    j = Journal(home)
    run_id = create_run(j, kind="train", name="c", config={"name": "c"})
    keep = sqlite3.connect(home / "journal.sqlite")  # an open connection: nothing is folded into the file
    keep.execute("SELECT 1 FROM runs").fetchall()
    j.finish_run(run_id, "completed", {"reason": "done"})
    j.add_note("kept only in the log", run_id=run_id)
    copy.mkdir()
    for name in ("journal.sqlite", "journal.sqlite-wal"):
        shutil.copyfile(home / name, copy / name)
    keep.close()
    assert (copy / "journal.sqlite-wal").stat().st_size > 32
    if not _mount_read_only(copy, ro):
        pytest.skip("cannot bind-mount a read-only folder here (needs root and mount)")
    try:
        before = set(glob.glob(f"{tempfile.gettempdir()}/pilotrun-journal-*"))
        r = cli("runs", "--home", ro, "--json")
        assert r.code == 0 and [x["status"] for x in r.json["data"]["runs"]] == ["completed"], r.err
        r = cli("show", run_id, "--home", ro)
        assert r.code == 0 and "kept only in the log" in r.out + r.err, r.out
        assert set(glob.glob(f"{tempfile.gettempdir()}/pilotrun-journal-*")) == before
    finally:
        subprocess.run(["umount", str(ro)], capture_output=True)
    r = cli("show", run_id, "--home", copy)  # writable: SQLite reads the log itself
    assert r.code == 0 and "kept only in the log" in r.out + r.err
