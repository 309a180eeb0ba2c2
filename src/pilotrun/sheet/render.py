"""The sheet (a dict from ``stages.sheet.build_sheet``) as blocks, then as Markdown, HTML or terminal lines.

One list of blocks feeds all three forms, so they cannot disagree.
"""

from __future__ import annotations

import html

from pilotrun.sheet import plan as P

GiB = 2**30


def _gib(n) -> str:
    return "n/a" if n is None else f"{n / GiB:.2f} GiB"


def _inputs(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in (d or {}).items() if not isinstance(v, (list, dict))) or "—"


def blocks(s: dict) -> list[tuple]:
    """("h", title) | ("p", text) | ("table", columns, rows) | ("list", items)."""
    out: list[tuple] = [("h", f"Selection sheet — {s['campaign']}"),
                        ("p", f"From pilot run {s['pilot_run']} (config sha256 {s['config_sha256'][:12]}), "
                              f"measured on {s['pilot_device']} (counter {s['counter']}"
                              + (": process RSS, no reserved counter" if s['counter'] == "rss" else
                                 ": live tensor bytes as allocated, process RSS as reserved"
                                 if s['counter'] == "tensors+rss" else "") + ").")]
    if s["problems"] or s["warnings"]:
        out.append(("list", [f"FAIL: {p}" for p in s["problems"]] + [f"WARN: {w}" for w in s["warnings"]]))
    m = s["memory"]
    out.append(("h", "Memory per GPU"))
    if m["peak"] is not None:
        label = "peak RSS (CPU)" if s["counter"] in ("rss", "tensors+rss") else "peak reserved"
        out.append(("p", f"Needed: {_gib(m['need'])} = {label} {_gib(m['peak'])} × (1 + {P.MARGIN_FRACTION:g}) + "
                         f"{P.MARGIN_BYTES / GiB:g} GiB (margin: fragmentation and batch variation; CUDA context and "
                         f"workspaces outside torch's counters). Set by phase {m['phase']} rank {m['rank']} "
                         f"({_inputs(m['inputs'])}) — {m['source']}."))
        if s["counter"] in ("rss", "tensors+rss"):
            out.append(("p", "Measured on CPU as RSS (it includes the interpreter and libraries): an upper bound "
                             "for small models, not a GPU measurement; pilot on one GPU to confirm."))
    if len(s["per_rank"]) > 1:
        out.append(("table", ["rank", "peak", "phase"],
                    [[r["rank"], _gib(r["peak"]), r["phase"]] for r in s["per_rank"]]))
    lg = s.get("largest")
    if lg and s.get("target"):
        out.append(("p", f"Largest sizes on the {s['target']['name']} (linear extrapolation of the growth over each "
                         f"phase's baseline; verify with `pilotrun fit`): micro_batch {lg['micro_batch']}, "
                         f"eval_batch {lg['eval_batch']}, seq_len {lg['seq_len']} at the piloted micro_batch."))
    st = s["settings"]
    out.append(("h", "Settings"))
    out.append(("table", ["key", "value"], [[k, v] for k, v in st.items()]))
    out.append(("p", f"Effective batch = micro_batch {st['micro_batch']} × accumulation {st['accumulation']} × "
                     f"ranks {st['ranks']} = {st['effective_batch']}."))
    out += _stack_blocks(s)
    out.append(("h", "Fit table (catalogue GPUs; per phase: peak + margin ≤ GPU memory)"))
    phases = list(next(iter(s["fit"]))["phases"]) if s["fit"] else []
    out.append(("table", ["GPU", "memory", *phases, "verdict", "campaign time"],
                [[f["name"], f"{f['memory_bytes'] / GiB:g} GiB", *(f["phases"][p] for p in phases), f["verdict"],
                  P.fmt_duration(f.get("campaign_s"))] for f in s["fit"]]))
    out += _time_blocks(s)
    e = s["expected"]
    out.append(("h", "Expected result"))
    out.append(("p", e["statement"] + f". Variants: {e['variants'] or 'none'}. Reread this after the rental: "
                     f"the decision is made on {e['metric']} ({e['goal']})."))
    out.append(("h", "Constants"))
    out.append(("list", [f"memory margin: × (1 + {P.MARGIN_FRACTION:g}) + {P.MARGIN_BYTES / GiB:g} GiB",
                         f"CPU extrapolation: {P.ASSUMED_MFU:.0%} of the datasheet dense rate; at least "
                         f"{P.GPU_FLOOR_S_PER_PASS * 1e3:g} ms per pass",
                         "GPU figures: NVIDIA datasheets (src/pilotrun/sheet/catalogue.py), dense rates"]))
    return out


