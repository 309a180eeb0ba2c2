"""Text no UTF-8 can hold, from every door it came in by: a JSON escape of half a surrogate pair, a Parquet string
column of another encoding's bytes, and command-line arguments, file names and environment variables in another
encoding (Python carries their bytes as lone surrogates). Each was an exit 3: in the tokenizer, in SQLite, in
pyarrow's decoding. Each is now exit 2 naming where and the fix, before anything is written."""

import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import simple_records, tiny_causal_campaign, write_jsonl

from pilotrun import jsonsafe
from pilotrun.console.safe import escape_controls
from pilotrun.errors import not_utf8
from pilotrun.records.readers import read_records


@pytest.mark.parametrize("text, lone", [
    (r'{"a": "x\ud800y"}', r"\ud800"),                 # a high half alone
    (r'{"a": "x\udc00"}', r"\udc00"),                  # a low half alone
    (r'{"a": "cut \ud83d"}', r"\ud83d"),               # an emoji cut after its first half
    (r'{"a": "\ud83d\ud83d\ude00"}', r"\ud83d"),      # two highs: the first is alone
    (r'{"\ud800": 1}', r"\ud800"),                     # in a key
    (r'{"a": ["ok", {"b": "\\\ud800"}]}', r"\ud800"),  # an escaped backslash, then the escape
    (r'{"a": "\ud83d\ude00"}', None),                  # a pair is one character
    (r'{"a": "\\ud800"}', None),                       # an escaped backslash, then the letters ud800
    (r'{"a": "\u00e9\uD83D\uDE00"}', None),
])
def test_json_lone_surrogate(text, lone):
    for doc in (text, text.encode()):
        if lone is None:
            out = jsonsafe.loads(doc)
            assert not_utf8(str(out)) is None
            continue
        with pytest.raises(jsonsafe.LoneSurrogate) as e:
            jsonsafe.loads(doc)
        assert e.value.escape == lone
        assert text[e.value.pos:].startswith(lone)
        assert "is half of a UTF-16 surrogate pair, without its other half" in str(e.value)


@pytest.mark.parametrize("verb", ["validate", "inspect"])
def test_a_data_record_with_half_a_surrogate_pair(cli, tmp_path, verb):
    # was exit 3 in inspect: the tokenizer could not encode the string
    path = tiny_causal_campaign(tmp_path, simple_records(4))
    data = tmp_path / "data" / "train.jsonl"
    lines = data.read_text().splitlines()
    lines[2] = lines[2].replace('"output": "', '"output": "\\ud800', 1)
    data.write_text("\n".join(lines) + "\n")
    home = tmp_path / "home"
    r = cli(verb, path, "--home", home)
    assert r.code == 2, r.err
    assert "train.jsonl:3: \\ud800 is half of a UTF-16 surrogate pair, without its other half" in r.err, r.err
    assert "fix: write the character meant in place of \\ud800" in r.err
    assert not (home / "journal.sqlite").exists()
    # the clean case: the pair of an emoji, escaped as JSON writers escape it, is read as the emoji
    lines[2] = lines[2].replace("\\ud800", "\\ud83d\\ude00")
    data.write_text("\n".join(lines) + "\n")
    assert read_records(data)[2].fields["output"].startswith("\U0001F600")
    r = cli("validate", path, "--home", home)
    assert r.code == 0, r.err


def test_a_json_list_file_with_half_a_surrogate_pair(tmp_path):
    from pilotrun.errors import BadInput

    (tmp_path / "a.json").write_text('[\n  {"instruction": "a", "output": "b"},\n  {"instruction": "\\udfff"}\n]\n')
    with pytest.raises(BadInput) as e:
        read_records(tmp_path / "a.json")
    assert e.value.where.endswith("a.json:3") and "\\udfff is half of a UTF-16 surrogate pair" in str(e.value)


