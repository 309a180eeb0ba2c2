"""A custom pilotrun task: a small tabular classifier in plain PyTorch (no tokenizer, no HF model).

Use it with ``task: tabular_task:TabularTask`` (see ``tabular_campaign.yaml``) and this folder on the
import path (run pilotrun from here, or set PYTHONPATH). The campaign's ``data`` keys it reads:
``train/validation/test`` (CSV files), ``label`` (the class field), ``labels`` (class names in id
order), ``group_by`` (the leakage unit). Features are the fields listed in ``FEATURES``.

Each record becomes one :class:`pilotrun.tasks.base.Example` whose ``labels`` is ``[class id]``; the
float features travel in ``meta["x"]`` and ``input_ids`` holds each feature's value bucket, so the
checks that look at "tokens" (lengths, duplicates, leakage) see the record's content.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from pilotrun.errors import BadInput
from pilotrun.tasks import common
from pilotrun.tasks.base import Example

FEATURES = ("f1", "f2", "f3", "f4")
BUCKETS = 4096  # input_ids: feature i's value falls in bucket b -> id i * BUCKETS + b
HIDDEN = 32


class TabularNet(nn.Module):
    def __init__(self, n_features: int, n_classes: int, hidden: int = HIDDEN):
        super().__init__()
        self.config = {"n_features": n_features, "n_classes": n_classes, "hidden": hidden}
        self.net = nn.Sequential(nn.Linear(n_features, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, n_classes))

    def forward(self, x):
        return self.net(x)


def _bucket(v: float) -> int:
    return max(0, min(BUCKETS - 1, int((v + 8.0) / 16.0 * BUCKETS)))


class TabularTask:
    kind = "tabular-cls"

    def __init__(self, campaign):
        self.campaign = campaign
        self.c = campaign.campaign if hasattr(campaign, "campaign") else campaign
        self.labels = list(self.c.data.labels or [])
        if not self.labels:
            raise BadInput("the tabular task needs data.labels", where="data.labels",
                           fix="list the class names in id order")
        self.label2id = {n: i for i, n in enumerate(self.labels)}

    # --- records -----------------------------------------------------------------------------------
    def records(self, split: str):
        return common.read_split(self.c, split)

    def group_key(self, record) -> str | None:
        return common.group_of(record, self.c)

    def encode(self, record) -> Example:
        x = []
        for name in FEATURES:
            raw = common.field(record, name, f"feature {name}")
            try:
                x.append(float(raw))
            except (TypeError, ValueError):
                raise BadInput(f"feature '{name}' is {raw!r}, not a number", where=record.where,
                               fix="give every feature a numeric value") from None
        label = str(common.field(record, self.c.data.label or "label", "data.label"))
        if label not in self.label2id:
            raise BadInput(f"label {label!r} is not in data.labels {self.labels}", where=record.where,
                           fix="add the class to data.labels")
        ids = [i * BUCKETS + _bucket(v) for i, v in enumerate(x)]
        return Example(ids, [self.label2id[label]], record.where, group=self.group_key(record),
                       prompt_len=len(ids), target_len_full=1, meta={"x": x})

    def collate(self, examples: list[Example]) -> dict[str, Any]:
        return {"x": torch.tensor([e.meta["x"] for e in examples], dtype=torch.float32),
                "labels": torch.tensor([e.labels[0] for e in examples], dtype=torch.long),
                "rids": [e.rid for e in examples]}

    # --- the loss and predictions ------------------------------------------------------------------
    def count_targets(self, batch) -> int:
        return int(batch["labels"].numel())

    def loss(self, model, batch):
        logits = model(_on(model, batch["x"])).float()
        labels = _on(model, batch["labels"])
        return F.cross_entropy(logits, labels, reduction="sum"), labels.new_tensor(labels.numel())

    def predict(self, model, batch) -> list[list[int]]:
        logits = model(_on(model, batch["x"]))
        return [[int(i)] for i in logits.argmax(-1).tolist()]

    def targets(self, batch) -> list[list[int]]:
        return [[int(i)] for i in batch["labels"].tolist()]

    # --- the model and its artifact ----------------------------------------------------------------
    def build_model(self):
        torch.manual_seed(self.c.seed)
        return TabularNet(len(FEATURES), len(self.labels))

    def save_artifact(self, model, out_dir) -> list[str]:
        """Write out_dir/model/{model.safetensors,config.json}; returns the sub-folders written."""
        from safetensors.torch import save_file

        out = Path(out_dir) / "model"  # the artifact folder holds one sub-folder per loadable model
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
        save_file(state, str(out / "model.safetensors"))
        config = {**model.config, "features": list(FEATURES), "labels": self.labels}
        (out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        return ["model"]

    def load_artifact(self, path):
        from safetensors.torch import load_file

        path = Path(path)
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
        model = TabularNet(config["n_features"], config["n_classes"], config["hidden"])
        model.load_state_dict(load_file(str(path / "model.safetensors")))
        return model.eval()


def _on(model, t):
    p = next(model.parameters(), None)
    return t if p is None else t.to(p.device)
