"""The bad-input corpus, round two (issue 20), data files: record fields of the wrong type, looping and
unreadable paths (read as an unprivileged user: root reads mode-000 files), and the valid input that was
refused (U+2028 / U+0085 inside a JSONL string, CSV fields over the csv module's default limit)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign, write_jsonl
from test_corpus import _edit, _no_traces, _set


def _base(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))


def _records_with(i, **fields):
    recs = simple_records(8)
    recs[i].update(fields)
    return recs


def _train_records(records):
    def apply(tmp_path, path):
        write_jsonl(tmp_path / "data" / "train.jsonl", records)
    return apply


def _chat(tmp_path, path, messages):
    write_jsonl(tmp_path / "data" / "chat.jsonl", [{"messages": [{"role": "user", "content": "hi"},
                                                                 {"role": "assistant", "content": "yo"}]}] * 7
                + [{"messages": messages}])
    _edit(path, lambda c: c["data"].update(train="data/chat.jsonl", validation=None, prompt=None, response=None,
                                           messages="messages"))


def _parquet_train(tmp_path, path, records):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(records), tmp_path / "data" / "train.parquet")
    _edit(path, _set("data", train="data/train.parquet"))


FIELD_CASES = [
    ("response-is-a-list", _train_records(_records_with(3, output=["a", "b"])),
     "field 'output' (named by data.response) is a list, not text", "train.jsonl:4"),
    ("response-is-an-object", _train_records(_records_with(0, output={"text": "b"})),
     "field 'output' (named by data.response) is an object, not text", "train.jsonl:1"),
    ("prompt-is-a-list", _train_records(_records_with(5, instruction=[1, 2])),
     "field 'instruction' (named by data.prompt) is a list", "train.jsonl:6"),
    ("template-field-is-an-object", lambda tmp_path, path: (
        _train_records([dict(r, topic={"a": 1} if i == 2 else "t") for i, r in enumerate(simple_records(8))])(
            tmp_path, path),
        _edit(path, _set("data", prompt="{topic}: {instruction}", validation=None))),
     "field 'topic' (named by data.prompt) is an object", "train.jsonl:3"),
    ("chat-content-is-a-list", lambda tmp_path, path: _chat(tmp_path, path, [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": ["a", "b"]}]),
     "message 1 of field 'messages' has a role or content that is a list, not text", "chat.jsonl:8"),
    # OpenAI's content parts: was "a list, not text", which did not say what to do with them
    ("chat-content-is-parts", lambda tmp_path, path: _chat(tmp_path, path, [
        {"role": "user", "content": [{"type": "text", "text": "q"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": "a"}]),
     "message 0 of field 'messages' has its content as a list of parts (type text, image_url: OpenAI's and the "
     "multimodal form), not text; join its text parts into one string", "chat.jsonl:8"),
    # roles are read as written: 'Assistant' was "no assistant turn: nothing to train on", without why
    ("chat-role-capitalised", lambda tmp_path, path: _chat(tmp_path, path, [
        {"role": "User", "content": "q"}, {"role": "Assistant", "content": "a"}]),
     "conversation has no assistant turn: nothing to train on (its roles: User, Assistant); roles are read as "
     "written, and 'Assistant' is not 'assistant'", "chat.jsonl:8"),
    ("chat-role-is-an-object", lambda tmp_path, path: _chat(tmp_path, path, [
        {"role": {"r": 1}, "content": "q"}, {"role": "assistant", "content": "a"}]),
     "message 0 of field 'messages' has a role or content that is an object, not text", "chat.jsonl:8"),
    # a Parquet binary column (older writers and Spark store strings so): str() trained on "b'reverse word2'"
    ("prompt-is-binary", lambda tmp_path, path: _parquet_train(tmp_path, path, [
        dict(r, instruction=r["instruction"].encode()) for r in simple_records(8)]),
     "field 'instruction' (named by data.prompt) is binary data (a Parquet binary column: cast it to string",
     "train.parquet[0]"),
    ("data-symlink-loop", lambda tmp_path, path: (
        (tmp_path / "data" / "train.jsonl").unlink(),
        (tmp_path / "data" / "train.jsonl").symlink_to(tmp_path / "data" / "loop.jsonl"),
        (tmp_path / "data" / "loop.jsonl").symlink_to(tmp_path / "data" / "train.jsonl")),
     "a symlink that leads nowhere (a loop, or its target is missing)", "train.jsonl"),
    ("data-path-through-a-file", lambda tmp_path, path: _edit(path, _set("data", train="data/train.jsonl/more.jsonl")),
     "data file not found", "train.jsonl/more.jsonl"),
]


@pytest.mark.parametrize("case, breaker, expected, where", FIELD_CASES, ids=[c[0] for c in FIELD_CASES])
def test_field_case(cli, tmp_path, case, breaker, expected, where):
    path = _base(tmp_path)
    breaker(tmp_path, path)
    home = tmp_path / "home"
    r = cli("train", path, "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert expected in r.err and where in r.err, r.err
    assert "Traceback" not in r.err and "fix" in r.err
    _no_traces(home)


def test_seq_cls_text_is_a_list(cli, tmp_path):
    records = [{"text": t, "label": lab} for _ in range(4) for t, lab in (("a", "x"), ("b", "y"))]
    records[5]["text"] = ["not", "text"]
    write_jsonl(tmp_path / "data" / "train.jsonl", records)
    path = write_campaign(tmp_path, {
        "task": "seq-cls", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "text": "text", "label": "label", "labels": ["x", "y"]},
        "train": {"micro_batch": 2, "accumulation": 1, "updates": 1}})
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "field 'text' (named by data.text) is a list, not text" in r.err, r.err
    assert "train.jsonl:6" in r.err and "Traceback" not in r.err
    _no_traces(tmp_path / "home")


# --- valid input that must be read -----------------------------------------------------------------------
def test_jsonl_strings_holding_line_separators_are_read(cli, tmp_path):
    records = simple_records(8)
    records[2]["output"] = "one\u2028two\u0085three\u2029four\x1cfive"
    path = tiny_causal_campaign(tmp_path, records, simple_records(4, 100))
    text = (tmp_path / "data" / "train.jsonl").read_text()
    (tmp_path / "data" / "train.jsonl").write_text(text.replace("\\u2028", "\u2028").replace("\\u0085", "\u0085"))
    assert "\u2028" in (tmp_path / "data" / "train.jsonl").read_text()
    from pilotrun.records.readers import read_records

    recs = read_records(tmp_path / "data" / "train.jsonl")
    assert len(recs) == 8 and recs[2].fields["output"] == records[2]["output"] and recs[3].where.endswith(":4")
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err


def test_csv_fields_over_the_default_limit_are_read(cli, tmp_path):
    import csv

    path = _base(tmp_path)
    long = "word " * 60_000  # 300 KB: over csv's default 128 KiB field limit
    with open(tmp_path / "data" / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["instruction", "output"])
        for i in range(8):
            w.writerow([long if i == 1 else f"reverse word{i}", f"{i}drow"])
    _edit(path, _set("data", train="data/train.csv"))
    from pilotrun.records.readers import read_records

    assert read_records(tmp_path / "data" / "train.csv")[1].fields["instruction"] == long
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err


# --- unreadable files, read as an unprivileged user ------------------------------------------------------
@pytest.fixture
def shared_dir():
    """A folder the unprivileged user can enter (pytest's tmp_path is root's alone)."""
    d = Path(tempfile.mkdtemp(prefix="pilotrun-nobody-"))
    os.chmod(d, 0o777)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _as_nobody(*args, cwd):
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv to run the CLI as an unprivileged user (root reads mode-000 files)")
    src = str(Path(__file__).resolve().parents[2] / "src")
    cmd = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", sys.executable]
    env = dict(os.environ, PYTHONPATH=src, HOME=str(cwd))
    if subprocess.run([*cmd, "-c", "import pilotrun"], env=env, cwd=cwd, capture_output=True).returncode != 0:
        pytest.skip("the user 'nobody' cannot run this Python or read the sources here")
    return subprocess.run([*cmd, "-m", "pilotrun", *map(str, args)], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _open_up(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o777 if p.is_dir() else 0o666)


@pytest.mark.parametrize("verb", ["validate", "train"])
def test_unreadable_data_file(shared_dir, verb):
    path = _base(shared_dir)
    _open_up(shared_dir)
    os.chmod(shared_dir / "data" / "train.jsonl", 0o000)
    r = _as_nobody(verb, path, "--home", shared_dir / "home", cwd=shared_dir)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "cannot read the data file: Permission denied" in r.stderr and "train.jsonl" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    _no_traces(shared_dir / "home")


def test_unreadable_campaign_file(shared_dir):
    path = _base(shared_dir)
    _open_up(shared_dir)
    os.chmod(path, 0o000)
    r = _as_nobody("validate", path, cwd=shared_dir)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "is not readable" in r.stderr and str(path) in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def test_unreadable_journal(shared_dir):
    from pilotrun.journal import Journal

    Journal(shared_dir / "home").add_note("x")
    _open_up(shared_dir)
    os.chmod(shared_dir / "home" / "journal.sqlite", 0o000)
    r = _as_nobody("runs", "--home", shared_dir / "home", cwd=shared_dir)
    assert r.returncode == 2, (r.returncode, r.stderr)
    assert "journal.sqlite" in r.stderr and "Permission denied" in r.stderr and "Traceback" not in r.stderr


def test_the_unprivileged_user_reads_what_it_may(shared_dir):
    """The clean case: the same layout, readable, validates as that user."""
    path = _base(shared_dir)
    _open_up(shared_dir)
    r = _as_nobody("validate", path, cwd=shared_dir)
    assert r.returncode == 0, r.stderr
