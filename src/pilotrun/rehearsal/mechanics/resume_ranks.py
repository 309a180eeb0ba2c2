"""The resume check's runs on FSDP ranks: the model is sharded, so its state only exists across ranks.

``resume`` runs the reference and the second run to K as ``train.nproc`` spawned ranks (one launch:
each rank trains both, the reference writes its shards with ``save_state`` at K and goes on, its full
model is gathered into the artifact and its control predictions stored by rank 0); the fresh process
(``_resume-worker``) then launches as many new ranks, each loading its own shards into a freshly
sharded model (``load_state``) and continuing. Rank 0's history (its micro-batches' ids, the loss over
all ranks) is what is compared.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pilotrun.campaign.load import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.engine.artifact import export_artifact
from pilotrun.engine.control import control_predictions, store_control_predictions
from pilotrun.engine.distributed import (barrier, broadcast_from_rank0, default_device, exit_rank, free_port,
    gather_to_rank0, init_from_launcher, launch, under_launcher, world_rank, wrap_model)
from pilotrun.engine.loop import Hooks, make_state, train
from pilotrun.engine.state import load_state, save_state
from pilotrun.journal.files import atomic_write_json
from pilotrun.journal.runs import RunRecorder
from pilotrun.journal.store import Journal
from pilotrun import jsonsafe


def _sharded_model(prep, device, strategy: str = "fsdp"):
    import torch

    model = prep.task.build_model()
    torch.manual_seed(prep.c.seed)
    return wrap_model(model.to(device) if strategy == "ddp" else model, strategy, device)


def saving_at(at: int, path, skip) -> Hooks:
    """The reference's hooks: its whole state saved at update K, where the loop saves its checkpoints, as a
    run that is preempted later resumes from it; the reference goes on to 2K in the same call of the loop."""
    def save(state) -> None:
        if state.update == at:
            save_state(state, path, skip=tuple(skip))
    return Hooks(at_checkpoint=save)


def _run(prep, train_ex, total: int, device, strategy: str, hooks: Hooks):
    c = prep.c
    state = make_state(_sharded_model(prep, device, strategy), c.train, n_train=len(train_ex), seed=c.seed,
                       total_updates=total, device=device)
    return state, train(state, prep.task, train_ex, [], c.train, hooks=hooks)


def runs_rank(job: dict) -> None:
    """One rank of the reference (its state saved at K) and of the second run to K, which shows the reference
    reproducible (module level: pickled into spawned processes)."""
    rank, keep, strategy = world_rank()[1], job["keep"], job.get("strategy", "fsdp")
    prep = prepare(load_campaign(job["config"]), splits=("train", "validation"))
    train_ex, device = prep.train[: job["n_train"]], default_device()
    ref_state, ref = _run(prep, train_ex, job["total"], device, strategy,
                          saving_at(job["at"], job["state"], job["skip"]))
    _, again = _run(prep, train_ex, job["total"], device, strategy, Hooks(stop_at=job["at"]))
    artifact = export_artifact(prep.task, ref_state.model, Path(job["run_dir"]) / "artifact", rank, strategy)
    computed = control_predictions(prep, ref_state.model)  # every rank takes part in the forward passes
    if rank != 0:
        return
    rec = RunRecorder.attach(Journal(job["home"]), job["run_id"])
    store_control_predictions(rec, prep, ref_state.model, computed)
    rec.flush()
    atomic_write_json(job["out"], {
        "ref": {"status": ref.status, "reason": ref.reason, "history": [{k: h[k] for k in keep} for h in ref.history]},
        "again": [{k: h[k] for k in keep} for h in again.history], "artifact": artifact,
        "update": ref_state.update, "examples_seen": ref_state.examples_seen})


def worker_rank(spec: dict) -> None:
    """One rank of the fresh process's run: its shards loaded into a new sharded model, then on to 2K."""
    prep = prepare(load_campaign(spec["config"]), splits=("train",))
    c, device = prep.c, default_device()
    train_ex = prep.train[: spec["n_train"]]
    state = make_state(_sharded_model(prep, device, spec.get("strategy", "fsdp")), c.train, n_train=len(train_ex),
                       seed=c.seed, total_updates=spec["total"], device=device)
    restored = load_state(state, spec["state"])
    res = train(state, prep.task, train_ex, [], c.train)
    if world_rank()[1] == 0:
        atomic_write_json(spec["out"], {"restored": restored, "status": res.status, "reason": res.reason,
                                        "pid": os.getpid(), "ranks": world_rank()[0],
                                        "history": [{k: h[k] for k in spec["keep"]} for h in res.history]})


def run_sharded(spec: dict, ranks: int) -> dict:
    """Launch the reference and the second run on ``ranks`` ranks; returns rank 0's outcome."""
    launch(runs_rank, ranks, (spec,))
    return jsonsafe.loads(Path(spec["out"]).read_text())


def work_sharded(spec: dict) -> None:
    """The fresh process's ranks: spawned here, or this process is one of them (``run_joined`` started it
    with a rank of a new world in its environment)."""
    if under_launcher():
        init_from_launcher()
        worker_rank(spec)
        exit_rank(0)  # gloo's threads can abort an interpreter's finalisation (engine/distributed.exit_rank)
    launch(worker_rank, spec["ranks"], (spec,))


def run_joined(job: dict, spec: dict) -> tuple[dict | None, dict | None, list]:
    """On every rank of a world torchrun started (several nodes): ``runs_rank(job)``, the reference and the
    second run on this world (DDP or FSDP as the campaign says); then the fresh processes — each rank starts
    one ``_resume-worker`` of ``spec`` holding its own rank of a new world of the same size, at torchrun's
    MASTER_ADDR (rank 0's node) and a port rank 0 chose. Rank 0 gets (the runs' outcome, the fresh run's or
    None, every rank's (exit status, output tail) of its fresh process); the others (None, None, [])."""
    import subprocess
    import sys
    import tempfile

    runs_rank(job)
    barrier()
    rank = world_rank()[1]
    port = broadcast_from_rank0(free_port() if rank == 0 else None)
    with tempfile.TemporaryDirectory(prefix="pilotrun-resume-") as tmp:
        path = Path(tmp) / "spec.json"
        path.write_text(json.dumps(spec))
        proc = subprocess.run([sys.executable, "-m", "pilotrun", "_resume-worker", str(path)],
                              env=_fresh_world_env(port), capture_output=True, text=True,
                              timeout=3600)
    workers = gather_to_rank0((proc.returncode, (proc.stderr or proc.stdout).strip().splitlines()[-5:]))
    if rank != 0:
        return None, None, []
    ok = all(code == 0 for code, _ in workers)
    return (jsonsafe.loads(Path(job["out"]).read_text()), jsonsafe.loads(Path(spec["out"]).read_text()) if ok else None,
            workers)


def _fresh_world_env(port: int) -> dict:
    """This rank's environment for its fresh process: the same RANK, WORLD_SIZE and MASTER_ADDR, a new port
    rank 0's fresh process serves the store on (not torchrun's agent store, which that one would wait for)."""
    env = {k: v for k, v in os.environ.items() if k != "TORCHELASTIC_USE_AGENT_STORE"}
    env["MASTER_PORT"] = str(port)
    return env
