"""The pilot's phases on one rank: the registry's (``phases.registry``: load → first_step → steady_step →
eval_longest → save → export → reload) through the one driver, each inside ``probe.recorder.phase``
so each gives one ledger row; plus the typical updates timed for the sheet and the test switch that
plants faults.

Every phase runs through the same functions as ``train`` (``make_state``, ``run_update``,
``evaluate``, ``save_state``, ``task.save_artifact``, ``task.load_artifact``) on the worst-case
inputs chosen from the encoded data (``phases.worst``). A phase that fails (oom, nan, error) does not
stop the phases that can still run; one that needs what a failed phase did not produce gets an error
row saying so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from pilotrun.campaign.prepare import prepare
from pilotrun.engine.control import control_predictions
from pilotrun.engine.distributed import barrier, default_device, world_rank
from pilotrun.engine.loop import evaluate, precompute_reference, run_update
from pilotrun.engine.sampler import UpdateSampler
from pilotrun.errors import BadInput
from pilotrun.journal.files import atomic_write_json
from pilotrun.phases import PHASES, names
from pilotrun.phases.driver import PhaseContext, drive
from pilotrun.phases.registry import BY_NAME
from pilotrun.phases.worst import worst_case
from pilotrun.probe.recorder import phase
from pilotrun.probe.watch import exact_updates
from pilotrun.sheet import shape
from pilotrun.tasks.base import loss_parts
from pilotrun.tasks.moe import ROUTINGS, forced_routing, moe_parts

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


def parse_inject(inject: dict | str | None) -> dict:
    """{"oom": "eval_longest"} or "oom:eval_longest,nan:first_step" (also from $PILOTRUN_PILOT_INJECT)."""
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


class _NanLoss:
    """The task with a NaN multiplied into its loss: what a diverged model hands the loop."""

    def __init__(self, task):
        self._task = task

    def __getattr__(self, name):
        return getattr(self._task, name)

    def loss(self, model, batch):
        s, n, parts = loss_parts(self._task.loss(model, batch))
        return s * float("nan"), n, parts

    def reload_loss(self, model, batch):
        s, n = getattr(self._task, "reload_loss", self._task.loss)(model, batch)
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


def run_phases(job: PilotJob, prep=None) -> list[dict]:
    """Every phase of the registry on this rank (``phases.driver``); returns this rank's rows (rank 0
    writes everyone's to the journal)."""
    prep = prep or prepare(job.loaded, splits=("train", "validation"))
    world, rank = world_rank()
    device = default_device()
    short = job.inject.get("short")
    short = BY_NAME[short].kind if short in names("train", "eval") else None
    ctx = PhaseContext(prep, worst_case(prep, world, short=short), device=device, rank=rank, world=world,
                       run_dir=job.run_dir, plant=lambda name, task: _plant(job, name, task))

    def measured(name: str, inputs: dict):
        return phase(name, inputs, rank=rank, rows=ctx.rows, device=device, memory_limit=job.memory_limit,
                     catch_errors=True)

    def time_model(ctx) -> None:
        if ctx.state is not None and all(r["verdict"] == "ok" for r in ctx.rows):
            _time_model(job, prep, ctx.state, ctx.worst, rank, world)

    drive(ctx, measured, after={names("train")[-1]: time_model})
    barrier()
    return ctx.rows


def _time_model(job: PilotJob, prep, state, wc: dict, rank: int, world: int) -> None:
    """Time updates the campaign's sampler draws, chosen at the budget's quantiles of padded tokens, and count the
    budget's padded tokens (sheet/shape.py); rank 0 writes ``time_model.json`` into the run folder. Not a ledger
    row: the worst case stays the bound."""
    import time

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
    sampler = UpdateSampler.for_train(t, len(prep.train), c.seed, rank, world)
    budget, keys = shape.budget_shapes(prep.train, t, c.seed, prep.arithmetic()["updates"], rank, world)
    picks, drawn = iter(shape.typical_order(budget)), []
    typical = []
    worst = (shape.padded_tokens(wc["micro_batches"]), worst_s)
    while shape.more_typical(typical, world, worst):
        i = next(picks, len(drawn))  # past the chosen ones (a budget of fewer updates): the sampler's next
        while len(drawn) <= i:
            drawn.append(sampler.next_update())
        mbs = [[prep.train[j] for j in mb] for mb in drawn[i]]
        # a precomputed reference's pairs, outside the timing: the values (of the pilot's updated model) time only
        precompute_reference(state.model, prep.task, [e for mb in mbs for e in mb], device=state.device,
                             precision=state.precision, batch_size=t.eval_batch)
        _sync(default_device())
        t0 = time.perf_counter()
        run_update(state, prep.task, mbs, max_grad_norm=t.max_grad_norm)
        _sync(default_device())
        typical.append({"tokens": shape.padded_tokens(mbs), "seconds": time.perf_counter() - t0})
    routing = _routing(prep, state, wc, rank)
    pool = prep.validation or prep.train
    worst_eval = shape.padded_tokens([wc["eval"][rank::world][: t.eval_batch]]) if wc["eval"] else 0
    eval_tokens = shape.eval_tokens(pool, t.eval_batch, rank, world)
    typical_eval = _typical_evals(state, prep.task, pool, t.eval_batch, eval_tokens, worst_eval) \
        if eval_s and world == 1 else []
    control_s, warm_load_s = _run_extras(prep, state, rank)
    model = {"worst_update_tokens": worst[0], "typical": typical,
             "worst_update_s": worst_s, "worst_eval_s": eval_s, "control_s": control_s, "warm_load_s": warm_load_s,
             "budget_update_tokens": budget, "exact_updates": exact_updates(keys), "worst_eval_tokens": worst_eval,
             "eval_batch_tokens": eval_tokens, "typical_eval": typical_eval,
             **({"routing": routing} if routing else {})}
    barrier()
    if rank == 0:
        atomic_write_json(Path(job.run_dir) / "time_model.json", model)


