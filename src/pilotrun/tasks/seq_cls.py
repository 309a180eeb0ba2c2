"""seq-cls: text → one of data.labels. Names map to ids by the order of data.labels."""

from __future__ import annotations

import re
from typing import Any

from pilotrun.errors import BadInput
from pilotrun.tasks import common
from pilotrun.tasks.base import Example
from pilotrun.tasks.loading import build_model, load_hf_artifact


_ID = re.compile(r"-?[0-9]+")

ONE_CLASS = "where seq-cls trains one class of data.labels a record"
MULTI_LABEL_FIX = ("give each record one class (one record per class it has, or the one that matters); multi-label "
                   "classification is not a task pilotrun rehearses (a custom task, task: package.module:TaskClass, "
                   "can train its loss)")
"""A label that is a list ([0, 2]: Hugging Face's problem_type multi_label_classification), said by validate and
inspect alike."""


def as_id(value) -> int | None:
    """The class id a label value reads as, if it is one: an int (not a bool) or ASCII digits, optionally
    signed and padded with spaces. ``str.isdigit`` also accepts "²" and "①", which int() refuses."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and _ID.fullmatch(value.strip()):
        return int(value.strip())
    return None


class SeqClsTask(common.CampaignTask):
    kind = "seq-cls"

    def __init__(self, campaign, tokenizer=None):
        super().__init__(campaign, tokenizer)
        self.labels = list(self.c.data.labels or [])
        self.label2id = {n: i for i, n in enumerate(self.labels)}

    def label_id(self, record) -> int:
        """A class name of data.labels, else an id: an int or a string of ASCII digits ("2", " 2", "-1"); a boolean
        (JSON's true, a Parquet bool column) is the class named "true" or "false" (any case); anything else ("²",
        "--1", "1.0") is bad input, never an internal error."""
        value = common.field(record, self.c.data.label, "data.label")
        if isinstance(value, str) and value in self.label2id:
            return self.label2id[value]
        if isinstance(value, bool):  # a JSON or Parquet true/false: the class of that name, as JSON writes it
            named = [i for i, n in enumerate(self.labels) if n.strip().lower() == str(value).lower()]
            if len(named) == 1:
                return named[0]
            raise BadInput(f"label {str(value).lower()} is a yes/no (a JSON or Parquet boolean), and data.labels "
                           f"{self.labels} names no class {str(value).lower()!r}", where=record.where,
                           fix="name the two classes \"false\" and \"true\" in data.labels, in the order of their ids")
        i = as_id(value)
        if i is not None and 0 <= i < len(self.labels):
            return i
        raise BadInput(f"label {value!r} is not in data.labels {self.labels}", where=record.where,
                       fix="add the class to data.labels, or give a name or an id 0..n-1 (ASCII digits)")

    def tokenize_kwargs(self) -> dict:
        return {"add_special_tokens": True, "truncation": True, "max_length": self.c.data.max_length}

    def tokenized_texts(self, record) -> list[str]:
        """The texts ``encode`` gives the tokenizer for this record (``data.prefetch`` batches them)."""
        return [common.text_field(record, self.c.data.text, "data.text")]

    def encode(self, record) -> Example:
        (text,) = self.tokenized_texts(record)
        ids = list(self.tokenizer(text, **self.tokenize_kwargs())["input_ids"])
        return Example(ids, [self.label_id(record)], record.where, group=common.group_of(record, self.c),
                       period=common.period_of(record, self.c), prompt_len=len(ids), target_len_full=1)

    def collate(self, examples: list[Example]) -> dict[str, Any]:
        import torch

        width = max(e.length for e in examples)
        ids = torch.full((len(examples), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(examples), width), dtype=torch.long)
        for i, e in enumerate(examples):
            ids[i, : e.length] = torch.tensor(e.input_ids)
            mask[i, : e.length] = 1
        labels = torch.tensor([e.labels[0] for e in examples], dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels, "rids": [e.rid for e in examples]}

    def count_targets(self, batch) -> int:
        return int(batch["labels"].numel())

    def loss(self, model, batch):
        import torch.nn.functional as F

        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        return F.cross_entropy(logits, batch["labels"], reduction="sum"), batch["labels"].new_tensor(
            batch["labels"].numel())

    def predict(self, model, batch) -> list[list[int]]:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return [[int(i)] for i in logits.argmax(-1).tolist()]

    def targets(self, batch) -> list[list[int]]:
        return [[int(i)] for i in batch["labels"].tolist()]

    def build_model(self):
        if not self.labels:
            raise BadInput("seq-cls needs data.labels", where="data.labels", fix="list the class names in id order")
        return build_model(self.c, self.tokenizer, self.kind, self.labels)

    def load_artifact(self, path):
        return load_hf_artifact(self.c, self.tokenizer, self.kind, path, self.labels)