def _parquet_with_bytes(path, records, field, row, raw: bytes):
    """A Parquet file whose string column ``field`` holds ``raw`` (not UTF-8) at ``row``: pyarrow's writers check
    nothing of a string built from buffers, as some writers of other languages check nothing."""
    table = pa.Table.from_pylist(records)
    values = [str(r[field]).encode() for r in records]
    values[row] = raw
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + len(v))
    column = pa.Array.from_buffers(pa.string(), len(values),
                                   [None, pa.array(offsets, pa.int32()).buffers()[1], pa.py_buffer(b"".join(values))])
    pq.write_table(table.set_column(table.schema.get_field_index(field), field, column), path)


def test_a_parquet_string_column_that_is_not_utf8(cli, tmp_path):
    # pyarrow reads the bytes unchecked and decodes them in to_pylist: a UnicodeDecodeError, exit 3
    path = tiny_causal_campaign(tmp_path, simple_records(4))
    path.write_text(path.read_text().replace("data/train.jsonl", "data/train.parquet"))
    _parquet_with_bytes(tmp_path / "data" / "train.parquet", simple_records(6), "output", 4, b"caf\xe9")
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 2, r.err
    assert ("train.parquet[4]: column 'output', row 4: a string column holding text that is not UTF-8 (byte 0xe9)"
            in r.err), r.err
    assert "fix: write 'output' again as UTF-8 text" in r.err
    # the clean case: the same file, its text UTF-8
    _parquet_with_bytes(tmp_path / "data" / "train.parquet", simple_records(6), "output", 4, "café".encode())
    assert cli("validate", path, "--home", tmp_path / "home").code == 0


def _latin1(parent, name: str) -> str:
    """A folder named ``name`` encoded as Latin-1 (not UTF-8) under ``parent``, as Python names it: the byte that
    does not decode carried as a lone surrogate."""
    raw = os.path.join(os.fsencode(parent), name.encode("latin-1"))
    os.mkdir(raw)
    return os.fsdecode(raw)


def test_arguments_and_paths_that_are_not_utf8(cli, tmp_path, monkeypatch):
    # Python decodes argv, file names and the environment with surrogateescape: a Latin-1 "é" is "\udce9". A note or
    # a --set of one was exit 3 in SQLite; a campaign under such a folder passed validate, then train built its model
    # and was exit 3 recording the run
    folder = _latin1(tmp_path, "caf\xe9")
    path = tiny_causal_campaign(__import__("pathlib").Path(folder), simple_records(4))
    home = tmp_path / "home"
    said = "which is not UTF-8 (a terminal or a file name in another encoding)"
    for argv, option in (
        (("validate", path, "--home", home), "'CAMPAIGN'"),
        (("note", "caf\udce9", "--home", home), "'TEXT'"),
        (("validate", tmp_path / "x.yaml", "--set", "name=caf\udce9", "--home", home), "'--set'"),
        (("runs", "--home", folder), "'--home'"),
    ):
        r = cli(*argv)
        assert r.code == 2, (argv, r.err)
        assert f"Invalid value for {option}: it holds byte 0xe9, {said}" in r.err, r.err
    monkeypatch.setenv("PILOTRUN_HOME", folder)
    r = cli("runs")
    assert r.code == 2 and "Invalid value for $PILOTRUN_HOME (for --home): it holds byte 0xe9" in r.err, r.err
    monkeypatch.delenv("PILOTRUN_HOME")
    # the same folder reached without naming it: the current folder
    monkeypatch.chdir(folder)
    for verb in ("validate", "train"):
        r = cli(verb, "campaign.yaml", "--json")
        assert r.code == 2, r.err
        assert r.json["error"]["message"] == ("the path holds byte 0xe9, which is not UTF-8: pilotrun writes its "
                                              "paths into the journal, JSON and reports as UTF-8 text"), r.out
        assert "fix: rename the file or folder with a UTF-8 name" in r.err
    r = cli("runs")
    assert r.code == 2 and "--home: the path holds byte 0xe9" in r.err, r.err
    assert sorted(os.listdir(folder)) == ["campaign.yaml", "data"]  # no journal begun
    assert not home.exists()


