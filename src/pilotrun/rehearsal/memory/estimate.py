"""estimate: predicted memory per phase on a device that is not here, from the trace (probe/trace.py)."""

from __future__ import annotations

import os

from pilotrun.campaign.prepare import prepare
from pilotrun.console.progress import head
from pilotrun.errors import BadInput
from pilotrun.probe.alloc_conf import settings_from_env
from pilotrun.probe.counted import training_need
from pilotrun.probe.estimate import CATEGORIES
from pilotrun.probe.recorder import describe_inputs, peak_of
from pilotrun.sizes import fmt_bytes, parse_size
from pilotrun.probe.trace import trace
from pilotrun.verdicts import StageResult

LEDGER_KEYS = ("phase", "rank", "device", "counter", "inputs", "baseline", "peak_allocated", "peak_reserved",
               "end_allocated", "end_reserved", "duration_s", "verdict", "note", *CATEGORIES)
BYTE_KEYS = ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved", *CATEGORIES)
COLUMNS = ["phase", "rank", "device", "inputs", "baseline", "peak_allocated", "peak_reserved", "end_allocated",
           "verdict", *CATEGORIES]
CONTEXT_NOTE = ("allocated and reserved are the caching allocator's replay of the trace (probe/allocator.py: "
                "torch's CUDACachingAllocator policy, cuBLAS's two 32 MiB workspaces in it; calibrated on an H200, "
                "bench/RESULTS.md); the CUDA context (about 0.5–0.75 GiB per process) lives outside it and is not "
                "counted")


def estimate(loaded, *, device: str = "cuda", gpu_memory: int | None = None, prep=None) -> StageResult:
    """Predicted memory per phase on ``device``; rows over ``gpu_memory`` (default hardware.memory_per_gpu
    for cuda) are over-budget and fail the stage."""
    if device not in ("cuda", "cpu"):
        raise BadInput(f"--device {device!r}: the estimate knows the allocators of cuda and cpu", where="--device",
                       fix="use --device cuda (the rental) or --device cpu (this machine)")
    limit = gpu_memory
    if limit is None and device == "cuda":
        limit = parse_size(loaded.campaign.hardware.memory_per_gpu, where="hardware.memory_per_gpu")
    settings, variable = settings_from_env(os.environ)  # as the user's launch sets the allocator
    prep = prep or prepare(loaded, splits=("train", "validation"), shapes=True)
    head(f"tracing every phase on fake tensors ({device})")
    out = trace(loaded, device=device, prep=prep, settings=settings)
    rows = out["rows"]
    worst = max(rows, key=lambda r: peak_of(r) or 0)
    messages = [f"estimates on fake tensors: {out['params']:,} parameters ({out['trainable']:,} trainable), "
                f"traced in {out['wall_s']:.1f} s; nothing was allocated", prep.shapes_said()]
    if out["ranks"] > 1:
        messages.append(f"per rank, for {out['ranks']} ranks ({loaded.campaign.train.strategy})")
    if device == "cuda":
        messages.append(CONTEXT_NOTE + f"; allocator: {settings.said()}" + (f" ({variable})" if variable else ""))
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
            messages.append(f"{over[0]['note']}; {over_budget_advice(loaded, limit)}")
        elif device == "cuda" and (peak_of(worst) or 0) > limit - 2**29:
            verdict = "warn"
            messages.append(f"the estimated peak {fmt_bytes(peak_of(worst))} leaves under 0.5 GiB of "
                            f"{fmt_bytes(limit)} for the CUDA context")
    summary = (f"estimated peak {fmt_bytes(peak_of(worst))} at phase {worst['phase']} on {device}"
               + (f"; limit {fmt_bytes(limit)}" if limit else ""))
    messages += [f"{r['phase']}: {r['note']}" for r in rows if r["note"] and r["verdict"] == "ok"]
    return StageResult("estimate", verdict, summary, messages,
                       {"device": device, "limit": limit, "params": out["params"], "trainable": out["trainable"],
                        "ranks": out["ranks"], "wall_s": out["wall_s"], "estimate": True, "phases": rows,
                        "shapes": prep.shapes or "data"},
                       COLUMNS, [display_row(r) for r in rows])


def display_row(r: dict) -> dict:
    """A ledger row for the terminal: sizes as KiB/MiB/GiB, inputs as one line (raw rows stay in data)."""
    out = dict(r)
    for k in BYTE_KEYS:
        if k in out:
            out[k] = fmt_bytes(out[k])
    out["inputs"] = describe_inputs(r.get("inputs") or {})
    return out


def over_budget_advice(loaded, limit: int) -> str:
    """What to run when the estimate is over ``limit``: ``fit`` measures the variants that fit, on this machine,
    so only where this machine can hold the model's training and a ``limit`` of memory; else the options
    table (GPU, count, sharding, offload, adapters), which needs no memory here."""
    import psutil

    src = loaded.source or "CAMPAIGN"
    here = psutil.virtual_memory().total
    try:
        import torch

        if torch.cuda.is_available():
            here = torch.cuda.get_device_properties(0).total_memory
    except Exception:  # noqa: BLE001 - no usable GPU: the machine's memory is its RAM
        pass
    size = training_need(loaded)
    size = size if size["need"] > size["available"] else None
    if size is not None or limit > here:
        why = (f"training needs at least {size['need'] / 2**30:.1f} GiB, {size['available'] / 2**30:.1f} GiB "
               "available here" if size is not None else
               f"this machine has {here / 2**30:.1f} GiB, under the {_size_arg(limit)} asked")
        return (f"`pilotrun fit` cannot measure that here ({why}): try `pilotrun estimate {src} --options` for "
                "the GPUs, counts and options that fit")
    return f"try `pilotrun fit {src} --memory-limit {_size_arg(limit)}`"


def _size_arg(n: int) -> str:
    """A size as the command line takes it (whole MiB or GiB)."""
    return f"{n // 2**30}GiB" if n % 2**30 == 0 else f"{-(-n // 2**20)}MiB"
