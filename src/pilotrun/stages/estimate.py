"""estimate: the pilot's phases on fake tensors, for a device that is not here.

The same functions as the pilot run — ``task.build_model``, ``make_state`` (the optimizer of
engine/optim.py), ``run_update`` (``task.loss`` + backward + clip + step), ``evaluate`` — on the
same worst-case inputs (``phases.worst``): each phase's traced version from the registry, driven by
``phases.driver`` under ``probe.estimate.Accountant``. Nothing is allocated; one row per phase, shaped like the pilot's ledger rows and labelled as estimates.

Ranks: under ddp every rank holds everything, plus DDP's gradient buckets (one more copy of the
trainable parameters' gradients). Under fsdp the parameters, gradients and optimizer state are
divided by the ranks, activations are not, and two unsharded blocks (the one computing and the one
prefetched) are added as temporaries.
"""

from __future__ import annotations

import contextlib
import time

from pilotrun.phases import PHASES, names
from pilotrun.probe.estimate import CATEGORIES
from pilotrun.verdicts import StageResult

LEDGER_KEYS = ("phase", "rank", "device", "counter", "inputs", "baseline", "peak_allocated", "peak_reserved",
               "end_allocated", "end_reserved", "duration_s", "verdict", "note", *CATEGORIES)
BYTE_KEYS = ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved", *CATEGORIES)
COLUMNS = ["phase", "rank", "device", "inputs", "baseline", "peak_allocated", "peak_reserved", "end_allocated",
           "verdict", *CATEGORIES]
CONTEXT_NOTE = ("the CUDA context (about 0.3–0.6 GiB per process) and library workspaces are not tensors and "
                "are not counted; reserved assumes no fragmentation (a floor)")
SHARDED = ("parameters", "gradients", "optimizer_state")


