"""Records in chunks, for checks that must not hold a whole large file as Python objects.

.jsonl streams line by line; the other formats are read whole by ``read_records`` and handed out
in slices. Any problem in a line is reported by ``read_records`` itself, so the messages (file, line,
fix) are the reader's own.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun import jsonsafe
from pilotrun.records.readers import Record, key_twice, read_records
from pilotrun.errors import BadInput

CHUNK = 8192


def iter_chunks(path: str | Path, size: int = CHUNK):
    """Lists of at most ``size`` records, in file order, with the same ``where`` as ``read_records``."""
    path = Path(path)
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        records = read_records(path)
        for i in range(0, len(records), size):
            yield records[i:i + size]
        return
    out, index = [], 0
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            if n == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark, as read_records drops it
            if not raw.strip():
                continue
            try:
                obj = jsonsafe.loads(raw, object_pairs_hook=jsonsafe.object_once)
            except ValueError:
                obj = None
            except jsonsafe.KeyTwice as e:
                raise key_twice(e, f"{path}:{n}") from None
            if not isinstance(obj, dict):
                read_records(path)  # raises the located error
                raise BadInput("a line is not a JSON object", where=f"{path}:{n}", fix="one JSON object per line")
            out.append(Record(obj, f"{path}:{n}", index))
            index += 1
            if len(out) == size:
                yield out
                out = []
    if out:
        yield out
    elif index == 0:
        read_records(path)  # "no records in the file"
