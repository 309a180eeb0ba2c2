"""The one driver: the registry's phases in order, each inside a measurement.

``measure(name, inputs)`` is a context manager yielding a handle with ``inputs``, ``nan`` and
``check_finite`` (``probe.recorder.phase`` for the pilot and ``fit``; ``quiet`` where a phase runs
unmeasured; the accountant's marks for ``estimate``). A phase whose ``needs`` did not complete is not
run: it gets a row whose error says which phase it needed and how that one ended. A phase the campaign does not
have (``Phase.only``: the reference's precomputation of a preference campaign that precomputes it) is left out.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from pilotrun.console.progress import note
from pilotrun.phases.registry import BY_NAME, PHASES


class NotRun(Exception):
    """A phase that needs what an earlier, failed phase did not produce."""


@dataclass
class PhaseContext:
    """What the phases share on one rank: the prepared data, the worst case, the state they build."""

    prep: Any
    worst: dict
    device: Any = None
    rank: int = 0
    world: int = 1
    run_dir: str | None = None
    plant: Callable | None = None  # (name, task) -> the task to use there; raises a planted fault (tests)
    fake: dict | None = None  # estimate: acc, model, reloaded, ranks, device, notes
    state: Any = None
    written: list = field(default_factory=list)
    done: set = field(default_factory=set)
    rows: list = field(default_factory=list)

    @property
    def task(self):
        return self.prep.task

    def task_for(self, name: str):
        return self.plant(name, self.prep.task) if self.plant else self.prep.task


class Quiet:
    """The handle of an unmeasured phase (the same calls, nothing recorded)."""

    def __init__(self, inputs: dict | None = None):
        self.inputs, self.nan_reason = dict(inputs or {}), None

    def nan(self, message: str = "the loss is not finite") -> None:
        self.nan_reason = message

    def check_finite(self, value, what: str = "loss") -> bool:
        ok = math.isfinite(float(value))
        if not ok:
            self.nan(f"{what} is {float(value)}")
        return ok

    def untimed(self):
        return contextlib.nullcontext()  # nothing is timed


@contextlib.contextmanager
def quiet(name: str, inputs: dict | None = None):
    yield Quiet(inputs)


def drive(ctx: PhaseContext, measure, names=PHASES, *, traced: bool = False,
          after: dict[str, Callable] | None = None, stop: Callable[[PhaseContext], bool] | None = None) -> None:
    """Run ``names`` (registry order) on ``ctx``; ``traced``: their fake-tensor versions. ``after[name](ctx)``
    runs once that phase is over; ``stop(ctx)`` true after a phase ends the sequence there."""
    c = ctx.prep.c
    names = [n for n in names if BY_NAME[n].only is None or BY_NAME[n].only(c)]  # the campaign's phases only
    steps = [n for n in PHASES if n in names]
    steps += [f"{n}+" for n in steps if after and n in after]  # an after-hook is a step of its own
    total = len(steps)
    done = 0
    for name in PHASES:
        if name not in names:
            continue
        done += 1
        note(f"{'traced ' if traced else ''}phase {done}/{total}: {name}", done=done - 1, total=total, log=True,
             spent="model" if BY_NAME[name].kind == "load" else "work")
        spec = BY_NAME[name]
        inputs = spec.inputs(ctx)
        if not traced and spec.needs and spec.needs not in ctx.done:
            failed = next((r for r in ctx.rows if r["phase"] == spec.needs), None)
            why = f"ended with {failed['verdict']}" if failed else "did not run"
            with measure(name, inputs):
                raise NotRun(f"phase {spec.needs} {why}")
            continue
        with measure(name, inputs) as p:
            spec.trace(ctx) if traced else spec.run(ctx, p)
            ctx.done.add(name)
        if after and name in after:
            done += 1
            what = after[name].__name__.replace("_", " ")
            note(f"phase {done}/{total}: {what}", done=done - 1, total=total, log=True, spent="work")
            after[name](ctx)
        if stop is not None and stop(ctx):
            return
