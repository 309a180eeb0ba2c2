"""The phase recorder: one ledger row per phase per rank, for the pilot and for users' own loops.

    with pilotrun.phase("eval_longest", inputs={"seq_len": 1024, "eval_batch": 8},
                        journal=home, run_id=run_id) as p:
        loss = evaluate(...)
        p.check_finite(loss)            # or p.nan("why") — the row's verdict becomes "nan"

The block's duration and memory (see ``probe.memory``) become a row with a verdict:
ok | over-budget (peak above ``memory_limit``) | oom (an out-of-memory error, caught: the program
goes on) | nan (signalled in the block, or ``NonFinite`` raised) | error (any other exception; the
row is written, then the exception propagates unless ``catch_errors=True``; ``BadInput`` always does: exit 2).
A signal is no verdict: a block ended by one (``signals.Preempted``, Ctrl-C, an error that follows a signal)
writes no row and always propagates, so an interrupted phase is never read as a measurement (an "error", a
"does not fit").
Under torch.distributed every rank reads its counters after a barrier at the same boundaries.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from pathlib import Path

from pilotrun.engine.distributed import world_rank
from pilotrun.engine.oom import is_oom
from pilotrun.errors import BadInput
from pilotrun.journal.runs import create_run, end_run, user_command
from pilotrun.journal.store import Journal, resolve_home
from pilotrun.probe.memory import make_probe
from pilotrun.sizes import fmt_bytes
from pilotrun.signals import interruption

VERDICTS = ("ok", "over-budget", "oom", "nan", "error")
ROW_KEYS = ("phase", "rank", "device", "counter", "inputs", "baseline", "peak_allocated", "peak_reserved",
            "end_allocated", "end_reserved", "duration_s", "verdict", "note")


class NonFinite(Exception):
    """Raise inside a phase to end it with verdict "nan"."""


def peak_of(row: dict) -> int | None:
    """The device's figure, the one a memory limit (a GPU's memory) is checked against: on CUDA the reserved peak
    (what the card holds for the process, which a new allocation must fit beside); on CPU with the exact counter
    the live tensors' peak (CUDA's allocated semantics) — the process RSS beside it is this host's memory (the
    interpreter, the libraries), never judged as a GPU's; RSS only where it is the one counter (``rss``)."""
    if row.get("counter") == "tensors+rss" and row.get("peak_allocated") is not None:
        return row["peak_allocated"]
    vals = [v for v in (row.get("peak_allocated"), row.get("peak_reserved")) if v is not None]
    return max(vals) if vals else None


def host_peak(row: dict) -> int | None:
    """The process RSS peak of a CPU row (the host's memory), None on a GPU."""
    counter = row.get("counter")
    return row.get("peak_reserved") if counter == "tensors+rss" else row.get("peak_allocated") if counter == "rss" \
        else None


FIGURE = {"tensors+rss": "live tensors", "cuda": "CUDA reserved", "rss": "host RSS", "mps": "MPS allocated"}


def figure(row: dict) -> str:
    """What ``peak_of`` of this row is, in words (the over-budget note, the pilot's summary, the report)."""
    return FIGURE.get(row.get("counter"), row.get("counter") or "peak")


def describe_inputs(inputs: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in inputs.items())


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _journal(journal):
    if journal is None or hasattr(journal, "add_phase_rows"):
        return journal

    return Journal(Path(journal))


