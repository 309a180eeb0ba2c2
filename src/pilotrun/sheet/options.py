"""When the campaign does not fit: the options that do, per catalogue GPU and GPU count, and what each
changes in the experiment.

Memory comes from the estimator (probe/trace.py): three traces — the campaign as written, with
activation checkpointing, and with a LoRA adapter plus checkpointing — and from each the rows of one
rank for any count and strategy (``rows_for``: DDP buckets, FSDP's shards and gathered blocks, an
offloaded optimizer). QLoRA is a fourth trace, the LoRA one with its base loaded through bitsandbytes (nf4,
double-quantised, bf16 compute: the packed weights and their statistics, the dequantised temporaries, peft's
upcasts); without bitsandbytes installed, the LoRA trace with the decoder layers' linear weights at 4 bits.
The memory checked is the training run's phases (load, both steps, validation, checkpoint); the
artifact export and its reload check load the whole merged model and can run on the host, so they
are reported, not required.

Time is the plan's arithmetic (sheet/option_time.py): FLOPs per update (``plan.flops_per_update``) at ``plan.ASSUMED_MFU`` of the
GPU's dense rate, divided over the data-parallel ranks, plus communication at an assumed bus bandwidth, not
overlapped with compute (the assumptions are returned as words). When the campaign has a pilot, the sheet
passes its figures (``calibrate``): the campaign as written takes the time plan's seconds (from the pilot's
measured phases) and, piloted on CUDA, its measured memory; the other options are scaled from it.
Cost (``--rates``): the sheet's one rule, ``sheet/rates.rent`` (the row's campaign time × its GPUs × the hourly
price, or a whole-day plan that holds it less ``hardware.reserve``, whichever is cheaper). Words and stage results: sheet/options_view.py.
"""

from __future__ import annotations

import importlib.util
import math
import time

from pilotrun.campaign.arithmetic import batch_arithmetic, data_parallel_ranks, examples_per_update
from pilotrun.campaign.prepare import prepare
from pilotrun.console.progress import head
from pilotrun.errors import BadInput
from pilotrun import jsonsafe
from pilotrun.phases import names
from pilotrun.probe.trace import rows_for, traced
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE
from pilotrun.sheet.gpu_memory import HEADROOM_FRACTION, need_bytes, overheads
from pilotrun.sheet.option_time import BUS_GBS, HOST_GBS, HOST_PARAMS_S, NODE_GBS, QLORA_SLOWER, active_counts, \
    campaign_seconds
from pilotrun.sheet.rates import rent
from pilotrun.sheet.shape import budget_tokens, eval_tokens
from pilotrun.tasks.base import BUILTIN_TASKS
from pilotrun.tasks.preference_loss import reference_kind

COUNTS = (1, 2, 4, 8)  # GPUs on one node
NODES = (2, 4, 8)  # nodes of 8, tried for a GPU only when nothing that keeps the question fits one node
LORA_R = 16
NF4_BYTES = 0.5 + 0.016  # 4 bits per weight plus the double-quantized block constants (the fallback's)
QLORA = {"model.quantization": {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}}
TRAINING = names("load", "train", "eval", "save")  # the training run's phases; export and reload are reported
KEEPS = "keeps the experiment"
HOST_UNITS = ("run_overhead", "final_ref") + P.HOST_KINDS  # time-plan terms kept as measured on any option

# key, label, short label (the sheet's table), trace, strategy at > 1 GPU ("ddp" follows the campaign's own when
# it shards), offload, qlora
OPTIONS = (
    ("written", "as written", "as written", "written", "ddp", False, False),
    ("ckpt", "activation checkpointing", "ckpt", "ckpt", "ddp", False, False),
    ("fsdp", "FSDP full sharding", "FSDP", "written", "fsdp", False, False),
    ("fsdp_ckpt", "FSDP + checkpointing", "FSDP+ckpt", "ckpt", "fsdp", False, False),
    ("offload_ckpt", "optimizer offload + checkpointing", "offload+ckpt", "ckpt", "ddp", True, False),
    ("fsdp_ckpt_offload", "FSDP + checkpointing + optimizer offload", "FSDP+ckpt+offload", "ckpt", "fsdp", True,
     False),
    ("lora", "LoRA r={r} + checkpointing", "LoRA+ckpt", "lora", "ddp", False, False),
    ("fsdp_lora", "LoRA r={r} + FSDP + checkpointing", "LoRA+FSDP+ckpt", "lora", "fsdp", False, False),
    ("qlora", "QLoRA 4-bit r={r} + checkpointing", "QLoRA+ckpt", "qlora", "ddp", False, True),
)
# tensor parallel within a node × FSDP across nodes: only over nodes, only where the architecture has a TP plan
TP_OPTIONS = (
    ("tp_fsdp", "tensor parallel ×{t} + FSDP across nodes", "TP+FSDP", "written", "tp_fsdp", False, False),
    ("tp_fsdp_ckpt", "tensor parallel ×{t} + FSDP across nodes + checkpointing", "TP+FSDP+ckpt", "ckpt", "tp_fsdp",
     False, False),
)
# expert parallel × FSDP: a mixture of experts' routed experts split over e GPUs of a node, the rest FSDP over all
EP_OPTIONS = (
    ("ep_fsdp", "expert parallel ×{e} + FSDP", "EP+FSDP", "written", "ep_fsdp", False, False),
    ("ep_fsdp_ckpt", "expert parallel ×{e} + FSDP + checkpointing", "EP+FSDP+ckpt", "ckpt", "ep_fsdp", False,
     False),
)
EP_NOTE = ("memory estimated, not measured: the routed experts' parameters and gradients ÷ the EP degree (each GPU "
           "holds experts/EP of every MoE layer whole, never gathered), their optimizer state and every other "
           "parameter, gradient and optimizer state ÷ all the GPUs (FSDP; a distributed optimizer over the experts' "
           "replicas); activations per GPU as FSDP's, plus the routing worst case: dropless routing (transformers', "
           "the HF Trainer's, Axolotl's) lets every token of the EP group reach one GPU's experts, so that GPU's "
           "expert activations are sized × EP; pilotrun does not train with EP")
