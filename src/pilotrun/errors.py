"""The two kinds of failure a user sees, and the exit codes they map to (SPEC.md).

A check that gives a failing verdict is not an exception: stages return verdicts as data.
"""

from __future__ import annotations

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
