"""Reading JSON that pilotrun did not just write (data files, a model folder's config.json, a target env, a
journal's files) without an internal error on a document nested past the interpreter's recursion limit, or on a
string no UTF-8 text can hold.

Python's ``json`` raises ``RecursionError`` for ``[[[[...]]]]`` about a thousand deep, which no reader expects: it
was exit 3 on a data line of 200,000 brackets. It also reads ``"\\ud800"``, half of a UTF-16 surrogate pair with no
other half, as a string no tokenizer, SQLite or file can encode: a record holding one was exit 3 in ``inspect``.
``loads`` raises the ``json.JSONDecodeError`` every reader already turns into bad input naming its file and line.
"""

from __future__ import annotations

import json
import re
from typing import Any

# a \u escape of a surrogate (U+D800..U+DFFF) with the backslashes before it: an odd run is an escape
_SURROGATE_ESCAPE = re.compile(r"(\\+)u([dD][89a-fA-F][0-9a-fA-F]{2})")
_SURROGATE_ESCAPE_BYTES = re.compile(_SURROGATE_ESCAPE.pattern.encode())


class LoneSurrogate(json.JSONDecodeError):
    """A ``\\uD800``..``\\uDFFF`` escape that is not one half of a pair (``escape``: as written)."""

    def __init__(self, escape: str, doc: str, pos: int):
        super().__init__(f"{escape} is half of a UTF-16 surrogate pair, without its other half (text cut inside "
                         "an emoji, or a writer that escaped UTF-16 units one by one); no UTF-8 text holds it",
                         doc, pos)
        self.escape = escape


def loads(text: str | bytes, **kwargs) -> Any:
    """``json.loads`` (``kwargs`` passed on); a document nested too deep is a ``json.JSONDecodeError`` (a
    ``ValueError``), located at the first bracket past the depth the reader managed."""
    try:
        out = json.loads(text, **kwargs)
    except RecursionError:
        doc = text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")
        raise json.JSONDecodeError("nested deeper than the JSON reader goes (arrays or objects about a thousand "
                                   "levels deep)", doc, _too_deep(doc)) from None
    marks = _MARKS if isinstance(text, str) else _BYTE_MARKS
    if marks[0] in text or marks[1] in text:  # two substring searches: most documents hold no surrogate escape
        _no_lone_surrogate(text)
    return out


_MARKS, _BYTE_MARKS = ("\\ud", "\\uD"), (b"\\ud", b"\\uD")


def _no_lone_surrogate(text: str | bytes) -> None:
    """Raise ``LoneSurrogate`` at the first surrogate escape of ``text`` (valid JSON) that no partner completes: a
    high half (``\\uD800``..``\\uDBFF``) not followed at once by a low one, or a low half not preceded by a high."""
    found = (_SURROGATE_ESCAPE if isinstance(text, str) else _SURROGATE_ESCAPE_BYTES).finditer(text)
    pending = None  # a high half's match, waiting for its low half
    for m in found:
        if len(m.group(1)) % 2 == 0:  # "\\\\ud800": an escaped backslash, then the letters ud800
            continue
        low = int(m.group(2), 16) >= 0xDC00
        if pending is not None and low and m.start() + len(m.group(1)) - 1 == pending.end():
            pending = None  # the pair is one character
            continue
        if pending is not None or low:
            _lone(pending or m, text)
        pending = m
    if pending is not None:
        _lone(pending, text)


def _lone(m: re.Match, text: str | bytes):
    start = m.start() + len(m.group(1)) - 1  # the escape's own backslash
    doc = text if isinstance(text, str) else bytes(text).decode("utf-8", "replace")
    pos = start if isinstance(text, str) else len(bytes(text)[:start].decode("utf-8", "replace"))
    escape = m.group(0)[len(m.group(1)) - 1:]
    raise LoneSurrogate(escape if isinstance(escape, str) else escape.decode("ascii"), doc, pos)


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
