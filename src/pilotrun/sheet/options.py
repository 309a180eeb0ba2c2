"""When the campaign does not fit: the options that do, per catalogue GPU and GPU count, and what each
changes in the experiment.

Memory comes from the estimator (rehearsal/memory/estimate.py): three traces — the campaign as written, with
activation checkpointing, and with a LoRA adapter plus checkpointing — and from each the rows of one
rank for any count and strategy (``rows_for``: DDP buckets, FSDP's shards and gathered blocks, an
offloaded optimizer). QLoRA is the LoRA trace with the decoder layers' linear weights at 4 bits.
The memory checked is the training run's phases (load, both steps, validation, checkpoint); the
artifact export and its reload check load the whole merged model and can run on the host, so they
are reported, not required.

Time is the plan's arithmetic, not a measurement: FLOPs per update (``plan.flops_per_update``) at
``plan.ASSUMED_MFU`` of the GPU's dense rate, divided over the data-parallel ranks, plus communication
at an assumed bus bandwidth, not overlapped with compute (the assumptions are returned as words).
"""

from __future__ import annotations

import math
import time

from pilotrun.sheet import plan as P

COUNTS = (1, 2, 4, 8)  # GPUs on one node
NODES = (2, 4, 8)  # nodes of 8, tried for a GPU only when nothing that keeps the question fits one node
LORA_R = 16
BUS_GBS = {"sxm": 150.0, "other": 16.0}  # effective all-reduce bus bandwidth per GPU within a node
NODE_GBS = 12.5  # between nodes: 100 Gb/s per GPU
HOST_GBS = 16.0  # PCIe to the host, for an offloaded optimizer
HOST_PARAMS_S = 1.0e9  # parameters per second an optimizer step on the host updates (CPU Adam)
QLORA_SLOWER = 1.3  # 4-bit weights are dequantized before each matmul
NF4_BYTES = 0.5 + 0.016  # 4 bits per weight plus the double-quantized block constants
TRAINING = ("load", "first_step", "steady_step", "eval_longest", "save")
KEEPS = "keeps the experiment"

# key, label, trace, strategy at > 1 GPU ("ddp" follows the campaign's own when it shards), offload, qlora
OPTIONS = (
    ("written", "as written", "written", "ddp", False, False),
    ("ckpt", "activation checkpointing", "ckpt", "ddp", False, False),
    ("fsdp", "FSDP full sharding", "written", "fsdp", False, False),
    ("fsdp_ckpt", "FSDP + checkpointing", "ckpt", "fsdp", False, False),
    ("offload_ckpt", "optimizer offload + checkpointing", "ckpt", "ddp", True, False),
    ("fsdp_ckpt_offload", "FSDP + checkpointing + optimizer offload", "ckpt", "fsdp", True, False),
    ("lora", "LoRA r={r} + checkpointing", "lora", "ddp", False, False),
    ("fsdp_lora", "LoRA r={r} + FSDP + checkpointing", "lora", "fsdp", False, False),
    ("qlora", "QLoRA 4-bit r={r} + checkpointing", "lora", "ddp", False, True),
)

MEANINGS = {
    "written": "the campaign as written; over N GPUs data parallel with accumulation ÷ N (same effective batch)",
    "ckpt": "recomputes activations in the backward pass: same updates, about a third more compute",
    "fsdp": "parameters, gradients and optimizer state sharded over the N GPUs, activations per rank, two "
            "layers gathered at a time: same updates, more communication",
    "offload": "optimizer state and step on the host: same updates, slower steps, host memory needed",
    "lora": "trains an adapter, not the model: a different experiment",
    "qlora": "trains an adapter on a 4-bit copy of the base: a different experiment (needs bitsandbytes and a "
             "CUDA GPU; merging for export restores a bf16 model)",
    "shorter max_length / lower precision": "change what is trained: a different experiment (not listed)",
}


def _variants(loaded, r: int) -> dict:
    c = loaded.campaign
    ckpt = loaded if c.model.gradient_checkpointing else loaded.with_overrides({"model.gradient_checkpointing": True})
    if c.model.adapter is not None:
        lora = ckpt
    else:
        lora = ckpt.with_overrides({"model.adapter": {"kind": "lora", "r": r}})
    return {"written": loaded, "ckpt": ckpt, "lora": lora}


