"""Malformed data exits 2 naming file and line; nothing reaches the journal for a run that never started."""

import tempfile

import pytest
from conftest import simple_records, tiny_causal_campaign


def _assert_nothing_written(home):
    assert not (home / "journal.sqlite").exists()
    assert not (home / "runs").exists()


@pytest.mark.parametrize("content, where, message", [
    (b'{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": \n', ":2", "invalid JSON"),
    (b'{"instruction": "a", "output": "b"}\n{"instruction": "caf\xe9", "output": "b"}\n', ":2", "not UTF-8"),
    (b'{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": ""}\n', ":2", "is empty"),
    (b'{"instruction": "a", "output": "b"}\n{"instruction": "a"}\n', ":2", "no field 'output'"),
    (b'{"instruction": "a", "output": "b"}\n[1, 2]\n', ":2", "not an object"),
    (b"", "", "no records"),
    # nested past the interpreter's recursion limit: a RecursionError, exit 3
    (b'{"instruction": "a", "output": "b"}\n{"instruction": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", ":2",
     "nested deeper than the JSON reader goes"),
    # a key twice: JSON readers keep the last ("bad"), silently
    (b'{"instruction": "a", "output": "b"}\n{"instruction": "a", "output": "good", "output": "bad"}\n', ":2",
     "key 'output' appears twice in one JSON object; a JSON reader keeps the last, silently"),
])
@pytest.mark.parametrize("verb", ["validate", "train"])
def test_malformed_jsonl(cli, tmp_path, content, where, message, verb):
    path = tiny_causal_campaign(tmp_path, simple_records(2))
    (tmp_path / "data" / "train.jsonl").write_bytes(content)
    home = tmp_path / "home"
    r = cli(verb, path, "--home", home)
    assert r.code == 2, r.err
    assert f"train.jsonl{where}" in r.err and message in r.err
    assert "Traceback" not in r.err
    _assert_nothing_written(home)


def test_csv_with_missing_column(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(2))
    csv_path = tmp_path / "data" / "train.csv"
    csv_path.write_text("instruction,output\nhello,world\nonly-one-column\n")
    text = path.read_text().replace("data/train.jsonl", "data/train.csv")
    path.write_text(text)
    r = cli("validate", path)
    assert r.code == 2 and "train.csv:3" in r.err and "columns" in r.err


def test_a_csv_column_named_twice_is_refused(cli, tmp_path):
    # a record kept the last of the two columns, silently
    path = tiny_causal_campaign(tmp_path, simple_records(2))
    text = path.read_text().replace("data/train.jsonl", "data/train.csv")
    path.write_text(text)
    (tmp_path / "data" / "train.csv").write_text("instruction,output,output\na,good,bad\n")
    r = cli("validate", path)
    assert r.code == 2, r.err
    assert "train.csv:1: the header names 'output' (columns 2, 3) more than once" in r.err, r.err


@pytest.mark.parametrize("sep, said", [(";", "semicolons (as Excel writes CSV where the decimal mark is a comma)"),
                                       ("\t", "tabs"), ("|", "vertical bars")])
def test_a_csv_separated_by_another_character(cli, tmp_path, sep, said):
    # read with commas, each record was one field named 'instruction;output': "no record has 'output'"
    path = tiny_causal_campaign(tmp_path, simple_records(2))
    path.write_text(path.read_text().replace("data/train.jsonl", "data/train.csv"))
    (tmp_path / "data" / "train.csv").write_text(f"instruction{sep}output\nreverse abc{sep}cba\nupper x{sep}X\n")
    r = cli("validate", path)
    assert r.code == 2, r.err
    assert f"train.csv:1: the header is one column, {'instruction' + sep + 'output'!r}: the file is separated by " \
           f"{said}, and a CSV file here is separated by commas" in r.err, r.err
    assert f"pd.read_csv(f, sep={sep!r})" in r.err
    (tmp_path / "data" / "train.csv").write_text("instruction,output\nreverse a;b|c\tx,b;a\n" + "upper x,X\n" * 4)
    assert cli("validate", path).code == 0  # the separators inside a comma-separated file's fields are text


def test_json_list_and_parquet_are_read(tmp_path):
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from pilotrun.records.readers import read_records

    recs = simple_records(3)
    (tmp_path / "a.json").write_text(json.dumps(recs))
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "a.parquet")
    assert [r.fields for r in read_records(tmp_path / "a.json")] == recs
    got = read_records(tmp_path / "a.parquet")
    assert [r.fields for r in got] == recs and got[1].where.endswith("a.parquet[1]")