def trace(loaded, *, device: str = "cuda", prep=None) -> dict:
    """Run every phase of the registry on fake tensors (``phases.driver``, traced); returns
    {"rows": [...], "params": n, "trainable": n, "wall_s": s}."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from pilotrun.campaign.arithmetic import data_parallel_ranks
    from pilotrun.phases.driver import PhaseContext, drive
    from pilotrun.phases.worst import worst_case
    from pilotrun.probe.estimate import Accountant, fake_build, unsharded_block_bytes
    from pilotrun.stages.prepare import prepare

    started = time.perf_counter()
    prep = prep or prepare(loaded, splits=("train", "validation"))
    c, t = prep.c, prep.c.train
    ranks = data_parallel_ranks(t)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = fake_build(loaded, fake_mode)
    plain = loaded.with_overrides({"model.adapter": None, "model.gradient_checkpointing": False})
    reloaded = fake_build(plain, fake_mode)  # what `reload` loads: the full (merged) model
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    acc = Accountant(device)
    notes: dict = {}
    ctx = PhaseContext(prep, worst_case(prep, ranks), fake={"acc": acc, "model": model, "reloaded": reloaded,
                                                            "ranks": ranks, "device": device, "notes": notes})
    del reloaded
    inputs: dict = {}

    @contextlib.contextmanager
    def mark(name: str, phase_inputs: dict):
        inputs[name] = phase_inputs
        with acc.mark(name):
            yield None

    with fake_mode, acc.tracking(model):
        drive(ctx, mark, traced=True)
    sharded = t.strategy == "fsdp" and ranks > 1
    block = unsharded_block_bytes(model) if sharded else 0
    train_like = names("train")
    rows = []
    for name in PHASES:
        s = acc.summary(name, {k: 1 / ranks for k in SHARDED} if sharded else None)
        if sharded and name in names("train", "eval"):
            s = with_gathered_blocks(s, 2 * block)
        rows.append({"phase": name, "rank": "each" if ranks > 1 else 0, "device": f"{device} (estimate)",
                     "counter": "estimate", "inputs": dict(inputs[name], gradient_checkpointing=
                                                            c.model.gradient_checkpointing)
                     if name in train_like else dict(inputs[name]),
                     "duration_s": None, "verdict": "ok", "note": notes.get(name), **s})
    return {"rows": rows, "params": sum(p.numel() for p in params), "trainable": sum(p.numel() for p in trainable),
            "ranks": ranks, "wall_s": time.perf_counter() - started}


def with_gathered_blocks(s: dict, nbytes: int) -> dict:
    """FSDP holds the block computing and the one prefetched unsharded while it runs: add them to the peak."""
    out = dict(s, temporaries=s["temporaries"] + nbytes, peak_allocated=s["peak_allocated"] + nbytes)
    if out["peak_reserved"] is not None:
        out["peak_reserved"] = out["end_reserved"] = max(out["peak_reserved"], out["peak_allocated"])
    return out


def estimate(loaded, *, device: str = "cuda", gpu_memory: int | None = None, prep=None) -> StageResult:
    """Predicted memory per phase on ``device``; rows over ``gpu_memory`` (default hardware.memory_per_gpu
    for cuda) are over-budget and fail the stage."""
    from pilotrun.errors import BadInput
    from pilotrun.probe.recorder import describe_inputs, peak_of
    from pilotrun.probe.sizes import fmt_bytes, parse_size

    if device not in ("cuda", "cpu"):
        raise BadInput(f"--device {device!r}: the estimate knows the allocators of cuda and cpu", where="--device",
                       fix="use --device cuda (the rental) or --device cpu (this machine)")
    limit = gpu_memory
    if limit is None and device == "cuda":
        limit = parse_size(loaded.campaign.hardware.memory_per_gpu, where="hardware.memory_per_gpu")
    out = trace(loaded, device=device, prep=prep)
    rows = out["rows"]
    worst = max(rows, key=lambda r: peak_of(r) or 0)
    messages = [f"estimates on fake tensors: {out['params']:,} parameters ({out['trainable']:,} trainable), "
                f"traced in {out['wall_s']:.1f} s; nothing was allocated"]
    if out["ranks"] > 1:
        messages.append(f"per rank, for {out['ranks']} ranks ({loaded.campaign.train.strategy})")
    if device == "cuda":
        messages.append(CONTEXT_NOTE)
    else:
        messages.append("cpu: tensor bytes only; the process's RSS adds the interpreter and libraries")
    verdict = "ok"
    if limit:
        for r in rows:
            peak = peak_of(r)
            if peak is not None and peak > limit:
                r["verdict"] = "over-budget"
                r["note"] = (f"estimated peak {fmt_bytes(peak)} is above {fmt_bytes(limit)} at phase {r['phase']} "
                             f"({describe_inputs(r['inputs'])})")
        over = [r for r in rows if r["verdict"] == "over-budget"]
        if over:
            verdict = "fail"
            messages.append(f"{over[0]['note']}; try `pilotrun fit {loaded.source or 'CAMPAIGN'} "
                            f"--memory-limit {_size_arg(limit)}`")
        elif device == "cuda" and (peak_of(worst) or 0) > limit - 2**29:
            verdict = "warn"
            messages.append(f"the estimated peak {fmt_bytes(peak_of(worst))} leaves under 0.5 GiB of "
                            f"{fmt_bytes(limit)} for the CUDA context")
    summary = (f"estimated peak {fmt_bytes(peak_of(worst))} at phase {worst['phase']} on {device}"
               + (f"; limit {fmt_bytes(limit)}" if limit else ""))
    messages += [f"{r['phase']}: {r['note']}" for r in rows if r["note"] and r["verdict"] == "ok"]
    return StageResult("estimate", verdict, summary, messages,
                       {"device": device, "limit": limit, "params": out["params"], "trainable": out["trainable"],
                        "ranks": out["ranks"], "wall_s": out["wall_s"], "estimate": True, "phases": rows},
                       COLUMNS, [display_row(r) for r in rows])


def display_row(r: dict) -> dict:
    """A ledger row for the terminal: sizes as KiB/MiB/GiB, inputs as one line (raw rows stay in data)."""
    from pilotrun.probe.recorder import describe_inputs
    from pilotrun.probe.sizes import fmt_bytes

    out = dict(r)
    for k in BYTE_KEYS:
        if k in out:
            out[k] = fmt_bytes(out[k])
    out["inputs"] = describe_inputs(r.get("inputs") or {})
    return out


def _size_arg(n: int) -> str:
    """A size as the command line takes it (whole MiB or GiB)."""
    return f"{n // 2**30}GiB" if n % 2**30 == 0 else f"{-(-n // 2**20)}MiB"