def options_table(loaded, *, prep=None, rates: dict | None = None, lora_r: int | None = None,
                  gpus=None, device: str = "cuda") -> dict:
    """Every option × catalogue GPU × count evaluated; ``shown``: the fastest fitting option per GPU and count
    for each kind (keeps the experiment / changes it); ``recommended`` and ``cheapest``."""
    from pilotrun.campaign.arithmetic import data_parallel_ranks
    from pilotrun.sheet.catalogue import CATALOGUE
    from pilotrun.rehearsal.memory.estimate import traced
    from pilotrun.rehearsal.prepare import prepare

    started = time.perf_counter()
    c = loaded.campaign
    adapter = c.model.adapter
    r = lora_r or (adapter.r if adapter is not None else LORA_R)
    prep = prep or prepare(loaded, splits=("train", "validation"))
    variants = _variants(loaded, r)
    traces: dict[str, dict] = {}
    for key, v in variants.items():
        same = next((k for k, w in variants.items() if w is v and k in traces), None)
        share = traces["written"] if key == "ckpt" else None  # checkpointing changes the steps only
        traces[key] = traces[same] if same else traced(v, device=device, prep=prep, after_steps=share)
    work = _work(loaded, prep)
    effective = c.train.micro_batch * c.train.accumulation * data_parallel_ranks(c.train)
    cache: dict = {}
    rows = []
    for g in (gpus or CATALOGUE):
        if g.rate_tflops(c.train.precision) <= 0:
            continue  # no tensor cores for this precision (a T4 under bf16): nothing to plan
        fitted = False
        for n in COUNTS + tuple(8 * k for k in NODES):
            if n > 8 and fitted:
                break
            for opt in OPTIONS:
                row = _evaluate(opt, g, n, traces, cache, work, effective, r, c, adapter is not None, rates)
                if row is None:
                    continue
                rows.append(row)
                fitted = fitted or (row["fits"] and row["keeps"])
    shown = _shown(rows)
    keep = [x for x in rows if x["fits"] and x["keeps"]]
    fit = [x for x in rows if x["fits"]]
    by = "cost" if rates else "gpu_hours"
    rec = min(keep, key=lambda x: (x[by] if x[by] is not None else math.inf, x["seconds"]), default=None)
    cheap = min(fit, key=lambda x: (x[by] if x[by] is not None else math.inf, x["seconds"]), default=None)
    return {"rows": rows, "shown": shown, "recommended": rec, "cheapest": cheap if cheap is not rec else None,
            "by": by, "currency": (rates or {}).get("currency", ""), "lora_r": r, "meanings": MEANINGS,
            "params": traces["written"]["params"], "assumptions": _assumptions(), "effective_batch": effective,
            "counted": traces["written"].get("counted"), "wall_s": time.perf_counter() - started}


def _work(loaded, prep) -> dict:
    """Tokens an update and a validation pass compute on (the budget's mean padded tokens), and how often."""
    from pilotrun.campaign.arithmetic import batch_arithmetic
    from pilotrun.sheet.shape import budget_tokens, eval_tokens

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
            "evals": counts["evals"], "runs": runs, "precision": t.precision}


def _ranks_of(t) -> int:
    from pilotrun.campaign.arithmetic import data_parallel_ranks

    return data_parallel_ranks(t)


