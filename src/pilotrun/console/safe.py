"""Text that users or files supply (notes, run names, labels, record excerpts, values in error messages),
made safe to print: control characters are shown escaped, so a note cannot retitle, clear or rewrite the
terminal it is printed in. Line breaks and tabs stay; everything else below U+0020, DEL, the C1 controls,
the bidirectional overrides that reorder what is shown, and lone surrogates (a byte of a file name or argument that is
not UTF-8; no terminal can encode one) are written as \\xNN or \\uNNNN.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escaped(m: re.Match) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def escape_controls(text: str) -> str:
    return _CONTROL.sub(_escaped, text) if _CONTROL.search(text) else text


def safe(obj: Any) -> Any:
    """``obj`` with every string in it (keys too) passed through escape_controls; a dataclass is copied."""
    if isinstance(obj, str):
        return escape_controls(obj)
    if isinstance(obj, dict):
        return {safe(k): safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(safe(v) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.replace(obj, **{f.name: safe(getattr(obj, f.name)) for f in dataclasses.fields(obj)
                                           if f.init})
    return obj
