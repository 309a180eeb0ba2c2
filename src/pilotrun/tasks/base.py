"""The Task protocol: everything pilotrun needs to know about a task, and the encoded example.

A task turns a raw record into exactly what the loss sees (``encode``); every check uses that one
path. Its loss is a *sum* with the count of targets, so the loop can normalise over the whole
optimizer update (all micro-batches, all ranks) instead of averaging per micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

IGNORE = -100  # the label value cross-entropy skips (torch's default ignore_index)
BUILTIN_TASKS = ("causal-lm", "seq-cls", "preference")  # the tasks pilotrun builds itself; any other is package.module:Class
# what preference's ``take_metrics`` reports per validation (logged as val_<name>); the other built-in tasks report none
PREFERENCE_METRICS = ("reward_accuracy", "reward_margin", "chosen_reward", "rejected_reward", "chosen_logp",
                      "rejected_logp")
# the direction in which a validation metric is better, where it has one (plan.goal must agree)
METRIC_GOALS = {"val_loss": "minimize", "val_reward_accuracy": "maximize", "val_reward_margin": "maximize"}


def validation_metrics(task: str) -> tuple[str, ...] | None:
    """The metrics a built-in task's validations log (what plan.metric may name); None for a custom task, whose
    ``take_metrics`` is known only once it runs (the first validation checks it)."""
    if task not in BUILTIN_TASKS:
        return None
    return ("val_loss",) + (tuple(f"val_{k}" for k in PREFERENCE_METRICS) if task == "preference" else ())


@dataclass
class Example:
    """One encoded record: what the model gets and what the loss is computed on."""

    input_ids: list[int]
    labels: list[int]
    """causal-lm: one label per position, IGNORE where no loss; seq-cls: [class id]."""
    rid: str
    """Where the record came from ("file:line")."""
    group: str | None = None
    period: str | None = None
    prompt_len: int = 0
    """causal-lm: tokens before the first target (after truncation); checks use it."""
    target_len_full: int = 0
    """Target tokens before truncation; ``n_targets`` after it."""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def length(self) -> int:
        return len(self.input_ids)

    @property
    def n_targets(self) -> int:
        return sum(1 for t in self.labels if t != IGNORE)


@runtime_checkable
class Task(Protocol):
    """What a task provides. Built-in: causal-lm, seq-cls, preference; custom: ``task: package.module:Class``.

    A custom class is constructed as ``Class(campaign)`` with the :class:`LoadedCampaign`.
    """

    kind: str

    def build_model(self) -> Any:
        """The model (an ``nn.Module``), initialised or loaded, on the CPU."""

    def records(self, split: str) -> list:
        """Raw records of a split ("train", "validation", "test"), as :class:`Record` objects."""

    def encode(self, record) -> Example:
        """The one path from a record to what the loss sees."""

    def collate(self, examples: list[Example]) -> dict[str, Any]:
        """A batch of tensors (padded) from encoded examples."""

    def loss(self, model, batch: dict[str, Any]) -> tuple[Any, Any]:
        """(sum of per-target losses, number of targets) for a batch; a third element, when given, names the parts
        of that sum that are not the per-target loss (``{"router_aux": ...}``: a mixture of experts' load-balancing
        term, weighted by the targets as the sum is), which the loop reports apart (``loss_parts``)."""

    def count_targets(self, batch: dict[str, Any]) -> int:
        """Number of loss targets in a batch, known before the forward pass."""

    def predict(self, model, batch: dict[str, Any]) -> list[list[int]]:
        """Per example, the predicted ids at its targets (token ids, or the class id)."""

    def group_key(self, record) -> str | None:
        """The leakage unit of a record (data.group_by), or None."""

    def save_artifact(self, model, out_dir) -> None:
        """Write the artifact the campaign ships (safetensors, config, tokenizer) as sub-folders of out_dir,
        each loadable by ``load_artifact``; returns their names (verify reloads each)."""

    def load_artifact(self, path) -> Any:
        """Load an artifact written by save_artifact, the way a user would."""


def loss_parts(result) -> tuple[Any, Any, dict]:
    """A task's ``loss`` result as (sum, count, parts): a custom task's (sum, count) has no parts."""
    return result[0], result[1], (result[2] if len(result) > 2 else {})


REQUIRED_METHODS = ("build_model", "records", "encode", "collate", "loss", "count_targets", "predict",
                    "group_key", "save_artifact", "load_artifact")
