"""The bad-input corpus, round four (issue 44), data files that passed validate and failed later or trained garbage:
a NaN or an infinity read as the text "nan"/"inf", list and struct fields (JSONL or Parquet), a FIFO or a device as
a data file (read forever); and the valid input that was refused: a byte-order mark (Excel's "CSV UTF-8", CRLF).
Each through ``validate`` (the verb that must catch it): exit 2 naming file:line and the fix, nothing written."""

from __future__ import annotations

import os
import signal

import pytest
from conftest import simple_records, tiny_causal_campaign, write_jsonl
from test_corpus import _edit, _no_traces, _set


def _base(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))


def _jsonl_line(name: str, line: int, text: str):
    """Replace line ``line`` (1-based) of data/NAME by ``text`` (JSON as Python's json writes NaN/Infinity)."""
    def apply(tmp_path, path):
        f = tmp_path / "data" / name
        lines = f.read_text().splitlines()
        lines[line - 1] = text
        f.write_text("\n".join(lines) + "\n")
    return apply


def _parquet(field: str, value, at: int):
    def apply(tmp_path, path):
        import pyarrow as pa
        import pyarrow.parquet as pq

        recs = simple_records(8)
        # a struct or list column holds structs or lists in every row (Parquet types a column): one is planted
        other = (lambda r: {"text": r[field]}) if isinstance(value, dict) else (
            (lambda r: [r[field]]) if isinstance(value, list) else (lambda r: float(r["id"])))  # a float column
        rows = [dict(r, **{field: value if i == at else other(r)}) for i, r in enumerate(recs)]
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data" / "train.parquet")
        _edit(path, _set("data", train="data/train.parquet"))
    return apply


def _chat_nan(tmp_path, path):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}
    write_jsonl(tmp_path / "data" / "chat.jsonl", [good] * 5)
    with open(tmp_path / "data" / "chat.jsonl", "a") as f:
        f.write('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": NaN}]}\n')
    _edit(path, _set("data", train="data/chat.jsonl", validation=None, prompt=None, response=None, messages="messages"))


def _special(kind: str):
    def apply(tmp_path, path):
        f = tmp_path / "data" / "validation.jsonl"
        f.unlink()
        if kind == "fifo":
            os.mkfifo(f)
        else:
            f.symlink_to("/dev/zero")
    return apply


CASES = [
    ("response-nan", _jsonl_line("train.jsonl", 3, '{"instruction": "reverse x", "output": NaN}'),
     "field 'output' (named by data.response) is not a number (NaN), not text, in 1 of 8 records", "train.jsonl:3"),
    ("prompt-infinity", _jsonl_line("validation.jsonl", 2, '{"instruction": -Infinity, "output": "y"}'),
     "field 'instruction' (named by data.prompt) is an infinity, not text", "validation.jsonl:2"),
    ("parquet-struct-response", _parquet("output", {"text": "b"}, 4),
     "field 'output' (named by data.response) is an object, not text, in 8 of 8 records", "train.parquet[0]"),
    ("parquet-list-prompt", _parquet("instruction", ["a", "b"], 6),
     "field 'instruction' (named by data.prompt) is a list, not text, in 8 of 8 records", "train.parquet[0]"),
    ("parquet-nan-response", _parquet("output", float("nan"), 5),
     "field 'output' (named by data.response) is not a number (NaN), not text, in 1 of 8 records",
     "train.parquet[5]"),
    ("chat-content-nan", _chat_nan,
     "message 1 of field 'messages' has a role or content that is not a number (NaN), not text", "chat.jsonl:6"),
    ("validation-is-a-fifo", _special("fifo"), "is a FIFO (named pipe), not a regular file (named by data.validation)",
     "validation.jsonl"),
    ("validation-links-to-a-device", _special("device"),  # the campaign resolves the link: its target is named
     "is a character device, not a regular file (named by data.validation)", "/dev/zero"),
]


def _alarm(signum, frame):
    raise AssertionError("validate blocked reading a data file")


@pytest.mark.parametrize("case, breaker, expected, where", CASES, ids=[c[0] for c in CASES])
def test_validate_refuses_data_the_task_cannot_read(cli, tmp_path, case, breaker, expected, where):
    path = _base(tmp_path)
    breaker(tmp_path, path)
    home = tmp_path / "home"
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(60)  # the planted FIFO blocked validate forever
    try:
        r = cli("validate", path, "--home", home)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert r.code == 2, (r.code, r.err)
    assert expected in r.err and where in r.err, r.err
    assert "Traceback" not in r.err and "fix" in r.err, r.err
    _no_traces(home)


def test_a_byte_order_mark_is_no_part_of_the_first_field(cli, tmp_path):
    """The clean cases: Excel's "CSV UTF-8" (a byte-order mark, CRLF line ends, a quoted field with a line break)
    and a JSONL saved by Notepad (a byte-order mark) read as their fields; validate passes."""
    from pilotrun.records.readers import read_records
    from pilotrun.records.stream import iter_chunks

    path = _base(tmp_path)
    csv = tmp_path / "data" / "train.csv"
    csv.write_bytes(b"\xef\xbb\xbfinstruction,output\r\n" + b"".join(
        f'"reverse word{i}\r\nplease",{i}drow\r\n'.encode() for i in range(8)))
    valid = tmp_path / "data" / "validation.jsonl"
    valid.write_bytes(b"\xef\xbb\xbf" + valid.read_bytes())
    recs = read_records(csv)
    assert list(recs[0].fields) == ["instruction", "output"] and recs[0].fields["instruction"].endswith("please")
    assert list(next(iter_chunks(valid))[0].fields) == list(read_records(valid)[0].fields) == ["id", "instruction",
                                                                                               "output"]
    _edit(path, _set("data", train="data/train.csv"))
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err
