"""Read records from .jsonl, .json, .csv and .parquet files.

Errors name the file and the line (or row) and say what to do. Each record keeps where it came
from, so later checks can point at it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pilotrun.errors import BadInput, utf8_of
from pilotrun import jsonsafe
from pilotrun.journal.files import special_file

FORMATS = (".jsonl", ".json", ".csv", ".parquet", ".arrow")
"""``.arrow``: an Arrow IPC file, stream or file format (what ``datasets``' ``save_to_disk`` writes as its shards)."""
SPLIT_LEDGER, SPLIT_WRITTEN_BY = "split.json", "pilotrun split"
"""What ``pilotrun split`` writes beside its files (data/split.py): how they were made and each one's sha256."""


def a_split_ledger(doc) -> bool:
    """Whether a JSON document is the ledger ``pilotrun split`` writes (``written_by``)."""
    return isinstance(doc, dict) and doc.get("written_by") == SPLIT_WRITTEN_BY


SAVE_TO_DISK_FILES = ("state.json", "dataset_info.json", "dataset_dict.json")
"""What ``datasets``' ``save_to_disk`` writes beside its .arrow shards: JSON, but no records."""
TABLES = (".parquet", ".arrow")
"""Formats read as a table by pyarrow: never compressed outside, their rows indexed ``path[i]``."""
COMPRESSED = {".gz": "gzip", ".bz2": "bz2", ".xz": "lzma"}
"""A text format's file compressed (``train.jsonl.gz``), as Hugging Face datasets and so Axolotl read it: the module
that opens it."""
_BOMB_RATIO, _BOMB_FLOOR = 1000, 2**30  # past both, what a compressed file gives is a decompression bomb, not data


def data_format(path: Path) -> tuple[str, str | None]:
    """(the format's suffix, the compression's or None): ``train.jsonl.gz`` → (".jsonl", ".gz")."""
    suffix = path.suffix.lower()
    if suffix in COMPRESSED:
        return Path(path.stem).suffix.lower(), suffix
    return suffix, None


_CSV_FIELD_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class Record:
    fields: dict[str, Any]
    where: str  # "path:line" (jsonl, csv), "path[index]" (json, parquet)
    index: int  # 0-based position in the file

    @property
    def rid(self) -> str:
        return self.where


def not_text(value) -> str | None:
    """Why ``value`` is no text a task may read (str() would train its repr: "nan", "[1, 2]", "{'a': 1}"), or None:
    a list (a JSON array, a Parquet list), an object (a JSON object, a Parquet struct), a NaN or an infinity (JSON's
    NaN/Infinity, a Parquet float), bytes (a Parquet binary column, which older writers and Spark give strings as).
    Validate (``campaign.consistency``) and the tasks share it."""
    if isinstance(value, (list, tuple, dict)):
        return "a list" if isinstance(value, (list, tuple)) else "an object"
    if isinstance(value, float) and not math.isfinite(value):
        return "not a number (NaN)" if math.isnan(value) else "an infinity"
    if isinstance(value, (bytes, bytearray, memoryview)):  # str() trained on "b'Give three tips…'"
        return "binary data (a Parquet binary column: cast it to string, e.g. pyarrow's table.cast)"
    return None


def near_match(path: Path) -> Path | None:
    """The file beside ``path`` whose name is closest to it (``data/trian.jsonl`` → ``data/train.jsonl``), or None."""
    import difflib

    try:
        files = [p for p in path.parent.iterdir() if p.is_file()]
    except OSError:
        return None
    # names compared without the suffix they share (".jsonl" alone makes nope.jsonl "close" to test.jsonl)
    stems = {p.name[:len(p.name) - len(path.suffix)] if path.suffix and p.name.endswith(path.suffix) else p.name: p
             for p in files}
    close = difflib.get_close_matches(path.stem if path.suffix else path.name, list(stems), n=1, cutoff=0.75)
    return path.with_name(stems[close[0]].name) if close else None


def read_records(path: str | Path, key: str | None = None) -> list[Record]:
    """The records of one data file; ``key`` is the campaign key that named it (``data.train``), said in errors."""
    path = Path(path)
    named = f" (named by {key})" if key else ""
    if not path.exists():
        if path.is_symlink():
            raise BadInput(f"a symlink that leads nowhere (a loop, or its target is missing){named}", where=str(path),
                           fix=f"point {key or 'the key'} at the data file itself")
        near = near_match(path)
        if near is not None:
            raise BadInput(f"data file not found{named}; a file of a close name is beside it: {near}", where=str(path),
                           fix=f"set {key or 'the key'} to {near}, if that is the file meant")
        folder = "" if path.parent.is_dir() else f"; its folder {path.parent} does not exist either"
        raise BadInput(f"data file not found{named}{folder}", where=str(path),
                       fix=f"check {key or 'the path'} (relative to the campaign file)")
    if path.is_dir():
        raise _a_folder(path, key)
    special = special_file(path)
    if special:  # reading a FIFO blocks until a writer comes, a device never ends: refused before it is opened
        raise BadInput(f"is {special}, not a regular file{named}", where=str(path),
                       fix="point at a data file on disk (write what the pipe or device gives into a file first)")
    suffix, compressed = data_format(path)
    formats = f"one of {', '.join(FORMATS)} (or .jsonl, .json and .csv compressed: {', '.join(COMPRESSED)})"
    if suffix not in FORMATS or (compressed and suffix in TABLES):
        said = f"'{suffix}{compressed}'" if compressed else f"'{suffix}'"
        raise BadInput(f"unknown data format {said}", where=str(path), fix=f"use {formats}")
    if suffix == ".parquet":
        records = _read_parquet(path)
    elif suffix == ".arrow":
        records = _read_arrow(path)
    else:
        try:
            raw = path.read_bytes()
        except OSError as e:  # no permission, a special file, an I/O error
            raise BadInput(f"cannot read the data file: {e.strerror or e}", where=str(path),
                           fix="check its permissions (`ls -l`): the user running pilotrun must be able to read it"
                           ) from None
        if compressed:
            raw = _decompressed(raw, compressed, path)
        text = utf8_of(raw, path)
        if suffix == ".jsonl":
            records = _read_jsonl(text, path)
        elif suffix == ".json":
            records = _read_json(text, path, key)
        else:
            records = _read_csv(text, path)
    if not records:
        raise BadInput("no records in the file", where=str(path), fix="fill the file or remove the key")
    return records


def _split_fix(folder: Path, key: str | None) -> str:
    """Which of a split's files to name: the one of the key's split (data.validation → validation.jsonl)."""
    part = {"data.validation": "validation", "data.test": "test"}.get(key or "", "train")
    return (f"set {key or 'the key'} to {folder / f'{part}.jsonl'} (and data.validation, data.test to that folder's "
            "validation.jsonl, test.jsonl)")


def _a_folder(path: Path, key: str | None) -> BadInput:
    """A folder named where a data file belongs, with the file to name instead where the folder says it: one that
    ``datasets``' ``save_to_disk`` wrote (its state.json lists its .arrow shards), a DatasetDict (its splits'
    folders), or a folder holding one data file."""
    set_key = f"set {key or 'the key'} to"
    if (path / SPLIT_LEDGER).is_file():
        try:
            ledger = jsonsafe.loads((path / SPLIT_LEDGER).read_bytes())
        except (OSError, ValueError):
            ledger = None
        files = ledger.get("files") if a_split_ledger(ledger) else None
        if isinstance(files, dict) and files:
            return BadInput(f"is a folder that split wrote ({', '.join(map(str, files))}), not a data file",
                            where=str(path), fix=_split_fix(path, key))
    try:
        state = jsonsafe.loads((path / "state.json").read_bytes()) if (path / "state.json").is_file() else None
        splits = (jsonsafe.loads((path / "dataset_dict.json").read_bytes()).get("splits")
                  if (path / "dataset_dict.json").is_file() else None)
        files = sorted(p for p in path.iterdir() if p.is_file() and data_format(p)[0] in FORMATS
                       and p.name not in SAVE_TO_DISK_FILES)
    except (OSError, ValueError, AttributeError):
        state = splits = None
        files = []
    shards = [f.get("filename") for f in state.get("_data_files") or [] if isinstance(f, dict)] \
        if isinstance(state, dict) else []
    if shards:
        what = (f"a data set that datasets' save_to_disk wrote ({len(shards)} .arrow "
                f"shard{'s' if len(shards) > 1 else ''})")
        fix = (f"{set_key} its one shard: {path / shards[0]}" if len(shards) == 1 else
               f"write its records into one file: datasets.load_from_disk({str(path)!r}).to_json('train.jsonl'), "
               f"and {set_key} it")
    elif isinstance(splits, list) and splits:
        what = f"a DatasetDict that datasets' save_to_disk wrote (splits: {', '.join(map(str, splits))})"
        first = _a_folder(path / str(splits[0]), key) if (path / str(splits[0])).is_dir() else None
        fix = f"name one split's data: for {splits[0]}, " + (first.fix if first else
                                                              f"{set_key} {path / str(splits[0])}")
    elif len(files) == 1:
        what, fix = "a folder holding one data file", f"{set_key} {files[0]}"
    else:
        what = "a folder" + (f" holding {len(files)} data files" if files else "")
        fix = f"point at one file: one of {', '.join(FORMATS)}" + (" (concatenate them into one)" if files else "")
    return BadInput(f"is {what}, not a data file", where=str(path), fix=fix)


def _decompressed(raw: bytes, suffix: str, path: Path) -> bytes:
    """The bytes a compressed data file holds, read in pieces so that a decompression bomb (a few KB that expand past
    memory) is refused once it passes both ``_BOMB_FLOOR`` and ``_BOMB_RATIO`` times its own size."""
    import importlib
    import zlib

    module = importlib.import_module(COMPRESSED[suffix])
    damaged = (OSError, EOFError, ValueError, zlib.error, getattr(module, "LZMAError", OSError))
    limit = max(_BOMB_FLOOR, _BOMB_RATIO * len(raw))
    out = bytearray()
    try:
        with module.open(io.BytesIO(raw), "rb") as f:
            while piece := f.read(2**24):
                out += piece
                if len(out) > limit:
                    raise BadInput(f"expands past {limit >> 20} MiB from {len(raw)} bytes, more than {_BOMB_RATIO} "
                                   "times its size: a decompression bomb, not a data file", where=str(path),
                                   fix="decompress it yourself and check what it holds, then name that file")
    except damaged as e:  # each module's own: gzip's BadGzipFile and zlib.error, bz2's OSError, lzma's LZMAError
        raise BadInput(f"cannot decompress it as {COMPRESSED[suffix]} ({e})", where=str(path),
                       fix=f"check the file (e.g. `{_TEST[suffix]} {path.name}`): copy it again, or name it for "
                           "the compression it holds") from None
    return bytes(out)


_TEST = {".gz": "gzip -t", ".bz2": "bzip2 -t", ".xz": "xz -t"}


def key_twice(e: jsonsafe.KeyTwice, where: str) -> BadInput:
    return BadInput(f"key {e.key!r} appears twice in one JSON object; a JSON reader keeps the last, silently",
                    where=where, fix=f"keep one {e.key!r} in that object (or rename the other)")


def lone_surrogate(e: jsonsafe.LoneSurrogate, where: str) -> BadInput:
    return BadInput(f"{e.msg} (column {e.colno})", where=where,
                    fix=f"write the character meant in place of {e.escape} (both halves of a pair, as \\ud83d\\ude00 "
                    "for 😀, or the character itself), or remove it")


def _read_jsonl(text: str, path: Path) -> list[Record]:
    out = []
    # records end at "\n" only: str.splitlines would also split inside a string holding U+2028 or U+0085
    for n, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            obj = jsonsafe.loads(line, object_pairs_hook=jsonsafe.object_once)
        except jsonsafe.LoneSurrogate as e:
            raise lone_surrogate(e, f"{path}:{n}") from None
        except json.JSONDecodeError as e:
            raise BadInput(f"invalid JSON: {e.msg} (column {e.colno})", where=f"{path}:{n}",
                           fix="each line must hold one JSON object") from None
        except jsonsafe.KeyTwice as e:
            raise key_twice(e, f"{path}:{n}") from None
        if not isinstance(obj, dict):
            raise BadInput(f"a JSON {type(obj).__name__}, not an object", where=f"{path}:{n}",
                           fix="each line must hold one JSON object such as {\"prompt\": ..., \"response\": ...}")
        out.append(Record(obj, f"{path}:{n}", len(out)))
    return out


def _read_json(text: str, path: Path, key: str | None = None) -> list[Record]:
    try:
        obj = jsonsafe.loads(text, object_pairs_hook=jsonsafe.object_once)
    except jsonsafe.LoneSurrogate as e:
        raise lone_surrogate(e, f"{path}:{e.lineno}") from None
    except json.JSONDecodeError as e:
        lines = e.msg == "Extra data" and e.colno == 1  # one object per line: JSON Lines under a .json name
        raise BadInput(f"invalid JSON: {e.msg} (column {e.colno})", where=f"{path}:{e.lineno}",
                       fix=f"this reads as JSON Lines (one object per line): name the file {path.stem}.jsonl"
                       if lines else "the file must hold a JSON list of objects") from None
    except jsonsafe.KeyTwice as e:
        raise key_twice(e, str(path)) from None
    if a_split_ledger(obj):
        raise BadInput(f"is the {SPLIT_LEDGER} that split writes beside its files (how they were made), not data",
                       where=str(path), fix=_split_fix(path.parent, key))
    if isinstance(obj, dict):
        obj = _records_of_object(obj, path)
    if not isinstance(obj, list):
        raise BadInput("the JSON file must hold a list of objects", where=str(path),
                       fix="write [{...}, {...}] or use .jsonl with one object per line")
    out = []
    for i, item in enumerate(obj):
        if not isinstance(item, dict):
            raise BadInput(f"item {i} is a JSON {type(item).__name__}, not an object", where=f"{path}[{i}]",
                           fix="every item must be an object of fields")
        out.append(Record(item, f"{path}[{i}]", i))
    return out


def _records_of_object(obj: dict, path: Path):
    """The records a JSON object holds, as Hugging Face datasets' JSON reader takes them: one list of records under one
    key (``{"data": [...]}``), or columns (``{"instruction": [...], "output": [...]}``, what ``json.dump`` of
    ``Dataset.to_dict()`` or ``DataFrame.to_dict(orient="list")`` writes). Refused, naming the shape: pandas'
    ``to_json()`` by default (a column of ``{"0": …}`` per field), and several lists of records (``{"train": [...],
    "test": [...]}``), of which a campaign's file is one. Anything else is left to the caller's message."""
    values = list(obj.values())
    rows = [v for v in values if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
    if len(obj) == 1 and isinstance(values[0], list) and (rows or not values[0]):
        return values[0]
    if len(rows) > 1:
        keys = [k for k, v in obj.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)]
        raise BadInput(f"the JSON object holds {len(rows)} lists of records ({', '.join(map(repr, keys[:4]))}): a "
                       "campaign reads one list a file", where=str(path),
                       fix="write each list to a file of its own (a split each: data.train, data.validation …)")
    if values and all(isinstance(v, list) for v in values) and not rows:
        lengths = {len(v) for v in values}
        if len(lengths) == 1 and 0 not in lengths:
            n = lengths.pop()
            return [{k: v[i] for k, v in obj.items()} for i in range(n)]
        common = max(lengths, key=lambda n: sum(len(v) == n for v in values))
        odd = [f"{k}: {len(v)}" for k, v in obj.items() if len(v) != common]
        raise BadInput(f"the JSON object holds columns of different lengths ({', '.join(odd[:4])}; the others: "
                       f"{common})", where=str(path), fix="give every column one value a record")
    if values and all(isinstance(v, dict) for v in values) and len({tuple(v) for v in values}) == 1:
        raise BadInput("the JSON object holds a column of {index: value} per field, as pandas' to_json() writes "
                       "by default", where=str(path),
                       fix=f"write the records one a line: df.to_json('{path.stem}.jsonl', orient='records', "
                           "lines=True)")
    return obj


def _read_csv(text: str, path: Path) -> list[Record]:
    csv.field_size_limit(_CSV_FIELD_LIMIT)  # the default (128 KiB) refuses long documents
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        return []
    except csv.Error as e:
        raise BadInput(f"invalid CSV: {e}", where=f"{path}:1", fix="write the header as comma-separated names") from None
    _columns_once(header, f"{path}:1")
    _commas(header, path)
    out = []
    rows = iter(reader)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as e:
            raise BadInput(f"invalid CSV: {e}", where=f"{path}:{reader.line_num}",
                           fix="quote fields that hold commas, quotes or line breaks") from None
        line = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) != len(header):
            raise BadInput(f"{len(row)} columns where the header has {len(header)} ({', '.join(header)})",
                           where=f"{path}:{line}", fix="quote fields that contain commas; give every row each column")
        out.append(Record(dict(zip(header, row)), f"{path}:{line}", len(out)))
    return out


