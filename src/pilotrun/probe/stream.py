"""The trace as the caching allocator sees it, replayed: the accountant's births and deaths in their order, each
phase marked where the pilot's probe resets its peaks, with what the device holds that no tensor of the trace is
put where a run allocates it, then ``probe/allocator.replay``.

Where torch's own order differs from the trace's, modelled here:
- cuBLAS's workspaces: a thread's first cuBLAS call allocates its workspace through the caching allocator and
  keeps it (aten/src/ATen/cuda/CublasHandlePool.cpp, one per handle and stream). The accountant notes where each
  thread first called cuBLAS (``Accountant.cublas``: the forward on the main thread, the backward on autograd's
  device thread); one workspace is allocated right after that event and never freed.
- ``extras`` (probe/trace.py says which): DDP's gradient buckets (allocated once the model is wrapped, kept),
  FSDP's gathered blocks on the all-gather stream, a host copy moved whole, the inputs of untraced micro-batches:
  each allocated where its phase starts and freed where it ends, or kept.
- A counted trace (probe/counted.py: shallow depths) is not replayed at its depth: the replays of its depths (2, 4
  and 6 layers, two periods of the packing) are, and each phase's reserved is counted from theirs at the smaller
  period's slope (``counted.reserved``), never under the counted allocated peak plus the fragmentation the replays
  show (``trace.rows_for``).
- The weighting of ``rows_for`` (FSDP's shards: parameters, gradients and optimizer state ÷ ranks; offload: the
  optimizer state not on the device) scales each block before it is replayed.
"""

from __future__ import annotations

import math
import weakref

from pilotrun.probe.alloc_conf import DEFAULTS, Settings
from pilotrun.probe.allocator import MiB, replay

CUBLAS_WORKSPACE = 32 * MiB  # CUBLAS_WORKSPACE_CONFIG's default on compute capability >= 9.0 (the calibration card)
ALL_GATHER_STREAM = 1
FIELDS = ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved")


def events(acc, scale: dict | None = None, *, workspace: int = CUBLAS_WORKSPACE, extras=()) -> list[tuple]:
    """The replay's events of an accountant (``probe.estimate.Accountant``): ("phase", name) at each mark's start,
    ("+", key, bytes, stream) and ("-", key). ``extras``: (phase, bytes, stream, kept) — allocated where ``phase``
    starts (kept: where it ends, and never freed), else freed where it ends."""
    weight = dict(scale or {})
    weight.setdefault("optimizer_temporaries", weight.get("temporaries", 1.0))
    n = len(acc.timeline)
    at: list = [None] * n
    for i, b in enumerate(acc.blocks):
        c = "optimizer_temporaries" if (b.category == "temporaries" and b.in_optimizer) else b.category
        size = b.nbytes if weight.get(c, 1.0) == 1.0 else math.ceil(b.nbytes * weight[c])
        if size <= 0:
            continue
        at[b.born] = ("+", i, size, 0)
        if b.died != math.inf:
            at[b.died] = ("-", i)
    opens: dict[int, list[str]] = {}
    closes: dict[int, list[str]] = {}
    for name, (start, end) in acc.marks.items():
        opens.setdefault(start, []).append(name)
        closes.setdefault(end, []).append(name)
    after: dict[int, list] = {}
    for thread, i in (acc.cublas.items() if workspace else ()):
        after.setdefault(i, []).append(("+", f"cublas:{thread}", workspace, 0))

    def close(name):
        out.extend(("-", ("extra", name, j)) for j, x in enumerate(extras) if x[0] == name and not x[3])
        out.extend(("+", ("extra", name, j), x[1], x[2]) for j, x in enumerate(extras) if x[0] == name and x[3])
        out.append(("end", name))

    out: list[tuple] = []
    for i in range(n):  # event i, then what happens between it and the next: phases closing, then opening
        if at[i] is not None:
            out.append(at[i])
        out.extend(after.get(i, ()))
        for name in closes.get(i, ()):
            if acc.marks[name][0] < i:
                close(name)
        for name in opens.get(i, ()):
            out.append(("phase", name))
            out.extend(("+", ("extra", name, j), x[1], x[2]) for j, x in enumerate(extras) if x[0] == name and not x[3])
            if acc.marks[name][1] == i:  # a phase without events
                close(name)
    return out


def replayed(acc, scale: dict | None = None, *, settings: Settings = DEFAULTS, capacity: int | None = None,
             total: int | None = None, workspace: int = CUBLAS_WORKSPACE, extras=()) -> dict[str, dict]:
    """Per phase: the replay's counters (``FIELDS``); raises ``allocator.OutOfMemory`` when ``capacity`` is short.

    Each replay is kept with the accountant (``_kept_replay``): the sheet and the options table ask for the same
    trace under the same settings once per card and per option, and a card whose capacity the replay never
    reached replays exactly as a card that never fills."""
    key = _replay_key(acc, scale, settings, total or capacity, workspace, extras)
    free = _kept_replay(acc, key, lambda: replay(events(acc, scale, workspace=workspace, extras=extras), settings,
                                                 None, total or capacity))
    if capacity is None or free[1] <= capacity:
        return _counters(free[0])
    limited = _kept_replay(acc, key + (capacity,), lambda: replay(
        events(acc, scale, workspace=workspace, extras=extras), settings, capacity, total))
    return _counters(limited[0])


def _counters(phases) -> dict[str, dict]:
    return {p.name: {"baseline": p.start_allocated, "peak_allocated": p.peak_allocated,
                     "peak_reserved": p.peak_reserved, "end_allocated": p.end_allocated,
                     "end_reserved": p.end_reserved} for p in phases}


# per accountant (weakly: a trace dropped takes its replays with it), (replay key) -> (phases, most reserved)
_REPLAYS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _replay_key(acc, scale, settings: Settings, total: int | None, workspace: int, extras) -> tuple:
    """What a replay depends on besides the capacity. The card's total memory only counts under a memory fraction
    (the bytes allowed) or expandable segments (their address space); else every card shares one replay."""
    if settings.memory_fraction is None and not settings.expandable_segments:
        total = None
    return (len(acc.timeline), len(acc.blocks), tuple(sorted((scale or {}).items())), settings, total, workspace,
            tuple(tuple(x) for x in extras))


def _kept_replay(acc, key: tuple, run) -> tuple[list, int]:
    kept = _REPLAYS.setdefault(acc, {})
    if key not in kept:
        phases, a = run()  # an OutOfMemory is not kept: raised again at each ask
        kept[key] = (phases, a.most_reserved)
    return kept[key]


def threads(acc) -> dict[str, tuple[int, int]]:
    """Per phase: how many threads had their cuBLAS workspace when it started and when it ended."""
    points = sorted(acc.cublas.values())
    return {name: (sum(p < start for p in points), sum(p <= end for p in points))
            for name, (start, end) in acc.marks.items()}
