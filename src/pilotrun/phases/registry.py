"""Every phase of the rehearsal, declared once: its name, its kind, the inputs its ledger row names,
what it needs from an earlier phase, how it runs on real tensors and how it runs on fake ones.

The pilot runs them all in this order (``driver.drive``), ``fit`` the train and eval ones, ``estimate``
traces them all under the fake-tensor accountant; the sheet, the memory bound, the integrations and
the report read the names and kinds from here. Adding a phase is one entry here plus its test.

``run(ctx, p)``: ``p`` is the measuring handle (``p.inputs`` to add facts, ``p.nan(why)``).
``trace(ctx)``: on fake tensors, under ``ctx.fake["acc"]`` (``probe.estimate.Accountant``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.engine.artifact import export_artifact
from pilotrun.engine.distributed import wrap_model
from pilotrun.engine.loop import evaluate, make_state, plan_value, precompute_reference, run_update, to_device
from pilotrun.engine.precision import autocast
from pilotrun.engine.state import save_state
from pilotrun import jsonsafe
from pilotrun.phases.worst import by_length
from pilotrun.tasks.base import BUILTIN_TASKS, loss_parts
from pilotrun.tasks.loading import torch_dtype
from pilotrun.tasks.moe import active, expert_counts
from pilotrun.tasks.quantized import held, logical_numel, original_bytes, quant_tensors, said, \
    upcast_by_preparation
from pilotrun.tasks.preference_loss import reference_kind, reference_of, resident_bytes

KINDS = ("load", "train", "eval", "save", "export", "reload")


@dataclass(frozen=True)
class Phase:
    name: str
    kind: str  # one of KINDS
    inputs: Callable  # (ctx) -> the inputs its ledger row names
    run: Callable  # (ctx, p) -> None, on real tensors
    trace: Callable  # (ctx) -> None, on fake tensors
    needs: str | None = None  # the earlier phase whose product it uses; without it the phase is not run
    only: Callable | None = None  # (campaign) -> whether the campaign has this phase; None: every campaign


def _count(model) -> tuple[int, int]:
    ps = list(model.parameters())
    return sum(logical_numel(p) for p in ps), sum(p.numel() for p in ps if p.requires_grad)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- load ---------------------------------------------------------------------------------------------
def _load_inputs(ctx) -> dict:
    c = ctx.prep.c
    out = {"dtype": c.model.dtype, "precision": c.train.precision, "strategy": c.train.strategy,
           "adapter": c.model.adapter is not None}
    if c.model.quantization is not None:
        out["quantization"] = said(c.model.quantization)
    if c.task == "preference":  # which second model the phase holds beside the policy (none, copy, adapter ...)
        out["reference"] = reference_kind(c)
    return out


def _reference_inputs(p, model) -> None:
    """A preference campaign's reference copy in the load row: its parameters and bytes beside the policy's."""
    ref = reference_of(model)
    if ref is not None:
        p.inputs["reference_params"] = sum(t.numel() for t in ref.parameters())
        p.inputs["reference_bytes"] = resident_bytes(model)


def _load(ctx, p) -> None:
    c, task = ctx.prep.c, ctx.task_for("load")
    model = task.build_model()
    if "quantization" in p.inputs:  # what the built model was checked to hold (tasks/quantized.check_quantized)
        p.inputs["quantization"] = held(model)
    p.inputs["params"], p.inputs["trainable"] = _count(model)
    _reference_inputs(p, model)
    moe = expert_counts(model)
    if moe["experts"]:  # what a token runs through: the time plan's FLOPs; the memory holds every expert
        p.inputs["active_params"] = active(p.inputs["params"], moe["expert_params"], moe["experts"], moe["top_k"])
        p.inputs["active_trainable"] = active(p.inputs["trainable"], moe["expert_trainable"], moe["experts"],
                                              moe["top_k"])
    if c.train.strategy != "fsdp":  # fully_shard moves each block to the device as it cuts it
        model.to(ctx.device)
    model = wrap_model(model, c.train.strategy, ctx.device)
    ctx.state = make_state(model, c.train, n_train=len(ctx.prep.train), seed=c.seed,
                           total_updates=ctx.prep.arithmetic()["updates"], device=ctx.device)
    if getattr(ctx.device, "type", str(ctx.device)) == "cpu":
        from pilotrun.engine.tensors import LIVE, track  # lazy: pulls in torch

        track(model, reference_of(model))  # tensors a loader made without an operator (safetensors) still count
        with p.untimed():  # and those a library made beside the model without one (bitsandbytes' 4-bit tables)
            LIVE.sweep()


def _load_traced(ctx) -> None:
    import torch

    c, t, fake, acc = ctx.prep.c, ctx.prep.c.train, ctx.fake, ctx.fake["acc"]
    model = fake["model"]
    _built_in_float32(acc, model, c, fake["device"])
    if c.model.quantization is not None:
        _quantized_load_traced(acc, model, c)
    reference = reference_of(model)  # preference: the frozen copy beside the policy, resident from load on
    for m in (model,) + ((reference,) if reference is not None else ()):
        for p in m.parameters():
            acc.book(p, "parameters")
        for b in m.buffers():
            acc.book(b, "parameters")
    for q in quant_tensors(model):  # a quantised base's absmax, code and nested statistics: no parameter holds them
        acc.book(q, "parameters")
    if t.strategy == "ddp" and fake["ranks"] > 1:
        acc.allocate(_bytes(p for p in model.parameters() if p.requires_grad), "gradients")  # DDP's buckets
    # the optimizer kernel of the device estimated (optim.kernel): on CUDA torch's default, the foreach
    # kernels, whose temporaries differ; on CPU the fused kernel pilotrun steps with, which has none, but for
    # FSDP's DTensor shards, which torch steps one tensor at a time there
    ctx.state = make_state(model, t, n_train=len(ctx.prep.train), seed=c.seed,
                           total_updates=ctx.prep.arithmetic()["updates"], device=torch.device("cpu"),
                           kernel_device=fake["device"],
                           sharded=t.strategy == "fsdp" and data_parallel_ranks(t) > 1)


def _built_in_float32(acc, model, c, device: str) -> None:
    """A model built from model.config in a 16-bit model.dtype is initialised in float32 (``from_config`` in torch's
    default dtype) and then converted one tensor at a time (``Module.to``): the whole float32 model and the largest
    converted tensor at once, before the build goes on. The fake build makes it in its dtype directly. The build runs
    in the host's memory (``task.build_model``; the model goes to the GPU after it), so only an estimate for the CPU,
    where the host is the device, counts it: a 70B model's 262 GiB float32 build is the rental's RAM, not its GPU's."""
    import torch

    dtype = torch_dtype(c.model.dtype)
    if device != "cpu" or c.model.config is None or dtype == torch.float32:
        return
    tensors = [t for t in list(model.parameters()) + list(model.buffers()) if t.is_floating_point()
               or getattr(t, "quant_state", None) is not None]
    if not tensors:
        return
    numel = [logical_numel(t) for t in tensors]
    full = acc.allocate(sum(numel) * 4, "temporaries")
    largest = acc.allocate(max(numel) * torch.empty((), dtype=dtype).element_size(), "temporaries")
    acc.release(largest)
    acc.release(full)


