"""Each rehearsal stage as a function returning a StageResult (verdicts are data, not prints)."""

from pilotrun.stages.result import StageResult, exit_code

__all__ = ["StageResult", "exit_code"]
