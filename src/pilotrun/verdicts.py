"""Ground floor: a stage's result — a verdict, messages a user can act on, data for --json, an optional table."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pilotrun.errors import EXIT_CHECK_FAILED, EXIT_OK

Verdict = Literal["ok", "warn", "fail"]
FEW = 3  # record ids a check's message quotes
_ORDER = {"ok": 0, "warn": 1, "fail": 2}


@dataclass
class StageResult:
    stage: str
    verdict: Verdict
    summary: str
    messages: list[str] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None  # the stage's wall time, where a caller timed it (``all``)
    spent: dict[str, float] | None = None  # where ``seconds`` went (``all``: console/progress.SPENT's accounts)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Check:
    """One data check's verdict: what ``validate``, ``inspect`` and ``leakage`` report line by line."""

    name: str
    verdict: str  # ok | warn | fail
    message: str
    split: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def line(self) -> str:
        where = f" [{self.split}]" if self.split else ""
        return f"{self.verdict.upper()} {self.name}{where}: {self.message}"


def headline(message: str) -> str:
    """A message's first clause, for a summary: the text before its first ``": "`` (a colon and a space), so
    the colon of ``file.jsonl:3``, ``12:30`` or ``module:Class`` never cuts it."""
    return message.split(": ", 1)[0].strip() or message


def plural(n: int, noun: str, many: str | None = None) -> str:
    """``1 example``, ``2 examples`` (``many``: an irregular plural)."""
    return f"{n} {noun if n == 1 else (many or noun + 's')}"


def worst(verdicts) -> Verdict:
    return max(verdicts, key=_ORDER.__getitem__, default="ok")


def exit_code(results: list[StageResult]) -> int:
    """The one place verdicts become exit codes: any failing verdict exits 1."""
    return EXIT_CHECK_FAILED if any(r.verdict == "fail" for r in results) else EXIT_OK