def _quantized_load_traced(acc, model, c) -> None:
    """A quantised base's build in order. The unquantised parameters peft's kbit preparation upcasts (embeddings,
    norms, the head) are held in model.dtype from the load on, then each in float32 beside its 16-bit copy until the
    copy is freed. A base built from model.config also holds its linear weights in model.dtype first, then quantises
    them one at a time (``tasks/quantized.quantize_in_place``), each original freed once its packed weight exists
    (``from_pretrained`` reads a folder's one tensor at a time: that transient is one layer's, not counted)."""
    dtype = torch_dtype(c.model.dtype)
    upcast = upcast_by_preparation(model, dtype)
    small = [acc.allocate(t.numel() * t.new_empty((), dtype=dtype).element_size(), "parameters") for t in upcast]
    if c.model.config is not None:
        layers = original_bytes(model, dtype)
        blocks = [acc.allocate(n, "temporaries") for _, n in layers]
        packed = {id(m.weight) for m, _ in layers} | {id(t) for t in upcast}
        for t in list(model.parameters()) + list(model.buffers()):  # what from_config built beside them, as built
            if id(t) not in packed:
                acc.book(t, "parameters")
        for (m, _), block in zip(layers, blocks):
            acc.book(m.weight, "parameters")
            for q in quant_tensors(m):
                acc.book(q, "parameters")
            acc.release(block)
    skip = {id(t) for t in upcast}
    for t in list(model.parameters()) + list(model.buffers()) + quant_tensors(model):  # the rest, as loaded
        if id(t) not in skip:
            acc.book(t, "parameters")
    for t, block in zip(upcast, small):  # then the preparation's upcasts, one at a time
        acc.book(t, "parameters")
        acc.release(block)


