"""The options table (sheet/options.py) as words: the sheet's blocks, terminal lines, and the stage results of
``estimate --options`` and of ``sheet`` without a pilot (a model too large to pilot here)."""

from __future__ import annotations

from pilotrun.probe.counted import depth_of, training_need
from pilotrun.sheet import plan as P
from pilotrun.sheet.options import options_table
from pilotrun.tasks.hub import fetch_command, missing_weights, snapshot_of
from pilotrun.verdicts import StageResult

TITLE = "Selection sheet — "  # the sheet's heading, before the campaign's name (with a pilot or without: sections.py)

COLUMNS = ["GPU", "GPUs", "option", "per-GPU peak (phase)", "campaign time", "cost", "experiment"]


def money(cost: float | None, currency: str = "") -> str:
    if cost is None:
        return "—"
    return (f"{cost:,.0f}" if cost >= 100 else f"{cost:,.2f}") + (f" {currency}" if currency else "")


def table_rows(table: dict) -> list[list]:
    return [[x["name"], x["count"], x["label"], f"{x['peak'] / 2**30:.1f} GiB ({x['phase']})",
             P.fmt_duration(x["seconds"]), money(x["cost"], table["currency"]), x["changes"]] for x in table["shown"]]


def _price_column(table: dict) -> str:
    return (f"cost {table['currency']}".strip()) if table["by"] == "cost" else "GPU-hours"


WORTH = 0.75  # more GPUs, or an option that changes the experiment, is listed when it takes ≤ 75 % of the time


def listed(table: dict) -> list[dict]:
    """The rows of ``shown`` worth reading: per GPU, more GPUs only where fewer do not fit or the row is at least
    a quarter faster than every listed row with fewer; an option that changes the experiment only where nothing
    that keeps it fits at that count or it is at least a quarter faster. A campaign that fits one GPU of every
    kind listed 2, 4 and 8 of each with LoRA beside them, ~60 rows a few % apart (issue 43); ``--json`` keeps all."""
    keeps = {(x["gpu"], x["count"]): x["seconds"] for x in table["shown"] if x["keeps"]}
    out: list[dict] = []
    for x in sorted(table["shown"], key=lambda x: (x["count"], not x["keeps"])):
        if not x["keeps"] and (x["gpu"], x["count"]) in keeps and x["seconds"] > WORTH * keeps[(x["gpu"], x["count"])]:
            continue
        fewer = [y["seconds"] for y in out if y["gpu"] == x["gpu"] and y["keeps"] == x["keeps"]
                 and y["count"] < x["count"]]
        if fewer and x["seconds"] > WORTH * min(fewer):
            continue
        out.append(x)
    order = {id(x): i for i, x in enumerate(table["shown"])}
    return sorted(out, key=lambda x: order[id(x)])


def left_unlisted(table: dict) -> str | None:
    n = len(table["shown"]) - len(listed(table))
    return (f"{n} row(s) not listed: more GPUs of a kind less than a quarter faster than fewer, or an option "
            "that changes the experiment less than a quarter faster than one that keeps it (`--json` has every "
            "row)") if n else None


def compact_rows(table: dict) -> tuple[list[str], list[list]]:
    """The table narrow enough for a 100-column sheet.md: GPU keys, short option names, keeps/changes."""
    priced = table["by"] == "cost"
    cols = ["GPUs", "option", "peak/GPU", "set by", "time", _price_column(table), "question"]
    rows = [[f"{x['count']} × {x['gpu']}", x["short"], P.size(x["peak"]) + ("*" if _measured(x) else ""),
             x["phase"], P.fmt_duration(x["seconds"]), money(x["cost"]) if priced else f"{x['gpu_hours']:.3g}",
             "keeps" if x["keeps"] else "changes"] for x in listed(table)]
    return cols, rows


def items(table: dict) -> list[str]:
    """One line per listed row, the GPUs whose rows read the same (count, option, peak, time, price) said in one:
    ``1 × T4 16GB, L4 24GB or A10 24GB: as written — …``."""
    groups: dict[tuple, list[dict]] = {}
    for x in listed(table):
        groups.setdefault((x["count"], _item(x, table).split(": ", 1)[1]), []).append(x)
    out = []
    for (count, rest), xs in groups.items():
        names = [x["name"] for x in xs]
        said = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
        out.append(f"{count} × {said}: {rest}")
    return out


