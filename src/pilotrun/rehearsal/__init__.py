"""Each rehearsal stage as a function returning a StageResult (verdicts are data, not prints)."""

from pilotrun.verdicts import StageResult, exit_code

__all__ = ["StageResult", "exit_code"]
