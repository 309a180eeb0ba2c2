"""The two kinds of failure a user sees, and the exit codes they map to (SPEC.md).

A check that gives a failing verdict is not an exception: stages return verdicts as data.
"""

from __future__ import annotations

import errno
import re
from pathlib import Path

from pilotrun.console.safe import escape_controls

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3


class BadInput(Exception):
    """The user's input is wrong: the message names the file, line or key and the fix (exit 2)."""

    said = "bad input"  # how a stage it ends says it (console/progress.stopped_by)

    def __init__(self, message: str, *, where: str | None = None, fix: str | None = None):
        where, message, fix = (escape_controls(t) if isinstance(t, str) else t for t in (where, message, fix))
        self.where = where
        self.fix = fix
        self.detail = message
        text = f"{where}: {message}" if where else message
        if fix:
            text = f"{text}\n  fix: {fix}"
        super().__init__(text)


class BadInputs(BadInput):
    """Several problems found at once, reported together."""

    def __init__(self, problems: list[BadInput]):
        self.problems = problems
        Exception.__init__(self, "\n".join(str(p) for p in problems))
        self.where = None
        self.fix = None
        self.detail = str(self)


class DiskFull(BadInput):
    """No space left while writing: exit 2 like bad input (the fix is the user's), and a run it cuts short
    ends "interrupted", not "failed"."""

    said = "disk full"

    def __init__(self, path, *, fix: str | None = None):
        self.path = str(path)
        super().__init__(f"no space left on device while writing {path}", where=str(path),
                         fix=fix or "free space on that disk (or pass --home on another), then run the verb again")


_OS_REASONS = {
    errno.ENAMETOOLONG: ("a name in the path is longer than the file system allows (255 bytes per name, 4096 for the "
                         "whole path)", "use a shorter path (--home, --out, or the folder's or file's name)"),
    errno.EROFS: ("is on a read-only file system", "write it on a writable disk (--out, or --home)"),
    errno.EACCES: ("permission denied", "fix the permissions of the folder (`ls -ld`), or write elsewhere (--out, "
                                        "or --home)"),
    errno.EPERM: ("operation not permitted", "fix the permissions of the folder (`ls -ld`), or write elsewhere"),
    errno.ELOOP: ("a symlink in the path loops", "point the path at the real folder or file"),
    errno.ENOTDIR: ("a part of the path is a file, not a folder", "point the path below a folder"),
}