def _evaluate(opt, g, n, traces, cache, work, effective, r, c, has_adapter, rates) -> dict | None:
    from pilotrun.sheet.gpu_memory import need_bytes, overheads
    from pilotrun.rehearsal.memory.estimate import rows_for

    key, label, trace_key, strategy, offload, qlora = opt
    if strategy == "fsdp" and n == 1:
        return None
    if has_adapter and key in ("lora", "fsdp_lora"):
        return None  # the campaign is already an adapter: "as written" is that row
    if strategy == "ddp" and c.train.strategy == "fsdp" and key == "written":
        strategy = "fsdp"
    tr = traces[trace_key]
    ck = (trace_key, n, strategy if n > 1 else "single", offload, qlora)
    if ck not in cache:
        rows = rows_for(tr, ranks=n, strategy=ck[2], offload=offload)
        if qlora:
            rows = _quantized(rows, tr, n if ck[2] == "fsdp" else 1)
        cache[ck] = rows
    rows = cache[ck]
    train = [x for x in rows if x["phase"] in TRAINING]
    top = max(train, key=lambda x: P.row_peak(x) or 0)
    peak = P.row_peak(top)
    need = need_bytes(peak, sum(o["bytes"] for o in overheads(g, n, False)))
    after = max((x for x in rows if x["phase"] not in TRAINING), key=lambda x: P.row_peak(x) or 0)
    acc_n = effective / (c.train.micro_batch * n)
    batch_kept = acc_n >= 1 and acc_n == int(acc_n)
    changes = []
    if qlora:
        changes.append("trains an adapter on a 4-bit copy of the base: a different experiment")
    elif trace_key == "lora" and not has_adapter:
        changes.append(MEANINGS["lora"])
    if not batch_kept:
        changes.append(f"effective batch {c.train.micro_batch * max(1, round(acc_n)) * n}, not {effective}: a "
                       f"different experiment")
    seconds, how = _seconds(g, n, tr, strategy if n > 1 else "single", offload, qlora, work)
    hour = _hourly(rates, g.key)
    fits = need <= g.memory_bytes and (g.bf16 or work["precision"] not in ("bf16-mixed", "bf16-true"))
    return {"gpu": g.key, "name": g.name, "count": n, "nodes": max(1, n // 8), "option": key,
            "label": label.format(r=r), "peak": peak, "need": need, "phase": top["phase"], "fits": fits,
            "export_peak": P.row_peak(after), "export_phase": after["phase"],
            "keeps": not changes, "changes": "; ".join(changes) or KEEPS, "seconds": seconds, "time_how": how,
            "gpu_hours": seconds / 3600 * n, "cost": None if hour is None else seconds / 3600 * n * hour,
            "accumulation": max(1, round(acc_n))}


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


def _bus(g, n: int) -> float:
    if n > 8:
        return NODE_GBS
    return BUS_GBS["sxm" if "sxm" in g.key or g.key in ("h200", "b200", "mi300x") else "other"]


def _seconds(g, n: int, tr: dict, strategy: str, offload: bool, qlora: bool, work: dict) -> tuple[float, str]:
    """Campaign seconds on ``n`` GPUs of ``g``: every run one after another, each run on all n."""
    rate = g.rate_tflops(work["precision"]) * 1e12 * P.ASSUMED_MFU
    if rate <= 0:
        return math.inf, "no rate for this precision"
    f_up = P.flops_per_update(tr["params"], tr["trainable"], work["tokens_update"], tr["gradient_checkpointing"])
    compute = f_up / n / rate * (QLORA_SLOWER if qlora else 1.0)
    bytes_param = tr["param_bytes"]
    comm = 0.0
    if n > 1:
        ring = (n - 1) / n / (_bus(g, n) * 1e9)
        comm = (3 * bytes_param if strategy == "fsdp" else 2 * tr["trainable_bytes"]) * ring
    host = 0.0
    if offload:
        share = tr["trainable_bytes"] / (n if strategy == "fsdp" else 1)
        host = 2 * share / (HOST_GBS * 1e9) + tr["trainable"] / (n if strategy == "fsdp" else 1) / HOST_PARAMS_S
    update = compute + comm + host
    evals = work["evals"] * 2 * tr["params"] * work["tokens_val"] / n / rate
    per_run = work["updates"] * update + evals
    return per_run * work["runs"], (f"{work['runs']} run(s) × ({work['updates']} updates × {P.fmt_duration(update)} "
                                    f"+ {work['evals']} validations)")


def _hourly(rates: dict | None, key: str) -> float | None:
    """Price per GPU-hour from a rates file (sheet --rates): ``{"gpus": {key: {"hour": price}}}``."""
    if not rates:
        return None
    entry = (rates.get("gpus") or {}).get(key)
    if isinstance(entry, dict):
        return entry.get("hour")
    return entry if isinstance(entry, (int, float)) else None


def _assumptions() -> list[str]:
    from pilotrun.sheet.gpu_memory import MARGIN_FRACTION

    return [f"time: FLOPs per update (parameters × tokens, the budget's mean padded tokens) at "
            f"{P.ASSUMED_MFU:.0%} of each GPU's dense rate, divided over the GPUs (data parallel)",
            f"communication not overlapped with compute: DDP all-reduces the gradients, FSDP moves 3 × the "
            f"parameters per update; bus bandwidth {BUS_GBS['sxm']:g} GB/s per GPU on SXM parts (NVLink), "
            f"{BUS_GBS['other']:g} GB/s on PCIe parts, {NODE_GBS:g} GB/s between nodes",
            f"optimizer offload: gradients and parameters over PCIe at {HOST_GBS:g} GB/s and a host step at "
            f"{HOST_PARAMS_S:.0e} parameters/s",
            f"QLoRA: {NF4_BYTES * 8:.2f} bits per decoder-layer linear weight, compute {QLORA_SLOWER:g}× slower",
            f"memory: the training phases' peak reserved × (1 + {MARGIN_FRACTION:.0%}) + the CUDA context, cuBLAS "
            f"workspace and NCCL buffers (sheet/gpu_memory.py) ≤ the GPU's memory; export and the reload check "
            f"(the merged model) are shown, not required",
            "every run of the plan on all the GPUs of the row, one after another"]


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


def _money(x: dict, table: dict) -> str:
    if x.get("cost") is None:
        return "—"
    return f"{x['cost']:,.2f} {table['currency']}".strip()


def table_rows(table: dict) -> list[list]:
    return [[x["name"], x["count"], x["label"], f"{x['peak'] / 2**30:.1f} GiB ({x['phase']})",
             P.fmt_duration(x["seconds"]), _money(x, table), x["changes"]] for x in table["shown"]]


COLUMNS = ["GPU", "GPUs", "option", "per-GPU peak (phase)", "campaign time", "cost", "experiment"]


def _pick(x: dict | None, table: dict) -> str:
    if x is None:
        return "nothing"
    by = _money(x, table) if table["by"] == "cost" else f"{x['gpu_hours']:.3g} GPU-hours"
    return (f"{x['label']} on {x['count']} × {x['name']} — {x['peak'] / 2**30:.1f} GiB per GPU at "
            f"{x['phase']}, {P.fmt_duration(x['seconds'])}, {by}")


def blocks(table: dict) -> list[tuple]:
    """The options section in the sheet's block form (sheet/render.py)."""
    rec, cheap = table["recommended"], table["cheapest"]
    by = "cost" if table["by"] == "cost" else "GPU-hours (pass --rates FILE for cost)"
    out = [("h", "Options that fit (per GPU and count)"),
           ("p", f"{table['params']:,} parameters; memory from the estimator (fake tensors), time from the plan's "
                 f"arithmetic. Recommended (the cheapest by {by} that keeps the question): {_pick(rec, table)}."
                 + (f" Cheapest overall: {_pick(cheap, table)} — {cheap['changes']}." if cheap else ""))]
    if table["shown"]:
        out.append(("table", COLUMNS, table_rows(table)))
    else:
        out.append(("p", "No option fits any catalogue GPU at up to 64 GPUs."))
    out.append(("p", "What each option changes:"))
    out.append(("list", [f"{k}: {v}" for k, v in table["meanings"].items()]))
    out.append(("p", "Assumptions:"))
    out.append(("list", table["assumptions"]))
    return out


def to_lines(table: dict) -> list[str]:
    lines = []
    for b in blocks(table):
        if b[0] == "table":
            continue  # the stage result renders it as its table
        if b[0] == "h":
            lines.append(f"== {b[1]}")
        elif b[0] == "p":
            lines.append(b[1])
        elif b[0] == "list":
            lines += [f"  - {x}" for x in b[1]]
        else:
            lines += ["  " + " | ".join(str(v) for v in r) for r in [b[1], *b[2]]]
    return lines


def options_result(loaded, *, rates: dict | None = None, lora_r: int | None = None):
    """``estimate --options``: the table as a stage result (verdict fail when no option keeps the question)."""
    from pilotrun.verdicts import StageResult

    table = options_table(loaded, rates=rates, lora_r=lora_r)
    rec = table["recommended"]
    verdict = "ok" if rec else "fail"
    summary = (f"recommended: {_pick(rec, table)}" if rec else
               "no option that keeps the experiment fits any catalogue GPU at up to 64 GPUs")
    messages = to_lines(table)
    messages.append(f"options table in {table['wall_s']:.1f} s" + (
        f" (decoder layers counted: {table['counted']['layers']} from traces of 2 and 3)"
        if (table["counted"] or {}).get("layers") else ""))
    data = {k: v for k, v in table.items()}
    return StageResult("estimate", verdict, summary, messages, data, COLUMNS,
                       [dict(zip(COLUMNS, r)) for r in table_rows(table)])


def too_large_here(loaded) -> dict | None:
    """What training needs at least on this machine (weights, gradients and two Adam moments, or the
    weights alone under an adapter) when that exceeds its available memory, else None."""
    import psutil

    from pilotrun.probe.counted import parameter_bytes

    weights = parameter_bytes(loaded)
    need = weights if loaded.campaign.model.adapter is not None else 4 * weights
    have = psutil.virtual_memory().available
    return {"weights": weights, "need": need, "available": have} if need > have else None


def no_pilot_sheet(loaded, size: dict, *, rates: dict | None = None):
    """The sheet from the estimator alone, for a model this machine cannot pilot: says so at the top and
    what to pilot instead."""
    from pilotrun.verdicts import StageResult

    c = loaded.campaign
    src = loaded.source or "CAMPAIGN"
    depth = None
    from pilotrun.probe.counted import depth_of

    if isinstance(c.model.config, dict):
        depth = depth_of(c.model.config)
    if depth is not None:
        instead = (f"pilot a scaled-down config of the same architecture here: `pilotrun pilot {src} --set "
                   f"model.config.{depth[0]}=2` (same layer shapes, 2 of {depth[1]} layers), or one GPU of the "
                   f"target with the recommended option (e.g. `pilotrun pilot {src} --set train.strategy=fsdp "
                   f"--set train.nproc=8` on the rented node)")
    else:
        instead = (f"pilot a smaller model of the same family here, or run `pilotrun pilot {src}` on one node of "
                   f"the target with the recommended option")
    head = (f"NO PILOT: the model is too large to pilot on this machine (weights {size['weights'] / 2**30:.1f} GiB; "
            f"training needs at least {size['need'] / 2**30:.1f} GiB, {size['available'] / 2**30:.1f} GiB "
            f"available): this sheet is from the estimator alone (fake tensors, nothing allocated)")
    table = options_table(loaded, rates=rates)
    lines = [head, f"what to pilot instead: {instead}"] + to_lines(table)
    rec = table["recommended"]
    summary = "estimator only (too large to pilot here); " + (
        f"recommended: {rec['label']} on {rec['count']} × {rec['name']}" if rec else
        "no option that keeps the experiment fits")
    sheet = {"campaign": c.name, "pilot_run": None, "estimator_only": True, "too_large": size,
             "pilot_instead": instead, "options": table,
             "markdown": "\n".join([f"# Selection sheet — {c.name}", "", head, "", f"What to pilot instead: {instead}",
                                    ""] + _markdown(table))}
    return StageResult("sheet", "warn" if rec else "fail", summary, lines, sheet, COLUMNS,
                       [dict(zip(COLUMNS, r)) for r in table_rows(table)])


def _markdown(table: dict) -> list[str]:
    out: list[str] = []
    for b in blocks(table):
        if b[0] == "h":
            out += [f"## {b[1]}", ""]
        elif b[0] == "p":
            out += [b[1], ""]
        elif b[0] == "list":
            out += [f"- {x}" for x in b[1]] + [""]
        else:
            out += ["| " + " | ".join(b[1]) + " |", "|" + " --- |" * len(b[1])]
            out += ["| " + " | ".join(str(v).replace("|", "\\|") for v in r) + " |" for r in b[2]] + [""]
    return out
