"""The trace: the pilot's phases on fake tensors, for a device that is not here (the estimate stage, the sheet and fit
read it).

The same functions as the pilot run — ``task.build_model``, ``make_state`` (the optimizer of
engine/optim.py), ``run_update`` (``task.loss`` + backward + clip + step), ``evaluate`` — on the
same worst-case inputs (``phases.worst``): each phase's traced version from the registry, driven by
``phases.driver`` under ``probe.estimate.Accountant``. Nothing is allocated; one row per phase, shaped like the pilot's ledger rows and labelled as estimates.

Ranks: under ddp every rank holds everything, plus DDP's gradient buckets (one more copy of the
trainable parameters' gradients). Under fsdp the parameters, gradients and optimizer state are
divided by the ranks, activations are not, and two unsharded blocks (the one computing and the one
prefetched) are added as temporaries to the steps and the validation; load, export and reload add
what is held unsharded there (``_with_host_copies``). Checked against the exact counter on two CPU
ranks (tests/test_fsdp.py); on a GPU the load's one block moved whole is an assumption.
"""

from __future__ import annotations

import contextlib
import time

from pilotrun.campaign import reuse
from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.prepare import prepare
from pilotrun.phases import PHASES, names, registry
from pilotrun.phases.driver import PhaseContext, drive
from pilotrun.phases.registry import BY_NAME
from pilotrun.phases.worst import worst_case
from pilotrun.probe import counted as K
from pilotrun.probe import workers
from pilotrun.probe.estimate import Accountant, architecture_config, fake_build, root_bytes, unsharded_block_bytes
from pilotrun.probe.alloc_conf import DEFAULTS, Settings
from pilotrun.probe.fake_ops import device_paths
from pilotrun.probe.stream import ALL_GATHER_STREAM, CUBLAS_WORKSPACE, replayed, threads
from pilotrun.tasks.base import BUILTIN_TASKS
from pilotrun.tasks.preference_loss import resident_bytes
from pilotrun.tasks.moe import expert_counts
from pilotrun.tasks.quantized import logical_numel, said

SHARDED = ("parameters", "gradients", "optimizer_state")
# a mixture of experts' routed experts (tasks/moe.expert_counts), counted per layer as the parameters are
MOE_COUNTED = ("expert_params", "expert_bytes", "expert_trainable", "expert_trainable_bytes", "moe_layers")
BY_KIND = {name: phase.kind for name, phase in BY_NAME.items()}


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def trace(loaded, *, device: str = "cuda", prep=None, counted: bool | None = None,
          settings: Settings = DEFAULTS) -> dict:
    """Run every phase on fake tensors; returns {"rows": [...], "params": n, "trainable": n, "wall_s": s}; on CUDA
    the rows' counters are the caching allocator's replay under ``settings``.

    ``counted``: count identical decoder layers and micro-batches from shallow traces
    (probe/counted.py) instead of tracing them all; None: when the model has enough layers of one shape
    or the update more than two micro-batches."""
    started = time.perf_counter()
    tr = traced(loaded, device=device, prep=prep, counted=counted)
    t = loaded.campaign.train
    ranks = data_parallel_ranks(t)
    rows = rows_for(tr, ranks=ranks, strategy=t.strategy, settings=settings)
    return {"rows": rows, "params": tr["params"], "trainable": tr["trainable"], "ranks": ranks,
            "counted": tr["counted"], "wall_s": time.perf_counter() - started}