def from_os_error(exc: BaseException, path=None) -> BadInput | None:
    """The one mapping of the operating system's refusals to bad input (exit 2, naming the file and the fix): no
    space (ENOSPC, EDQUOT: :class:`DiskFull`), a name too long, a read-only file system, no permission, a symlink
    loop, a file where a folder must be. ``exc`` or an error it was raised from or during; ``path`` names what was
    being written when the error names nothing. None for anything else (a bug is exit 3)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            where = exc.filename if exc.filename is not None else path
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                return DiskFull(where if where is not None else "(the disk being written)")
            if exc.errno in _OS_REASONS:
                reason, fix = _OS_REASONS[exc.errno]
                return BadInput(f"cannot be written or opened: {reason} ({exc.strerror})",
                                where=str(where) if where is not None else None, fix=fix)
            return None
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def not_utf8(text: str) -> str | None:
    """What in ``text`` no UTF-8 text holds, or None: "byte 0xe9" for a byte that did not decode (Python carries a
    command-line argument, a file name or an environment variable in another encoding, such as Latin-1, as the lone
    surrogate U+DC80..U+DCFF), "\\ud800" for another lone surrogate. SQLite, JSON files and tokenizers refuse
    such text: a campaign under a Latin-1 folder name trained for 5 s, then was exit 3 recording its run."""
    m = _SURROGATE.search(text)
    if m is None:
        return None
    o = ord(m.group())
    return f"byte 0x{o - 0xDC00:02x}" if 0xDC80 <= o <= 0xDCFF else f"\\u{o:04x}"


_SURROGATE = re.compile("[\ud800-\udfff]")

_UTF16_MARKS = (b"\xff\xfe", b"\xfe\xff")  # the byte-order marks of UTF-16 (and UTF-32 little-endian)


def utf8_of(raw: bytes, path) -> str:
    """A file's bytes as text: UTF-8, a leading byte-order mark dropped (Excel's "CSV UTF-8", Notepad, PowerShell's
    ``Out-File -Encoding utf8``: no part of the first field or key). Else bad input at the line of the first byte
    that is not, naming it: a UTF-16 file (PowerShell's ``>``, Notepad's "Unicode") said as such, where a Latin-1
    fix would garble it."""
    try:
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as e:
        name = Path(str(path)).name
        if raw.startswith(_UTF16_MARKS):
            raise BadInput(f"the file is UTF-16 (it starts with the byte-order mark 0x{raw[0]:02x} 0x{raw[1]:02x}, as "
                           "PowerShell's > and Notepad's \"Unicode\" write it), not UTF-8", where=f"{path}:1",
                           fix=f"convert it: iconv -f UTF-16 -t UTF-8 {name} > utf8-{name}, and use that file "
                           "(or save it as UTF-8)") from None
        line = raw[: e.start].count(b"\n") + 1
        column = e.start - raw.rfind(b"\n", 0, e.start)
        raise BadInput(f"byte 0x{raw[e.start]:02x} (line {line}, column {column}) is not UTF-8", where=f"{path}:{line}",
                       fix="save the file as UTF-8 (one in Latin-1: iconv -f latin1 -t utf-8)") from None


def utf8_path(path, where: str | None = None) -> None:
    """Bad input where the path ``path`` (as resolved) is not UTF-8 text (``not_utf8``)."""
    bad = not_utf8(str(path))
    if bad:
        raise BadInput(f"the path holds {bad}, which is not UTF-8: pilotrun writes its paths into the journal, JSON "
                       "and reports as UTF-8 text", where=where or str(path),
                       fix="rename the file or folder with a UTF-8 name (e.g. `convmv -f latin1 -t utf-8 --notest "
                       "NAME`), or work from a folder whose path is UTF-8")


_COMMA_NUMBER = re.compile(r"\s*-?\d+,\d+([eE][-+]?\d+)?\s*")


def comma_number_fix(value, whole: bool) -> str | None:
    """The fix for a number written with a comma (``0,001``, ``2,49``; ``1,000`` where a whole number belongs), which
    YAML and JSON read as text: the same number as they read it. None for any other value."""
    if not isinstance(value, str) or not _COMMA_NUMBER.fullmatch(value):
        return None
    text = value.strip()
    if whole:
        return f"write {text.replace(',', '')} (no thousands separator: YAML reads {text} as text)"
    return f"write {text.replace(',', '.')} (a decimal point: YAML reads {text} as text)"


NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
"""A number as text: ``2``, ``2.49``, ``.5``, ``1e-4`` (what a reader of YAML 1.1's leftover text takes as one)."""
EXPONENT_NUMBER = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)[eE][+-]?\d+\s*")
EXPONENT_FIX = "check the exponent: write the number you mean (e.g. 1e-4, not 1e-400)"


def beyond_a_float(text: str) -> str | None:
    """What is wrong with a number written with an exponent past what a float holds, which every reader (YAML, JSON,
    pydantic) takes without a word: ``1e-400`` reads as 0 (``lr: 1e-400`` would train nothing), ``1e400`` as
    infinity. None for any other text."""
    if len(text) > 400 or not EXPONENT_NUMBER.fullmatch(text):
        return None
    import decimal
    import math

    d = decimal.Decimal(text.strip())
    f = float(d)
    if not math.isfinite(f):
        return f"{text.strip()} is larger than any number a float holds (about 1.8e308): it would read as infinity"
    if f == 0 and d != 0:
        return f"{text.strip()} is smaller than any number a float holds (about 5e-324): it would read as 0"
    return None


_PACKAGE = Path(__file__).resolve().parent


def raised_by_pilotrun(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by pilotrun's own code (the innermost frame of its traceback is in this package):
    a bug to report as one (exit 3), not a refusal by a library or server pilotrun called, whose own code raised
    it. pilotrun's deliberate refusals are :class:`BadInput` and are not asked about."""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    try:
        return Path(tb.tb_frame.f_code.co_filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):
        return False
