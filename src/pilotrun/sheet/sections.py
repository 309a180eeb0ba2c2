"""The sheet's sections as blocks: ("h", title) | ("p", text) | ("table", columns, rows) | ("list", items).

Each section is a function of the sheet dict (``sheet.build.build_sheet``); render.py lists them in
order (``SECTIONS``) and turns the blocks into Markdown, HTML or terminal lines. Every figure names its
source: a ledger row (measured), the estimator (predicted), a datasheet, or a stated constant.
"""

from __future__ import annotations

from pilotrun.sheet import gpu_memory as GM
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import BY_KEY
from pilotrun.sheet.options_view import TITLE, blocks
from pilotrun.sheet.sizes import DEFINITION

GiB, MiB = 2**30, 2**20


size = P.size  # one precision for every size on the sheet


def _inputs(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items() if not isinstance(v, (list, dict))) or "—"


def header(s: dict) -> list[tuple]:
    out = [("h", f"{TITLE}{s['campaign']}"),
           ("p", f"From pilot run {s['pilot_run']} (config sha256 {s['config_sha256'][:12]}), run on "
                 f"{s['pilot_device']} (counter {s['counter']}).")]
    if s["problems"] or s["warnings"]:
        out.append(("list", [f"FAIL: {p}" for p in s["problems"]] + [f"WARN: {w}" for w in s["warnings"]]))
    return out


def memory(s: dict) -> list[tuple]:
    m = s["memory"]
    out = [("h", "Memory per GPU")]
    if m["need"] is None:
        out.append(("p", "No GPU memory figure (see the problems above)."))
    else:
        what = ("measured by the pilot's CUDA counters" if m["kind"] == "measured" else
                "PREDICTED for CUDA: `pilotrun estimate`'s trace replayed through the caching allocator "
                "(probe/allocator.py, the policy of torch's CUDACachingAllocator; cuBLAS's workspaces in it), on a "
                "card that never fills (the calibration card, an H200: predicted ÷ measured reserved 0.93–1.06 "
                "per phase, bench/RESULTS.md)")
        extra = " + ".join(f"{o['what']} {size(o['bytes'])}" for o in m["overheads"])
        out.append(("p", f"Needed: {size(m['need'])} per GPU = (reserved {size(m['peak'])} + {extra}) ÷ "
                         f"(1 − {GM.HEADROOM_FRACTION:g} headroom); set by phase {m['phase']} "
                         f"({_inputs(m['inputs'])}). Reserved is {what}; the constants live outside the caching "
                         f"allocator and the headroom is what the replay cannot know (sources under Constants). "
                         f"Allocator: {s.get('allocator', {}).get('said', 'torch defaults')}."))
    rows = [[p["phase"], p["rank"], size(p["allocated"]), size(p["reserved"]), size(p["need"]), p["tag"]]
            for p in m["phases"]]
    if rows:
        out.append(("table", ["phase", "rank", "allocated", "reserved", "needed", "source"], rows))
    if m.get("fragmentation"):
        out.append(("p", "Fragmentation (reserved − allocated at each phase's peaks): measured by the pilot on its "
                         "card, beside the caching allocator's replay of the estimator's trace for the same campaign "
                         "(on a card that never fills)."))
        out.append(("table", ["phase", "rank", "reserved", "fragmentation", "replay: reserved", "fragmentation"],
                    [[f["phase"], f["rank"], size(f["measured_reserved"]), size(f["measured"]),
                      size(f["replay_reserved"]), size(f["replay"])] for f in m["fragmentation"]]))
    if m.get("proof"):
        out.append(("p", f"The CPU pilot's ledger (run {s['pilot_run']}), proof that every phase ran: process "
                         f"RSS counts the interpreter and libraries and no GPU memory, so it is never the GPU "
                         f"figure."))
        out.append(("table", ["phase", "rank", "verdict", "RSS peak (CPU)", "time"],
                    [[r["phase"], r["rank"], r["verdict"], size(r["rss_peak"]), P.fmt_duration(r["seconds"])]
                     for r in m["proof"]]))
    if s.get("per_rank") and len(s["per_rank"]) > 1:
        out.append(("table", ["rank", "peak", "phase"], [[r["rank"], size(r["peak"]), r["phase"]]
                                                          for r in s["per_rank"]]))
    lg = s.get("largest")
    if lg and s.get("target"):
        sources = sorted({v["source"] + (f" ({v['fallback']})" if v.get("fallback") else "") for v in lg.values()})
        probes = sum(v.get("probes") or 0 for v in lg.values())
        out.append(("p", f"Largest sizes on the {s['target']['name']}: {DEFINITION}; each capped by what can "
                         f"exist (the model's maximum positions, the longest record, the examples a rank gets). "
                         f"Source: " + "; ".join(sources) + (f", {probes} probes on fake tensors" if probes else "")
                         + "."))
        out.append(("table", ["size", "largest", "bound", "at"],
                    [[k, "—" if v["value"] is None else f"{v['value']:,}", v.get("bound", "—"), v.get("at", "")]
                     for k, v in lg.items()]))
    return out