# --- precompute_reference: preference.reference: precomputed, the starting model's no-grad forward -----------
def precomputes(c) -> bool:
    return c.task == "preference" and reference_kind(c) == "precomputed"


def _precompute_examples(ctx) -> list:
    """The pairs the later phases read the reference of: the worst update's and the worst validation batch; the
    precomputation's batches are the longest of them first, ``eval_batch`` pairs each (the rental's worst batch)."""
    seen, out = set(), []
    for e in [e for b in ctx.worst["micro_batches"] for e in b] + list(ctx.worst["eval"]):
        if id(e) not in seen:
            seen.add(id(e))
            out.append(e)
    return out


def _precompute_inputs(ctx) -> dict:
    t, longest = ctx.prep.c.train, by_length(_precompute_examples(ctx))
    return {"eval_batch": t.eval_batch, "seq_len": longest[0].length if longest else 0, "precision": t.precision,
            "pairs": len(longest), "reference": "precomputed"}


def _precompute_traced(ctx, task=None) -> None:
    state = ctx.state
    precompute_reference(state.model, task or ctx.task, _precompute_examples(ctx), device=state.device,
                         precision=state.precision, batch_size=ctx.prep.c.train.eval_batch)


def _precompute(ctx, p) -> None:
    import torch

    _precompute_traced(ctx, ctx.task_for("precompute_reference"))
    values = [v for _, v in ctx.task.reference_table(ctx.state.model).entries.values()]
    if values:
        p.check_finite(torch.tensor(values, dtype=torch.float32), "a precomputed reference log-probability is")


# --- train: first_step (the optimizer state is allocated in it), steady_step (everything lives at once) --
def _train_inputs(ctx) -> dict:
    return dict(ctx.worst["train_inputs"])


def _step(name: str):
    def run(ctx, p) -> None:
        c = ctx.prep.c
        out = run_update(ctx.state, ctx.task_for(name), ctx.worst["micro_batches"],
                         max_grad_norm=c.train.max_grad_norm)
        p.inputs["targets"] = out["targets"]
        for part, value in out.get("loss_parts", {}).items():  # the loss's parts besides the targets', apart
            p.inputs[part] = round(value, 6)
        if not out["finite"]:
            p.nan(f"the update's loss is {out['loss']} (seq_len {ctx.worst['train_inputs']['seq_len']}, "
                  f"micro_batch {c.train.micro_batch}); the optimizer step was skipped")
    return run


def _step_traced(ctx) -> None:
    run_update(ctx.state, ctx.task, ctx.worst["micro_batches"], max_grad_norm=ctx.prep.c.train.max_grad_norm)


REPLAY = True  # tests switch it off to compare the replayed steady step and reload with the ones dispatched


def _steady_traced(ctx) -> None:
    """The steady update on fake tensors: the first update's events booked again less its optimizer state's
    births (``Accountant.replay``), without dispatching an op, where that is what dispatching it again books: a
    built-in task (a transformers model, whose second update runs the first's code on the same micro-batches;
    a custom task's model may keep state between calls), torch's AdamW or SGD (whose first step only adds the
    state the second finds), no grad scaler (it allocates its scale at the first update), no gradient held,
    and the first update closed but for its optimizer state (``replayable``). Else it is dispatched op by op.
    tests/test_estimate.py checks the two ledgers agree event by event."""
    import torch

    acc, state = ctx.fake["acc"], ctx.state
    if (REPLAY and ctx.prep.c.task in BUILTIN_TASKS and state.scaler is None
            and type(state.optimizer) in (torch.optim.AdamW, torch.optim.SGD)
            and "first_step" in acc.marks and all(p.grad is None for p in state.model.parameters())
            and acc.replayable("first_step", "optimizer_state")):
        acc.replay(acc.recorded("first_step", "optimizer_state"))
        return
    _step_traced(ctx)


# --- eval_longest ---------------------------------------------------------------------------------------
def _eval_inputs(ctx) -> dict:
    return dict(ctx.worst["eval_inputs"])


def _eval(ctx, p) -> None:
    ev = evaluate(ctx.state, ctx.task_for("eval_longest"), ctx.worst["eval"], ctx.prep.c.train.eval_batch)
    p.check_finite(ev["val_loss"], "the validation loss")
    plan_value(ev, ctx.prep.c.plan.metric)  # a custom task's validation logs what the plan decides on


def _eval_traced(ctx) -> None:
    evaluate(ctx.state, ctx.task, ctx.worst["eval"], ctx.prep.c.train.eval_batch)


