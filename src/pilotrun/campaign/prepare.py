"""Shared set-up of the stages: campaign → task → encoded splits."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pilotrun.campaign import reuse
from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.consistency import check_consistency
from pilotrun.console.progress import note, spending
from pilotrun.tasks import make_task
from pilotrun.tasks.common import SPLITS
from pilotrun.tasks.hub import snapshot_of
from pilotrun.tasks.loading import architecture_only, check_model_dir, check_positions, check_weights_fit, lora_targets
from pilotrun.tasks.base import BUILTIN_TASKS


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


def require_weights(loaded) -> None:
    """A stage that runs the model (pilot, overfit, train, resume, fit) needs its weights: a hub model whose
    config.json alone is cached is exit 2 here, naming the missing files, before any run is created
    (``validate``, ``estimate`` and the sheet without a pilot work from the config); so is a folder whose weights'
    headers disagree with the model its config.json describes (``tasks.loading.check_weights_fit``)."""
    from pathlib import Path

    path = loaded.campaign.model.path
    if path and snapshot_of(path):
        check_model_dir(Path(path))
    if path and loaded.campaign.task in BUILTIN_TASKS:
        check_weights_fit(loaded.campaign, loaded.campaign.task)  # names and shapes against the headers


def prepare(loaded, splits=SPLITS) -> Prepared:
    """Validate, build the task and encode every record of the splits through task.encode (inside ``all``, once
    per campaign identity and split: ``campaign/reuse.encoded``)."""
    with spending("data"):
        if not reuse.shared():
            task = _task(loaded)
            return Prepared(loaded, task, _encoded(task, splits))
        kept = reuse.encoded(loaded, splits, lambda: _task(loaded, keep=True), _encoded)
        return Prepared(loaded, kept["task"], {k: list(v) for k, v in kept["splits"].items()  # the stage's own lists
                                               if k in splits and v})


def _task(loaded, keep: bool = False):
    check_consistency(loaded.campaign, loaded.base_dir)
    if loaded.campaign.task in BUILTIN_TASKS:
        check_positions(loaded.campaign)  # with model.config's class defaults, before anything runs
        adapter_choice(loaded)  # LoRA's modules exist in the model (or the family has a default)
    task = make_task(loaded)
    if keep:
        reuse.keep_pristine(task, loaded)  # a later stage's build is a fresh copy of the weights read here
    return task


def _encoded(task, splits) -> dict[str, list]:
    """Each split's records encoded ([] for a split without records: the caller keeps only the others)."""
    examples = {}
    for split in splits:
        note(f"reading and encoding the {split} split", log=True)
        records = task.records(split)
        examples[split] = [task.encode(r) for r in records] if records else []
    return examples


def adapter_choice(loaded) -> tuple[list[str], str] | None:
    """The LoRA modules a built-in task's campaign adapts and why (``lora_targets``), checked on the architecture
    built on the meta device (no memory, no weights read) before anything runs; None without an adapter."""
    c = loaded.campaign
    if c.model.adapter is None or c.task not in BUILTIN_TASKS:
        return None
    import torch

    plain = loaded.with_overrides({"model.adapter": None, "model.gradient_checkpointing": False})
    with torch.device("meta"), architecture_only():
        model = make_task(plain).build_model()
    return lora_targets(model, c.model.adapter)