def _measured(x: dict) -> bool:
    return x.get("memory_from", "").startswith("measured")


def _item(x: dict, table: dict) -> str:
    price = money(x["cost"], table["currency"]) if table["by"] == "cost" else f"{x['gpu_hours']:.3g} GPU-hours"
    return (f"{x['count']} × {x['name']}: {x['label']} — {P.size(x['peak'])} per GPU at {x['phase']}"
            f"{' (measured)' if _measured(x) else ''}, {P.fmt_duration(x['seconds'])}, {price}; {x['changes']}"
            + (f" ({x['note']})" if x.get("note") else ""))


def pick(x: dict | None, table: dict) -> str:
    if x is None:
        return "nothing"
    by = money(x["cost"], table["currency"]) if x.get("cost") is not None and table["by"] == "cost" else \
        f"{x['gpu_hours']:.3g} GPU-hours"
    return (f"{x['label']} on {x['count']} × {x['name']} — {P.size(x['peak'])} per GPU at "
            f"{x['phase']}, {P.fmt_duration(x['seconds'])}, {by}")


def _judged_by(table: dict) -> str:
    if table["by"] == "cost":
        return f"by cost; prices from {table['rates']}"
    if table["by"].startswith("gpu_hours ("):
        return f"by GPU-hours: no GPU priced in {table['rates']} fits and keeps it"
    return "by GPU-hours; pass --rates FILE for cost"


def params_said(table: dict) -> str:
    """The model's parameters as the table uses them: a mixture of experts' total (memory holds every expert) and
    active (a token computes with its top_k experts) apart; a preference campaign's reference model beside them."""
    ref = table.get("reference")
    if ref and ref["kind"] == "copy":
        reference = (f"; a frozen reference copy ({P.size(ref['bytes'])}) is resident beside the policy in every row that "
                     "trains the whole model (sharded with it under FSDP), and the reference's no-grad forward of "
                     "both halves is in each step; the LoRA rows compare with the base under a disabled adapter")
    elif ref and ref["kind"] == "adapter":
        reference = "; the reference is the base under a disabled adapter (no copy resident), its forward in each step"
    elif ref and ref["kind"] == "precomputed":
        reference = ("; the reference's log-probabilities are precomputed once before training (one no-grad forward "
                     "over the pairs, the precompute_reference phase): no reference model is resident in any row, "
                     "and no reference forward is in a step")
    else:
        reference = ""
    moe = table.get("moe")
    if not moe:
        return f"{table['params']:,} parameters{reference}"
    return (f"{moe['total']:,} parameters in total, {moe['active']:,} active per token (a mixture of experts: "
            f"{moe['experts']} routed experts in each of {moe['moe_layers']} MoE layers, {moe['top_k']} per token): "
            "memory holds the total, compute runs the active; expert parallel rows split the routed experts "
            f"({moe['expert_params']:,} parameters) by their EP degree and size each GPU for the routing worst case"
            + reference)