_OTHER_SEPARATORS = {";": "semicolons (as Excel writes CSV where the decimal mark is a comma)", "\t": "tabs",
                     "|": "vertical bars"}


def _commas(header: list[str], path: Path) -> None:
    """A header read as one column that holds another separator: the file is separated by it, not by commas. Read on,
    each record was one field named 'instruction;output', and the message was that no record has 'output'."""
    if len(header) != 1:
        return
    found = [s for s in _OTHER_SEPARATORS if s in header[0]]
    if found:
        sep = max(found, key=header[0].count)
        raise BadInput(f"the header is one column, {header[0]!r}: the file is separated by {_OTHER_SEPARATORS[sep]}, "
                       "and a CSV file here is separated by commas", where=f"{path}:1",
                       fix="save it with commas between fields (pandas: pd.read_csv(f, sep=" + repr(sep) + ")"
                       ".to_csv(f, index=False)), or as .jsonl")


def _columns_once(names: list[str], where: str) -> None:
    """Each CSV column named once: a record keeps the last of two columns of one name, silently (pyarrow refuses
    such a Parquet file itself)."""
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        said = ", ".join(f"{n!r} (columns {', '.join(str(i + 1) for i, m in enumerate(names) if m == n)})"
                         for n in twice)
        raise BadInput(f"the header names {said} more than once; a record would keep only the last", where=where,
                       fix="rename or remove the repeated columns")