def test_not_utf8_is_shown_escaped():
    assert not_utf8("café") is None and not_utf8("\U0001F600") is None
    assert not_utf8("caf\udce9") == "byte 0xe9" and not_utf8("a\ud800") == "\\ud800"
    assert escape_controls("caf\udce9") == "caf\\udce9"
    escape_controls("caf\udce9").encode("utf-8")  # a terminal can print it


def test_files_in_another_encoding_are_named_at_every_door(cli, tmp_path):
    # one reading of a file's bytes (errors.utf8_of) for the campaign, the data, an imported config, the rates, a
    # target's env and a chat template file: a UTF-16 file is said as such (a Latin-1 fix would garble it), a Latin-1
    # byte by its value and line, and a UTF-8 byte-order mark is dropped (an imported JSON holding one was refused)
    from types import SimpleNamespace

    from pilotrun.errors import BadInput
    from pilotrun.sheet.rates import read_rates
    from pilotrun.sheet.stack import read_target_env
    from pilotrun.tasks.chat import resolve

    path = tiny_causal_campaign(tmp_path, simple_records(4))
    text = path.read_text()
    (tmp_path / "c16.yaml").write_bytes(text.encode("utf-16"))
    r = cli("validate", tmp_path / "c16.yaml")
    assert r.code == 2, r.err
    assert "c16.yaml:1: the file is UTF-16 (it starts with the byte-order mark 0xff 0xfe" in r.err, r.err
    assert "fix: convert it: iconv -f UTF-16 -t UTF-8 c16.yaml > utf8-c16.yaml" in r.err
    (tmp_path / "data" / "train.jsonl").write_bytes((tmp_path / "data" / "train.jsonl").read_text().encode("utf-16"))
    r = cli("validate", path)
    assert r.code == 2 and "train.jsonl:1: the file is UTF-16" in r.err, r.err
    write_jsonl(tmp_path / "data" / "train.jsonl", simple_records(4))
    (tmp_path / "lat.yaml").write_bytes(text.replace("name: tiny", "name: caf\xe9").encode("latin-1"))
    r = cli("validate", tmp_path / "lat.yaml")
    assert r.code == 2 and "lat.yaml:1: byte 0xe9 (line 1, column 10) is not UTF-8" in r.err, r.err
    assert "fix: save the file as UTF-8 (one in Latin-1: iconv -f latin1 -t utf-8)" in r.err
    (tmp_path / "bom.yaml").write_bytes(b"\xef\xbb\xbf" + text.encode())
    assert cli("validate", tmp_path / "bom.yaml").code == 0
    (tmp_path / "args.json").write_bytes(b'\xef\xbb\xbf{"per_device_train_batch_size": 2, "learning_rate": 1e-4}')
    r = cli("import", tmp_path / "args.json", "--out", tmp_path / "imported.yaml")
    assert r.code == 0, r.err
    (tmp_path / "rates.yaml").write_bytes("h100-sxm: 2.5 €\n".encode("cp1252"))
    (tmp_path / "env.json").write_bytes('{"torch": "2.13"}'.encode("utf-16"))
    (tmp_path / "t.jinja").write_bytes("{% for m in messages %}caf\xe9{% endfor %}".encode("latin-1"))
    chat = SimpleNamespace(data=SimpleNamespace(chat_template="t.jinja"))
    for read, said in ((lambda: read_rates(tmp_path / "rates.yaml"), "rates.yaml:1: byte 0x80 (line 1, column 15)"),
                       (lambda: read_target_env(tmp_path / "env.json"), "env.json:1: the file is UTF-16"),
                       (lambda: resolve(chat, None, tmp_path), "t.jinja:1: byte 0xe9 (line 1, column 27)")):
        with pytest.raises(BadInput) as e:
            read()
        assert said in str(e.value), str(e.value)
