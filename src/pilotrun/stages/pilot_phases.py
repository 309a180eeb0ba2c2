"""The pilot's phases on one rank: load → first_step → steady_step → eval_longest → save → export → reload.

Every phase runs through the same functions as ``train`` (``make_state``, ``run_update``,
``evaluate``, ``save_state``, ``task.save_artifact``, ``task.load_artifact``) on the worst-case
inputs chosen from the encoded data, inside ``probe.recorder.phase`` so each gives one ledger row.
A phase that fails (oom, nan, error) does not stop the phases that can still run; one that needs
what a failed phase did not produce gets an error row saying so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pilotrun.probe.recorder import NonFinite, phase

PHASES = ("load", "first_step", "steady_step", "eval_longest", "save", "export", "reload")
INJECT_KINDS = ("oom", "nan", "error", "short")
# Test switch: "oom:eval_longest,nan:first_step". "short:steady_step" (or first_step) feeds the train
# phases the shortest examples instead of the longest, "short:eval_longest" the evaluation: a pilot
# that did not see the worst case, which the runs' memory bound (probe/watch.py) must then flag.
INJECT_ENV = "PILOTRUN_PILOT_INJECT"


@dataclass
class PilotJob:
    """What every rank needs (picklable: it crosses into spawned processes)."""

    loaded: object
    home: str
    run_id: str
    run_dir: str
    memory_limit: int | None
    inject: dict = field(default_factory=dict)  # kind -> phase


def by_length(examples: list) -> list:
    """Longest first (ties: more targets first), so the first micro-batch is the widest padded one."""
    return sorted(examples, key=lambda e: (e.length, e.n_targets), reverse=True)


def padded(chosen: list, pool: list) -> list:
    """``chosen`` (longest first), with its last example swapped for the longest shorter one of ``pool`` when
    every chosen example has the same length and ``pool`` has a shorter one: a batch with padding makes
    the model build an attention mask (batch × length² elements) that a batch without any does not, so a
    campaign with uneven lengths will meet the padded batch at the longest length."""
    if len(chosen) < 2 or chosen[-1].length < chosen[0].length:
        return chosen
    ids = {id(e) for e in chosen}
    shorter = [e for e in pool if e.length < chosen[0].length and id(e) not in ids]
    return chosen[:-1] + by_length(shorter)[:1] if shorter else chosen


def worst_case(prep, world: int, short: str | None = None) -> dict:
    """The inputs each rank gets: one full update of ``accumulation`` micro-batches of ``micro_batch`` from
    the longest training examples, and the longest validation examples as ``eval_batch`` per rank.

    The widest micro-batch comes last, when the gradients of the earlier ones are already held (the
    heaviest moment of any update), and holds padding when the data can pad it (``padded``).
    ``short`` ("train" or "eval", the test switch only) takes the shortest instead."""
    t = prep.c.train
    per_rank = t.micro_batch * t.accumulation
    order = by_length(prep.train)
    longest = (order[::-1] if short == "train" else order)[:per_rank]
    if short == "train":
        longest = by_length(longest)
    else:
        longest = padded(longest[: t.micro_batch], prep.train) + longest[t.micro_batch:]
    micro_batches = [longest[i: i + t.micro_batch] for i in range(0, len(longest), t.micro_batch)][::-1]
    pool = prep.validation or prep.train
    order = by_length(pool)
    evals = by_length((order[::-1] if short == "eval" else order)[: t.eval_batch * world])
    if short != "eval" and world == 1:
        evals = padded(evals, pool)
    train_inputs = {"micro_batch": t.micro_batch, "accumulation": t.accumulation, "ranks": world,
                    "seq_len": max(e.length for e in longest), "precision": t.precision}
    eval_inputs = {"eval_batch": t.eval_batch, "seq_len": evals[0].length if evals else 0, "precision": t.precision}
    if not prep.validation:
        eval_inputs["split"] = "train (no validation split)"
    return {"micro_batches": micro_batches, "train_inputs": train_inputs, "eval": evals, "eval_inputs": eval_inputs}


def parse_inject(inject: dict | str | None) -> dict:
    """{"oom": "eval_longest"} or "oom:eval_longest,nan:first_step" (also from $PILOTRUN_PILOT_INJECT)."""
    from pilotrun.errors import BadInput

    if inject is None:
        inject = os.environ.get(INJECT_ENV) or {}
    if isinstance(inject, str):
        pairs = [p.split(":", 1) for p in inject.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise BadInput(f"cannot read {inject!r}", where=INJECT_ENV, fix="write KIND:PHASE, e.g. oom:eval_longest")
        inject = {k.strip(): v.strip() for k, v in pairs}
    for kind, name in inject.items():
        if kind not in INJECT_KINDS or name not in PHASES:
            raise BadInput(f"cannot plant {kind!r} in {name!r}", where=INJECT_ENV,
                           fix=f"kinds: {', '.join(INJECT_KINDS)}; phases: {', '.join(PHASES)}")
    return dict(inject)


class NotRun(Exception):
    """A phase that needs what an earlier, failed phase did not produce."""


class _NanLoss:
    """The task with a NaN multiplied into its loss: what a diverged model hands the loop."""

    def __init__(self, task):
        self._task = task

    def __getattr__(self, name):
        return getattr(self._task, name)

    def loss(self, model, batch):
        s, n = self._task.loss(model, batch)
        return s * float("nan"), n


def _plant(job: PilotJob, name: str, task):
    """The task to use in phase ``name``; raises the planted fault where the test switch asks for one."""
    kinds = {k for k, p in job.inject.items() if p == name and k != "short"}
    if "oom" in kinds:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (planted in phase {name} "
                                     f"by the test switch {INJECT_ENV})")
    if "error" in kinds:
        raise RuntimeError(f"planted error in phase {name} ({INJECT_ENV})")
    return _NanLoss(task) if "nan" in kinds else task


def _unwrap(model):
    return getattr(model, "module", model)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _count(model) -> tuple[int, int]:
    ps = list(model.parameters())
    return sum(p.numel() for p in ps), sum(p.numel() for p in ps if p.requires_grad)


def run_phases(job: PilotJob, prep=None) -> list[dict]:
    """Every phase on this rank; returns this rank's rows (rank 0 writes everyone's to the journal)."""
    import torch

    from pilotrun.engine.distributed import default_device, is_initialized, world_rank, wrap_model
    from pilotrun.engine.loop import evaluate, make_state, run_update
    from pilotrun.engine.precision import autocast
    from pilotrun.engine.state import save_state
    from pilotrun.probe.tensors import track
    from pilotrun.stages.prepare import prepare

    prep = prep or prepare(job.loaded, splits=("train", "validation"))
    c, task = prep.c, prep.task
    world, rank = world_rank()
    device = default_device()
    short = job.inject.get("short")
    wc = worst_case(prep, world, short={"first_step": "train", "steady_step": "train",
                                        "eval_longest": "eval"}.get(short))
    run_dir = Path(job.run_dir)
    rows: list[dict] = []
    done: set[str] = set()

    def measured(name: str, inputs: dict):
        return phase(name, inputs, rank=rank, rows=rows, device=device, memory_limit=job.memory_limit,
                     catch_errors=True)

    def skipped(name: str, inputs: dict, needs: str) -> None:
        failed = next((r for r in rows if r["phase"] == needs), None)
        why = f"ended with {failed['verdict']}" if failed else "did not run"
        with measured(name, inputs):
            raise NotRun(f"phase {needs} {why}")

    state = None
    with measured("load", {"dtype": c.model.dtype, "precision": c.train.precision, "strategy": c.train.strategy,
                           "adapter": c.model.adapter is not None}) as p:
        _plant(job, "load", task)
        model = task.build_model()
        p.inputs["params"], p.inputs["trainable"] = _count(model)
        model.to(device)
        model = wrap_model(model, c.train.strategy, device)
        state = make_state(model, c.train, n_train=len(prep.train), seed=c.seed,
                           total_updates=prep.arithmetic()["updates"], device=device)
        track(model)  # tensors a loader made without an operator (safetensors) still count, as in a run
        done.add("load")

    for name in ("first_step", "steady_step"):
        if state is None:
            skipped(name, wc["train_inputs"], "load")
            continue
        with measured(name, dict(wc["train_inputs"])) as p:
            out = run_update(state, _plant(job, name, task), wc["micro_batches"], max_grad_norm=c.train.max_grad_norm)
            p.inputs["targets"] = out["targets"]
            if not out["finite"]:
                p.nan(f"the update's loss is {out['loss']} (seq_len {wc['train_inputs']['seq_len']}, "
                      f"micro_batch {c.train.micro_batch}); the optimizer step was skipped")

    if state is not None and all(r["verdict"] == "ok" for r in rows):
        _time_model(job, prep, state, wc, rank, world)

    if state is None:
        skipped("eval_longest", wc["eval_inputs"], "load")
    else:
        with measured("eval_longest", dict(wc["eval_inputs"])) as p:
            ev = evaluate(state, _plant(job, "eval_longest", task), wc["eval"], c.train.eval_batch)
            p.check_finite(ev["val_loss"], "the validation loss")

    ckpt = run_dir / "checkpoints" / "pilot"
    if state is None:
        skipped("save", {"path": "checkpoints/pilot"}, "load")
    else:
        with measured("save", {"path": "checkpoints/pilot"}) as p:
            _plant(job, "save", task)
            save_state(state, ckpt)  # every rank calls it; rank 0 writes
            if rank == 0:
                p.inputs["bytes"] = _dir_bytes(ckpt)

    art = run_dir / "artifact"
    written: list[str] = []
    if state is None:
        skipped("export", {"path": "artifact"}, "load")
    else:
        with measured("export", {"path": "artifact"}) as p:
            _plant(job, "export", task)
            written = export_artifact(task, state.model, art, rank, c.train.strategy)
            if rank == 0:
                p.inputs.update(parts=written, bytes=_dir_bytes(art))
            done.add("export")

    sample = by_length(prep.validation or prep.train)[:1]
    if "export" not in done:
        skipped("reload", {"path": "artifact"}, "export")
    else:
        with measured("reload", {"path": "artifact", "parts": written, "seq_len": sample[0].length}):
            reload_task = _plant(job, "reload", task)
            if rank == 0:
                for part in written:
                    loaded_model = task.load_artifact(art / part).to(device)
                    loaded_model.eval()
                    with torch.no_grad(), autocast(c.train.precision, device.type):
                        batch = {k: (v.to(device) if hasattr(v, "to") else v)
                                 for k, v in task.collate(sample).items()}
                        s, n = reload_task.loss(loaded_model, batch)
                    loss = float(s) / max(1, int(n))
                    if loss != loss or loss in (float("inf"), float("-inf")):
                        raise NonFinite(f"the reloaded artifact/{part} gives the loss {loss}")
                    del loaded_model
    if is_initialized():
        torch.distributed.barrier()
    return rows


def _time_model(job: PilotJob, prep, state, wc: dict, rank: int, world: int) -> None:
    """Time the first updates the campaign's sampler draws and count the budget's padded tokens (sheet/shape.py);
    rank 0 writes ``time_model.json`` into the run folder. Not a ledger row: the worst case stays the bound."""
    import time

    from pilotrun.engine.distributed import barrier, default_device
    from pilotrun.engine.loop import run_update
    from pilotrun.engine.sampler import UpdateSampler
    from pilotrun.journal.files import atomic_write_json
    from pilotrun.sheet import shape

    from pilotrun.engine.loop import evaluate

    c, t = prep.c, prep.c.train
    # the worst case once more without the exact memory counter, whose dispatch slows the measured phases
    _sync(default_device())
    t0 = time.perf_counter()
    run_update(state, prep.task, wc["micro_batches"], max_grad_norm=t.max_grad_norm)
    _sync(default_device())
    worst_s = time.perf_counter() - t0
    eval_s = None
    if wc["eval"]:
        t0 = time.perf_counter()
        evaluate(state, prep.task, wc["eval"], t.eval_batch)
        _sync(default_device())
        eval_s = time.perf_counter() - t0
    sampler = UpdateSampler(len(prep.train), t.micro_batch, t.accumulation, c.seed, t.drop_last, rank, world)
    typical = []
    for _ in range(shape.TYPICAL_UPDATES):
        mbs = [[prep.train[i] for i in mb] for mb in sampler.next_update()]
        _sync(default_device())
        t0 = time.perf_counter()
        run_update(state, prep.task, mbs, max_grad_norm=t.max_grad_norm)
        _sync(default_device())
        typical.append({"tokens": shape.padded_tokens(mbs), "seconds": time.perf_counter() - t0})
    pool = prep.validation or prep.train
    model = {"worst_update_tokens": shape.padded_tokens(wc["micro_batches"]), "typical": typical,
             "worst_update_s": worst_s, "worst_eval_s": eval_s,
             "budget_update_tokens": shape.budget_tokens(prep.train, t, c.seed, prep.arithmetic()["updates"], rank,
                                                         world),
             "worst_eval_tokens": shape.padded_tokens([wc["eval"][rank::world][: t.eval_batch]]) if wc["eval"] else 0,
             "eval_batch_tokens": shape.eval_tokens(pool, t.eval_batch, rank, world)}
    barrier()
    if rank == 0:
        atomic_write_json(Path(job.run_dir) / "time_model.json", model)


def _sync(device) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def export_artifact(task, model, out_dir: Path, rank: int, strategy: str) -> list[str]:
    """Rank 0 writes the artifact (into a temporary folder renamed when complete); under FSDP every rank
    first helps gather the full weights."""
    from pilotrun.engine.distributed import barrier, broadcast_from_rank0
    from pilotrun.journal.files import write_dir_atomically

    if strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        written = []
        if rank == 0:
            plain = task.build_model()
            plain.load_state_dict(full)
            written = write_dir_atomically(out_dir, lambda tmp: task.save_artifact(plain, tmp))
        barrier()
        return broadcast_from_rank0(written)
    written = []
    if rank == 0:
        written = write_dir_atomically(out_dir, lambda tmp: task.save_artifact(_unwrap(model), tmp))
    barrier()
    return broadcast_from_rank0(written)