def settings(s: dict) -> list[tuple]:
    st = s["settings"]
    return [("h", "Settings"), ("table", ["key", "value"], [[k, v] for k, v in st.items()]),
            ("p", f"Effective batch = micro_batch {st['micro_batch']} × accumulation {st['accumulation']} × "
                  f"ranks {st['ranks']} = {st['effective_batch']}.")]


def stack(s: dict) -> list[tuple]:
    req = s["stack"]["required"]
    out = [("h", "Software stack"),
           ("list", [f"torch {req['torch']['range']}", "a CUDA device (or ROCm for an AMD GPU)",
                     f"compute capability >= {req['compute_capability_min']} (bf16)" if req["bf16"]
                     else "no bf16 requirement",
                     f"{req['gpus_per_run']} GPU(s) per run" + (", NCCL" if req["nccl"] else ""),
                     "packages: " + (", ".join(f"{k} {v or ''}".strip() for k, v in req["packages"].items()))])]
    if s["stack"]["checks"]:
        out.append(("p", f"Target machine: {s['stack']['target']}"))
        out.append(("table", ["check", "needed", "found", "verdict", "message"],
                    [[c["check"], c["needed"], c["found"], c["verdict"], c["message"]] for c in s["stack"]["checks"]]))
    else:
        out.append(("p", "No target checked: pass `--target-env FILE` (the target's `pilotrun env --json`)."))
    return out


def fit(s: dict) -> list[tuple]:
    if s["memory"]["kind"] == "measured":
        src = ("the pilot's measured reserved peak of every phase (on the pilot's card) against each GPU's capacity "
               "(its memory less the headroom, the CUDA context and NCCL's buffers)")
    else:
        src = ("the caching allocator's replay on each GPU (its own cuBLAS workspaces; where the calibration card's "
               "reserved peak is above the GPU's capacity, the replay on that capacity, whose retry path may hold "
               "it): every phase's reserved peak against the GPU's capacity (its memory less the headroom, the CUDA "
               "context and NCCL's buffers); each figure is for the GPU of its row")
    out = [("h", "Fit table"),
           ("p", f"Per catalogue GPU: {src}; the campaign's time on it (all runs, per lane)."),
           ("table", ["GPU", "memory", "reserved on it", "needed", "verdict", "campaign time"],
            [[f["name"], f"{f['memory_bytes'] / GiB:g} GiB", size(f.get("reserved")), size(f.get("need")),
              f["verdict"], P.fmt_duration(f.get("campaign_s"))] for f in s["fit"]])]
    if s.get("advice"):
        out.append(("p", "With the caching allocator's expandable segments (PYTORCH_CUDA_ALLOC_CONF="
                         "expandable_segments:True) the campaign fits where it does not as launched:"))
        out.append(("table", ["GPU", "reserved as launched", "reserved with expandable_segments", "needed with it"],
                    [[a["name"], size(a["default_reserved"]), size(a["reserved"]), size(a["need"])]
                     for a in s["advice"]]))
    return out


def time(s: dict) -> list[tuple]:
    tm = s.get("time")
    out = [("h", "Time plan")]
    if not tm:
        return out + [("p", "No time plan (see the problems above).")]
    tgt = s.get("target")
    out.append(("p", f"For the {tgt['name'] if tgt else 'pilot device'} ({s.get('target_from')}). "
                     f"{tm['scaling']['text']}."))
    for why in tm.get("why") or []:
        out.append(("p", why))
    out.append(("table", ["phase", "measured", "source (slowest rank)"],
                [[k, P.fmt_duration(v["seconds"]), v["source"]] for k, v in tm["measured"].items()]))
    if tm.get("shape"):
        out.append(("p", f"Batch shapes: {tm['shape']['text']}."))
    out.append(("p", f"Counts per run: {tm['counts']['from']}."))
    out.append(("table", ["term", "each", "count", "total"],
                [[x["term"], P.fmt_duration(x["each_s"]), x["count_text"], P.fmt_duration(x["seconds"])]
                 for x in tm["terms"]] + [["one run", "", "", P.fmt_duration(tm["per_run_s"])]]))
    out.append(("p", f"{len(tm['runs'])} runs (control first, then variants, then extra seeds) × "
                     f"{P.fmt_duration(tm['per_run_s'])} = {P.fmt_duration(tm['total_s'])} of GPU time, on "
                     f"{tm['lanes']} parallel lane(s) (hardware.gpus / ranks per run, at most one per run)"
                     + (f": {P.fmt_duration(tm['campaign_s'])} of wall time." if tm.get("campaign_s") else ".")))
    notes = [f"{r['label']}: {r['note']}" for r in tm["runs"] if r.get("note")]
    if notes:
        out.append(("list", notes))
    out.append(("table", ["plan", "reserve", "budget per lane", "used", "placed", "not placed"],
                [[f"{p['days']} days", P.fmt_duration(p["reserve_s"]), P.fmt_duration(p["budget_s"]),
                  P.fmt_duration(p["used_s"]), f"{len(p['placed'])}/{len(tm['runs'])}",
                  ", ".join(p["not_fitting"]) or "—"] for p in tm["plans"]]))
    return out


