"""all: the full rehearsal, every stage that exists, in SPEC order; then one summary table.

Stages are (name, function) pairs; a later stage joins by adding itself to STAGES in its place.
A bad input stops the rehearsal (exit 2); a failing verdict does not stop the stages after it.
"""

from __future__ import annotations


def _validate(loaded, home):
    from pilotrun.stages.validate import validate

    return validate(loaded)


def _train(loaded, home):
    from pilotrun.stages.train import train_run

    return train_run(loaded, home)


# SPEC order: validate → data checks → leakage → overfit → pilot → resume → verify → sheet.
STAGES = [
    ("validate", _validate),
    ("train", _train),
]


def run_all(loaded, home, on_result=None) -> list:
    """Run every stage; ``on_result`` sees each result as soon as its stage ends (the CLI renders it)."""
    results = []
    for name, fn in STAGES:
        result = fn(loaded, home)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