TP_NOTE = ("memory estimated, not measured: parameters, gradients and optimizer state ÷ the TP × FSDP ranks, "
           "activations ÷ the TP degree (pilotrun does not train with TP; transformers' TP plan, run on 2 CPU ranks "
           "over gloo in tests/test_tp_gloo.py, splits the parameters so, all but the norms)")

MEANINGS = {
    "written": "the campaign as written; over N GPUs data parallel with accumulation ÷ N (same effective batch)",
    "ckpt": "recomputes activations in the backward pass: same updates, about a third more compute",
    "fsdp": "parameters, gradients and optimizer state sharded over the N GPUs, activations per rank, two "
            "layers gathered at a time: same updates, more communication",
    "offload": "optimizer state and step on the host: same updates, slower steps, host memory needed",
    "tp_fsdp": "tensor parallel within a node (each layer's matmuls split over its GPUs, the architecture's TP "
               "plan) × FSDP across nodes: one data rank per node, so accumulation ÷ nodes keeps the effective "
               "batch; same updates, all-reduces of activations within the node",
    "ep_fsdp": "expert parallel (a mixture of experts' routed experts split over the GPUs of a node, each token "
               "sent to its experts' GPU and back) × FSDP for the rest: same updates, all-to-alls per MoE layer",
    "lora": "trains an adapter, not the model: a different experiment",
    "qlora": "trains an adapter on a 4-bit copy of the base: a different experiment (bitsandbytes; rehearse it here "
             "with model.quantization: {bits: 4} and model.adapter; a merged export holds the dequantised weights)",
    "shorter max_length / lower precision": "change what is trained: a different experiment (not listed)",
}


def _variants(loaded, r: int) -> dict:
    c = loaded.campaign
    ckpt = loaded if c.model.gradient_checkpointing else loaded.with_overrides({"model.gradient_checkpointing": True})
    if c.model.adapter is not None:
        lora = ckpt
    else:
        lora = ckpt.with_overrides({"model.adapter": {"kind": "lora", "r": r}})
    out = {"written": loaded, "ckpt": ckpt, "lora": lora}
    if c.model.quantization is None:  # already quantised: "as written" is the QLoRA row
        # QLoRA as users run it (bitsandbytes nf4, double-quantised, bf16 compute), traced through bitsandbytes'
        # own layers; without bitsandbytes (or for a custom task) the LoRA trace with its linear weights at 4 bits
        if importlib.util.find_spec("bitsandbytes") is not None and c.task in BUILTIN_TASKS:
            strategy = {"train.strategy": "ddp"} if c.train.strategy == "fsdp" else {}
            out["qlora"] = lora.with_overrides({**QLORA, **strategy})
        else:
            out["qlora"] = lora
    return out