def test_a_json_object_of_columns_is_read_and_other_objects_are_named(tmp_path):
    """`json.dump(Dataset.to_dict())` and `DataFrame.to_dict(orient="list")` write columns, which Hugging Face
    datasets' JSON reader reads as a table: pilotrun said "the JSON file must hold a list of objects". pandas'
    default to_json() (a {index: value} column per field), columns of different lengths and several lists of records
    in one object are named as such."""
    import json

    import pandas as pd

    from pilotrun.errors import BadInput
    from pilotrun.records.readers import read_records

    recs = simple_records(4)
    frame = pd.DataFrame(recs)
    cases = {"cols.json": frame.to_dict(orient="list"), "one.json": {"instruction": [r["instruction"] for r in recs]},
             "wrapped.json": {"data": recs}}
    for name, obj in cases.items():
        (tmp_path / name).write_text(json.dumps(obj))
    assert [r.fields for r in read_records(tmp_path / "cols.json")] == recs
    assert read_records(tmp_path / "cols.json")[3].where == f"{tmp_path / 'cols.json'}[3]"
    assert [r.fields for r in read_records(tmp_path / "one.json")] == [{"instruction": r["instruction"]} for r in recs]
    assert [r.fields for r in read_records(tmp_path / "wrapped.json")] == recs
    frame.to_json(tmp_path / "pandas.json")  # orient="columns": {"instruction": {"0": ...}, ...}
    short = dict(frame.to_dict(orient="list"), output=[r["output"] for r in recs][:3])
    (tmp_path / "short.json").write_text(json.dumps(short))
    (tmp_path / "splits.json").write_text(json.dumps({"train": recs[:3], "test": recs[3:]}))
    for name, said, fix in [
        ("pandas.json", "a column of {index: value} per field, as pandas' to_json() writes by default",
         "df.to_json('pandas.jsonl', orient='records', lines=True)"),
        ("short.json", "columns of different lengths (output: 3; the others: 4)", "one value a record"),
        ("splits.json", "holds 2 lists of records ('train', 'test'): a campaign reads one list a file",
         "a file of its own"),
    ]:
        with pytest.raises(BadInput) as e:
            read_records(tmp_path / name)
        assert said in e.value.detail and fix in e.value.fix, str(e.value)


def test_shared_alpaca_and_stack_exchange_read(tmp_path):
    from conftest import SHARED_DATA

    from pilotrun.records.readers import read_records

    alpaca = read_records(SHARED_DATA / "alpaca_tiny.json")
    assert len(alpaca) == 100 and {"instruction", "input", "output"} <= set(alpaca[0].fields)
    assert len(read_records(SHARED_DATA / "stack_exchange_paired_tiny.json")) == 25


def test_internal_error_exits_3(cli, tmp_path, monkeypatch):
    """A bug is not bad input: exit 3, a short message, the traceback in a file."""
    import pilotrun.rehearsal.data_checks.validate as v

    def broken(loaded, **options):  # validate's own signature (the verb passes home=)
        raise ZeroDivisionError("planted bug")

    monkeypatch.setattr(v, "validate", broken)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # the traceback's file lands here, not in TMPDIR
    (tmp_path / "tmp").mkdir()
    path = tiny_causal_campaign(tmp_path, simple_records(2))
    r = cli("validate", path)
    assert r.code == 3 and "internal error" in r.err and "planted bug" in r.err and "Traceback" not in r.err
    (saved,) = (tmp_path / "tmp").glob("pilotrun-error-*.txt")
    assert str(saved) in r.err and "ZeroDivisionError: planted bug" in saved.read_text()


@pytest.mark.parametrize("suffix, module", [(".gz", "gzip"), (".bz2", "bz2"), (".xz", "lzma")])
def test_compressed_data_files_are_read(cli, tmp_path, suffix, module):
    # Hugging Face datasets (so Axolotl) read train.jsonl.gz; pilotrun said "unknown data format '.gz'", and an
    # imported config naming one carried a path validate then refused
    import importlib

    records = simple_records(6)
    path = tiny_causal_campaign(tmp_path, records)
    plain = tmp_path / "data" / "train.jsonl"
    packed = plain.with_name("train.jsonl" + suffix)
    packed.write_bytes(importlib.import_module(module).compress(plain.read_bytes()))
    plain.unlink()
    path.write_text(path.read_text().replace("data/train.jsonl", f"data/train.jsonl{suffix}"))
    r = cli("validate", path)
    assert r.code == 0 and "train: 6 records" in r.err + r.out, r.err
    from pilotrun.records.readers import read_records

    got = read_records(packed)
    assert [x.fields for x in got] == records and got[2].where == f"{packed}:3"
    packed.write_bytes(packed.read_bytes()[:20])  # cut short in the copy
    r = cli("validate", path)
    assert r.code == 2 and f"train.jsonl{suffix}: cannot decompress it as {module}" in r.err, r.err
    packed.write_bytes(b'{"instruction": "a", "output": "b"}\n')  # named .gz, not compressed
    r = cli("validate", path)
    assert r.code == 2 and f"cannot decompress it as {module}" in r.err, r.err
    assert "name it for the compression it holds" in r.err


