"""Counting instead of tracing: a deep model's estimate from shallow traces.

Decoder layers of one shape allocate the same storages in the same order, so every counter of a
phase (parameters, gradients, optimizer state, saved activations, the optimizer's temporaries) grows
by the same bytes per layer: the traces of a model at two depths give the bytes of one layer, which is
then counted N times (``value(N) = value(d1) + (N - d1) × (value(d2) - value(d1)) / (d2 - d1)``). A 70B
Llama's 80 layers cost two or three traces of a few layers instead of one of 80. (Not from 1 layer: the first
layer's peak moments hold less than the others', nothing runs before it.)

The depths (``depths_for``): 2 and 3 on the CPU, whose counters are tensor bytes alone. On CUDA the rows'
reserved is the caching allocator's replay, and a replay is linear in the layers only over whole periods of its
packing (two layers' projections share one 20 MiB segment) and between the moments a block outgrows the cache
(one new segment, once): the replays of 2, 4 and 6 layers are traced and each phase's reserved is counted from
the deepest at the smaller of the two periods' slopes (``reserved``), never under the counted allocated peak plus
the fragmentation the replays show. An 8-layer 1024-wide Llama counted so reads 1.000-1.002 of its whole replay per
phase; from 2 and 3 layers plus their fragmentation it read 0.79 at eval_longest.

The peak of a phase is the highest of several moments (the end of the forward pass, the backward
pass, the optimizer step), and those grow at different rates per layer: each stage's peak is counted
separately and the highest after counting is the phase's peak, so an optimizer step that overtakes
the activations at 80 layers is not missed because the activations won at 2.

The same holds for the micro-batches of an update: after the first (which allocates the gradients)
each one repeats the widest's allocations on shorter or equal inputs (the worst case puts the widest
last), so the first and the widest are traced and the others' input tensors, which the loop keeps
alive for the whole update, are added.

Configurations whose layers differ (``layer_types`` with more than one kind, dense-then-MoE layer
lists) are traced whole.
"""

from __future__ import annotations

from pilotrun.probe.estimate import architecture_config, fake_build

DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers")
# per-layer lists or switches that make layers differ from one another: trace those configs whole
UNEVEN_KEYS = ("first_k_dense_replace", "moe_layer_freq", "mlp_only_layers", "decoder_sparse_step",
               "no_rope_layers", "sliding_window_pattern", "attention_layers", "block_types")
# fewer layers than this: tracing them all is faster (one model build and one pass over the embeddings, head and
# optimizer instead of two; 4 layers: 0.53 against 0.93 CPU s, 6 layers: about even, on the 2-core bench box)
COUNT_FROM = 6
TRACED_MICRO_BATCHES = 2
# On CUDA a model of up to this many layers is traced whole (its replay is the run's own stream, exact); deeper ones
# are counted from the replays of 2, 4 and 6 layers (``CUDA_DEPTHS``), which read 1.000-1.002 of the whole replay's
# reserved per phase on an 8-layer 1024-wide Llama; a whole 16-layer trace costs about 4 s on the 2-core box.
REPLAY_WHOLE_LAYERS = 16
NUMERIC = ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved")


def depth_of(cfg: dict | None) -> tuple[str, int] | None:
    """(key, layers) when the config's decoder layers are all of one shape and worth counting, else None."""
    if not isinstance(cfg, dict):
        return None
    key = next((k for k in DEPTH_KEYS if isinstance(cfg.get(k), int)), None)
    if key is None or cfg[key] < COUNT_FROM:
        return None
    if any(cfg.get(k) not in (None, 0, [], 1) for k in UNEVEN_KEYS):
        return None
    kinds = cfg.get("layer_types")
    if kinds is not None and len(set(kinds)) > 1:
        return None
    return key, cfg[key]


def with_depth(cfg: dict, key: str, depth: int) -> dict:
    """The config keys that make ``cfg`` ``depth`` layers deep (``fake_build``'s overrides)."""
    out = {key: depth}
    if cfg.get("layer_types") is not None:
        out["layer_types"] = list(cfg["layer_types"])[:depth]
    return out


DEPTHS = (2, 3)  # the first layer can differ in what its peak moment holds (nothing before it); the second on do not
# CUDA: two periods of the allocator's packing (two layers' projections share a 20 MiB segment), for ``reserved``
CUDA_DEPTHS = (2, 4, 6)


def depths_for(device: str) -> tuple[int, ...]:
    """The depths a counted trace traces: 2, 4 and 6 layers on CUDA (their replays are counted), else 2 and 3."""
    return CUDA_DEPTHS if device == "cuda" else DEPTHS


