"""GPU memory for the sheet, from the right source, every figure naming it.

- Piloted on CUDA: the pilot's own counters. Reserved is what the order must cover (the caching
  allocator keeps what it reserved); allocated is shown beside it. cuBLAS's workspace is allocated
  through the caching allocator, so it is already inside reserved.
- Piloted on CPU: process RSS counts the interpreter and libraries and nothing of the GPU, so it is
  never the GPU figure. The figure is ``estimate``'s per-phase prediction for CUDA (fake tensors,
  the caching allocator's rounding), plus what no tensor counter sees: the CUDA context and the
  cuBLAS workspace, stated below with their source. The CPU ledger stays on the sheet as proof
  that every phase ran.

In both cases the order is ``reserved × (1 + MARGIN_FRACTION)`` (fragmentation over a long run,
batch-to-batch variation) plus the constants the counters cannot see.
"""

from __future__ import annotations

import math

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.probe.trace import rows_for, traced
from pilotrun.sheet.plan import source

GiB, MiB = 2**30, 2**20
MARGIN_FRACTION = 0.10

# The CUDA context (driver state, the kernels of torch/cuBLAS/cuDNN loaded lazily) lives outside the
# caching allocator: the device's used memory minus torch.cuda.memory_reserved() once the kernels ran.
# With lazy module loading (CUDA_MODULE_LOADING=LAZY, PyTorch's default since 1.13 on CUDA >= 11.7) it
# was 300-500 MiB per process on CUDA 11/12 stacks; on an H200 (driver 580.159, torch 2.11.0+cu130) it
# measured 527 MiB at creation and 753 MiB after a whole pilot (bench/gpu_check.py, bench/RESULTS.md
# "On a GPU"), which the old 512 MiB figure understated by 241 MiB. 768 MiB is the round upper figure.
CUDA_CONTEXT_BYTES = 768 * MiB
CUDA_CONTEXT_SOURCE = ("CUDA context per process with lazy module loading (PyTorch's default): 753 MiB "
                       "measured after a whole pilot on an H200 with torch 2.11+cu130 (device used minus torch "
                       "reserved), 300-500 MiB on CUDA 11/12 stacks; 768 MiB assumed")
# PyTorch's cuBLAS workspace per handle and stream (aten/src/ATen/cuda/CublasHandlePool.cpp defaults:
# CUBLAS_WORKSPACE_CONFIG ":4096:8" = 32 MiB on compute capability 9.0+, ":4096:2:16:8" = 8.125 MiB
# before; cuBLAS's documentation recommends 32 MiB on Hopper). Handles are per thread: a training step
# holds two, the forward's (the main thread) and the backward's (autograd's device thread) — an H200
# pilot's allocated bytes stayed 64 MiB above the fake-tensor trace's from first_step on (bench/RESULTS.md
# "On a GPU"; a matmul and a backward each added 32 MiB). The fake-tensor trace cannot see them.
CUBLAS_HANDLES = 2
CUBLAS_WORKSPACE_SOURCE = ("PyTorch's default CUBLAS_WORKSPACE_CONFIG (CublasHandlePool.cpp): 32 MiB on "
                           "compute capability >= 9.0 and on ROCm, 8.125 MiB before, per handle; 2 handles "
                           "(the forward's thread, autograd's backward thread), as measured on an H200")
# NCCL's buffers for ranks > 1: NCCL_BUFFSIZE (4 MiB by default, NCCL environment documentation) per
# channel and peer, send and receive; a 2-GPU ring with its default channels stays under 256 MiB.
NCCL_BYTES = 256 * MiB
NCCL_SOURCE = "NCCL_BUFFSIZE 4 MiB (NCCL docs) × channels × send/recv; 256 MiB assumed for ranks > 1"


def cublas_workspace_bytes(gpu) -> int:
    if gpu is None or gpu.vendor == "amd" or float(gpu.compute_capability) >= 9.0:
        return CUBLAS_HANDLES * 32 * MiB
    return CUBLAS_HANDLES * (4 * MiB * 2 + 16 * 1024 * 8)


def overheads(gpu, ranks: int, counted_in_reserved: bool) -> list[dict]:
    """What the counters cannot see, per GPU: each with its bytes and its source."""
    out = [{"what": "CUDA context", "bytes": CUDA_CONTEXT_BYTES, "source": CUDA_CONTEXT_SOURCE}]
    if not counted_in_reserved:
        out.append({"what": "cuBLAS workspace", "bytes": cublas_workspace_bytes(gpu),
                    "source": CUBLAS_WORKSPACE_SOURCE})
    if ranks > 1:
        out.append({"what": "NCCL buffers", "bytes": NCCL_BYTES, "source": NCCL_SOURCE})
    return out


def need_bytes(reserved: int, extra: int) -> int:
    return int(math.ceil(reserved * (1 + MARGIN_FRACTION))) + extra


def gpu_rows(rows: list[dict], predicted: list[dict] | None) -> tuple[list[dict], str]:
    """The rows the GPU figure comes from, and their kind: "measured" (CUDA counters of the pilot)
    or "predicted" (the estimate's rows); CPU rows never qualify."""
    if rows and rows[0].get("counter") == "cuda":
        return rows, "measured"
    return (predicted or []), "predicted"


