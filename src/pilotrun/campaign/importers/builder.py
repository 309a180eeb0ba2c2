"""The campaign an import builds: each key carried with its source, each setting not carried with its reason."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilotrun.errors import BadInput
from pilotrun.records.readers import read_records


@dataclass
class Carried:
    source: str
    key: str
    value: Any
    note: str = ""


@dataclass
class NotCarried:
    key: str
    value: Any
    reason: str


@dataclass
class Imported:
    fmt: str
    detected: bool
    source: Path
    out: Path
    campaign: dict[str, Any]
    carried: list[Carried] = field(default_factory=list)
    not_carried: list[NotCarried] = field(default_factory=list)
    to_set: list[str] = field(default_factory=list)
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.fmt, "detected": self.detected, "source": str(self.source), "out": str(self.out),
                "carried": [c.__dict__ for c in self.carried],
                "not_carried": [n.__dict__ for n in self.not_carried], "to_set": self.to_set}



def empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}



class Builder:
    def __init__(self, fmt: str, source: Path, out: Path):
        self.fmt, self.source, self.out = fmt, source, out
        self.c: dict[str, Any] = {"name": source.stem, "task": "causal-lm", "model": {}, "data": {}, "train": {}}
        self.carried: list[Carried] = []
        self.not_carried: list[NotCarried] = []
        self.to_set: list[str] = []
        self.problems: list[BadInput] = []
        self.examples: int | None = None  # training records, when the data file could be read

    def put(self, src: str, key: str, value: Any, note: str = "") -> None:
        node = self.c
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        self.carried.append(Carried(src, key, value, note))

    def skip(self, key: str, value: Any, reason: str) -> None:
        self.not_carried.append(NotCarried(key, value, reason))

    def ask(self, message: str, fix: str) -> None:
        self.problems.append(BadInput(message, where=str(self.source), fix=fix))

    def local_path(self, src_key: str, value: str) -> str:
        """A path of the source (relative to the source file) written relative to the campaign's folder."""
        p = Path(os.path.expanduser(value))
        p = p if p.is_absolute() else (self.source.parent / p)
        try:
            return os.path.relpath(p.resolve(), self.out.parent.resolve())
        except ValueError:  # another drive
            return str(p.resolve())

    def updates_per_epoch(self) -> float | None:
        t = self.c["train"]
        if self.examples is None:
            return None
        per_update = t.get("micro_batch", 2) * t.get("accumulation", 8) * t.get("nproc", 1)
        return self.examples / per_update

    def total_updates(self) -> float | None:
        t = self.c["train"]
        if t.get("updates"):
            return t["updates"]
        upe = self.updates_per_epoch()
        return None if upe is None or not t.get("epochs") else upe * t["epochs"]

    def in_updates(self, src: str, key: str, value: Any, *, ratio_of: str, minimum: int = 1) -> None:
        """Carry a count of updates given as a share (ratio_of: 'total' or 'epoch'; value < 1 a fraction, or
        N per epoch) as updates from the data's size and the batch arithmetic."""
        if ratio_of == "total":
            base, what = self.total_updates(), "of the budget"
        else:
            base, what = self.updates_per_epoch(), "per epoch"
        if base is None:
            self.skip(src, value, f"a share {what}: the number of updates needs the training data's size, "
                                  f"which the import could not read; set {key} (in updates)")
            self.to_set.append(key)
            return
        n = max(minimum, round(base * value)) if ratio_of == "total" else max(minimum, math.floor(base / value))
        self.put(src, key, int(n), f"{value} {what} = {n} updates, from {self.examples} training examples and "
                                   "the batch arithmetic")

    def read_examples(self) -> None:
        train = self.c["data"].get("train")
        if not train:
            return

        try:
            self.examples = len(read_records(self.out.parent / train))
        except BadInput:
            self.examples = None