def at_depth(low: int, high: int, layers: int, depths: tuple[int, ...] = DEPTHS) -> int:
    """A value at ``layers`` from its values ``low`` and ``high`` at the first and last of ``depths``: linear in the
    layers."""
    return low + (layers - depths[0]) * (high - low) // (depths[-1] - depths[0])


def count(low: dict, high: dict, layers: int, depths: tuple[int, ...] = DEPTHS) -> dict:
    """A phase summary at ``layers`` from the summaries at the first and last of ``depths`` (both with ``stages``)."""

    def line(a, b):
        return None if a is None or b is None else at_depth(a, b, layers, depths)

    stages = {}
    for name, s1 in low["stages"].items():
        s2 = high["stages"].get(name)
        if s2 is not None:
            stages[name] = {key: line(s1[key], s2[key]) for key in s1}
    top = max(stages.values(), key=lambda s: s["peak_allocated"])
    out = {key: line(low[key], high[key]) for key in NUMERIC}
    out.update(top)
    if out["peak_reserved"] is not None:
        out["peak_reserved"] = out["end_reserved"] = max(out["peak_reserved"], out["peak_allocated"])
    return out


def reserved(replays: list[dict[str, dict]], layers: int, depths: tuple[int, ...]) -> dict[str, tuple[int, int]]:
    """Per phase, from the allocator's replays (probe/stream.replayed) at ``depths`` layers: (the reserved peak counted
    to ``layers``, the most any replay held above its allocated peak). The reserved is counted from the deepest replay
    at the smaller slope of the two periods (2 to 4 and 4 to 6 layers): a block that outgrows the cache reserves a new
    segment once, not once per layer, and raises the period it falls in alone (FSDP over 16 ranks of a 70B Llama:
    11.25, 13.43, 13.65 GiB at its steady step). ``rows_for`` keeps the reserved at least the counted allocated peak
    plus that most held above it, and at least an earlier phase's (the cache never shrinks)."""
    out = {}
    for name in replays[-1]:
        at = [r[name]["peak_reserved"] for r in replays if name in r]
        if len(at) != len(depths):
            continue
        slope = min((b - a) / (d2 - d1) for a, b, d1, d2 in zip(at, at[1:], depths, depths[1:]))
        above = max(r[name]["peak_reserved"] - r[name]["peak_allocated"] for r in replays)
        out[name] = (at[-1] + int((layers - depths[-1]) * slope), above)
    return out


def with_inputs(summary: dict, nbytes: int) -> dict:
    """Add input tensors that stay alive through the whole phase (the untraced micro-batches)."""
    if not nbytes:
        return summary
    out = dict(summary, peak_allocated=summary["peak_allocated"] + nbytes,
               activations=summary["activations"] + nbytes)
    if out["peak_reserved"] is not None:
        out["peak_reserved"] = out["end_reserved"] = out["peak_reserved"] + nbytes
    if "stages" in out:
        out["stages"] = {k: dict(v, peak_allocated=v["peak_allocated"] + nbytes,
                                 activations=v["activations"] + nbytes) for k, v in out["stages"].items()}
    return out


def input_bytes(task, micro_batches: list[list], cuda: bool) -> int:
    """Bytes of the collated tensors of these micro-batches (as the loop collates them), rounded like the allocator."""
    total = 0
    for mb in micro_batches:
        for v in task.collate(mb).values():
            if hasattr(v, "untyped_storage"):
                n = v.untyped_storage().nbytes()
                total += -(-n // 512) * 512 if cuda and n else n
    return total


def training_need(loaded) -> dict:
    """What training needs at least (weights, gradients and two Adam moments, or the weights alone under an
    adapter) and the memory this machine has available: {"weights", "need", "available"}."""
    import psutil

    weights = parameter_bytes(loaded)
    need = weights if loaded.campaign.model.adapter is not None else 4 * weights
    return {"weights": weights, "need": need, "available": psutil.virtual_memory().available}


def parameter_bytes(loaded) -> int:
    """Bytes of the model's parameters and buffers, from fake builds (of 2 and 3 layers when counted: parameters
    are linear in the layers from any two depths): known before anything is loaded."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cfg = architecture_config(loaded)
    depth = depth_of(cfg)

    def size(overrides=None) -> int:
        model = fake_build(loaded, FakeTensorMode(allow_non_fake_inputs=True), overrides)
        return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))

    if depth is None:
        return size()
    key, layers = depth
    low, high = (size(with_depth(cfg, key, d)) for d in DEPTHS)
    return at_depth(low, high, layers)
