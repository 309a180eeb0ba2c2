"""What each run of a sweep needs, wherever it runs (here: ``sweep``, or on a Ray node: ``sweep_ray``): the
`pilotrun train` line that repeats it and the encoded examples runs with the same encoding share."""

from __future__ import annotations

from pilotrun.campaign.arms import Arm
from pilotrun.campaign.prepare import Prepared, prepare
from pilotrun.errors import BadInput
from pilotrun.journal.runs import command_line
from pilotrun.provenance import config_sha256
from pilotrun.tasks import make_task


def arm_command(campaign_path, arm: Arm, seed: int, sets: tuple[str, ...] = ()) -> str | None:
    """The `pilotrun train` line that repeats this one run of the sweep (the run README's "Reproduce"):
    the sweep's own ``--set`` items, then the arm's overrides, then the seed."""
    import json
    import shlex

    if campaign_path is None:
        return command_line()
    items = [*sets, *(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in arm.overrides.items())]
    return " ".join(["pilotrun train", shlex.quote(str(campaign_path)), *(f"--set {shlex.quote(i)}" for i in items),
                     f"--seed {seed}"])

def encoded_for(loaded, cache: dict):
    """train_run's ``prep`` and ``prepare_s``: the encoded examples of an earlier run with the same task, model and data
    sections (train.*, seed and plan keys do not change encoding), under this run's own task object."""
    import time

    d = loaded.resolved_dict()
    key = config_sha256({k: d.get(k) for k in ("task", "model", "data")})
    if key not in cache:
        t0 = time.perf_counter()
        cache[key] = prepare(loaded, splits=("train", "validation"))
        return {"prep": cache[key], "prepare_s": time.perf_counter() - t0}
    return {"prep": Prepared(loaded, make_task(loaded), cache[key].examples), "prepare_s": 0.0}


def check_sweep_id(sweep_id: str) -> None:
    """A sweep id a launch file may fix: letters, digits, '.', '_' and '-' (it names folders and a bucket)."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", sweep_id):
        raise BadInput(f"sweep id {sweep_id!r} is not letters, digits, '.', '_' and '-' (at most 100, a letter or "
                       f"digit first)", where="--id", fix="pass an id such as sweep-demo-1")


def launch_sweep_id(loaded) -> str:
    """The sweep id a launch file fixes: the campaign's name and its config sha256 (the plan is part of it), so
    a changed campaign gets a new id (a new sweep) and the same campaign the same one."""
    return f"sweep-{slug(loaded.c.name)[:40]}-{loaded.config_sha256()[:12]}"


def slug(name: str) -> str:
    """``name`` lower-cased, each character but ASCII letters, digits, '-' and '_' a '-': it names a sweep, a
    bucket and a scheduler's job, and `sweep --id` takes [A-Za-z0-9._-] only (check_sweep_id)."""
    return "".join(ch if (ch.isascii() and ch.isalnum()) or ch in "-_" else "-" for ch in name.lower()) or "campaign"
