"""all: the full rehearsal, every stage that exists, in SPEC order; then one summary table.

Stages are (name, function) pairs; a later stage joins by adding itself to STAGES in its place.
A bad input stops the rehearsal (exit 2); a failing verdict does not stop the stages after it.
"""

from __future__ import annotations


def _validate(loaded, home):
    from pilotrun.rehearsal.data_checks.validate import validate

    return validate(loaded)


def _inspect(loaded, home):
    from pilotrun.rehearsal.data_checks.inspect import inspect

    return inspect(loaded)


def _leakage(loaded, home):
    from pilotrun.rehearsal.data_checks.leakage import leakage

    return leakage(loaded)


def _overfit(loaded, home):
    from pilotrun.rehearsal.mechanics.overfit import overfit

    return overfit(loaded, home)


def _resume(loaded, home):
    from pilotrun.rehearsal.mechanics.resume import resume

    return resume(loaded, home)


def _verify(loaded, home):
    from pilotrun.rehearsal.mechanics.verify import verify_latest

    return verify_latest(loaded, home)


def _train(loaded, home):
    from pilotrun.rehearsal.training.train import train_run

    return train_run(loaded, home)


def _sheet(loaded, home):
    from pathlib import Path

    from pilotrun.rehearsal.rental.sheet import sheet_stage

    # `all` said what an imported campaign does not reproduce at its start: the sheet does not repeat it
    return sheet_stage(loaded, home, out=str(Path(home) / "sheet.md"), say_imported=False)


def _imported(loaded):
    """For a campaign written by `pilotrun import`: the source's settings the rehearsal does not reproduce,
    said once, before the stages (a warning: the figures below are for the campaign as rehearsed)."""
    from pilotrun.campaign.importers import not_reproduced_lines
    from pilotrun.verdicts import StageResult

    lines = not_reproduced_lines(loaded.campaign)
    if not lines:
        return None
    return StageResult("imported", "warn", lines[0], lines[1:], {"not_carried": [
        n.model_dump() for n in loaded.campaign.imported.not_carried]})


def _pilot(loaded, home):
    from pilotrun.rehearsal.memory.pilot import pilot

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


def run_all(loaded, home, on_result=None) -> list:
    """Run every stage; ``on_result`` sees each result as soon as its stage ends (the CLI renders it)."""
    results = []
    said = _imported(loaded)
    if said is not None:
        results.append(said)
        if on_result is not None:
            on_result(said)
    for name, fn in STAGES:
        result = fn(loaded, home)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