def _stack_blocks(s: dict) -> list[tuple]:
    req = s["stack"]["required"]
    out = [("h", "Software stack"),
           ("list", [f"torch {req['torch']['range']}", "a CUDA device",
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


def _time_blocks(s: dict) -> list[tuple]:
    tm = s.get("time")
    out = [("h", "Time plan")]
    if not tm:
        out.append(("p", "No time plan (see the problems above)."))
        return out
    tgt = s.get("target")
    out.append(("p", f"For {tgt['name'] if tgt else 'the pilot device'} ({s.get('target_from')}). "
                     f"{tm['scaling']['text']}."))
    out.append(("p", "Measured (slowest rank): " + "; ".join(
        f"{k} {P.fmt_duration(v['seconds'])} [{v['source']}]" for k, v in tm["measured"].items())))
    if tm.get("shape"):
        out.append(("p", f"Batch shapes: {tm['shape']['text']}."))
    out.append(("p", f"Counts per run: {tm['counts']['from']}."))
    out.append(("table", ["term", "each", "count", "seconds"],
                [[x["term"], P.fmt_duration(x["each_s"]), x["count_text"], f"{x['seconds']:.4g}"]
                 for x in tm["terms"]] + [["one run", "", "", f"{tm['per_run_s']:.4g}"]]))
    notes = [f"{r['label']}: {r['note']}" for r in tm["runs"] if r.get("note")]
    out.append(("p", f"{len(tm['runs'])} runs (control first, then variants, then extra seeds) × "
                     f"{P.fmt_duration(tm['per_run_s'])} = {P.fmt_duration(tm['total_s'])} of GPU time, on "
                     f"{tm['lanes']} parallel lane(s) (hardware.gpus / ranks per run)."))
    if notes:
        out.append(("list", notes))
    rows = []
    for p in tm["plans"]:
        rows.append([f"{p['days']} days", P.fmt_duration(p["reserve_s"]), P.fmt_duration(p["budget_s"]),
                     P.fmt_duration(p["used_s"]), f"{len(p['placed'])}/{len(tm['runs'])}",
                     ", ".join(p["not_fitting"]) or "—"])
    out.append(("table", ["plan", "reserve (eval, export)", "budget per lane", "used", "runs placed",
                          "does not fit"], rows))
    return out


def to_markdown(s: dict) -> str:
    lines: list[str] = []
    for b in blocks(s):
        if b[0] == "h":
            lines += [("# " if not lines else "## ") + b[1], ""]
        elif b[0] == "p":
            lines += [b[1], ""]
        elif b[0] == "list":
            lines += [f"- {x}" for x in b[1]] + [""]
        else:
            cols, rows = b[1], b[2]
            cell = lambda v: str(v).replace("|", "\\|")  # noqa: E731
            lines += ["| " + " | ".join(cols) + " |", "|" + " --- |" * len(cols)]
            lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows] + [""]
    return "\n".join(lines)


def to_html(s: dict) -> str:
    e = html.escape
    parts: list[str] = []
    for b in blocks(s):
        if b[0] == "h":
            parts.append(f"<h3>{e(b[1])}</h3>" if not parts else f"<h4>{e(b[1])}</h4>")
        elif b[0] == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif b[0] == "list":
            parts.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b[1]) + "</ul>")
        else:
            head = "".join(f"<th>{e(str(c))}</th>" for c in b[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in b[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "<div class='sheet'>" + "".join(parts) + "</div>"


def to_lines(s: dict) -> list[str]:
    """The terminal form: every block but the fit table (the stage result renders that as its table)."""
    lines: list[str] = []
    for b in blocks(s):
        if b[0] == "h":
            if not b[1].startswith("Fit table"):
                lines.append(f"== {b[1]}")
        elif b[0] == "p":
            lines.append(b[1])
        elif b[0] == "list":
            lines += [f"  - {x}" for x in b[1]]
        elif b[1][:1] != ["GPU"]:
            lines += ["  " + " | ".join(str(v) for v in r) for r in [b[1], *b[2]]]
    return lines
