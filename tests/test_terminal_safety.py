"""Terminal safety (issue 20): text that users or files supply is printed with its control characters
escaped, so a note, a run name, a record or an argument cannot retitle, clear or rewrite the terminal."""

from __future__ import annotations

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal import Journal
from pilotrun.console.safe import escape_controls

EVIL = "\x1b]0;PWNED\x07\x1b[2J\x1b[H\rgone\x08\x9b31m\u202eevil"


def _clean(text: str) -> None:
    for ch in ("\x1b", "\x07", "\r", "\x08", "\x9b", "\u202e"):
        assert ch not in text, (ch, text)


@pytest.mark.parametrize("raw, shown", [
    ("\x1b[2J", "\\x1b[2J"), ("a\rb", "a\\x0db"), ("bell\x07", "bell\\x07"), ("\x9b", "\\x9b"),
    ("\u202eabc", "\\u202eabc"), ("\x00", "\\x00"), ("\x7f", "\\x7f"),
    ("line one\nline two\tand a tab", "line one\nline two\tand a tab"),
    ("naïve — ünïcödé 日本 ✓", "naïve — ünïcödé 日本 ✓"),
])
def test_escape_controls(raw, shown):
    assert escape_controls(raw) == shown


@pytest.fixture
def evil_run(tmp_path):
    j = Journal(tmp_path / "home")
    run_id = j.create_run(kind="train", name="tiny" + EVIL + "[/]", config={"name": "x"}, config_sha256="0" * 64,
                          campaign_path=None, seed=0, git_rev=None, packages={}, data={}, trust_remote_code=False,
                          command="pilotrun train " + EVIL)
    j.finish_run(run_id, "completed", {"reason": EVIL})
    return j, run_id


def test_a_note_cannot_retitle_or_clear_the_terminal(cli, evil_run, tmp_path):
    j, run_id = evil_run
    r = cli("note", "look: " + EVIL, "--run", run_id, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    _clean(r.out)
    assert j.notes(run_id)[0]["text"] == "look: " + EVIL  # stored as given; only the printing escapes
    r = cli("show", run_id, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    _clean(r.out)
    assert "note 1: look: \\x1b]0;PWNED\\x07\\x1b[2J" in r.out
    assert "tiny\\x1b]0;PWNED" in r.out and "[/]" in r.out  # the name, markup characters and all


def test_the_runs_table_escapes_names(cli, evil_run, tmp_path):
    r = cli("runs", "--home", tmp_path / "home")
    assert r.code == 0, r.err
    _clean(r.out)
    assert "\\x1b" in r.out


def test_the_json_envelope_keeps_the_text(cli, evil_run, tmp_path):
    j, run_id = evil_run
    r = cli("runs", "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    _clean(r.out)  # JSON writes control characters as \\u escapes
    assert r.json["data"]["runs"][0]["name"] == "tiny" + EVIL + "[/]"


def test_an_argument_in_an_error_message(cli, evil_run, tmp_path):
    r = cli("show", "\x1b[2J\x1b]0;x\x07", "--home", tmp_path / "home")
    assert r.code == 2
    _clean(r.err)
    assert "\\x1b[2J" in r.err


def test_a_record_excerpt(cli, tmp_path):
    records = simple_records(8)
    records[0]["output"] = "fine" + EVIL
    path = tiny_causal_campaign(tmp_path, records)
    r = cli("inspect", path, "--home", tmp_path / "home")
    assert r.code in (0, 1), r.err
    _clean(r.out)
    assert "\\x1b" in r.out
