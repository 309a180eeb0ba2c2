"""The resume check's runs on FSDP ranks: the model is sharded, so its state only exists across ranks.

``resume`` runs the reference and the run stopped at K as ``train.nproc`` spawned ranks (one launch:
each rank trains both, the stopped one writes its shards with ``save_state``, the reference's full
model is gathered into the artifact and its control predictions stored by rank 0); the fresh process
(``_resume-worker``) then launches as many new ranks, each loading its own shards into a freshly
sharded model (``load_state``) and continuing. Rank 0's history (its micro-batches' ids, the loss over
all ranks) is what is compared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path


def _sharded_model(prep, device):
    import torch

    from pilotrun.engine.distributed import wrap_model

    model = prep.task.build_model()
    torch.manual_seed(prep.c.seed)
    return wrap_model(model, "fsdp", device)


def _run(prep, train_ex, total: int, stop_at: int | None, device):
    from pilotrun.engine.loop import Hooks, make_state, train

    c = prep.c
    state = make_state(_sharded_model(prep, device), c.train, n_train=len(train_ex), seed=c.seed,
                       total_updates=total, device=device)
    return state, train(state, prep.task, train_ex, [], c.train, hooks=Hooks(stop_at=stop_at))


def runs_rank(job: dict) -> None:
    """One rank of the reference and the stopped run (module level: pickled into spawned processes)."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.artifact import export_artifact
    from pilotrun.engine.distributed import default_device, world_rank
    from pilotrun.engine.state import save_state
    from pilotrun.journal.files import atomic_write_json
    from pilotrun.journal.runs import RunRecorder
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.prepare import prepare
    from pilotrun.rehearsal.training.train import control_predictions, store_control_predictions

    rank, keep = world_rank()[1], job["keep"]
    prep = prepare(load_campaign(job["config"]), splits=("train", "validation"))
    train_ex, device = prep.train[: job["n_train"]], default_device()
    ref_state, ref = _run(prep, train_ex, job["total"], None, device)
    stop_state, stopped = _run(prep, train_ex, job["total"], job["at"], device)
    save_state(stop_state, job["state"], skip=tuple(job["skip"]))
    artifact = export_artifact(prep.task, ref_state.model, Path(job["run_dir"]) / "artifact", rank, "fsdp")
    computed = control_predictions(prep, ref_state.model)  # every rank takes part in the forward passes
    if rank != 0:
        return
    rec = RunRecorder.attach(Journal(job["home"]), job["run_id"])
    store_control_predictions(rec, prep, ref_state.model, computed)
    rec.flush()
    atomic_write_json(job["out"], {
        "ref": {"status": ref.status, "reason": ref.reason, "history": [{k: h[k] for k in keep} for h in ref.history]},
        "stopped": [{k: h[k] for k in keep} for h in stopped.history], "artifact": artifact,
        "update": ref_state.update, "examples_seen": ref_state.examples_seen})


def worker_rank(spec: dict) -> None:
    """One rank of the fresh process's run: its shards loaded into a new sharded model, then on to 2K."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.distributed import default_device, world_rank
    from pilotrun.engine.loop import make_state, train
    from pilotrun.engine.state import load_state
    from pilotrun.journal.files import atomic_write_json
    from pilotrun.rehearsal.prepare import prepare

    prep = prepare(load_campaign(spec["config"]), splits=("train",))
    c, device = prep.c, default_device()
    train_ex = prep.train[: spec["n_train"]]
    state = make_state(_sharded_model(prep, device), c.train, n_train=len(train_ex), seed=c.seed,
                       total_updates=spec["total"], device=device)
    restored = load_state(state, spec["state"])
    res = train(state, prep.task, train_ex, [], c.train)
    if world_rank()[1] == 0:
        atomic_write_json(spec["out"], {"restored": restored, "status": res.status, "reason": res.reason,
                                        "pid": os.getpid(), "ranks": world_rank()[0],
                                        "history": [{k: h[k] for k in spec["keep"]} for h in res.history]})


def run_sharded(spec: dict, ranks: int) -> dict:
    """Launch the reference and stopped runs on ``ranks`` ranks; returns rank 0's outcome."""
    from pilotrun.engine.distributed import launch

    launch(runs_rank, ranks, (spec,))
    return json.loads(Path(spec["out"]).read_text())


def work_sharded(spec: dict) -> None:
    from pilotrun.engine.distributed import launch

    launch(worker_rank, spec["ranks"], (spec,))