def options_table(loaded, *, prep=None, rates: dict | None = None, lora_r: int | None = None,
                  gpus=None, device: str = "cuda", written=None, pilot: dict | None = None) -> dict:
    """Every option × catalogue GPU × count evaluated; ``shown``: the fastest fitting option per GPU and count
    for each kind (keeps the experiment / changes it); ``recommended`` and ``cheapest``.

    ``rates``: ``sheet/rates.read_rates``'s dict (cost per row, and "cheapest" by cost). ``written``: the
    campaign's own trace when the caller has it (the sheet's prediction). ``pilot``: the pilot's measured
    figures (``calibrate``), which replace the estimator's where they exist."""
    started = time.perf_counter()
    c = loaded.campaign
    adapter = c.model.adapter
    r = lora_r or (adapter.r if adapter is not None else LORA_R)
    prep = prep or prepare(loaded, splits=("train", "validation"), shapes=True)
    variants = _variants(loaded, r)
    traces: dict[str, dict] = {"written": written} if written is not None else {}
    labels = {"written": "as written", "ckpt": "with checkpointing", "lora": f"LoRA r={r}", "qlora": f"QLoRA r={r}"}

    def need(key: str) -> None:
        if key in traces:
            return
        same = next((k for k, w in variants.items() if w is variants[key] and k in traces), None)
        share = traces["written"] if key == "ckpt" and "written" in traces else None  # ckpt changes the steps only
        if not same:  # a 70B model's traces are seconds each: the sheet and estimate --options say which
            head(f"tracing {labels[key]}")  # on fake tensors; the phases' notes follow
        traces[key] = traces[same] if same else traced(variants[key], device=device, prep=prep, after_steps=share)

    need("written")
    try:
        need("lora")
    except BadInput as e:  # the rank --lora-r gave, not the campaign's
        if lora_r and e.where == "model.adapter.r":
            raise BadInput(e.detail, where="--lora-r", fix=e.fix.replace("model.adapter.r", "--lora-r")) from None
        raise
    work = _work(loaded, prep)
    work["net"] = (rates or {}).get("interconnect") or {}
    tp = tp_degree(c.model)
    work["tp"] = tp
    work["hidden"] = (_config_dict(c.model) or {}).get("hidden_size") or 0
    effective = examples_per_update(c.train)
    cache: dict = {}
    args = (traces, cache, work, effective, r, c, adapter is not None, gpus or CATALOGUE)
    rows = _rows(*args)
    # checkpointing only adds compute where the campaign as written fits: traced when it does not fit somewhere
    skipped = None
    if any(x["trace"] == "written" and x["precision_ok"] and not x["fits"] for x in rows):
        need("ckpt")
        rows = _rows(*args)
    else:
        skipped = ("activation checkpointing not evaluated: the campaign as written fits every GPU and count "
                   "planned, and checkpointing only adds compute")
    # QLoRA runs on the same GPUs as LoRA, slower: traced only where LoRA (the campaign's own adapter as written)
    # does not fit somewhere, as checkpointing is
    lora_keys = ("written", "ckpt", "lora") if adapter is not None else ("lora",)
    if "qlora" in variants:
        if any(x["trace"] in lora_keys and x["precision_ok"] and not x["fits"] for x in rows):
            need("qlora")
            rows = _rows(*args)
        else:
            said = (f"QLoRA not evaluated: {'the adapter as written' if adapter is not None else 'LoRA'} fits every "
                    "GPU and count planned, and QLoRA only adds compute on the same GPUs")
            skipped = f"{skipped}; {said}" if skipped else said
    for g in gpus or CATALOGUE:
        ours = [x for x in rows if x["gpu"] == g.key]
        if pilot is not None and ours:
            calibrate(ours, g, pilot)
        for row in ours:
            _priced(row, rates, loaded.campaign.hardware.reserve)
    shown = _shown(rows)
    rec, cheap, by = _choose(rows, rates)
    left_out = [{"gpu": g.key, "name": g.name, "why": f"no {c.train.precision} tensor rate on it (train.precision)"}
                for g in gpus or CATALOGUE if g.rate_tflops(c.train.precision) <= 0]  # what _rows leaves out
    return {"rows": rows, "shown": shown, "recommended": rec, "cheapest": cheap if cheap is not rec else None,
            "by": by, "currency": (rates or {}).get("currency", ""), "rates": (rates or {}).get("path"),
            "lora_r": r, "meanings": _meanings(c), "params": traces["written"]["params"],
            "reference": _reference(c, traces["written"]),
            "moe": moe_facts(traces["written"]),
            "assumptions": _assumptions(pilot, work["net"], moe_facts(traces["written"])),
            "effective_batch": effective,
            "counted": traces["written"].get("counted"), "pilot_run": (pilot or {}).get("run"),
            "skipped": skipped, "left_out": left_out, "tp": tp, "shapes": prep.shapes_said(),
            "why_none": None if rec else why_none(rows, tp, effective), "wall_s": time.perf_counter() - started}


def _reference(c, tr: dict) -> dict | None:
    """A preference campaign's reference model: what it is and the bytes of a frozen copy (0 under LoRA, whose
    reference is the base with the adapter disabled, and for a precomputed one: no model resident); None for another
    task."""
    if c.task != "preference":
        return None
    return {"kind": reference_kind(c), "bytes": tr.get("reference_bytes", 0)}


def _meanings(c) -> dict:
    """What each option changes; a preference campaign's LoRA rows also change the reference (no resident copy)."""
    if c.task != "preference" or reference_kind(c) != "copy":
        return MEANINGS
    return dict(MEANINGS, lora=MEANINGS["lora"] + "; its reference is the base with the adapter disabled, so the "
                                                  "frozen reference copy the campaign holds is no longer resident")