def traced(loaded, *, device: str = "cuda", prep=None, counted: bool | None = None, after_steps=None) -> dict:
    """The phases' summaries (per stage, unscaled) and the facts ``rows_for`` needs, traced or counted.

    ``after_steps``: another trace of the same model and optimizer whose phases after the two steps
    (validation, save, export, reload) this one shares (only activation checkpointing differs), so
    only load and the steps are traced."""
    prep = prep or prepare(loaded, splits=("train", "validation"), shapes=True)
    wc = worst_case(prep, 1)

    cfg = architecture_config(loaded)
    depth = K.depth_of(cfg)
    if counted is None and device == "cuda" and depth is not None and depth[1] <= K.REPLAY_WHOLE_LAYERS:
        depth = None  # traced whole for the allocator's replay (probe/counted.py says why)
    mbs = wc["micro_batches"]
    if counted is None:
        counted = depth is not None or len(mbs) > K.TRACED_MICRO_BATCHES
    steps_only = after_steps is not None
    if not counted:
        return _sharing(dict(_trace_once(loaded, device, prep, wc, steps_only), counted=None), after_steps)
    # the first micro-batch (it allocates the gradients) and the widest, which the worst case puts last: the
    # ones between repeat the widest's allocations on shorter inputs, so only their input tensors are added
    kept = mbs if len(mbs) <= K.TRACED_MICRO_BATCHES else [mbs[0], mbs[-1]]
    extra = K.input_bytes(prep.task, mbs[1:-1] if len(mbs) > K.TRACED_MICRO_BATCHES else [], device == "cuda")
    wc = dict(wc, micro_batches=kept)
    if depth is None:
        out = _trace_once(loaded, device, prep, wc, steps_only)
        layers = None
    else:
        key, layers = depth
        ds = K.depths_for(device)
        shallow = _trace_each(loaded, device, prep, wc, steps_only, [K.with_depth(cfg, key, d) for d in ds])
        low, high = shallow[0], shallow[-1]
        per_layer = ("params", "trainable", "trainable_bytes", "param_bytes", "linear_bytes", "linear_numel",
                     "reference_bytes") + MOE_COUNTED
        out = dict(high, **{k: K.at_depth(low[k], high[k], layers, ds) for k in per_layer},
                   summarize=lambda name, scale, f1=low["summarize"], f2=high["summarize"], n=layers:
                   K.count(f1(name, scale), f2(name, scale), n, ds))
        if "replay" in high:  # CUDA: the reserved counted from the shallow replays (no replay on the CPU)
            for t in shallow:  # the untraced micro-batches' inputs in every replay (``extras``)
                t["input_bytes"] = extra
            out["counted_reserved"] = lambda scale, extras_of, n=layers, **kw: K.reserved(
                [t["replay"](scale, extras_of, **kw) for t in shallow], n, ds)
        out.pop("replay", None)
    summarize = out["summarize"]
    out["summarize"] = lambda name, scale: K.with_inputs(summarize(name, scale), extra if name in names(
        "train") else 0)
    out["input_bytes"] = extra
    return _sharing(dict(out, counted={"layers": layers, "micro_batches": len(mbs),
                                       "micro_batches_traced": min(len(mbs), K.TRACED_MICRO_BATCHES),
                                       "depths": list(K.depths_for(device)) if layers else None}), after_steps)


def _sharing(tr: dict, other: dict | None) -> dict:
    if other is None:
        return tr
    own, mine = tr["summarize"], ("load",) + names("train")
    return dict(tr, summarize=lambda name, scale: (own if name in mine else other["summarize"])(name, scale),
                **({"replay": lambda scale, extras_of, **kw: _shared_replay(
                    tr["replay"](scale, extras_of, **kw), other["replay"](scale, extras_of, **kw), mine)}
                   if "replay" in tr and "replay" in other else {}),
                **({"counted_reserved": lambda scale, extras_of, **kw: {
                    **other["counted_reserved"](scale, extras_of, **kw),
                    **{n: v for n, v in tr["counted_reserved"](scale, extras_of, **kw).items() if n in mine}}}
                   if "counted_reserved" in tr and "counted_reserved" in other else {}),
                cublas_threads={**other.get("cublas_threads", {}), **tr.get("cublas_threads", {})},
                inputs={**other["inputs"], **tr["inputs"]}, notes={**other["notes"], **tr["notes"]})


def _shared_replay(own: dict, other: dict, mine: tuple) -> dict:
    """This trace's replay for its own phases, the other's after them: its cache reserved at least what this
    one's steps left reserved."""
    kept = max(own[n]["end_reserved"] for n in mine if n in own)
    return {**{n: dict(v, peak_reserved=max(v["peak_reserved"], kept), end_reserved=max(v["end_reserved"], kept))
               for n, v in other.items()}, **{n: own[n] for n in mine if n in own}}