# --- save ----------------------------------------------------------------------------------------------
def _save(ctx, p) -> None:
    ctx.task_for("save")
    ckpt = Path(ctx.run_dir) / "checkpoints" / "pilot"
    save_state(ctx.state, ckpt)  # every rank calls it; rank 0 writes
    if ctx.rank == 0:
        p.inputs["bytes"] = _dir_bytes(ckpt)


def _save_traced(ctx) -> None:
    ctx.fake["notes"]["save"] = ("not traced: the checkpoint is written from host copies, device memory stays "
                                 "at the live tensors")


# --- export --------------------------------------------------------------------------------------------
def _export(ctx, p) -> None:
    task = ctx.task_for("export")
    art = Path(ctx.run_dir) / "artifact"
    ctx.written = export_artifact(task, ctx.state.model, art, ctx.rank, ctx.prep.c.train.strategy)
    if ctx.rank == 0:
        p.inputs.update(parts=ctx.written, bytes=_dir_bytes(art))
        merged = art / "merged" / "config.json"
        if ctx.prep.c.model.quantization is not None and merged.is_file():  # what the merged weights are
            p.inputs["merged"] = jsonsafe.loads(merged.read_text()).get("pilotrun_dequantized")


def _export_traced(ctx) -> None:
    fake, model = ctx.fake, ctx.fake["model"]
    fake["notes"]["export"] = "not traced: the artifact is written from host copies"
    if ctx.prep.c.model.adapter is None and ctx.prep.c.train.strategy != "fsdp" and _reverted_copies(model):
        fake["notes"]["export"] = ("the copies save_pretrained makes on the device are counted (the fused experts "
                                   "split back into one tensor per expert, each made contiguous); files are written "
                                   "from host copies")
    if ctx.prep.c.model.quantization is not None:
        # peft's save reads the model's state_dict, where each quantised layer adds its statistics packed anew
        held = model.state_dict()
        del held
        fake["notes"]["export"] = ("the quantised layers' statistics the adapter's save packs anew are counted; files "
                                   "are written from host copies")
    if ctx.prep.c.model.adapter is not None and ctx.prep.c.model.adapter.merged_copy:
        # save_hf_artifact merges a deep copy of the adapted model, on the model's device
        q = ctx.prep.c.model.quantization
        held = _bytes(model.parameters()) + _bytes(model.buffers())
        if q is not None:  # the copy's quantised layers dequantised beside it, each summed with its delta in float32
            layers = original_bytes(model, torch_dtype(q.compute_dtype) if q.bits == 4 else torch_dtype("float16"))
            held += _bytes(quant_tensors(model)) + sum(n for _, n in layers)
            held += max((m.in_features * m.out_features * 4 for m, _ in layers), default=0)
        copy = fake["acc"].allocate(held, "temporaries")
        fake["acc"].release(copy)
        fake["notes"]["export"] = "the merged copy of the adapted model is counted" + (
            " (its quantised layers dequantised)" if q is not None else "") + "; files are written from host copies"


