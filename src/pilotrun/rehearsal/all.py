"""all: the full rehearsal, every stage that exists, in SPEC order; then one summary table.

Stages are (name, function) pairs; a later stage joins by adding itself to STAGES in its place.
A bad input stops the rehearsal (exit 2); a failing verdict does not stop the stages after it.
Each stage runs inside the one progress line (console/progress.py), labelled ``all 4/9 overfit``: its own
progress live on a terminal, and in a log a line when it starts and when it ends with its time. Each
result carries its seconds (the summary's time column) and where they went (``spent``: start-up, campaign
load, data, model build, the work itself, from the progress line's accounts; ``--verbose`` prints them). ``Budgets`` bound the long stages (``all
--quick`` or the budget options); the summary says which budgets were used.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pilotrun import startup
from pilotrun.campaign.importers import not_reproduced_lines
from pilotrun.campaign.reuse import forget, sharing
from pilotrun.console.progress import spending, stage_progress
from pilotrun.engine import fresh
from pilotrun.rehearsal.mechanics.resume import DEFAULT_AT
from pilotrun.verdicts import StageResult


@dataclass(frozen=True)
class Budgets:
    """How much the long stages of ``all`` may do: overfit's examples and updates, the resume point, the
    train stage's updates (None: the campaign's own budget). ``sized``: overfit may take fewer updates than
    ``max_updates``, as many as its time budget holds (mechanics/overfit.UpdateBudget); off when given."""

    examples: int = 8
    max_updates: int = 150
    at: int | None = None
    train_updates: int | None = None
    sized: bool = True

    @classmethod
    def quick(cls) -> "Budgets":
        return cls(examples=4, max_updates=120, at=2, train_updates=8)

    def lines(self, loaded, results: list | None = None) -> list[str]:
        """What the summary says about the budgets used: overfit's as its stage sized and took it (``results``)."""
        t = loaded.campaign.train
        own = f"{t.updates} updates" if t.updates is not None else f"{t.epochs:g} epochs"
        train = (f"train ≤ {self.train_updates} updates (the campaign's budget is {own})"
                 if self._bounds_train(loaded) else f"train {own} (the campaign's budget)")
        return [f"budgets: {self._overfit(results)}; resume at update "
                f"{self.at or DEFAULT_AT} (reference {2 * (self.at or DEFAULT_AT)}); {train}"]

    def _overfit(self, results) -> str:
        """overfit's examples and update budget: the one its stage sized and how many it took, once it ran."""
        ran = next((r for r in results or [] if r.stage == "overfit"), None)
        b, used = ((ran.data or {}).get("budget"), (ran.data or {}).get("updates")) if ran else (None, None)
        if not b:
            return f"overfit {self.examples} examples, ≤ {self.max_updates} updates"
        sized = (f" (sized to {b['seconds']:g} s at {b['seconds_per_update']:.3g} s each; ceiling {b['ceiling']})"
                 if b.get("sized") and b.get("seconds_per_update") else "")
        took = f", {used} taken" if used is not None else ""
        return f"overfit {self.examples} examples, ≤ {b['updates']} updates{sized}{took}"

    def _bounds_train(self, loaded) -> bool:
        t = loaded.campaign.train
        return self.train_updates is not None and (t.updates is None or self.train_updates < t.updates)

    def for_train(self, loaded):
        if not self._bounds_train(loaded):
            return loaded
        return loaded.with_overrides({"train.updates": self.train_updates, "train.epochs": None})