def _trace_each(loaded, device: str, prep, wc: dict, steps_only: bool, overrides: list[dict]) -> list[dict]:
    """``_trace_once`` for each of ``overrides`` (the depths of one counted trace, shallowest first), in order: the
    last and deepest (about as much work as the others together: 6 layers against 2 + 4) in a forked worker
    (probe/workers.py) while this process traces the others, where the machine allows and it is not kept in the
    journal's home. The same traces either way: the worker sends what a kept trace holds, rebuilt as one is, and
    where it does not answer whole this process traces that depth itself.

    This process's first trace imports what tracing needs on the way (about 2 s on 2 cores, half of a cold
    70B count): a worker forked before it would import it all again, so then the shallowest is traced here first
    (and the others two at a time when there are three)."""
    out: list[dict] = []
    if not _TRACED and len(overrides) > 1:
        out.append(_trace_once(loaded, device, prep, wc, steps_only, overrides[0]))
    rest, last = overrides[len(out):-1], overrides[-1]
    worker = None
    if rest and not reuse.has_trace(_trace_key(loaded, device, wc, steps_only, last)):
        worker = workers.start(lambda: _traced_state(loaded, device, prep, wc, steps_only, last))
    try:
        started = time.perf_counter()
        out += [_trace_once(loaded, device, prep, wc, steps_only, o) for o in rest]
        # the worker's share is about this process's: a generous bound before it is killed and traced here
        state = worker.result(timeout=60 + 4 * (time.perf_counter() - started)) if worker is not None else None
    finally:
        if worker is not None:
            worker.cancel()
    return out + [_trace_once(loaded, device, prep, wc, steps_only, last, state)]


def _trace_key(loaded, device: str, wc: dict, steps_only: bool, overrides: dict | None) -> str | None:
    return reuse.trace_key(loaded, {"device": device, "steps_only": steps_only, "overrides": overrides,
                                    "micro_batches": len(wc["micro_batches"])})


def _trace_once(loaded, device: str, prep, wc: dict, steps_only: bool = False, overrides: dict | None = None,
                state: dict | None = None) -> dict:
    """One trace of the registry's phases (``phases.driver``, traced) on one rank's worth of tensors;
    ``steps_only``: load and the two steps only (the rest is shared from another trace); ``overrides``:
    config keys of the model built (a depth to count from). Inside ``reuse.keeping_traces`` (the sheet), a trace
    of the same campaign, files, pilotrun and question is read from the journal's home instead. ``state``: this
    trace as a forked worker computed it (``_traced_state``), used as traced here (and kept as such)."""
    key = _trace_key(loaded, device, wc, steps_only, overrides)
    kept = reuse.stored_trace(key)
    try:
        acc = Accountant.from_state(kept.pop("accountant")) if kept is not None else None
    except Exception:  # noqa: BLE001 - a kept trace this code cannot read back is a miss: traced again
        acc = None
    if acc is not None:
        out = dict(kept, summarize=lambda name, scale: acc.summary(name, scale, by_stage=True))
    else:
        out = _from_state(state, prep) if state is not None else None
        if out is None:
            out = _traced_once(loaded, device, prep, wc, steps_only, overrides)
        acc = out.pop("accountant")
        if key is not None:
            reuse.store_trace(key, dict({k: v for k, v in out.items() if k != "summarize"}, accountant=acc.state()))
    if acc.cuda:
        out["replay"] = lambda scale, extras_of, t=out, **kw: replayed(acc, scale, extras=extras_of(t), **kw)
        out["cublas_threads"] = threads(acc)
    return out


def _traced_state(loaded, device: str, prep, wc: dict, steps_only: bool, overrides: dict | None) -> dict:
    """In a forked worker: ``_traced_once`` as plain data (what a kept trace holds) and the reload events it
    recorded for later traces (``_RELOADS``)."""
    before = dict(_RELOADS)
    out = _traced_once(loaded, device, prep, wc, steps_only, overrides)
    acc = out.pop("accountant")
    return {"trace": dict({k: v for k, v in out.items() if k != "summarize"}, accountant=acc.state()),
            "reloads": [[k, v[1]] for k, v in _RELOADS.items() if before.get(k) is not v]}


def _from_state(state: dict, prep) -> dict | None:
    """A worker's ``_traced_state`` as ``_traced_once`` returns it (its Accountant rebuilt as a kept trace's is), its
    reload events remembered as a trace here would have; None when it cannot be read back (traced here instead)."""
    try:
        out = dict(state["trace"])
        acc = out["accountant"] = Accountant.from_state(out["accountant"])
        reloads = [(str(k), list(v)) for k, v in state["reloads"]]
    except Exception:  # noqa: BLE001 - a worker's answer this code cannot read: traced here
        return None
    for k, events in reloads:
        _remember_reload(k, prep, events)
    out["summarize"] = lambda name, scale: acc.summary(name, scale, by_stage=True)
    return out