def _read_parquet(path: Path) -> list[Record]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise BadInput(f"cannot read parquet: {e}", where=str(path), fix="rewrite the file with pyarrow or pandas") from None
    return _table_records(table, path)


def _read_arrow(path: Path) -> list[Record]:
    """An Arrow IPC file: the stream format (``datasets``' shards and cache files) or the file format (pyarrow's
    ``ipc.new_file``, Feather v2), told by the file format's magic bytes."""
    import pyarrow as pa

    try:
        with pa.memory_map(str(path)) as source:
            magic = source.read(6)
            source.seek(0)
            reader = pa.ipc.open_file(source) if magic == b"ARROW1" else pa.ipc.open_stream(source)
            table = reader.read_all()
    except Exception as e:  # pyarrow raises several types for a damaged file
        raise BadInput(f"cannot read it as an Arrow IPC file: {e}", where=str(path),
                       fix="write it again (datasets' save_to_disk, or pyarrow.ipc), or export the records as .jsonl"
                       ) from None
    return _table_records(table, path)


def _table_records(table, path: Path) -> list[Record]:
    try:
        rows = table.to_pylist()
    except UnicodeDecodeError as e:  # pyarrow reads a string column's bytes unchecked and decodes them here
        raise _not_utf8(table, path, e) from None
    return [Record(row, f"{path}[{i}]", i) for i, row in enumerate(rows)]