def blocks(table: dict) -> list[tuple]:
    """The options section in the sheet's block form (sheet/render.py): a "rows" block is a table in
    Markdown and HTML and one line per row on a terminal."""
    rec, cheap = table["recommended"], table["cheapest"]
    source = (f"memory from the estimator (fake tensors) and time from the plan's arithmetic, the pilot "
              f"{table['pilot_run']}'s figures where they exist (see Assumptions)" if table.get("pilot_run") else
              "memory from the estimator (fake tensors), time from the plan's arithmetic")
    out = [("h", "Options that fit (per GPU and count)"),
           ("p", f"{params_said(table)}; {source}" + (f"; {table['shapes']}" if table.get("shapes") else "")
                 + f". Recommended, the cheapest that keeps the question "
                 f"({_judged_by(table)}): {pick(rec, table)}."
                 + (f" Cheapest overall: {pick(cheap, table)} — {cheap['changes']}." if cheap else ""))]
    if table["shown"]:
        cols, rows = compact_rows(table)
        mark = " A peak marked * is the pilot's measured figure." if any(r[2].endswith("*") for r in rows) else ""
        out.append(("p", "Per GPU and count, the fastest option that keeps the experiment, and the fastest that "
                         "changes it when that is faster; \"question\": whether the row keeps the experiment's "
                         "question (each option and what it changes: below); `--json` holds every option evaluated."
                         + mark))
        out.append(("rows", cols, rows, items(table)))
        if left_unlisted(table):
            out.append(("p", left_unlisted(table)[0].upper() + left_unlisted(table)[1:] + "."))
    else:
        out.append(("p", "No option fits any catalogue GPU at up to 64 GPUs."))
    if table.get("why_none"):
        out.append(("p", "Why no option keeps the experiment and fits, per option:"))
        out.append(("list", table["why_none"]))
    elif (table.get("tp") or {}).get("why"):
        out.append(("p", f"Tensor parallel × FSDP across nodes not evaluated: {table['tp']['why']}."))
    if table.get("skipped"):
        out.append(("p", table["skipped"][0].upper() + table["skipped"][1:] + "."))
    if table.get("left_out"):
        out.append(("p", "Left out of the table: " + "; ".join(f"{x['name']} ({x['why']})"
                                                                for x in table["left_out"]) + "."))
    qlora = sorted((x for x in table.get("rows", []) if x.get("option") == "qlora" and x["fits"]),
                   key=lambda x: (x["count"], x["seconds"]))
    if qlora and not any(x.get("option") == "qlora" for x in table["shown"]):
        q = qlora[0]
        out.append(("p", f"QLoRA ({q['changes']}): fits from {q['count']} × {q['name']} at {P.size(q['peak'])} per "
                         f"GPU, {P.fmt_duration(q['seconds'])}; never faster than the rows above, so not among them "
                         f"({len(qlora)} fitting QLoRA rows in `--json`)."))
    out.append(("p", "What each option changes:"))
    out.append(("list", [f"{k}: {v}" for k, v in table["meanings"].items()]))
    out.append(("p", "Assumptions:"))
    out.append(("list", table["assumptions"]))
    return out


def to_lines(table: dict, *, with_rows: bool = False) -> list[str]:
    """Terminal lines; the rows themselves only with ``with_rows`` (``estimate`` renders them as its table)."""
    lines = []
    for b in blocks(table):
        if b[0] == "h":
            lines.append(f"== {b[1]}")
        elif b[0] == "p":
            lines.append(b[1])
        elif b[0] == "list" or (b[0] == "rows" and with_rows):
            lines += [f"  - {x}" for x in b[-1]]
    return lines


def no_pilot_blocks(sheet: dict) -> list[tuple]:
    """The sheet without a pilot (``no_pilot_sheet``'s data) in the sheet's block form."""
    return [("h", f"{TITLE}{sheet['campaign']}"), ("p", sheet["head"]),
            ("p", f"What to pilot instead: {sheet['pilot_instead']}")] + blocks(sheet["options"]) + \
        launch_blocks(sheet.get("launch"))


def launch_blocks(launch: dict | None) -> list[tuple]:
    """What the launch files of the sheet without a pilot are for (``sheet/launch.options_launch``), or why
    there are none; nothing when no files were asked for (no ``--out``)."""
    if launch is None:
        return []
    if launch["files"] is None:
        return [("h", "Launch files"), ("p", f"No launch files: {launch['why']}.")]
    f, row = launch["files"], launch["row"]
    where = f"{f['nodes']} nodes × {f['per_node']}" if f["nodes"] > 1 else f"{f['gpus']}"
    sets = " ".join(f"--set {x}" for x in f["sets"]) or "the campaign as written"
    why = "" if launch["why"] == "the recommended row" else launch["why"][0].upper() + launch["why"][1:] + ". "
    return [("h", "Launch files"),
            ("p", f"{why}For {launch['text']}, on {where} × {row['gpu']}: `pilotrun sweep "
                  f"{f['campaign_file']} --id {f['sweep_id']}` with {sets}, in STEM.commands.sh, STEM.sky.yaml (SkyPilot "
                  "managed job) and STEM.sbatch (SLURM, --requeue); time limit "
                  f"{P.fmt_duration(f['time_limit_s'])}: {f['time_how']}. From the estimator, not a pilot: pilot "
                  "one node of it first.")]