class Phase:
    """The handle ``phase()`` yields; after the block, ``.row`` holds the ledger row."""

    def __init__(self, name: str, inputs: dict | None = None, *, journal=None, run_id: str | None = None,
                 rank: int | None = None, rows: list | None = None, device=None, memory_limit: int | None = None,
                 catch_errors: bool = False, barrier: bool = True):
        if journal is not None and run_id is None:
            raise BadInput("phase(journal=...) needs the run_id the rows belong to", where="pilotrun.phase",
                           fix="open a run first: `with pilotrun.probe.recorder.own_run(home) as run:` and pass "
                               "journal=run.journal, run_id=run.run_id")
        if rank is None:
            rank = world_rank()[1]
        self.name, self.inputs, self.rank = name, dict(inputs or {}), int(rank)
        self.journal, self.run_id, self.rows = _journal(journal), run_id, rows
        self.memory_limit, self.catch_errors, self.barrier = memory_limit, catch_errors, barrier
        self.probe = make_probe(device)
        self.note: str | None = None
        self._nan: str | None = None
        self.row: dict | None = None

    # --- what the block may call ------------------------------------------------------------------
    def nan(self, message: str = "the loss is not finite") -> None:
        self._nan = message

    def check_finite(self, value, what: str = "loss") -> bool:
        """A number or a tensor of any shape (every element checked); a non-finite one: verdict nan."""
        problem = non_finite(value)
        if problem:
            self.nan(f"{what} {problem}")
            return False
        return True

    # --- the context manager ----------------------------------------------------------------------
    def __enter__(self) -> "Phase":
        if self.barrier:
            _barrier()
        self.probe.start()
        self._t0 = time.perf_counter()
        self._untimed = 0.0
        return self

    @contextmanager
    def untimed(self):
        """Work inside the phase that is its counter's, not the phase's (``LiveTensors.sweep``): left out of its
        duration, which the time plan reads as the work a run repeats."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._untimed += time.perf_counter() - t0

    def __exit__(self, exc_type, exc, tb) -> bool:
        duration = time.perf_counter() - self._t0 - self._untimed
        verdict, note = "ok", self.note
        if exc is not None:
            stopped = exc if not isinstance(exc, Exception) else interruption(exc)
            if stopped is not None:
                # a signal (or an error that is part of one, signals.interruption) is no measurement: no row, not
                # even under catch_errors, and it goes on up as the interruption it is (exit 143/130/129)
                try:
                    self.probe.stop()  # its sampling thread ends with the phase
                except Exception:  # noqa: BLE001 - the interruption is what goes on up, not a counter's error
                    pass
                if stopped is exc:
                    return False
                raise stopped from exc
            if is_oom(exc):
                verdict, note = "oom", f"out of memory: {_first_line(exc)}"
            elif isinstance(exc, NonFinite):
                verdict, note = "nan", str(exc) or "the loss is not finite"
            else:
                verdict, note = "error", f"{type(exc).__name__}: {_first_line(exc)}"
        elif self._nan is not None:
            verdict, note = "nan", self._nan
        # bad input (a campaign the build refuses) is no measurement: it goes on up as exit 2 even under catch_errors
        suppress = exc is None or verdict in ("oom", "nan") or (self.catch_errors and not isinstance(exc, BadInput))
        if self.barrier and suppress:
            # ranks that go on meet here; one whose exception propagates cannot be waited for
            _barrier()
        counters = self.probe.stop()
        if verdict == "oom":
            _release_cached(counters["device"])
        row = {"phase": self.name, "rank": self.rank, "inputs": self.inputs, **counters,
               "duration_s": duration, "verdict": verdict, "note": note}
        peak = peak_of(row)
        if verdict == "ok" and self.memory_limit and peak is not None and peak > self.memory_limit:
            row["verdict"] = "over-budget"
            row["note"] = (f"peak {fmt_bytes(peak)} ({figure(row)}) is above the limit "
                           f"{fmt_bytes(self.memory_limit)} at phase {self.name} ({describe_inputs(self.inputs)})")
        self.row = {k: row.get(k) for k in ROW_KEYS}
        if self.rows is not None:
            self.rows.append(self.row)
        if self.journal is not None:
            self.journal.add_phase_rows(self.run_id, [self.row])
        return exc is not None and suppress


def phase(name: str, inputs: dict | None = None, journal=None, run_id: str | None = None, rank: int | None = None,
          rows: list | None = None, **kwargs) -> Phase:
    """A context manager measuring one phase of a loop; see the module docstring.

    ``journal`` is a :class:`Journal` or a home folder; ``rows`` a list the row is appended to.
    Keyword options: ``device`` (default the process's device), ``memory_limit`` (bytes),
    ``catch_errors`` (keep going after an error), ``barrier`` (default True under torch.distributed).
    """
    return Phase(name, inputs, journal=journal, run_id=run_id, rank=rank, rows=rows, **kwargs)


def non_finite(value) -> str | None:
    """None when ``value`` (a number, or a tensor/array of any shape) is finite everywhere; else what is not."""
    if hasattr(value, "detach"):
        value = value.detach()
    try:
        v = float(value)
    except (TypeError, ValueError, RuntimeError):  # a tensor or array of more than one element
        import torch

        t = torch.as_tensor(value).detach()
        if not (t.is_floating_point() or t.is_complex()):
            return None
        bad = ~torch.isfinite(t)
        n = int(bad.sum())
        if not n:
            return None
        first = t[bad].flatten()[0].item()
        return f"has {n} of {t.numel()} values not finite (shape {tuple(t.shape)}; the first is {first})"
    return None if math.isfinite(v) else f"is {v}"


class OwnRun:
    """The run ``own_run`` opens: ``run.phase(...)`` measures a phase, ``run.log(step, loss=...)`` records
    the curve (a non-finite training loss makes the run "diverged")."""

    def __init__(self, journal, run_id: str):
        self.journal, self.run_id = journal, run_id
        self.diverged: str | None = None
        self.updates = 0

    def phase(self, name: str, inputs: dict | None = None, **kwargs) -> Phase:
        return phase(name, inputs, journal=self.journal, run_id=self.run_id, **kwargs)

    def log(self, step: int, split: str = "train", **values) -> None:
        """Record ``values`` (loss=..., lr=..., val_loss=...; numbers or one-element tensors) at ``step``."""
        rows = []
        for name, value in values.items():
            problem = non_finite(value)
            if problem and self.diverged is None and split == "train":
                self.diverged = f"training {name} {problem} at step {step}"
            rows.append((split, name, int(step), None if problem else float(value), None, None))
        if split == "train":
            self.updates = max(self.updates, int(step))
        if rows:
            self.journal.add_metrics(self.run_id, rows, progress=(self.updates, 0) if split == "train" else None)


@contextmanager
def own_run(home=None, name: str = "own-loop", config: dict | None = None):
    """A journal run of kind "phases" for rows recorded from a user's own loop; finished on exit:
    "completed", or "diverged" when a phase ended "nan" or a logged training loss was not finite.
    ``home``: default $PILOTRUN_HOME, else ./.pilotrun."""
    journal = Journal(resolve_home(home))
    run_id = create_run(journal, kind="phases", name=name, config=dict(config or {}), command=user_command())
    run = OwnRun(journal, run_id)
    try:
        yield run
    except BaseException as e:
        end_run(journal, run_id, e)
        raise
    rows = journal.phase_rows(run_id)
    summary = {"phases": len(rows), "failing": sum(r["verdict"] != "ok" for r in rows), "updates": run.updates}
    nan = next((r for r in rows if r["verdict"] == "nan"), None)
    reason = run.diverged or (f"phase {nan['phase']} (rank {nan['rank']}): {nan['note']}" if nan else None)
    if reason:
        summary["reason"] = reason
    journal.finish_run(run_id, "diverged" if reason else "completed", summary)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _release_cached(device: str) -> None:
    """After an OOM, hand the allocator's cache back so the phases after it start from a clean card."""
    if device.startswith("cuda"):
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