def _reverted_copies(model) -> bool:
    """save_pretrained's work on the model's device, on fake tensors: transformers reverts the conversion it loads
    with (an MoE's fused experts split back into the per-expert tensors a checkpoint holds) and makes each tensor
    contiguous before it is written; whether there was anything to revert."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4 converts nothing
        return False
    state = model.state_dict()
    reverted = revert_weight_conversion(model, state)
    if reverted is state or set(reverted) == set(state):
        return False
    held = [t.contiguous() for t in reverted.values()]
    del held, reverted
    return True


# --- reload: the artifact loaded back, one loss on the longest example ----------------------------------
def _sample(ctx) -> list:
    return by_length(ctx.prep.validation or ctx.prep.train)[:1]


def _reload_inputs(ctx) -> dict:
    sample = _sample(ctx)
    if ctx.fake is not None:
        return {"path": "artifact", "seq_len": sample[0].length if sample else 0}
    if "export" not in ctx.done:
        return {"path": "artifact"}
    return {"path": "artifact", "parts": ctx.written, "seq_len": sample[0].length}


def artifact_loss(task):
    """The loss the reload phase computes with the reloaded artifact: the task's ``reload_loss`` where the artifact
    alone cannot give its training loss (preference: no reference beside it), else its ``loss``."""
    return getattr(task, "reload_loss", task.loss)


def _reload(ctx, p) -> None:
    import torch

    task, reload_task = ctx.task, ctx.task_for("reload")
    if ctx.rank != 0:
        return
    art, sample = Path(ctx.run_dir) / "artifact", _sample(ctx)
    for part in ctx.written:
        loaded_model = task.load_artifact(art / part).to(ctx.device)
        if getattr(ctx.device, "type", str(ctx.device)) == "cpu":
            from pilotrun.engine.tensors import track  # lazy: pulls in torch

            track(loaded_model)  # safetensors' tensors come without an operator: counted as at load
        loaded_model.eval()
        with torch.no_grad(), autocast(ctx.prep.c.train.precision, ctx.device.type):
            batch = to_device(task.collate(sample), ctx.device)
            s, n, _ = loss_parts(artifact_loss(reload_task)(loaded_model, batch))
        loss = float(s) / max(1, int(n))
        del loaded_model
        if loss != loss or loss in (float("inf"), float("-inf")):
            p.nan(f"the reloaded artifact/{part} gives the loss {loss}")
            return


def _reload_traced(ctx) -> None:
    """The merged model built whole and one loss on the longest example; where another trace of this process
    reloaded the same model (the same plain campaign, depth, device and prepared sample: ``probe/trace``), its
    events replayed instead: the same code on the same shapes, its phase closed (``Accountant.replayable``), and
    this trace's steps and evaluation closed too (nothing of theirs left for the reload to free)."""
    import torch

    reloaded, acc = ctx.fake.pop("reloaded"), ctx.fake["acc"]
    if ctx.fake.get("reload") is not None:
        if all(acc.replayable(n, "optimizer_state") for n in names("train", "eval") if n in acc.marks):
            acc.replay(ctx.fake["reload"])
            return
        with acc.paused():  # not built on the chance of a replay: built now, booked from the phase as before
            reloaded = ctx.fake["rebuild"]()
    c = ctx.prep.c
    _built_in_float32(acc, reloaded, c, ctx.fake["device"])
    if c.model.quantization is not None:
        _quantized_load_traced(acc, reloaded, c)
    for p in list(reloaded.parameters()) + list(reloaded.buffers()) + quant_tensors(reloaded):
        acc.book(p, "parameters")
    reloaded.eval()
    # under the precision's autocast, as ``_reload`` runs it: bf16-mixed casts the reloaded weights and keeps the
    # casts (autocast's weight cache) until the loss is computed — the reload's rise the H200 measured
    with torch.no_grad(), autocast(ctx.prep.c.train.precision, "cpu"):
        artifact_loss(ctx.task)(reloaded, ctx.task.collate(_sample(ctx)))
    del reloaded
    if "rebuild_merged" in ctx.fake:  # a quantised base's merged copy, reloaded after the adapter: dequantised
        with acc.paused():
            merged = ctx.fake["rebuild_merged"]()
        for p in list(merged.parameters()) + list(merged.buffers()):
            acc.book(p, "parameters")
        merged.eval()
        with torch.no_grad():
            artifact_loss(ctx.task)(merged, ctx.task.collate(_sample(ctx)))
        del merged


REGISTRY: tuple[Phase, ...] = (
    Phase("load", "load", _load_inputs, _load, _load_traced),
    Phase("precompute_reference", "eval", _precompute_inputs, _precompute, _precompute_traced, needs="load",
          only=precomputes),
    Phase("first_step", "train", _train_inputs, _step("first_step"), _step_traced, needs="load"),
    Phase("steady_step", "train", _train_inputs, _step("steady_step"), _steady_traced, needs="load"),
    Phase("eval_longest", "eval", _eval_inputs, _eval, _eval_traced, needs="load"),
    Phase("save", "save", lambda ctx: {"path": "checkpoints/pilot"}, _save, _save_traced, needs="load"),
    Phase("export", "export", lambda ctx: {"path": "artifact"}, _export, _export_traced, needs="load"),
    Phase("reload", "reload", _reload_inputs, _reload, _reload_traced, needs="export"),
)
PHASES = tuple(p.name for p in REGISTRY)
BY_NAME = {p.name: p for p in REGISTRY}


def phases_of(c) -> tuple[str, ...]:
    """The phases campaign ``c`` has: every one but those its settings leave out (``Phase.only``)."""
    return tuple(p.name for p in REGISTRY if p.only is None or p.only(c))


def names(*kinds: str) -> tuple[str, ...]:
    """The phases of these kinds, in order: ``names("train")`` → ("first_step", "steady_step")."""
    unknown = set(kinds) - set(KINDS)
    assert not unknown, unknown
    return tuple(p.name for p in REGISTRY if p.kind in kinds)