def _not_utf8(table, path: Path, e: UnicodeDecodeError) -> BadInput:
    """Bad input naming the first column and row of ``table`` whose text is not UTF-8 (searched only once decoding
    the whole table failed, cell by cell in the column that fails)."""
    byte = f"byte 0x{e.object[e.start]:02x}" if e.start < len(e.object) else "a cut sequence"
    for name in table.column_names:
        row = 0
        for chunk in table.column(name).chunks:
            try:
                chunk.to_pylist()
            except UnicodeDecodeError:
                bad = next((i for i in range(len(chunk)) if _undecodable(chunk[i])), 0)
                return BadInput(f"column {name!r}, row {row + bad}: a string column holding text that is not UTF-8 "
                                f"({byte}): the writer stored bytes of another encoding (Latin-1, UTF-16) as strings",
                                where=f"{path}[{row + bad}]",
                                fix=f"write {name!r} again as UTF-8 text: its values read as bytes (pyarrow: "
                                f"table.column({name!r}).cast(pa.binary())), decoded from their real encoding")
            row += len(chunk)
    return BadInput(f"text that is not UTF-8 ({byte}) in a string column", where=str(path),
                    fix="rewrite the file's string columns as UTF-8 text")


def _undecodable(cell) -> bool:
    try:
        cell.as_py()
    except UnicodeDecodeError:
        return True
    return False


