"""What the callbacks for other training loops share: the journal run, the one open phase, the metrics.

A callback translates its framework's events into ``start``/``end`` of the phases ``load``,
``first_step``, ``steady_step``, ``evaluation`` and ``save``; this module writes the rows (one per
phase per rank, through ``probe.recorder.Phase``), the loss curve, and the run's final status.
A non-finite training loss (or gradient norm, or validation loss) makes the run "diverged" with the
step named (and, where the callback still has that step's phase open, that row's verdict "nan"), as
the pilotrun loop does.
"""

from __future__ import annotations

import math

from pilotrun.journal.runs import create_run, end_run, phase_summary, user_command
from pilotrun.journal.store import Journal, resolve_home
from pilotrun.phases import names
from pilotrun.probe.recorder import Phase

STEP_NAMES = FIRST_STEP, STEADY_STEP = names("train")  # the first and second optimizer steps, as the pilot names them


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Recorder:
    """The journal run and the open phase of one process (one rank)."""

    def __init__(self, home, *, kind: str, name: str, memory_limit: int | None = None):
        self.journal = Journal(resolve_home(home))  # None: $PILOTRUN_HOME, else ./.pilotrun
        self.kind, self.name, self.memory_limit = kind, name, memory_limit
        self.run_id: str | None = None
        self.open: Phase | None = None
        self.steps_seen = 0  # optimizer steps measured (first_step, steady_step)
        self.diverged: str | None = None  # the reason, at the first non-finite training loss
        self.ended = False  # finish or fail ran: the run has its final status (on rank 0)
        self.uncaught: BaseException | None = None  # what escaped the process, seen by end_run_at_exit

    # --- the run ------------------------------------------------------------------------------------
    def create_run(self, config: dict, *, seed: int | None, is_rank0: bool, broadcast) -> str | None:
        """Rank 0 creates the run; ``broadcast(obj)`` hands its id to every rank (identity on one process)."""
        run_id = None
        if is_rank0:
            run_id = create_run(self.journal, kind=self.kind, name=self.name, config=config, seed=seed,
                                command=user_command())
        self.run_id = broadcast(run_id)
        return self.run_id

    def finish(self, *, updates: int, is_rank0: bool, barrier=None) -> None:
        """Close the open phase; rank 0 finishes the run once every rank has written its rows."""
        self.end()
        if barrier is not None:
            barrier()
        if not (self.run_id and is_rank0):
            return

        summary = {"updates": updates, **phase_summary(self.journal, self.run_id)}
        if self.diverged:
            summary["reason"] = self.diverged
        self.journal.finish_run(self.run_id, "diverged" if self.diverged else "completed", summary)
        self.ended = True

    def fail(self, exc: BaseException, *, is_rank0: bool) -> None:
        """The framework's loop raised: the open phase gets verdict error (or oom), rank 0 ends the run."""
        if self.open is not None:
            phase, self.open = self.open, None
            self._attach(phase)
            phase.barrier = False  # the other ranks may not come to this boundary
            phase.__exit__(type(exc), exc, exc.__traceback__)
        if self.run_id and is_rank0 and not self.ended:
            end_run(self.journal, self.run_id, exc)
            self.ended = True

    def end_run_at_exit(self, *, is_rank0: bool) -> None:
        """For loops that give callbacks no exception hook (the HF Trainer): when the process exits with
        the run still open, an exception escaped the loop, and rank 0 ends the run "failed" naming it
        (the uncaught exception, through a chained ``sys.excepthook``), instead of leaving it "running"."""
        import atexit
        import sys

        if not is_rank0:
            return
        previous = sys.excepthook

        def seen(kind, exc, tb):
            self.uncaught = exc
            previous(kind, exc, tb)

        sys.excepthook = seen

        def at_exit():
            if self.ended or not self.run_id:
                return
            import sqlite3

            try:
                self.fail(self.uncaught or RuntimeError("the process ended before the training loop finished"),
                          is_rank0=True)
            except (OSError, sqlite3.Error):  # the journal's folder is gone: nothing left to record into
                pass

        atexit.register(at_exit)

    # --- phases -------------------------------------------------------------------------------------
    def is_open(self, *names: str) -> bool:
        return self.open is not None and (not names or self.open.name in names)

    def start(self, name: str, inputs: dict | None = None, *, rank: int, device=None) -> None:
        self.end()
        self.open = Phase(name, inputs, rank=rank, device=device, memory_limit=self.memory_limit,
                          journal=self.journal if self.run_id else None, run_id=self.run_id).__enter__()

    def end(self, name: str | None = None) -> None:
        if self.open is not None and (name is None or self.open.name == name):
            phase, self.open = self.open, None
            self._attach(phase)
            phase.__exit__(None, None, None)
            if phase.name in STEP_NAMES:
                self.steps_seen += 1

    def _attach(self, phase: Phase) -> None:
        if phase.run_id is None and self.run_id is not None:  # load began before the run existed
            phase.journal, phase.run_id = self.journal, self.run_id

    # --- metrics ------------------------------------------------------------------------------------
    def check_finite(self, value: float, step: int, what: str = "training loss") -> bool:
        """A non-finite loss (or gradient norm): the run diverged at ``step``; an open step phase gets
        verdict nan. Returns whether ``value`` is finite."""
        if math.isfinite(value):
            return True
        message = f"{what} is {value} at step {step}"
        if self.diverged is None:
            self.diverged = message
        if self.is_open(*STEP_NAMES):
            self.open.nan(message)
        return False

    def log(self, split: str, step: int, values: dict, *, is_rank0: bool) -> None:
        rows = [(split, k, int(step), float(v), None, None) for k, v in values.items() if is_number(v)]
        if rows and self.run_id and is_rank0:
            self.journal.add_metrics(self.run_id, rows)

    def progress(self, updates: int, examples: int, *, is_rank0: bool) -> None:
        if self.run_id and is_rank0:
            self.journal.update_progress(self.run_id, updates_done=updates, examples_seen=examples)