def _config_dict(model) -> dict | None:
    """model.config, or model.path's config.json, as a dict (with model.config_overrides); None when unreadable."""
    from pathlib import Path

    cfg = model.config if isinstance(model.config, dict) else None
    if cfg is None and model.path and (Path(model.path) / "config.json").is_file():
        try:
            cfg = jsonsafe.loads((Path(model.path) / "config.json").read_text())
        except (OSError, ValueError):
            cfg = None
    if isinstance(cfg, dict) and getattr(model, "config_overrides", None):
        cfg = {**cfg, **model.config_overrides}
    return cfg if isinstance(cfg, dict) else None


def moe_facts(tr: dict) -> dict | None:
    """A mixture of experts' parameters as the table uses them: ``total`` for memory (every expert is held),
    ``active`` for compute (a token runs through its top_k experts), the experts and how many a token is sent to;
    None for a dense model."""
    if not tr.get("experts"):
        return None
    params, trainable = active_counts(tr)
    return {"total": tr["params"], "active": params, "active_trainable": trainable, "experts": tr["experts"],
            "top_k": tr["top_k"], "moe_layers": tr["moe_layers"], "expert_params": tr["expert_params"]}


def ep_degree(experts: int, n: int) -> int | None:
    """The expert-parallel degree on ``n`` GPUs: the largest of 8, 4, 2 that divides the experts and the GPUs
    and fits one node (an EP group's all-to-alls stay on the node's interconnect); None for a dense model or when
    none divides."""
    if not experts or n < 2:
        return None
    return next((e for e in (8, 4, 2) if e <= min(n, 8) and experts % e == 0 and n % e == 0), None)


def tp_degree(model) -> dict:
    """{"degree": t, "why": None} for an architecture whose transformers config class carries a tensor-parallel
    plan (``base_model_tp_plan``) and whose attention and key/value heads t ∈ (8, 4, 2) divides (the largest);
    else {"degree": None, "why": the reason}."""
    cfg = _config_dict(model)
    if not isinstance(cfg, dict) or not cfg.get("model_type"):
        return {"degree": None, "why": "no model config with a model_type to look up a tensor-parallel plan in"}
    from transformers import CONFIG_MAPPING

    kind = cfg["model_type"]
    cls = CONFIG_MAPPING[kind] if kind in CONFIG_MAPPING else None
    if cls is None or not getattr(cls, "base_model_tp_plan", None):
        return {"degree": None, "why": f"transformers has no tensor-parallel plan for {kind} (base_model_tp_plan)"}
    heads = cfg.get("num_attention_heads") or cls().num_attention_heads
    kv = cfg.get("num_key_value_heads") or heads
    t = next((t for t in (8, 4, 2) if heads % t == 0 and kv % t == 0), None)
    if t is None:
        return {"degree": None, "why": f"{heads} attention heads ({kv} key/value heads) are not divisible by a "
                                       f"tensor-parallel degree of 8, 4 or 2"}
    return {"degree": t, "why": None, "layers": cfg.get("num_hidden_layers"), "hidden": cfg.get("hidden_size")}


def why_none(rows: list[dict], tp: dict, effective: int) -> list[str]:
    """When no row fits and keeps the experiment: per option, the constraint it broke."""
    out = []
    for key, label in dict((x["option"], x["label"]) for x in rows).items():
        xs = [x for x in rows if x["option"] == key]
        kept = [x for x in xs if x["keeps"] and x["precision_ok"]]
        if not kept:
            broke = next((x["changes"] for x in xs if not x["keeps"]), "no GPU with a rate for the precision")
            out.append(f"{label}: {broke}")
            continue
        least = min(kept, key=lambda x: x["need"])
        most = max(x["count"] for x in kept)
        batch = [x for x in xs if not x["keeps"] and x["changes"].startswith("effective batch")]
        big = max(kept, key=lambda x: x["gpu_memory"])
        out.append(f"{label}: memory — at least {P.size(least['need'])} per GPU (with {least['count']} GPU(s)), more "
                   f"than the largest GPU's {P.size(big['gpu_memory'])} ({big['name']})" + (
                       f"; beyond {most} GPUs the effective batch is no longer {effective}" if batch else ""))
    if tp["degree"] is None:
        out.append(f"tensor parallel × FSDP across nodes: not evaluated — {tp['why']}")
    return out


def _rows(traces, cache, work, effective, r, c, has_adapter, gpus) -> list[dict]:
    """Every option whose trace is at hand × GPU × count (nodes of 8 only where nothing keeping the question
    fits one node)."""
    rows = []
    for g in gpus:
        if g.rate_tflops(c.train.precision) <= 0:
            continue  # no tensor cores for this precision (a T4 under bf16): nothing to plan
        fitted = False
        for n in COUNTS + tuple(8 * k for k in NODES):
            if n > 8 and fitted:
                break
            t = work["tp"]["degree"] if n > 8 else None
            e = ep_degree(traces["written"].get("experts") or 0, n)
            for opt in OPTIONS + (TP_OPTIONS if t else ()) + (EP_OPTIONS if e else ()):
                if opt[3] not in traces:
                    continue
                row = _evaluate(opt, g, n // 8 * t if opt[4] == "tp_fsdp" else n, traces, cache, work, effective,
                                r, c, has_adapter, t if opt[4] == "tp_fsdp" else 1, e if opt[4] == "ep_fsdp" else 1)
                if row is None:
                    continue
                rows.append(row)
                fitted = fitted or (row["fits"] and row["keeps"] and not opt[5])
    return rows