def test_a_compressed_parquet_and_a_decompression_bomb_are_refused(tmp_path, monkeypatch):
    import lzma

    from pilotrun.errors import BadInput
    from pilotrun.records import readers

    (tmp_path / "a.parquet.gz").write_bytes(b"")
    with pytest.raises(BadInput) as e:
        readers.read_records(tmp_path / "a.parquet.gz")
    assert "unknown data format '.parquet.gz'" in str(e.value)
    assert "(or .jsonl, .json and .csv compressed: .gz, .bz2, .xz)" in str(e.value)
    # a few KB that expand to gigabytes: read whole, it would take the memory; past 1000 times its size and the floor
    # (1 GiB, lowered here to keep the test small) it is refused
    monkeypatch.setattr(readers, "_BOMB_FLOOR", 2**20)
    bomb = lzma.compress(b"\n" * (64 * 2**20))
    (tmp_path / "bomb.jsonl.xz").write_bytes(bomb)
    assert len(bomb) * 1000 < 64 * 2**20
    with pytest.raises(BadInput) as e:
        readers.read_records(tmp_path / "bomb.jsonl.xz")
    assert f"from {len(bomb)} bytes, more than 1000 times its size: a decompression bomb" in str(e.value)
    (tmp_path / "ok.jsonl.xz").write_bytes(lzma.compress(b'{"a": "' + b"x" * 500_000 + b'"}\n'))  # 1000x is data
    assert len(readers.read_records(tmp_path / "ok.jsonl.xz")) == 1


def test_a_data_set_saved_by_datasets_is_read_from_its_arrow_shard(cli, tmp_path):
    """`Dataset.save_to_disk` writes a folder of Arrow IPC shards beside state.json: named as data.train it was "is a
    folder, not a data file", and its .arrow shard "unknown data format '.arrow'". A shard (stream format) and a
    Feather / Arrow IPC file (file format) are read now; the folder is named for what it is, with the file to name."""
    import datasets
    import pyarrow.feather as feather

    from pilotrun.records.readers import read_records

    records = simple_records(6)
    path = tiny_causal_campaign(tmp_path, records)
    ds = datasets.Dataset.from_list(records)
    ds.save_to_disk(str(tmp_path / "one"))
    ds.save_to_disk(str(tmp_path / "three"), num_shards=3)
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dict"))
    feather.write_feather(ds.data.table, str(tmp_path / "train.arrow"))  # the IPC file format
    shard = tmp_path / "one" / "data-00000-of-00001.arrow"
    for data in (shard, tmp_path / "train.arrow"):
        got = read_records(data)
        assert [r.fields for r in got] == records and got[4].where == f"{data}[4]"
        r = cli("validate", path, "--set", f"data.train={data}")
        assert r.code == 0 and "train: 6 records" in r.err + r.out, r.err
    for folder, said, fix in [
        ("one", "is a data set that datasets' save_to_disk wrote (1 .arrow shard), not a data file",
         f"fix: set data.train to its one shard: {shard}"),
        ("three", "(3 .arrow shards)", f"datasets.load_from_disk('{tmp_path / 'three'}').to_json('train.jsonl')"),
        ("dict", "is a DatasetDict that datasets' save_to_disk wrote (splits: train, test)",
         f"name one split's data: for train, set data.train to its one shard: {tmp_path / 'dict' / 'train'}/"),
    ]:
        r = cli("validate", path, "--set", f"data.train={tmp_path / folder}")
        assert r.code == 2 and said in r.err and fix in r.err, r.err
    shard.write_bytes(shard.read_bytes()[:100])  # cut short
    r = cli("validate", path, "--set", f"data.train={shard}")
    assert r.code == 2 and "cannot read it as an Arrow IPC file" in r.err, r.err
