"""Shared set-up of the stages: campaign → task → encoded splits; provenance for the journal."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.consistency import check_consistency
from pilotrun.tasks import make_task
from pilotrun.tasks.common import SPLITS

PACKAGES = ("pilotrun", "torch", "transformers", "peft", "safetensors", "numpy", "pyarrow", "pydantic")


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
    check_consistency(loaded.campaign, loaded.base_dir)
    task = make_task(loaded)
    examples = {}
    for split in splits:
        records = task.records(split)
        if records:
            examples[split] = [task.encode(r) for r in records]
    return Prepared(loaded, task, examples)


def git_revision(folder: str | Path | None) -> str | None:
    if folder is None:
        return None
    try:
        rev = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def data_fingerprints(c) -> dict[str, dict]:
    from pilotrun.data.readers import fingerprint

    return {s: {"path": getattr(c.data, s), "sha256": fingerprint(getattr(c.data, s))}
            for s in SPLITS if getattr(c.data, s)}


def run_provenance(loaded) -> dict:
    c = loaded.campaign
    return {"config": loaded.resolved_dict(), "config_sha256": loaded.config_sha256(),
            "campaign_path": str(loaded.source) if loaded.source else None, "seed": c.seed,
            "git_rev": git_revision(loaded.base_dir), "packages": package_versions(),
            "data": data_fingerprints(c), "trust_remote_code": c.model.trust_remote_code}
