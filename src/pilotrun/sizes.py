"""Memory sizes as users write them ("24GiB", "512MiB", "1.5GB") and as the tables print them."""

from __future__ import annotations

import re

from pilotrun.errors import BadInput

_UNITS = {"": 1, "b": 1,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
          # bare K/M/G/T follow the binary convention of nvidia-smi and torch
          "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text, where: str = "--memory-limit") -> int:
    """Bytes from "24GiB" (binary), "1.5GB" (decimal), "512MiB", "80G" or a plain number of bytes (at least
    ``BARE_MIN``: ``80`` is a unit left out, refused rather than planned for as 80 bytes; ``80B`` says bytes)."""
    if isinstance(text, bool):
        raise BadInput(f"not a size: {text!r}", where=where, fix="write it like 24GiB, 512MiB or 1.5GB")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        m = _SIZE.match(str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise BadInput(f"not a size: {text!r}", where=where,
                           fix="write it like 24GiB, 512MiB or 1.5GB (KiB/MiB/GiB are 1024-based, KB/MB/GB 1000-based)")
        value, unit = float(m.group(1)), m.group(2).lower()
    n = int(value * _UNITS[unit])
    if n <= 0:
        raise BadInput(f"a memory size must be positive, got {text!r}", where=where, fix="e.g. 24GiB")
    if unit == "" and n < BARE_MIN:
        shown = str(int(value)) if value.is_integer() else str(value)
        raise BadInput(f"{text!r} has no unit, so it reads as {n} bytes (a number alone is bytes), less than any GPU "
                       "holds", where=where, fix=f"write the unit: {shown}GiB (or {shown}GB)")
    return n


BARE_MIN = 2**20
"""The least size written without a unit (a number of bytes): one below 1 MiB is a unit left out, not a GPU."""


def fmt_bytes(n: int | None) -> str:
    """"1.50 GiB", "312.4 MiB", "900 KiB"; "" for a counter that does not exist (RSS has no reserved)."""
    if n is None:
        return ""
    sign, n = ("-" if n < 0 else ""), abs(n)
    if n >= 2**30:
        return f"{sign}{n / 2**30:.2f} GiB"
    if n >= 2**20:
        return f"{sign}{n / 2**20:.1f} MiB"
    return f"{sign}{n / 2**10:.0f} KiB"
