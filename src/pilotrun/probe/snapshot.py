"""torch's memory snapshots as the replay's input, to tell "the replay is wrong" from "the trace is wrong".

``torch.cuda.memory._record_memory_history()`` then ``torch.cuda.memory._snapshot()`` on a GPU gives each
device's trace of allocator events (torch/cuda/memory.py documents them): ``alloc`` (the requested size, unrounded),
``free_requested`` / ``free_completed``, ``segment_alloc`` / ``segment_free`` (cudaMalloc / cudaFree) and, under
``expandable_segments``, ``segment_map`` / ``segment_unmap``, each with its address, size and stream.
bench/gpu_snapshots.py captures them for the calibration campaigns and keeps only those fields.

``events`` turns one device's trace into the replay's events (its own allocations and frees, in its order);
``segments`` reads what the GPU's allocator reserved from the same trace. A replay of a snapshot's own events that
reserves other segments is the replay's error; the calibration's remaining error is then the trace's.
"""

from __future__ import annotations

ALLOC, FREE = "alloc", "free_completed"  # a free whose block is back in the pool (after any other stream's use)
GROW, SHRINK = ("segment_alloc", "segment_map"), ("segment_free", "segment_unmap")


def events(trace: list[dict]) -> list[tuple]:
    """The replay's events of one device's trace: each ``alloc`` and the ``free_completed`` of a block allocated
    inside the trace (a block the trace saw no allocation of was allocated before recording began: skipped)."""
    out: list[tuple] = []
    live: set[int] = set()
    for e in trace:
        action = e.get("action")
        if action == ALLOC:
            live.add(e["addr"])
            out.append(("+", e["addr"], int(e["size"]), int(e.get("stream") or 0)))
        elif action == FREE and e["addr"] in live:
            live.discard(e["addr"])
            out.append(("-", e["addr"]))
    return out


def segments(trace: list[dict]) -> dict:
    """What the device's allocator reserved over the trace: each segment allocated (or range mapped) in order, the
    reserved peak and the reserved at the end (from the trace's start)."""
    grown, now, peak = [], 0, 0
    for e in trace:
        if e.get("action") in GROW:
            grown.append(int(e["size"]))
            now += int(e["size"])
            peak = max(peak, now)
        elif e.get("action") in SHRINK:
            now -= int(e["size"])
    return {"allocated_segments": grown, "peak_reserved": peak, "end_reserved": now}


def compact(snapshot: dict, device: int = 0) -> list[dict]:
    """One device's trace from ``torch.cuda.memory._snapshot()`` with only what the replay reads (no stack frames):
    what the capture keeps."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces):
        return []
    keep = ("action", "addr", "size", "stream")
    return [{k: e[k] for k in keep if k in e} for e in traces[device]]