def _validate(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.data_checks.validate import validate

    return validate(loaded, home)


def _inspect(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.data_checks.inspect import inspect

    return inspect(loaded)


def _leakage(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.data_checks.leakage import leakage

    return leakage(loaded)


def _overfit(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.mechanics.overfit import overfit

    return overfit(loaded, home, examples=budgets.examples, max_updates=budgets.max_updates, sized=budgets.sized)


def _resume(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.mechanics.resume import resume

    return resume(loaded, home, at=budgets.at)


def _verify(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.mechanics.verify import verify_latest

    return verify_latest(loaded, home)


def _train(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.training.train import train_run
        from pilotrun.campaign.reuse import unshared

    with unshared():  # its prepare and load times are the run's own (the time check compares them with the plan)
        return train_run(budgets.for_train(loaded), home)


def _sheet(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.rental.sheet import sheet_stage

    # `all` said what an imported campaign does not reproduce at its start: the sheet does not repeat it
    return sheet_stage(loaded, home, out=str(_sheet_out(home)), say_imported=False)


def _sheet_out(home) -> Path:
    """Where `all`'s sheet is written, its launch files beside it."""
    return Path(home) / "sheet.md"


def _imported(loaded):
    """For a campaign written by `pilotrun import`: the source's settings the rehearsal does not reproduce,
    said once, before the stages (a warning: the figures below are for the campaign as rehearsed)."""
    lines = not_reproduced_lines(loaded.campaign)
    if not lines:
        return None
    return StageResult("imported", "warn", lines[0], lines[1:], {"not_carried": [
        n.model_dump() for n in loaded.campaign.imported.not_carried]})


def _pilot(loaded, home, budgets):
    with spending("startup"):  # the stage's imports
        from pilotrun.rehearsal.memory.pilot import pilot
        from pilotrun.campaign.reuse import unshared

    with unshared():  # its prepare and load times are terms of the sheet's plan: measured, never served
        return pilot(loaded, home)


# SPEC order: validate → data checks → leakage → overfit → pilot → resume → verify → sheet.
STAGES = [
    ("validate", _validate),
    ("inspect", _inspect),
    ("leakage", _leakage),
    ("overfit", _overfit),
    ("pilot", _pilot),
    ("resume", _resume),
    ("verify", _verify),
    ("train", _train),
    ("sheet", _sheet),
]


def _sheet_libraries() -> None:
    """What the sheet stage imports and no stage before it does: peft for its options table's LoRA and QLoRA traces,
    and bitsandbytes, which peft imports (~0.8 s of one core with MiniLM, the sheet's ``model`` account before).
    ``all`` imports them while resume's fresh process runs (``fresh.meanwhile``); a library not installed is left to
    the sheet, which says so."""
    import importlib.util

    if importlib.util.find_spec("bitsandbytes") is not None:
        from pilotrun.tasks.quantized import import_bitsandbytes

        import_bitsandbytes()  # as the sheet imports it: its import-time warnings kept quiet
    if importlib.util.find_spec("peft") is not None:
        import peft  # noqa: F401


def run_all(loaded, home, on_result=None, budgets: Budgets | None = None) -> list:
    """Run every stage; ``on_result`` sees each result as soon as its stage ends (the CLI renders it)."""
    from pilotrun.rehearsal.rental.sheet import refuse_sheet_over
    from pilotrun.sheet.ship import wheel_beside

    budgets = budgets or Budgets()
    sheet = _sheet_out(home)  # checked before the stages' minutes, not at the sheet after them
    refuse_sheet_over(sheet, loaded, fix=f"move it away from {sheet.parent}, or pass another --home (`all` writes its "
                                         "sheet and launch files there)")
    results = []
    said = _imported(loaded)
    if said is not None:
        results.append(said)
        if on_result is not None:
            on_result(said)
    # while resume's fresh process runs (its start is one core's work): pilotrun's wheel for the sheet's launch
    # files started in the background (when it ships as one), the sheet's libraries imported
    try:
        with wheel_beside(_sheet_out(home).parent if loaded.source is not None else None, now=False) as start_wheel, \
                fresh.meanwhile(start_wheel), fresh.meanwhile(_sheet_libraries):
            _stages(loaded, home, budgets, results, on_result)
    finally:
        # what the stages shared is not kept past them, nor past a stage that raised (bad input, Ctrl-C): a model
        # kept in a process that goes on (a notebook, a script calling run_all) would be counted as the memory of
        # its next pilot or run
        forget()
    return results


def _stages(loaded, home, budgets: Budgets, results: list, on_result) -> None:
    for i, (name, fn) in enumerate(STAGES, 1):
        t0 = time.perf_counter()
        with sharing(), stage_progress(f"all {i}/{len(STAGES)} {name}") as cur:
            result = fn(loaded, home, budgets)
            cur["outcome"] = result.verdict
        result.seconds = time.perf_counter() - t0
        result.spent = cur.get("spent")
        startup.discount(result.seconds)  # a later stage's start-up is the process's, not the stages' before it
        results.append(result)
        if on_result is not None:
            on_result(result)
