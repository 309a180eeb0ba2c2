"""Shared set-up of the stages: campaign → task → encoded splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.consistency import check_consistency
from pilotrun.tasks import make_task
from pilotrun.tasks.common import SPLITS


@dataclass
class Prepared:
    loaded: Any
    task: Any
    examples: dict[str, list] = field(default_factory=dict)

    @property
    def c(self):
        return self.loaded.campaign

    @property
    def train(self) -> list:
        return self.examples.get("train", [])

    @property
    def validation(self) -> list:
        return self.examples.get("validation", [])

    def arithmetic(self) -> dict:
        return batch_arithmetic(self.c.train, len(self.train))


def prepare(loaded, splits=SPLITS) -> Prepared:
    """Validate, build the task and encode every record of the splits through task.encode."""
    from pilotrun.report.progress import note

    check_consistency(loaded.campaign, loaded.base_dir)
    if loaded.campaign.task in ("causal-lm", "seq-cls"):
        from pilotrun.tasks.loading import check_positions

        check_positions(loaded.campaign)  # with model.config's class defaults, before anything runs
    task = make_task(loaded)
    examples = {}
    for split in splits:
        note(f"reading and encoding the {split} split", log=True)
        records = task.records(split)
        if records:
            examples[split] = [task.encode(r) for r in records]
    return Prepared(loaded, task, examples)
