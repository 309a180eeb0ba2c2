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
    until: str | None = None
    """A campaign key that settles it once set (val_set_size: data.validation): then it is no longer said."""


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
    schemas: list[str] = field(default_factory=list)
    """The tools' schemas the keys were checked against (version and source)."""

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.fmt, "detected": self.detected, "source": str(self.source), "out": str(self.out),
                "carried": [c.__dict__ for c in self.carried],
                "not_carried": [n.__dict__ for n in self.not_carried], "to_set": self.to_set,
                "schemas": self.schemas}



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
        self.examples: int | None = None  # training examples, when the data file could be read
        self.split_off: str | None = None  # the validation share the source splits off the training records

    def put(self, src: str, key: str, value: Any, note: str = "") -> None:
        node = self.c
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        self.carried = [c for c in self.carried if c.key != key]  # carried again: the later value stands
        self.carried.append(Carried(src, key, value, note))

    def skip(self, key: str, value: Any, reason: str, until: str | None = None) -> None:
        self.not_carried.append(NotCarried(key, value, reason, until))

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

    def updates_per_epoch(self) -> int | None:
        """Updates per epoch as the Trainer counts them: ceil(examples / (micro_batch x ranks)) // accumulation, at
        least 1, from the training examples left after the source's own validation split."""
        t = self.c["train"]
        if self.examples is None:
            return None
        batches = math.ceil(self.examples / (t.get("micro_batch", 2) * t.get("nproc", 1)))
        return max(batches // t.get("accumulation", 8), 1)

    def total_updates(self) -> int | None:
        t = self.c["train"]
        if t.get("updates"):
            return t["updates"]
        upe = self.updates_per_epoch()
        return None if upe is None or not t.get("epochs") else math.ceil(upe * t["epochs"])

    def counted(self) -> str:
        split = f" (left after the source's validation split of {self.split_off})" if self.split_off else ""
        return f"{self.examples} training examples{split} and the batch arithmetic"

    def unknown_count(self, src: str, key: str, value: Any, what: str) -> None:
        self.skip(src, value, f"{what}: the number of updates needs the training data's size, which the import could "
                              f"not read; set {key} (in updates)")
        self.to_set.append(key)

    def share(self, src: str, key: str, value: float, *, rounding: str = "ceil", minimum: int = 1,
              tool: str = "the Trainer") -> int | None:
        """Carry a share of the budget as updates, rounded as the source tool rounds it (the Trainer takes the
        ceiling of warmup and of save/eval steps below 1; Axolotl floors its warmup_ratio)."""
        total = self.total_updates()
        if total is None:
            self.unknown_count(src, key, value, "a share of the budget")
            return None
        exact = total * float(value)
        n = max(minimum, math.ceil(exact - 1e-9) if rounding == "ceil" else math.floor(exact + 1e-9))
        self.put(src, key, int(n), f"{value} of {total} updates = {plural(n)} ({tool} takes the "
                                   f"{'ceiling' if rounding == 'ceil' else 'floor'}), from {self.counted()}")
        return n

    def per_epoch(self, src: str, key: str, count: int) -> int | None:
        """Carry N per epoch as updates between them, as Axolotl does: the share 1 / (N x epochs) of the budget,
        its ceiling (the Trainer's rule for a share)."""
        total, epochs = self.total_updates(), self.c["train"].get("epochs") or 1
        if total is None:
            self.unknown_count(src, key, count, "a count per epoch")
            return None
        n = max(1, math.ceil(total / (count * epochs) - 1e-9))
        self.put(src, key, int(n), f"{count} per epoch over {epochs:g} epoch(s) of {total} updates = every "
                                   f"{plural(n)}, from {self.counted()}")
        return n

    def read_examples(self, split_off: Any = None) -> None:
        """Count the training records; ``split_off`` (Axolotl's val_set_size: a share below 1, or a count) is taken
        off as the source's own split does (datasets' train_test_split: the test side is the ceiling of a share)."""
        train = self.c["data"].get("train")
        if not train:
            return
        try:
            n = len(read_records(self.out.parent / train))
        except BadInput:
            self.examples = None
            return
        if split_off:
            v = float(split_off)
            held = math.ceil(n * v) if v < 1 else int(v)
            n = max(n - held, 0)
            self.split_off = f"{split_off}: {held} records"
        self.examples = n


def plural(n: int) -> str:
    return f"{n} update" + ("" if n == 1 else "s")