# the reload phase's events per merged model, depth and device, with the prepared data whose sample it ran on:
# the written campaign's trace and its LoRA variant's reload the same plain model (``_reload_traced`` replays)
_RELOADS: dict[str, tuple] = {}
_TRACED = False  # this process has traced (``_trace_each``)


def _remember_reload(key: str, prep, events: list) -> None:
    _RELOADS[key] = (prep, events)
    while len(_RELOADS) > 4:
        _RELOADS.pop(next(iter(_RELOADS)))


def _traced_once(loaded, device: str, prep, wc: dict, steps_only: bool, overrides: dict | None) -> dict:
    from torch._subclasses.fake_tensor import FakeTensorMode

    global _TRACED
    c = loaded.campaign
    _TRACED = True
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = fake_build(loaded, fake_mode, overrides)
    plain = loaded.with_overrides({"model.adapter": None, "model.gradient_checkpointing": False})
    builtin = c.task in BUILTIN_TASKS  # a custom task's model may keep state between calls
    key = None if steps_only or not builtin else reuse.identity(plain, {"device": device, "overrides": overrides})
    reload = _RELOADS.get(key)
    reload = reload[1] if reload is not None and reload[0] is prep and registry.REPLAY else None
    # what `reload` loads: the merged model; not built where another trace's reload of it is replayed
    reloaded = None if steps_only or reload is not None else fake_build(plain, fake_mode, overrides)
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    acc = Accountant(device)
    notes: dict = {}
    # ranks 1: DDP's buckets and FSDP's shards are added per rank count by ``rows_for``
    ctx = PhaseContext(prep, wc, fake={"acc": acc, "model": model, "reloaded": reloaded, "reload": reload,
                                       "rebuild": lambda: fake_build(plain, fake_mode, overrides), "ranks": 1,
                                       "device": device, "notes": notes})
    q = c.model.quantization
    if q is not None and c.model.adapter is not None and c.model.adapter.merged_copy:
        # the merged copy of a quantised base, reloaded after the adapter: unquantised, and in float32, the dtype its
        # config.json names (peft's preparation upcast the base's other parameters to float32)
        merged = plain.with_overrides({"model.quantization": None, "model.dtype": "float32"})
        ctx.fake["rebuild_merged"] = lambda: fake_build(merged, fake_mode, overrides)
    del reloaded
    inputs: dict = {}

    @contextlib.contextmanager
    def mark(name: str, phase_inputs: dict):
        inputs[name] = phase_inputs
        with acc.mark(name):
            yield None

    with fake_mode, acc.tracking(model), device_paths(device == "cuda"):
        drive(ctx, mark, names("load", "train") if steps_only else PHASES, traced=True)
    if key is not None and reload is None and "reload" in acc.marks and acc.replayable("reload"):
        _remember_reload(key, prep, acc.recorded("reload"))
    for name in names("train"):
        inputs[name] = dict(inputs[name], micro_batch=c.train.micro_batch, accumulation=c.train.accumulation)
    return {"summarize": lambda name, scale: acc.summary(name, scale, by_stage=True), "inputs": inputs,
            "notes": notes, "params": sum(logical_numel(p) for p in params), "trainable": sum(p.numel() for p in trainable),
            "trainable_bytes": _bytes(trainable), "param_bytes": _bytes(params), **_frozen_linear(model),
            **expert_counts(model), "reference_bytes": resident_bytes(model),  # preference: a frozen copy beside it
            "block": unsharded_block_bytes(model), "root": root_bytes(model), "device": device,
            "quantization": said(c.model.quantization) if c.model.quantization is not None else None,
            "gradient_checkpointing": c.model.gradient_checkpointing, "accountant": acc}


def _frozen_linear(model) -> dict:
    """Bytes and count of the frozen linear weights inside the decoder layers (what QLoRA holds in 4 bits)."""
    import torch

    names = set(getattr(model, "_no_split_modules", None) or [])
    nbytes = numel = 0
    for block in model.modules():
        if type(block).__name__ in names:
            for m in block.modules():
                if isinstance(m, torch.nn.Linear) and not m.weight.requires_grad:
                    nbytes += m.weight.numel() * m.weight.element_size()
                    numel += m.weight.numel()
    return {"linear_bytes": nbytes, "linear_numel": numel}