def _typical_evals(state, task, pool: list, batch: int, tokens: list[int], worst_tokens: int) -> list[dict]:
    """Validation batches a run's validation takes (``pool`` in ``batch``-sized batches, of ``tokens`` padded tokens:
    shape.eval_tokens), timed as it takes them (``evaluate``, no memory counter): the one of median padded tokens and
    the smallest, where they are shorter than the worst case. With the worst case they are the validation's line of
    seconds over tokens (sheet/shape.py ``scaled_units``): a forward pass's fixed share is its own, not the update's,
    which was assumed before (on the demo the two agree: its batch of 136 tokens timed 0.18 of its worst batch of
    1,088, the update's share read 0.20). Each is one batch, shorter than the worst case's. One process only: ranks
    would time different batches, and a forward one rank takes alone waits on the others' collectives (the worst
    case's fixed share is used there)."""
    import time

    batches = [pool[i: i + batch] for i in range(0, len(pool), batch)]
    shorter = sorted((tok, i) for i, tok in enumerate(tokens) if tok < worst_tokens)
    chosen = sorted({i for _, i in (shorter[len(shorter) // 2], shorter[0])} if shorter else set())
    out = []
    for i in chosen:
        # a precomputed reference's pairs, outside the timing (a run precomputes every pair before its first update)
        precompute_reference(state.model, task, batches[i], device=state.device, precision=state.precision,
                             batch_size=batch)
        _sync(default_device())
        t0 = time.perf_counter()
        evaluate(state, task, batches[i], batch)
        _sync(default_device())
        out.append({"tokens": tokens[i], "seconds": time.perf_counter() - t0})
    return out


def _routing(prep, state, wc: dict, rank: int) -> dict | None:
    """A mixture of experts' worst-case update, and its worst validation batches, once more under each forced
    routing (tasks/moe.forced_routing: balanced, and every token to the same top-k experts), each under the exact
    memory counter: the rise of its peak tensor bytes above its start, and its seconds. The router's own choice
    depends on the data and on the weights, which move, so a run's update or validation can route the same shapes
    worse than the pilot's router did. The sheet sizes each of the two phases for the highest
    (probe/watch.routing_worst), and a run's peaks are judged against it. None for a dense model (or experts that
    take no routing: Llama 4's)."""
    model = getattr(state.model, "module", state.model)
    if not any(moe_parts(model)[1:]):
        return None
    out = {}
    for mode in ROUTINGS:
        rows: list = []
        with forced_routing(model, mode) as forced:
            if not forced:
                return None
            with phase(f"steady_step ({mode} routing)", {}, rank=rank, rows=rows, device=default_device()):
                run_update(state, prep.task, wc["micro_batches"], max_grad_norm=prep.c.train.max_grad_norm)
            if wc["eval"]:
                with phase(f"eval_longest ({mode} routing)", {}, rank=rank, rows=rows, device=default_device()):
                    evaluate(state, prep.task, wc["eval"], prep.c.train.eval_batch)
        out[mode] = {"peak_allocated": rows[0]["peak_allocated"] - rows[0]["baseline"],
                     "seconds": rows[0]["duration_s"],
                     **({"eval_peak_allocated": rows[1]["peak_allocated"] - rows[1]["baseline"],
                         "eval_seconds": rows[1]["duration_s"]} if len(rows) > 1 else {})}
    return out


def _run_extras(prep, state, rank: int) -> tuple[float | None, float | None]:
    """Seconds of two things every run of a sweep does outside its timed blocks, measured here as they run
    there: the control predictions (engine/control.py ``control_predictions``: rank 0 on the
    plain model, every rank under FSDP), and, for a model built from a config, a second, warm build (the
    sweep's later runs build in a process that has imported everything; a pretrained model's warm load is
    a read from disk, which the ``reload`` phase measures)."""
    import time

    fsdp = prep.c.train.strategy == "fsdp"
    control_s = None
    if rank == 0 or fsdp:
        model = state.model if fsdp else getattr(state.model, "module", state.model)
        t0 = time.perf_counter()
        control_predictions(prep, model)
        control_s = time.perf_counter() - t0
        model.train()
    warm_load_s = None
    if prep.c.model.config is not None:
        t0 = time.perf_counter()
        built = prep.task.build_model()
        warm_load_s = time.perf_counter() - t0
        del built
    return control_s, warm_load_s


def _sync(device) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)
