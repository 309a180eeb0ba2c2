"""Reading W&B's offline run files (``run-ID.wandb``) back, for the tests.

wandb 0.30/0.31 ship no Python reader for these files any more (the DataStore and ``wandb sync --view`` are
gone; ``wandb leet`` reads them in a terminal). The records are W&B's own protobuf ``Record`` messages
(``wandb.proto.wandb_internal_pb2``), framed as a LevelDB log: a 7-byte W&B header, then 32 KiB blocks of
chunks, each a 7-byte header (crc32c, little-endian length, type: full, first, middle, last) and its bytes.
"""

from __future__ import annotations

import struct
from collections import defaultdict
from pathlib import Path

BLOCK, HEADER = 32 * 1024, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def read_records(path: Path) -> dict[str, list]:
    """Every record of the file, by its kind (run, history, summary, exit, config, ...), in file order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out: dict[str, list] = defaultdict(list)
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        pos += HEADER
        if kind == 0 and n == 0:  # zero padding to the block's end
            pos += left - HEADER
            continue
        assert kind in (FULL, FIRST, MIDDLE, LAST), f"{path}: chunk type {kind} at byte {pos - HEADER}"
        pending += data[pos:pos + n]
        pos += n
        if kind in (FULL, LAST):
            rec = pb.Record.FromString(pending)
            out[rec.WhichOneof("record_type")].append(getattr(rec, rec.WhichOneof("record_type")))
            pending = b""
    return out