def phase_needs(rows: list[dict], kind: str, gpu, ranks: int, not_measured=("oom", "error")) -> list[dict]:
    """Per phase: the worst rank's reserved and allocated, what the GPU needs for it, and the source."""
    extra = sum(o["bytes"] for o in overheads(gpu, ranks, kind == "measured"))
    out: dict[str, dict] = {}
    for r in rows:
        reserved = r.get("peak_reserved")
        bad = r.get("verdict") in not_measured or reserved is None
        seen = out.get(r["phase"])
        if seen is not None and (seen["reserved"] is None or (not bad and seen["reserved"] >= reserved)):
            continue  # a phase not measured on one rank stays not measured
        out[r["phase"]] = {
            "phase": r["phase"], "rank": r.get("rank", 0), "verdict": r.get("verdict"),
            "reserved": None if bad else int(reserved), "allocated": r.get("peak_allocated"),
            "need": None if bad else need_bytes(int(reserved), extra), "inputs": r.get("inputs") or {},
            "tag": f"measured (row {r.get('id')})" if kind == "measured" else "predicted",
            "source": (f"measured: {source(r)}, CUDA reserved counter" if kind == "measured"
                       else "predicted: `pilotrun estimate` trace for CUDA (fake tensors, allocator rounding)")}
    return list(out.values())


def predict_rows(loaded, prep) -> tuple[list[dict], dict]:
    """``estimate``'s rows for CUDA on this campaign (the same phases on fake tensors), and the trace they
    come from (the options table reuses it)."""
    tr = traced(loaded, device="cuda", prep=prep)
    t = loaded.campaign.train
    return rows_for(tr, ranks=data_parallel_ranks(t), strategy=t.strategy), tr


def memory_summary(rows: list[dict], gpu_rows: list[dict], kind: str, ranks: int) -> dict:
    """The campaign's GPU memory need (conservative constants: any catalogue GPU), what sets it, and
    the CPU ledger kept as proof when the figure is predicted."""
    phases = phase_needs(gpu_rows, kind, None, ranks)
    known = [p for p in phases if p["need"] is not None]
    out = {"kind": kind, "phases": phases, "overheads": overheads(None, ranks, kind == "measured"),
           "margin": f"reserved × (1 + {MARGIN_FRACTION:g}) + constants", "peak": None, "need": None,
           "phase": None, "unmeasured": sorted(p["phase"] for p in phases if p["need"] is None)}
    if known:
        top = max(known, key=lambda p: p["need"])
        out.update(peak=top["reserved"], need=top["need"], phase=top["phase"], rank=top["rank"],
                   inputs=top["inputs"], source=top["source"])
    if kind == "predicted":
        out["proof"] = [{"phase": r["phase"], "rank": r.get("rank", 0), "verdict": r["verdict"],
                         "rss_peak": r.get("peak_reserved") if r.get("counter") == "tensors+rss" else r.get("peak_allocated"),
                         "seconds": r.get("duration_s")} for r in rows]
    return out


def fit_table(gpu_rows: list[dict], kind: str, gpus, *, needs_bf16: bool, ranks: int) -> list[dict]:
    """Per catalogue GPU and phase: does the phase's reserved peak plus margin and constants fit."""
    table = []
    for g in gpus:
        phases = phase_needs(gpu_rows, kind, g, ranks)
        cells, over, unknown = {}, [], []
        for p in phases:
            if p["need"] is None:
                cells[p["phase"]] = f"not measured ({p['verdict']})"
                unknown.append(p["phase"])
            elif p["need"] <= g.memory_bytes:
                cells[p["phase"]] = "fits"
            else:
                cells[p["phase"]] = "does not fit"
                over.append(p["phase"])
        if over:
            verdict = "does not fit: " + ", ".join(over)
        elif needs_bf16 and not g.bf16:
            verdict = f"does not fit: no bf16 (compute capability {g.compute_capability} < 8.0)"
        elif unknown or not phases:
            verdict = ("unknown: " + ", ".join(unknown) + " not measured") if unknown else \
                "unknown: no GPU memory figure"
        else:
            verdict = "fits"
        need = max((p["need"] for p in phases if p["need"] is not None), default=None)
        table.append({"gpu": g.key, "name": g.name, "memory_bytes": g.memory_bytes, "phases": cells,
                      "need": need, "fits": verdict == "fits", "verdict": verdict})
    return table


def reserved_limit(gpu, kind: str, ranks: int) -> int:
    """The largest reserved peak ``gpu`` holds once the margin and the constants are set aside."""
    extra = sum(o["bytes"] for o in overheads(gpu, ranks, kind == "measured"))
    return int((gpu.memory_bytes - extra) / (1 + MARGIN_FRACTION))


def routing_worst(rows: list[dict], routing: dict | None) -> list[dict]:
    """A mixture of experts' pilot rows sized for the worst routing it measured: where an update under forced routing
    (the pilot's time model: balanced, every token to the same experts) rose higher above its start than the
    steady_step row's as the router chose, that row's peaks take the difference (``routing`` in its inputs says
    which); unchanged for a dense model or when the router's own was the highest."""
    if not routing:
        return rows
    out = []
    for r in rows:
        if r["phase"] == "steady_step" and r.get("peak_allocated") is not None and r.get("baseline") is not None:
            mode, worst = max(routing.items(), key=lambda kv: kv[1]["peak_allocated"])
            extra = worst["peak_allocated"] - (r["peak_allocated"] - r["baseline"])
            if extra > 0:
                r = dict(r, inputs=dict(r["inputs"], routing=f"{mode} (forced; +{extra} bytes)"),
                         **{k: r[k] + extra for k in ("peak_allocated", "peak_reserved") if r.get(k) is not None})
        out.append(r)
    return out