def _choose(rows: list[dict], rates: dict | None) -> tuple[dict | None, dict | None, str]:
    """The recommended row (the cheapest that keeps the question), the cheapest overall, and what "cheapest"
    was judged by: cost when rates are given and a rated GPU fits, else GPU-hours."""
    fit = [x for x in rows if x["fits"]]
    keep = [x for x in fit if x["keeps"]]
    priced = [x for x in fit if x["cost"] is not None]
    by = "cost" if rates and priced else "gpu_hours"
    if by == "cost":
        keep, fit = [x for x in keep if x["cost"] is not None], priced
        if not keep:  # no rated GPU keeps the question: the recommendation is by GPU-hours, said so
            rec = min((x for x in rows if x["fits"] and x["keeps"]), key=lambda x: (x["gpu_hours"], x["seconds"]),
                      default=None)
            return rec, min(fit, key=lambda x: (x["cost"], x["seconds"])), "gpu_hours (no rated GPU keeps it)"
    rec = min(keep, key=lambda x: (x[by], x["seconds"]), default=None)
    cheap = min(fit, key=lambda x: (x[by], x["seconds"]), default=None)
    return rec, cheap, by


def calibrate(rows: list[dict], g, pilot: dict) -> None:
    """Replace the estimator's figures of one GPU's rows with the pilot's where they exist.

    ``pilot``: {"run", "ranks", "runs", "kind" ("measured" | "predicted"), "needs": {gpu key: training-phase need
    row of ``gpu_memory.phase_needs``}, "terms": {gpu key: the time plan's terms of one run}}.
    Memory: the campaign as written on the pilot's own rank count takes the pilot's CUDA figure (a CPU
    pilot's figure is this same estimate). Time: the time plan's seconds for the campaign as written on
    this GPU (from the pilot's measured phases); every other option keeps that run's load, checkpoint,
    export and reload terms as measured and scales its updates and validations by the arithmetic's ratio
    of the option to the campaign as written."""
    anchor = next((x for x in rows if x["option"] == "written" and x["count"] == pilot["ranks"]), None)
    if anchor is None:
        return
    need = (pilot.get("needs") or {}).get(g.key)
    if need is not None and pilot.get("kind") == "measured":
        anchor.update(peak=need["reserved"], need=need["need"], phase=need["phase"],
                      fits=anchor["precision_ok"] and need["need"] <= g.memory_bytes,
                      memory_from=f"measured: pilot {pilot['run']}, CUDA reserved counter")
    terms = (pilot.get("terms") or {}).get(g.key)
    base = anchor["seconds"]
    if not terms or not base or not math.isfinite(base):
        return
    fixed = sum(x["seconds"] for x in terms if x["unit"] in HOST_UNITS)
    scaled = sum(x["seconds"] for x in terms) - fixed
    for x in rows:
        ratio = x["seconds"] / base
        x["seconds"] = pilot["runs"] * (fixed + scaled * ratio)
        x["time_how"] = (f"{pilot['runs']} run(s) × (host work {P.fmt_duration(fixed)} as "
                         f"the time plan measured + updates and validations {P.fmt_duration(scaled)} × {ratio:.3g}, "
                         f"the arithmetic's ratio to the campaign as written)")
        x["time_from"] = f"pilot {pilot['run']} (time plan), scaled by the arithmetic"


def _priced(x: dict, rates: dict | None, reserve: float = 0.0) -> None:
    """GPU-hours and, with rates, the cost of the row's campaign time on its GPUs (``cost_how`` says how)."""
    x["gpu_hours"] = x["seconds"] / 3600 * x["count"]
    x["cost"], x["cost_how"] = row_cost(rates, x["gpu"], x["seconds"], x["count"], reserve)


def row_cost(rates: dict | None, key: str, seconds: float, n: int, reserve: float = 0.0) -> tuple[float | None, str]:
    """A row's cost by the sheet's one rule (``sheet/rates.rent``: hourly, or a whole-day plan that holds it);
    None (and why) without a price."""
    if not rates:
        return None, "no rates: pass --rates FILE"
    rate = (rates.get("gpus") or {}).get(key)
    if rate is None:
        return None, f"no price for {key} in {rates.get('path', 'the rates file')}"
    if not math.isfinite(seconds):
        return None, "no campaign time"
    cost, how, _ = rent(rate, seconds, n, reserve, key)
    return cost, how