def rows_for(tr: dict, *, ranks: int = 1, strategy: str = "single", offload: bool = False, tp: int = 1,
             settings: Settings = DEFAULTS, workspace: int = CUBLAS_WORKSPACE) -> list[dict]:
    """Ledger-shaped rows per phase for one rank of ``ranks``: under ddp every rank holds everything plus
    DDP's gradient buckets; under fsdp parameters, gradients, optimizer state and the optimizer's
    temporaries are divided by the ranks and two unsharded blocks are added; ``offload`` keeps the
    optimizer state and its step on the host (what stays on the GPU is counted). ``tp``: tensor parallel
    degree under fsdp (``ranks`` = TP × FSDP ranks): activations and the gathered blocks ÷ ``tp`` as well, an
    estimate (pilotrun does not train with TP; tests/test_tp_gloo.py checks the parameters' split).

    On CUDA the counters (baseline, allocated, reserved) are the caching allocator's replay of the trace
    (probe/stream.py) under ``settings``, cuBLAS's workspaces of ``workspace`` bytes included, on a card that never
    fills: what the calibration card (an H200) reserved; the parts (parameters, gradients …) are the trace's."""
    scale = replay_scale(ranks, strategy, offload, tp)
    sharded = strategy == "fsdp" and ranks > 1
    bucket = tr["trainable_bytes"] if strategy == "ddp" and ranks > 1 else 0
    counters = counted = None
    extras_of = lambda t: extras(t, ranks=ranks, strategy=strategy, tp=tp)  # noqa: E731
    if "replay" in tr:
        counters = tr["replay"](scale or None, extras_of, settings=settings, workspace=workspace)
    elif "counted_reserved" in tr:
        counted = tr["counted_reserved"](scale or None, extras_of, settings=settings, workspace=workspace)
    kept = 0
    rows = []
    for name in PHASES:
        if BY_NAME[name].only is not None and name not in tr["inputs"]:  # a phase this campaign does not have
            continue
        s = tr["summarize"](name, scale or None)
        s.pop("stages", None)
        if bucket:  # DDP's buckets, allocated with the wrapper and alive from then on
            s = _with_resident(s, bucket, name != "load")
        if sharded and name in names("train", "eval"):
            s = with_gathered_blocks(s, (2 * tr["block"] + _root_unsharded(tr, ranks)) // tp)
        elif sharded:
            s = _with_host_copies(s, name, tr, ranks)
        if counters is not None:
            s.update(counters[name])
        elif counted is not None:  # counted: the allocated bytes and the shallow replays' reserved counted
            before, after = tr["cublas_threads"].get(name, (0, 0))
            s = dict(s, baseline=s["baseline"] + before * workspace, end_allocated=s["end_allocated"] + after * workspace,
                     peak_allocated=s["peak_allocated"] + after * workspace)
            reserved, above = counted.get(name, (0, 0))
            kept = max(kept, s["peak_allocated"] + above, reserved)
            s["peak_reserved"] = s["end_reserved"] = kept
        inputs = dict(tr["inputs"][name])
        if name in names("train"):
            inputs.update(ranks=ranks, gradient_checkpointing=tr["gradient_checkpointing"])
        rows.append({"phase": name, "rank": "each" if ranks > 1 else 0, "device": f"{tr['device']} (estimate)",
                     "counter": "estimate", "inputs": inputs, "duration_s": None, "verdict": "ok",
                     "note": tr["notes"].get(name), **s})
    return rows


def replay_rows(tr: dict, *, ranks: int = 1, strategy: str = "single", offload: bool = False, tp: int = 1,
                settings: Settings = DEFAULTS, workspace: int = CUBLAS_WORKSPACE, capacity: int | None = None,
                total: int | None = None) -> dict | None:
    """A whole trace's replay per phase (``stream.FIELDS``) for one rank, on a card whose allocator may take
    ``capacity`` bytes (raises ``allocator.OutOfMemory`` naming the phase); None for a counted trace, which has no
    stream at its depth."""
    if "replay" not in tr:
        return None
    return tr["replay"](replay_scale(ranks, strategy, offload, tp) or None,
                        lambda t: extras(t, ranks=ranks, strategy=strategy, tp=tp), settings=settings,
                        workspace=workspace, capacity=capacity, total=total)


def replay_scale(ranks: int, strategy: str, offload: bool = False, tp: int = 1) -> dict:
    """How ``rows_for`` weighs the trace's categories for one rank (FSDP's shards, TP's split, offload)."""
    sharded = strategy == "fsdp" and ranks > 1
    scale = {k: 1 / ranks for k in SHARDED + ("optimizer_temporaries",)} if sharded else {}
    if sharded and tp > 1:
        scale["activations"] = 1 / tp
    if offload:
        scale.update(optimizer_state=0.0, optimizer_temporaries=0.0)
    return scale


def extras(tr: dict, *, ranks: int, strategy: str, tp: int = 1) -> list[tuple]:
    """What a rank's device holds beside the trace's tensors, for the replay (probe/stream.py's ``extras``): DDP's
    buckets from the wrap on; FSDP's two gathered blocks on the all-gather stream through each step and validation,
    at load one block moved whole and its shard, at reload the artifact's unsharded rest; the inputs of the
    micro-batches a counted trace did not trace."""
    out: list[tuple] = []
    if strategy == "ddp" and ranks > 1:
        out.append(("load", tr["trainable_bytes"], 0, True))
    if strategy == "fsdp" and ranks > 1:
        block = tr["block"] // tp
        for name in names("train", "eval"):
            out += [(name, block, ALL_GATHER_STREAM, False)] * 2 + [
                (name, _root_unsharded(tr, ranks) // tp, ALL_GATHER_STREAM, False)]
        for name in names("load"):
            if tr.get("root", 0) > tr["block"] + tr["block"] // ranks:
                out.append((name, tr["root"], 0, False))
            else:
                out += [(name, tr["block"], 0, False), (name, tr["block"] // ranks, 0, False)]
        for name in names("reload"):
            out.append((name, tr["param_bytes"] - tr["param_bytes"] // ranks, 0, False))
    if tr.get("input_bytes"):
        out += [(name, tr["input_bytes"], 0, False) for name in names("train")]
    return out


def _with_resident(s: dict, nbytes: int, before: bool = True) -> dict:
    out = dict(s, gradients=s["gradients"] + nbytes)
    for k in ("baseline",) * before + ("peak_allocated", "end_allocated", "peak_reserved", "end_reserved"):
        if out[k] is not None:
            out[k] += nbytes
    return out


def _with_host_copies(s: dict, name: str, tr: dict, ranks: int) -> dict:
    """What FSDP holds unsharded outside the steps: at load, the model built whole on the host (the device
    itself on CPU) while each block is cut into shards, or on a GPU one block moved whole before it is
    cut; at export, rank 0's gathered full weights and the plain model they are loaded into, both on the
    host; at reload, the artifact read whole (booked as parameters, which ``scale`` divided)."""
    full, block, on_host = tr["param_bytes"], tr["block"], tr["device"] == "cpu"
    kind = BY_KIND.get(name)
    if kind == "load":  # the first block cut (the rest whole), or the root cut last (its whole and its shard, the
        # blocks already shards): above the shards the trace books, the larger of the two
        extra = max(full - full // ranks + block // ranks if on_host else block + block // ranks, tr.get("root", 0))
    elif kind == "export":
        extra = 2 * full if on_host else 0
    elif kind == "reload":
        extra = full - full // ranks
    else:
        extra = 0
    return with_gathered_blocks(s, extra) if extra else s


def _root_unsharded(tr: dict, ranks: int) -> int:
    """What FSDP2 holds of the root's parameters beyond its shard through a forward and backward: the root is not
    resharded after its forward (its embeddings, head and final norm stay gathered until the backward ends, or
    until ``evaluate`` reshards it)."""
    root = tr.get("root", 0)
    return root - root // ranks


def with_gathered_blocks(s: dict, nbytes: int) -> dict:
    """FSDP holds the block computing and the one prefetched unsharded while it runs: add them to the peak."""
    out = dict(s, temporaries=s["temporaries"] + nbytes, peak_allocated=s["peak_allocated"] + nbytes)
    if out["peak_reserved"] is not None:
        out["peak_reserved"] = out["end_reserved"] = max(out["peak_reserved"], out["peak_allocated"])
    return out
