"""GPU memory for the sheet, from the right source, every figure naming it and the card it is for.

- Piloted on CUDA: the pilot's own counters. Reserved is what the card must hold (the caching allocator keeps
  what it reserved); allocated is shown beside it, and the fragmentation it measured (reserved − allocated)
  beside the replay's. cuBLAS's workspaces are allocated through the caching allocator: inside reserved.
- Piloted on CPU: process RSS counts the interpreter and libraries and nothing of the GPU, so it is never the GPU
  figure. The figure is ``estimate``'s replay of the trace through the caching allocator (probe/stream.py; cuBLAS's
  workspaces in it), on the calibration card (a card that never fills) and again on each catalogue card that the
  first replay does not clearly fit: a smaller card can hold it through the allocator's retry path (cached
  segments released), reserving less than the H200 did.

A phase fits a card when its reserved bytes fit the card's capacity: its memory less the headroom, the CUDA
context and NCCL's buffers (``capacity``). The headroom is what the replay cannot know (another process on the
card, memory a library takes outside torch's allocator), stated as such.
"""

from __future__ import annotations

import math

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.probe.alloc_conf import DEFAULTS, Settings
from pilotrun.probe.allocator import OutOfMemory
from pilotrun.probe.stream import CUBLAS_WORKSPACE
from pilotrun.probe.trace import replay_rows, rows_for, traced
from pilotrun.sheet.plan import source

GiB, MiB = 2**30, 2**20
HEADROOM_FRACTION = 0.05
HEADROOM_SOURCE = ("5 % of the card kept free for what the replay cannot know: another process on the card, memory a "
                   "library takes outside torch's allocator")

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
# "On a GPU"; a matmul and a backward each added 32 MiB). They are allocated through the caching allocator, so
# the replay allocates them where each thread first calls cuBLAS (probe/stream.py), of the card's own size.
CUBLAS_WORKSPACE_SOURCE = ("PyTorch's default CUBLAS_WORKSPACE_CONFIG (CublasHandlePool.cpp): 32 MiB on "
                           "compute capability >= 9.0 and on ROCm, 8.125 MiB before, per handle; 2 handles "
                           "(the forward's thread, autograd's backward thread), as measured on an H200; inside "
                           "reserved (through the caching allocator): the replay allocates each card's own")
# NCCL's buffers for ranks > 1: NCCL_BUFFSIZE (4 MiB by default, NCCL environment documentation) per
# channel and peer, send and receive; a 2-GPU ring with its default channels stays under 256 MiB.
NCCL_BYTES = 256 * MiB
NCCL_SOURCE = "NCCL_BUFFSIZE 4 MiB (NCCL docs) × channels × send/recv; 256 MiB assumed for ranks > 1"


def workspace_bytes(gpu) -> int:
    """One cuBLAS workspace on ``gpu`` (None: the calibration card's, 32 MiB)."""
    if gpu is None or gpu.vendor == "amd" or float(gpu.compute_capability) >= 9.0:
        return CUBLAS_WORKSPACE
    return 4 * MiB * 2 + 16 * 1024 * 8


def overheads(gpu, ranks: int) -> list[dict]:
    """What lives outside the caching allocator, per GPU: each with its bytes and its source."""
    out = [{"what": "CUDA context", "bytes": CUDA_CONTEXT_BYTES, "source": CUDA_CONTEXT_SOURCE}]
    if ranks > 1:
        out.append({"what": "NCCL buffers", "bytes": NCCL_BYTES, "source": NCCL_SOURCE})
    return out


def need_bytes(reserved: int, extra: int) -> int:
    """The card a reserved peak needs: reserved plus what lives outside the allocator, then the headroom."""
    return int(math.ceil((reserved + extra) / (1 - HEADROOM_FRACTION)))


def capacity(gpu, ranks: int) -> int:
    """The bytes ``gpu``'s caching allocator may reserve: its memory less the headroom, the context and NCCL."""
    return int(gpu.memory_bytes * (1 - HEADROOM_FRACTION)) - sum(o["bytes"] for o in overheads(gpu, ranks))


def gpu_rows(rows: list[dict], predicted: list[dict] | None) -> tuple[list[dict], str]:
    """The rows the GPU figure comes from, and their kind: "measured" (CUDA counters of the pilot)
    or "predicted" (the estimate's rows); CPU rows never qualify."""
    if rows and rows[0].get("counter") == "cuda":
        return rows, "measured"
    return (predicted or []), "predicted"


def phase_needs(rows: list[dict], kind: str, gpu, ranks: int, not_measured=("oom", "error"),
                card: dict | None = None) -> list[dict]:
    """Per phase: the worst rank's reserved and allocated, what the GPU needs for it, and the source. ``card``
    (predicted figures, ``on_cards``): the replay on that GPU, whose reserved replaces the calibration card's."""
    extra = sum(o["bytes"] for o in overheads(gpu, ranks))
    out: dict[str, dict] = {}
    for r in rows:
        reserved = r.get("peak_reserved")
        bad = r.get("verdict") in not_measured or reserved is None
        seen = out.get(r["phase"])
        if seen is not None and (seen["reserved"] is None or (not bad and seen["reserved"] >= reserved)):
            continue  # a phase not measured on one rank stays not measured
        on = (card or {}).get(r["phase"]) or {}
        if on.get("reserved") is not None and not bad:
            reserved = on["reserved"]
        out[r["phase"]] = {
            "phase": r["phase"], "rank": r.get("rank", 0), "verdict": r.get("verdict"),
            "reserved": None if bad else int(reserved), "allocated": r.get("peak_allocated"),
            "need": None if bad else need_bytes(int(reserved), extra), "inputs": r.get("inputs") or {},
            "tag": f"measured (row {r.get('id')})" if kind == "measured" else "predicted",
            "oom": on.get("oom"), "card": on.get("how"),
            "source": (f"measured: {source(r)}, CUDA reserved counter" if kind == "measured"
                       else "predicted: the caching allocator's replay of `pilotrun estimate`'s trace for CUDA")}
    return list(out.values())