def _work(loaded, prep) -> dict:
    """Tokens an update and a validation pass compute on (the budget's mean padded tokens), and how often."""
    c = loaded.campaign
    t = c.train
    updates = batch_arithmetic(t, len(prep.train))["updates"]
    sample = min(updates, 200)
    tokens = budget_tokens(prep.train, t, c.seed, sample)
    val = eval_tokens(prep.validation or [], t.eval_batch)
    counts = P.run_counts(updates, t.eval_every, t.save_every, len(prep.validation or []), t.eval_batch, 1,
                          bool(prep.validation))
    runs = len(P.run_list(c.plan.control, c.plan.variants, c.plan.seeds))
    return {"tokens_update": sum(tokens) / len(tokens) * _ranks_of(t), "tokens_val": sum(val), "updates": updates,
            # a no-grad forward in each step (a precomputed reference's is once, before training)
            "reference": c.task == "preference" and reference_kind(c) in ("copy", "adapter"),
            "evals": counts["evals"], "eval_batches": counts["eval_batches"], "runs": runs, "precision": t.precision}


def _ranks_of(t) -> int:
    return data_parallel_ranks(t)


def _evaluate(opt, g, n, traces, cache, work, effective, r, c, has_adapter, tp: int = 1, ep: int = 1) -> dict | None:
    """One row: the option at ``n`` GPUs (``_at_count``, computed once per option and count whatever the GPU)
    priced on ``g``: its memory need with g's overheads, its time at g's rate and bus."""
    at = _at_count(opt, n, traces, cache, effective, c, has_adapter, tp, ep, work.get("hidden") or 0)
    if at is None:
        return None
    need = need_bytes(at["peak"], sum(o["bytes"] for o in overheads(g, n)))
    seconds, how = campaign_seconds(g, n, at["tr"], at["strategy"] if n > 1 else "single", at["offload"],
                                    at["qlora"], dict(work, ep=ep), math.ceil(at["acc_n"]))
    precision_ok = g.bf16 or work["precision"] not in ("bf16-mixed", "bf16-true")
    fits = need <= g.memory_bytes and precision_ok
    extra = {"tp": tp, "note": TP_NOTE} if tp > 1 else {"ep": ep, "note": EP_NOTE} if ep > 1 else {}
    return {"gpu": g.key, "name": g.name, "count": n, "nodes": at["data"] if tp > 1 else max(1, n // 8),
            "option": at["key"], "label": at["label"].format(r=r, t=tp, e=ep), "short": at["short"],
            "gpu_memory": g.memory_bytes, **extra, "trace": at["trace_key"], "peak": at["peak"], "need": need,
            "phase": at["phase"], "fits": fits, "precision_ok": precision_ok,
            "export_peak": at["export_peak"], "export_phase": at["export_phase"],
            "keeps": not at["changes"], "changes": "; ".join(at["changes"]) or KEEPS, "seconds": seconds,
            "time_how": how, "time_from": "the plan's arithmetic",
            "memory_from": "predicted: the estimator (fake tensors) replayed through the caching allocator", "accumulation": max(1, round(at["acc_n"]))}


def _at_count(opt, n, traces, cache, effective, c, has_adapter, tp: int = 1, ep: int = 1,
              hidden: int = 0) -> dict | None:
    """What an option is at ``n`` GPUs whatever the GPU: one rank's memory rows (``rows_for``; QLoRA's weights at
    4 bits), the training phases' peak, the export's, the accumulation that keeps the effective batch and what
    the option changes in the experiment; None where the option does not apply. Kept in ``cache``."""
    key, label, short, trace_key, strategy, offload, qlora = opt
    if strategy == "fsdp" and n == 1:
        return None
    if has_adapter and key in ("lora", "fsdp_lora"):
        return None  # the campaign is already an adapter: "as written" is that row
    if ("option", key, n, tp) in cache:
        return cache[("option", key, n, tp)]
    if strategy == "ddp" and c.train.strategy == "fsdp" and key == "written":
        strategy = "fsdp"
    tr = traces[trace_key]
    rows = _memory_rows(tr, cache, trace_key, n, strategy, offload, qlora, tp)
    if strategy == "ep_fsdp":
        rows = with_expert_parallel(rows, tr, n, ep, c.train.precision, hidden)
    train = [x for x in rows if x["phase"] in TRAINING]
    top = max(train, key=lambda x: P.row_peak(x) or 0)
    after = max((x for x in rows if x["phase"] not in TRAINING), key=lambda x: P.row_peak(x) or 0)
    data = n // tp  # data-parallel ranks: one per node under TP × FSDP
    acc_n = effective / (c.train.micro_batch * data)
    changes = []
    if qlora:
        changes.append("trains an adapter on a 4-bit copy of the base: a different experiment")
    elif trace_key == "lora" and not has_adapter:
        changes.append(MEANINGS["lora"])
    if not (acc_n >= 1 and acc_n == int(acc_n)):
        changes.append(f"effective batch {c.train.micro_batch * max(1, round(acc_n)) * data}, not {effective}: a "
                       f"different experiment")
    cache[("option", key, n, tp)] = {
        "key": key, "label": label, "short": short, "trace_key": trace_key, "strategy": strategy,
        "offload": offload, "qlora": qlora, "tr": tr, "data": data, "acc_n": acc_n, "changes": changes,
        "peak": P.row_peak(top), "phase": top["phase"], "export_peak": P.row_peak(after),
        "export_phase": after["phase"]}
    return cache[("option", key, n, tp)]


def _memory_rows(tr, cache, trace_key, n, strategy, offload, qlora, tp) -> list[dict]:
    """One rank's rows of a trace at ``n`` GPUs under a strategy (kept in ``cache``: options share them)."""
    ck = (trace_key, n, strategy if n > 1 else "single", offload, qlora)
    if ck not in cache:
        fsdp = tp > 1 or ck[2] == "ep_fsdp"  # TP × FSDP and EP × FSDP start from FSDP's rows
        rows = rows_for(tr, ranks=n, strategy="fsdp" if fsdp else ck[2], offload=offload, tp=tp)
        if qlora and not tr.get("quantization"):  # the LoRA trace standing in for one through bitsandbytes
            rows = _quantized(rows, tr, n if ck[2] == "fsdp" else 1)
        cache[ck] = rows
    return cache[ck]


def expert_activation_bytes(tr: dict, tokens: float, precision: str, hidden: int) -> float:
    """What one GPU's MoE layers keep for the backward pass of ``tokens`` tokens routed to them: each of a token's
    top_k copies holds its dispatched hidden state, the experts' gate-and-up output (two widths), the activation
    and the down projection's output — (2 × hidden + 3 × expert width) per copy per MoE layer, the expert width
    read back from the experts' parameters (3 × hidden × width per expert)."""
    experts, layers, k = tr.get("experts") or 0, tr.get("moe_layers") or 0, tr.get("top_k") or 0
    if not experts or not layers or not hidden:
        return 0.0
    width = tr["expert_params"] / layers / experts / (3 * hidden)
    elem = 2 if precision.startswith(("bf16", "fp16")) else 4
    return tokens * k * layers * (2 * hidden + 3 * width) * elem


def with_expert_parallel(rows: list[dict], tr: dict, n: int, e: int, precision: str, hidden: int) -> list[dict]:
    """FSDP's rows over ``n`` GPUs made expert parallel ×``e``: the routed experts' parameters and gradients ÷ e
    instead of ÷ n (each GPU holds experts/e of every MoE layer whole), their optimizer state still ÷ n (a
    distributed optimizer over their n/e replicas), no expert gathered with a block, and in the steps and the
    validation the routing worst case: every token of the EP group sent to this GPU's experts (dropless routing
    allows it), its expert activations × e."""
    f_p = (tr.get("expert_bytes") or 0) / tr["param_bytes"] if tr["param_bytes"] else 0.0
    f_t = (tr.get("expert_trainable_bytes") or 0) / tr["trainable_bytes"] if tr["trainable_bytes"] else 0.0
    per_layer = (tr.get("expert_bytes") or 0) / max(1, tr.get("moe_layers") or 1)
    step = tr["inputs"].get(names("train")[-1], {})
    tokens = (step.get("micro_batch") or 0) * (step.get("seq_len") or 0)  # the widest micro-batch's forward
    out = []
    for x in rows:
        y = dict(x)
        resident = (x["parameters"] * f_p + x["gradients"] * f_t) * n * (1 / e - 1 / n)
        y["parameters"] = x["parameters"] + x["parameters"] * f_p * n * (1 / e - 1 / n)
        y["gradients"] = x["gradients"] + x["gradients"] * f_t * n * (1 / e - 1 / n)
        delta = resident
        if x["phase"] in names("train", "eval"):
            skew = expert_activation_bytes(tr, tokens, precision, hidden) * (e - 1) if x["phase"] in names("train") \
                else 0
            delta += skew - 2 * per_layer  # the worst routing; the experts are never gathered with their block
            y["activations"] = x["activations"] + skew
            y["temporaries"] = x["temporaries"] - 2 * per_layer
        for k in ("peak_allocated", "end_allocated", "peak_reserved", "end_reserved"):
            if y.get(k) is not None:
                y[k] = int(max(0, y[k] + (delta if k.startswith("peak") else resident)))
        if y.get("baseline") is not None and x["phase"] != "load":
            y["baseline"] = int(y["baseline"] + resident)
        y["note"] = EP_NOTE
        out.append(y)
    return out


def _quantized(rows: list[dict], tr: dict, shards: int) -> list[dict]:
    """The LoRA rows with the decoder layers' frozen linear weights at 4 bits (the reload check loads the
    merged bf16 model and keeps its bytes)."""
    saved = int((tr["linear_bytes"] - tr["linear_numel"] * NF4_BYTES) / shards)
    out = []
    for x in rows:
        if x["phase"] == "reload" or x["phase"] == "export":
            out.append(x)
            continue
        y = dict(x, parameters=x["parameters"] - saved)
        for k in ("baseline", "peak_allocated", "end_allocated", "peak_reserved", "end_reserved"):
            if y.get(k) is not None and (k != "baseline" or x["phase"] != "load"):
                y[k] = max(0, y[k] - saved)
        out.append(y)
    return out


def _assumptions(pilot: dict | None = None, net: dict | None = None, moe: dict | None = None) -> list[str]:
    measured = [] if pilot is None else [
        f"from pilot {pilot['run']}: the campaign as written on {pilot['ranks']} GPU(s) takes the sheet's memory "
        f"figure ({'measured CUDA counters' if pilot.get('kind') == 'measured' else 'the same estimate'}) and the "
        f"time plan's seconds per GPU; every other row keeps that run's host work (run start, load, checkpoints, "
        f"export, reload) as measured and scales its updates and validations by the arithmetic's ratio to the "
        f"campaign as written"]
    return measured + [f"time: FLOPs per update (parameters × tokens, the budget's mean padded tokens) at "
            f"{P.ASSUMED_MFU:.0%} of each GPU's dense rate, divided over the GPUs (data parallel); at least "
            f"{P.GPU_FLOOR_S_PER_PASS * 1e3:g} ms per micro-batch and validation batch of a rank (the launch floor)",
            f"communication not overlapped with compute: DDP all-reduces the gradients, FSDP moves 3 × the "
            f"parameters per update; tensor parallel × FSDP all-reduces 4 × a layer's activations per decoder "
            f"layer within the node (6 with checkpointing) and FSDP moves 3 × the TP shard across nodes; bus "
            f"bandwidth per GPU " + _net_words(net),
            "tensor parallel × FSDP: " + TP_NOTE,
            *([] if not moe else [
                f"a mixture of experts: compute with the {moe['active']:,} active parameters (every token through "
                f"{moe['top_k']} of {moe['experts']} experts), memory with all {moe['total']:,}",
                "expert parallel × FSDP: " + EP_NOTE + "; time assumes balanced routing (each GPU computes its own "
                "tokens' share; the worst case would put the EP group's expert work on one GPU), plus the "
                "dispatch and combine all-to-alls of every MoE layer (top_k copies of each token's hidden state, "
                "4 per update, 6 with checkpointing) within the node, FSDP's 3 × the other parameters and the "
                "experts' gradients reduced over their replicas"]),
            f"optimizer offload: gradients and parameters over PCIe at {HOST_GBS:g} GB/s and a host step at "
            f"{HOST_PARAMS_S:.0e} parameters/s",
            f"QLoRA: traced through bitsandbytes (nf4, double-quantised, bf16 compute) when it is installed, else "
            f"{NF4_BYTES * 8:.2f} bits per decoder-layer linear weight; compute {QLORA_SLOWER:g}× slower",
            f"memory: the training phases' peak reserved (the caching allocator's replay, cuBLAS's workspaces in it) "
            f"+ the CUDA context and NCCL buffers ≤ the GPU's memory less {HEADROOM_FRACTION:.0%} kept free "
            f"(sheet/gpu_memory.py); export and the reload check "
            f"(the merged model) are shown, not required",
            "every run of the plan on all the GPUs of the row, one after another",
            "cost (with --rates): the row's campaign time in hours × its GPUs × the hourly price, or the shortest "
            "whole-day plan whose days less hardware.reserve hold it × its GPUs, whichever is cheaper (the headline's rule)"]


def _net_words(net: dict | None) -> str:
    net = net or {}
    intra = (f"{net['intra_node_gbs']:g} GB/s within a node" if net.get("intra_node_gbs") else
             f"{BUS_GBS['sxm']:g} GB/s on SXM parts (NVLink), {BUS_GBS['other']:g} GB/s on PCIe parts (defaults)")
    inter = (f"{net['inter_node_gbs']:g} GB/s between nodes" if net.get("inter_node_gbs") else
             f"{NODE_GBS:g} GB/s between nodes (default: 100 Gb/s per GPU)")
    src = f" ({net['where']}: interconnect)" if net.get("intra_node_gbs") or net.get("inter_node_gbs") else \
        "; say yours under `interconnect:` in the rates file"
    return f"{intra}, {inter}{src}"


def _shown(rows: list[dict]) -> list[dict]:
    """Per GPU and count: the fastest fitting option that keeps the experiment and the fastest that changes
    it (when it is faster), each naming the slower ones that fit too."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for x in rows:
        if x["fits"]:
            groups.setdefault((x["gpu"], x["count"]), []).append(x)
    for _, xs in groups.items():
        best = {}
        for kind in (True, False):
            same = sorted((x for x in xs if x["keeps"] is kind), key=lambda x: x["seconds"])
            if same:
                best[kind] = dict(same[0], also=[x["label"] for x in same[1:]])
        if True in best:
            out.append(best[True])
        if False in best and (True not in best or best[False]["seconds"] < best[True]["seconds"]):
            out.append(best[False])
    return out