def costs(s: dict) -> list[tuple]:
    out = [("h", "Costs")]
    co = s.get("costs")
    if co is None:
        return out + [("p", "No costs: the input missing is your prices. Pass `--rates FILE`, a YAML of GPU → "
                            "price per GPU-hour (optionally a price per 3/7/30-day plan); see the README.")]
    cur = f" {co['currency']}" if co["currency"] else ""
    out.append(("p", f"From {co['path']}, for {s['hardware']['gpus']} GPU(s); plans per GPU as in the time plan."))
    out.append(("table", ["GPU", "plan", "cost", "how", "places every run"],
                [[r["gpu"], r["plan"],
                  "—" if r["cost"] is None else f"{r['cost']:,.2f}{cur}", r["how"],
                  "yes" if r["fits_all"] else (f"no ({r['placed']} placed)" if r["cost"] is not None else "no")]
                 for r in co["rows"]]))
    ch = co["cheapest"]
    out.append(("p", f"Cheapest plan that places every run: {ch['gpu']}, the {ch['plan']} plan, "
                     f"{ch['cost']:,.2f}{cur} ({ch['how']}; the options table's rows are priced by this same rule)."
                if ch else "No rated GPU has a plan that places every run."))
    return out


def options(s: dict) -> list[tuple]:
    """The options table (sheet/options.py), when the sheet was built with it."""
    if "options" not in s:
        return []
    if s["options"] is None:
        return [("h", "Options that fit (per GPU and count)"), ("p", "No options table (see the warnings above).")]
    return blocks(s["options"])


def launch(s: dict) -> list[tuple]:
    out = [("h", "Launch")]
    ch = s.get("launch")
    if not ch:
        return out + [("p", "No launch files: no GPU and plan to launch (see the problems above).")]
    files = ch.get("files")

    text = f"For the {BY_KEY[ch['gpu']].name} on the {ch['days']}-day plan ({ch['why']})."
    if not files:
        return out + [("p", text + " Pass `--out sheet.md` to write the launch files next to it.")]
    out.append(("p", text + f" Files next to this sheet run `pilotrun sweep --id {files['sweep_id']}`, which "
                            "starts the sweep or continues it (a requeued or recovered job skips the finished runs): "
                            "STEM.commands.sh (here, by lane), STEM.sky.yaml (SkyPilot managed job, the journal on a "
                            "bucket), STEM.sbatch (SLURM, --requeue, the journal on the shared file system; time "
                            f"limit {P.fmt_duration(files['time_limit_s'])}: {files['time_how']}). The sweep's runs:"))
    out.append(("list", [r["command"] for r in files["runs"]]))
    return out


def expected(s: dict) -> list[tuple]:
    e = s["expected"]
    return [("h", "Expected result"),
            ("p", e["statement"] + f". Variants: {e['variants'] or 'none'}. Reread this after the rental: "
                  f"the decision is made on {e['metric']} ({e['goal']}).")]


def constants(s: dict) -> list[tuple]:
    return [("h", "Constants"),
            ("list", [f"headroom: {GM.HEADROOM_SOURCE}",
                      f"CUDA context: {size(GM.CUDA_CONTEXT_BYTES)} — {GM.CUDA_CONTEXT_SOURCE}",
                      f"cuBLAS workspaces: {GM.CUBLAS_WORKSPACE_SOURCE}",
                      f"NCCL buffers (ranks > 1): {size(GM.NCCL_BYTES)} — {GM.NCCL_SOURCE}",
                      f"efficiency assumed for a CPU pilot: {P.ASSUMED_MFU:.0%} of the datasheet dense rate of "
                      f"the campaign's precision; a GPU pilot's own measured seconds replace it",
                      f"launch floor: at least {P.GPU_FLOOR_S_PER_PASS * 1e3:g} ms per forward/backward pass",
                      "GPU figures: vendor datasheets, one named on each entry of src/pilotrun/sheet/catalogue.py; "
                      "tensor rates dense (no 2:4 sparsity)"])]
