"""Reading JSON that pilotrun did not just write (data files, a model folder's config.json, a target env, a
journal's files) without an internal error on a document nested past the interpreter's recursion limit.

Python's ``json`` raises ``RecursionError`` for ``[[[[...]]]]`` about a thousand deep, which no reader expects: it
was exit 3 on a data line of 200,000 brackets. ``loads`` raises the ``json.JSONDecodeError`` every reader already
turns into bad input naming its file and line.
"""

from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes, **kwargs) -> Any:
    """``json.loads`` (``kwargs`` passed on); a document nested too deep is a ``json.JSONDecodeError`` (a
    ``ValueError``), located at the first bracket past the depth the reader managed."""
    try:
        return json.loads(text, **kwargs)
    except RecursionError:
        doc = text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")
        raise json.JSONDecodeError("nested deeper than the JSON reader goes (arrays or objects about a thousand "
                                   "levels deep)", doc, _too_deep(doc)) from None


def _too_deep(doc: str, limit: int = 1000) -> int:
    """The offset of the first ``[`` or ``{`` at depth ``limit`` (strings skipped), else 0."""
    depth, in_string, escaped = 0, False, False
    for i, ch in enumerate(doc):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth >= limit:
                return i
        elif ch in "]}":
            depth -= 1
    return 0


class KeyTwice(Exception):
    """A key written twice in one JSON object (``key``): ``json`` keeps the last, silently."""

    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def object_once(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An ``object_pairs_hook``: the object's pairs as a dict, each key once, else ``KeyTwice`` (a data record
    ``{"output": "good", "output": "bad"}`` trained on "bad" without a word)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise KeyTwice(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out