def options_result(loaded, *, rates: dict | None = None, lora_r: int | None = None):
    """``estimate --options``: the table as a stage result (verdict fail when no option keeps the question)."""
    table = options_table(loaded, rates=rates, lora_r=lora_r)
    rec = table["recommended"]
    verdict = "ok" if rec else "fail"
    summary = (f"recommended: {pick(rec, table)}" if rec else
               "no option that keeps the experiment fits any catalogue GPU at up to 64 GPUs")
    messages = to_lines(table)
    messages.append(f"options table in {table['wall_s']:.1f} s" + (
        f" (decoder layers counted: {table['counted']['layers']} from traces of {_depths(table['counted'])} layers)"
        if (table["counted"] or {}).get("layers") else ""))
    return StageResult("estimate", verdict, summary, messages, dict(table), COLUMNS,
                       [dict(zip(COLUMNS, r)) for r in table_rows(table)])


def _depths(counted: dict) -> str:
    """The depths a counted trace traced (probe/trace.traced's ``counted``), "2, 4 and 6"."""
    d = [str(x) for x in counted["depths"]]
    return ", ".join(d[:-1]) + f" and {d[-1]}"


def too_large_here(loaded) -> dict | None:
    """What training needs at least on this machine (weights, gradients and two Adam moments, or the
    weights alone under an adapter) when that exceeds its available memory, or when the model's weights are
    not here to pilot with (a hub model whose config.json alone is cached: ``missing`` names the files);
    else None."""
    path = loaded.campaign.model.path
    missing = missing_weights(path) if path and snapshot_of(path) else []
    size = training_need(loaded)
    if size["need"] > size["available"] or missing:
        return dict(size, missing=missing)
    return None


def no_pilot_sheet(loaded, size: dict, *, rates: dict | None = None):
    """The sheet from the estimator alone, for a model this machine cannot pilot: says so at the top and
    what to pilot instead."""
    c = loaded.campaign
    src = loaded.source or "CAMPAIGN"
    depth = depth_of(c.model.config) if isinstance(c.model.config, dict) else None
    if depth is not None:
        instead = (f"pilot a scaled-down config of the same architecture here: `pilotrun pilot {src} --set "
                   f"model.config.{depth[0]}=2` (same layer shapes, 2 of {depth[1]} layers), or one GPU of the "
                   f"target with the recommended option (e.g. `pilotrun pilot {src} --set train.strategy=fsdp "
                   f"--set train.nproc=8` on the rented node)")
    else:
        instead = (f"pilot a smaller model of the same family here, or run `pilotrun pilot {src}` on one node of "
                   f"the target with the recommended option")
    if size.get("missing") and size["need"] <= size["available"]:
        hub = snapshot_of(c.model.path)
        head = (f"NO PILOT: only the config of {hub[0] if hub else c.model.path} is cached, not its weights "
                f"({', '.join(size['missing'])}; weights {size['weights'] / 2**30:.1f} GiB): this sheet is from the "
                f"estimator alone (fake tensors, nothing allocated); `{fetch_command(hub[0]) if hub else 'hf download'}` "
                "fetches the weights, then the pilot measures")
        instead = f"`pilotrun pilot {src}` once the weights are fetched"
    else:
        head = (f"NO PILOT: the model is too large to pilot on this machine (weights {size['weights'] / 2**30:.1f} "
                f"GiB; training needs at least {size['need'] / 2**30:.1f} GiB, {size['available'] / 2**30:.1f} GiB "
                f"available): this sheet is from the estimator alone (fake tensors, nothing allocated)")
    table = options_table(loaded, rates=rates)
    lines = [head, f"what to pilot instead: {instead}"] + to_lines(table)
    rec = table["recommended"]
    why = "weights not cached" if size.get("missing") and size["need"] <= size["available"] else "too large to pilot here"
    summary = f"estimator only ({why}); " + (
        f"recommended: {rec['label']} on {rec['count']} × {rec['name']}" if rec else
        "no option that keeps the experiment fits")
    if rec and rec.get("cost") is not None and table["by"] == "cost":
        summary += f", {money(rec['cost'], table['currency'])}"
    sheet = {"campaign": c.name, "pilot_run": None, "estimator_only": True, "too_large": size, "head": head,
             "pilot_instead": instead, "options": table}
    return StageResult("sheet", "warn" if rec else "fail", summary, lines, sheet, COLUMNS,
                       [dict(zip(COLUMNS, r)) for r in table_rows(table)])