def predict_rows(loaded, prep, settings: Settings = DEFAULTS) -> tuple[list[dict], dict]:
    """``estimate``'s rows for CUDA on this campaign (the same phases on fake tensors, replayed through the caching
    allocator under ``settings`` on a card that never fills), and the trace they come from (the options table and
    the per-card replays reuse it)."""
    tr = traced(loaded, device="cuda", prep=prep)
    t = loaded.campaign.train
    return rows_for(tr, ranks=data_parallel_ranks(t), strategy=t.strategy, settings=settings), tr


def on_cards(tr: dict, rows: list[dict], gpus, *, ranks: int, strategy: str, settings: Settings = DEFAULTS) -> dict:
    """Per catalogue GPU and phase, the replay on that GPU: its own cuBLAS workspaces and, where the calibration
    card's reserved peak is above the GPU's capacity while its allocated peak is not, the replay on that capacity
    (the retry path may hold it). {gpu: {phase: {"reserved", "oom" (the phase it ran out in), "how"}}}. A counted
    trace has no whole stream to replay on a capacity: its calibration-card figure stands (conservative)."""
    from pilotrun.phases import PHASES

    by_size: dict[int, list[dict]] = {CUBLAS_WORKSPACE: rows}
    out: dict[str, dict] = {}
    for g in gpus:
        ws = workspace_bytes(g)
        if ws not in by_size:
            by_size[ws] = rows_for(tr, ranks=ranks, strategy=strategy, settings=settings, workspace=ws)
        base = {r["phase"]: r for r in by_size[ws]}
        cap = capacity(g, ranks)
        res = {n: {"reserved": r["peak_reserved"], "oom": None, "how": "replay"} for n, r in base.items()}
        tight = any(r["peak_reserved"] > cap >= r["peak_allocated"] for r in base.values())
        if tight and "replay" in tr:
            try:
                counters = replay_rows(tr, ranks=ranks, strategy=strategy, settings=settings, workspace=ws,
                                       capacity=cap, total=g.memory_bytes)
                for n, v in counters.items():
                    res[n].update(reserved=v["peak_reserved"], how="replay on this card")
            except OutOfMemory as e:
                done = {p.name: p.peak_reserved for p in e.phases}
                after = False
                for n in PHASES:
                    if n in done:
                        res[n].update(reserved=done[n], how="replay on this card")
                    elif n in res:
                        after = after or n == e.phase
                        res[n].update(oom=e.phase if after else None, how="replay on this card: out of memory")
        out[g.key] = res
    return out


def memory_summary(rows: list[dict], gpu_rows: list[dict], kind: str, ranks: int) -> dict:
    """The campaign's GPU memory need (the calibration card's figures), what sets it, and the CPU ledger kept as
    proof when the figure is predicted."""
    phases = phase_needs(gpu_rows, kind, None, ranks)
    known = [p for p in phases if p["need"] is not None]
    out = {"kind": kind, "phases": phases, "overheads": overheads(None, ranks),
           "margin": f"(reserved + constants) ÷ (1 − {HEADROOM_FRACTION:g})", "peak": None, "need": None,
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


def fit_table(gpu_rows: list[dict], kind: str, gpus, *, needs_bf16: bool, ranks: int,
              cards: dict | None = None) -> list[dict]:
    """Per catalogue GPU and phase: does the phase's reserved peak (on that card, ``cards``) fit its capacity."""
    table = []
    for g in gpus:
        phases = phase_needs(gpu_rows, kind, g, ranks, card=(cards or {}).get(g.key))
        cells, over, unknown = {}, [], []
        for p in phases:
            if p["need"] is None:
                cells[p["phase"]] = f"not measured ({p['verdict']})"
                unknown.append(p["phase"])
            elif p["oom"]:
                cells[p["phase"]] = f"does not fit (the replay runs out of memory at {p['oom']})"
                over.append(p["phase"])
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
        reserved = max((p["reserved"] for p in phases if p["reserved"] is not None), default=None)
        table.append({"gpu": g.key, "name": g.name, "memory_bytes": g.memory_bytes, "phases": cells,
                      "need": need, "reserved": reserved, "capacity": capacity(g, ranks), "fits": verdict == "fits",
                      "verdict": verdict})
    return table


def fragmentation(measured: list[dict], predicted: list[dict]) -> list[dict]:
    """Per phase of a CUDA pilot: the fragmentation it measured (reserved − allocated at the phase's peaks, the worst
    rank) beside the replay's for the same campaign, each with its reserved."""
    pred = {r["phase"]: r for r in predicted}
    out = []
    for name in dict.fromkeys(r["phase"] for r in measured):
        rs = [r for r in measured if r["phase"] == name and r.get("peak_reserved") is not None]
        p = pred.get(name)
        if not rs or p is None or p.get("peak_reserved") is None:
            continue
        m = max(rs, key=lambda r: r["peak_reserved"])
        out.append({"phase": name, "rank": m.get("rank", 0), "measured_reserved": m["peak_reserved"],
                    "measured": m["peak_reserved"] - m["peak_allocated"], "replay_reserved": p["peak_reserved"],
                    "replay": p["peak_reserved"] - p["peak_allocated"]})
    return out
