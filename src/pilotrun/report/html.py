"""The HTML report: ONE self-contained file (inline CSS and SVG; no network, no CDN, no script).

Sections are pluggable: ``SECTIONS`` is an ordered list of ``(title, fn(journal) -> html)``; a stage
adds its own section by appending (or inserting) a builder. A builder returns an HTML fragment,
escaping whatever text it takes from the journal with :func:`esc`.
"""

from __future__ import annotations

import html
import json
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from pilotrun.console.progress import head, note
from pilotrun.console.safe import escape_controls
from pilotrun.journal.files import refuse_replacing, write_output
from pilotrun.journal.runs import run_table_rows, shown_status
from pilotrun.probe.recorder import figure, host_peak, peak_of
from pilotrun.sizes import fmt_bytes
from pilotrun.rehearsal.training.compare import TABLE_COLUMNS
from pilotrun.rehearsal.training.sweep import sweep_comparison
from pilotrun.rehearsal.training.timecheck import sweep_time_check
from pilotrun.report.plots import loss_curves, paired_bars, phase_ledger
from pilotrun.sheet.plan import fmt_duration

Section = tuple[str, Callable[..., str]]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;max-width:1200px;color:#222;
padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;font-size:.85em;margin:.6em 0}th,td{border:1px solid #ddd;padding:.25em .5em;
text-align:left;vertical-align:top}th{background:#f4f4f4}
.muted{color:#777}.status-diverged,.verdict-worse{color:#b03a2e;font-weight:600}.status-stopped{color:#b9770e}
.verdict-better{color:#1e8449;font-weight:600}.status-interrupted,.status-failed{color:#7d3c98}.status-check-failed{color:#b03a2e;font-weight:600}
.plot svg{max-width:100%;height:auto}code{background:#f4f4f4;padding:0 .2em}
.scroll{overflow-x:auto}table.runs td.id,table.runs td.time,table.runs td.status{white-space:nowrap}
details.run{margin:.4em 0;border-left:3px solid #ddd;padding-left:.6em}details.run>summary{font-weight:600;cursor:pointer}
"""


def esc(v) -> str:
    """``v`` as HTML text: markup escaped, and control characters shown escaped as the terminal shows them
    (console.safe), so a run name cannot hide words behind U+202E or put a NUL in the page."""
    if v is None:
        return ""
    if isinstance(v, float):
        return esc(f"{v:.4g}" if math.isfinite(v) else str(v))
    if isinstance(v, (dict, list)):
        return html.escape(json.dumps(v, default=str))  # json.dumps already writes controls as \uNNNN
    return html.escape(escape_controls(str(v)))


def table(columns: list[str], rows: list[dict], classes: dict[str, Callable[[dict], str]] | None = None) -> str:
    """An HTML table; ``classes`` maps a column to a function giving a cell's CSS class."""
    classes = classes or {}
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    for r in rows:
        cells = []
        for c in columns:
            cls = classes[c](r) if c in classes else ""
            cells.append(f'<td class="{esc(cls)}">{esc(r.get(c))}</td>' if cls else f"<td>{esc(r.get(c))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def latest_sweep_id(journal) -> str | None:
    with journal.connect() as db:
        row = db.execute(f"SELECT sweep_id FROM sweeps ORDER BY {journal.order} DESC LIMIT 1").fetchone()
    return row["sweep_id"] if row else None


def _sweep_data(journal) -> dict | None:
    sid = latest_sweep_id(journal)
    return sweep_comparison(journal, sid) if sid else None


NO_SWEEP = '<p class="muted">no sweep in this journal yet: run <code>pilotrun sweep CAMPAIGN</code>.</p>'


def section_curves(journal) -> str:
    data = _sweep_data(journal)
    if data is None:
        return NO_SWEEP
    plan, series = data["plan"], []
    for r in sorted(data["runs"], key=lambda r: (r["arm"], r["seed"])):
        train = journal.metrics(r["run_id"], "train", "loss")
        val = journal.metrics(r["run_id"], "validation", plan["metric"])  # never val_loss in its place
        series.append({"arm": r["arm"], "seed": r["seed"], "status": r["status"],
                       "train_steps": [m["step"] for m in train], "train_loss": [m["value"] for m in train],
                       "val_steps": [m["step"] for m in val], "val_values": [m["value"] for m in val]})
    svg = loss_curves(series, data["labels"], [a["name"] for a in plan["arms"]],
                      title=f"sweep {data['sweep_id']} — {plan['metric']} ({plan['goal']})")
    points = [{"run_id": r["run_id"], "arm": r["arm"], "seed": r["seed"], "status": r["status"],
               "update": m["step"], plan["metric"]: m["value"]}
              for r in sorted(data["runs"], key=lambda r: (r["arm"], r["seed"]))
              for m in journal.metrics(r["run_id"], "validation", plan["metric"])]
    return (f'<div class="plot">{svg}</div>'
            f"<details><summary>validation points ({len(points)})</summary>"
            f"{table(['run_id', 'arm', 'seed', 'status', 'update', plan['metric']], points, _STATUS_CLASS)}"
            f"</details>")


_STATUS_CLASS = {"status": lambda r: f"status-{r.get('status')}"}


def section_comparison(journal) -> str:
    data = _sweep_data(journal)
    if data is None:
        return NO_SWEEP
    plan, eb = data["plan"], data["plan"]["effective_batch"]
    frozen = (f"<p>sweep <code>{esc(data['sweep_id'])}</code>, plan sha256 <code>{esc(data['plan_sha256'])}</code>, "
              f"campaign config sha256 <code>{esc(plan['config_sha256'])}</code>.<br>Fixed before launch for every "
              f"arm: budget updates={esc(plan['budget']['updates'])} epochs={esc(plan['budget']['epochs'])}; "
              f"effective batch {eb['micro_batch']} × {eb['accumulation']} × {eb['ranks']} = "
              f"{eb['examples_per_update']}; eval_every {esc(plan['eval_every'])}; stop rules {esc(plan['stop'])}; "
              f"metric {esc(plan['metric'])} ({esc(plan['goal'])}); seeds {esc(plan['seeds'])}.</p>")
    verdict_cls = {"verdict": lambda r: "verdict-" + r["verdict"].split(" ")[0]}
    comp = table(TABLE_COLUMNS, data["rows"], verdict_cls)
    note = ('<p class="muted">at_budget: the plan metric at each run\'s last validation; best: its best so far; '
            "both as mean [95% t interval] over seeds. vs_control: the arm minus the control, paired by seed. "
            "Diverged runs are failures of their arm: counted, listed, and left out of the means.</p>")
    runs = table(["run_id", "arm", "seed", "status", "at_budget", "best", "last_validation_update", "updates",
                  "reason"], sorted(data["runs"], key=lambda r: (r["seed"], r["arm"])), _STATUS_CLASS)
    sup = ""
    if data["superseded"]:
        sup = ("<p>superseded runs (kept, not counted):</p>" +
               table(["run_id", "arm", "seed", "status"], data["superseded"], _STATUS_CLASS))
    return frozen + comp + note + "<h3>every run</h3>" + runs + sup


LEDGER_COLUMNS = ["phase", "rank", "counter", "inputs", "baseline", "peak_allocated", "peak_reserved",
                  "end_allocated", "end_reserved", "duration_s", "verdict", "note"]


def section_ledger(journal) -> str:
    pilots = journal.list_runs(kind="pilot")
    if not pilots:
        return '<p class="muted">no pilot run in this journal yet: run <code>pilotrun pilot CAMPAIGN</code>.</p>'
    run = pilots[-1]
    rows = journal.phase_rows(run["run_id"])
    head = f"<p>pilot run <code>{esc(run['run_id'])}</code> ({esc(run['status'])}, {esc(run['created_at'])})</p>"
    if not rows:
        return head + '<p class="muted">this pilot run recorded no phase rows.</p>'
    shown = []
    for r in rows:
        s = dict(r)
        for k in ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved"):
            s[k] = fmt_bytes(r[k]) if r.get(k) is not None else "—"
        s["inputs"] = ", ".join(f"{k} {v}" for k, v in (r.get("inputs") or {}).items())
        s["duration_s"] = f"{r['duration_s']:.3f}" if r.get("duration_s") is not None else "—"
        shown.append(s)
    counters = {r.get("counter") for r in rows}
    rss = ('<p class="muted">counter rss: process resident memory on the CPU; RSS has no reserved counter, '
           "so *_reserved stay empty.</p>") if "rss" in counters else ""
    if "tensors+rss" in counters:
        rss += ('<p class="muted">counter tensors+rss (CPU): *_allocated are the bytes held by live tensors, exact '
                "at every operator (engine/tensors.py); *_reserved are the process's resident memory (RSS).</p>")
    svg = phase_ledger(rows, title=f"phase ledger of pilot run {run['run_id']}")
    verdict_cls = {"verdict": lambda r: "" if r["verdict"] == "ok" else "verdict-worse"}
    return head + f'<div class="plot">{svg}</div>' + rss + table(LEDGER_COLUMNS, shown, verdict_cls)


def section_notes(journal) -> str:
    notes = journal.notes()
    if not notes:
        return ('<p class="muted">no notes yet: <code>pilotrun note "TEXT" [--run ID] [--decision]</code>.</p>')
    rows = [{"when": n["created_at"], "kind": "decision" if n["decision"] else "note", "run": n["run_id"] or "",
             "text": n["text"]} for n in notes]
    return table(["when", "kind", "run", "text"], rows, {"kind": lambda r: "verdict-better" if r["kind"] == "decision"
                                                         else ""})


def section_promises(journal) -> str:
    """The pilot's two promises checked by the latest sweep: its peaks bound the runs', its plan their time."""
    sid = latest_sweep_id(journal)
    if sid is None:
        return NO_SWEEP
    mem = []
    for run in journal.list_runs(sweep_id=sid):
        bound = (run.get("summary") or {}).get("memory_bound") or {}
        for kind, k in (bound.get("kinds") or {}).items():
            mem.append({"run_id": run["run_id"], "arm": run["arm"], "seed": run["seed"], "kind": kind,
                        "observed": fmt_bytes(k["peak"]) if k["peak"] is not None else "—",
                        "pilot": f"{fmt_bytes(k['pilot_peak'])} ({k['pilot_phase']})" if k["pilot_peak"] else "—",
                        "ratio": f"{k['ratio']:.3f}" if k["ratio"] is not None else "—",
                        "worst at": ", ".join(f"{a} {b}" for a, b in k["inputs"].items() if a not in ("blocks", "probed")),
                        "verdict": "pilot did not see the worst case" if k.get("over") else "bounded"})
    out = [f"<h3>memory: each run's observed peak against pilot {esc(bound.get('pilot_run') if mem else '—')}</h3>"]
    drawn = [(f"{m['arm']} seed {m['seed']} {m['kind']}", k) for run in journal.list_runs(sweep_id=sid)
             for m in [{"arm": run["arm"], "seed": run["seed"]}]
             for m["kind"], k in ((run.get("summary") or {}).get("memory_bound") or {}).get("kinds", {}).items()
             if k.get("peak") and k.get("pilot_peak")]
    if drawn:
        out.append('<div class="plot">' + paired_bars(
            [d[0] for d in drawn], [d[1]["pilot_peak"] / 2**20 for d in drawn], [d[1]["peak"] / 2**20 for d in drawn],
            ("pilot peak", "observed peak"), unit="MiB", band=(0.0, 1.10),
            title="memory bound: each run's observed peak against the pilot's") + "</div>")
    out.append(table(["run_id", "arm", "seed", "kind", "observed", "pilot", "ratio", "worst at", "verdict"], mem,
                     {"verdict": lambda r: "verdict-worse" if r["verdict"] != "bounded" else ""}) if mem else
               '<p class="muted">no run of this sweep recorded its peaks.</p>')
    out.append('<p class="muted">On CPU the bound is judged on the bytes of live tensors (counter tensors+rss, exact: '
               "no allowance), on CUDA on its allocator's counters. Only rows of the older RSS-only counter (rss) "
               "keep an allowance of 10% (at least 16 MiB; probe/watch.py NOISE).</p>")
    check = sweep_time_check(journal, sid)
    out.append("<h3>time: the sheet's plan on this machine against the clock</h3>")
    if not check or not check.get("runs"):
        out.append(f'<p class="muted">not compared: {esc((check or {}).get("why", "no timed runs"))}</p>')
    else:
        rows = [{"run_id": r["run_id"], "arm": r["arm"], "seed": r["seed"], "status": r["status"],
                 "updates": r["updates"], "predicted": fmt_duration(r["predicted_s"]),
                 "actual": fmt_duration(r["actual_s"]), "predicted ÷ actual": f"{r['ratio']:.2f}"}
                for r in check["runs"]]
        rows.append({"run_id": "total", "arm": "", "seed": "", "status": "", "updates": sum(r["updates"] for r in
                                                                                            check["runs"]),
                     "predicted": fmt_duration(check["predicted_s"]), "actual": fmt_duration(check["actual_s"]),
                     "predicted ÷ actual": f"{check['ratio']:.2f}"})
        out.append(table(["run_id", "arm", "seed", "status", "updates", "predicted", "actual", "predicted ÷ actual"],
                         rows))

        out.append('<div class="plot">' + paired_bars(
            [f"{r['arm']} seed {r['seed']}" for r in check["runs"]], [r["actual_s"] for r in check["runs"]],
            [r["predicted_s"] for r in check["runs"]], ("actual", "predicted"), unit="seconds",
            band=tuple(check["goal"]), title="time plan: predicted against actual seconds per run") + "</div>")
        u = check["units"]
        out.append(f'<p class="muted">from pilot {esc(check["pilot_run"])}: {u["update"]:.3g} s per update, '
                   f'{u["eval_batch"]:.3g} s per validation batch, {u["save"]:.3g} s per checkpoint, {u["load"]:.3g} '
                   "s load, for the updates, validations and checkpoints each run did.</p>")
        parts = [{"term": b["term"], "predicted": f"{b['predicted_s']:.1f} s",
                  "actual": "—" if b["actual_s"] is None else f"{b['actual_s']:.1f} s",
                  "predicted ÷ actual": f"{b['predicted_s'] / b['actual_s']:.2f}" if b["actual_s"] and b["predicted_s"]
                  else "—"} for b in check.get("breakdown") or []]
        if parts:
            out.append("<h4>the plan's terms against the runs' own timed blocks, all runs</h4>")
            out.append(table(["term", "predicted", "actual", "predicted ÷ actual"], parts))
    return "".join(out)


RUNS_OPEN = 3  # the latest runs shown unfolded; every other run is one click away


def section_runs(journal) -> str:
    """Every run in the journal: a table linking to each, then each run folded (the latest few open) with
    its loss curve, its ledger and its memory bound. Sweeps and pilots also have their own sections below."""
    runs = run_table_rows(journal, journal.list_runs())
    if not runs:
        return '<p class="muted">no run yet.</p>'
    index = [{"run": f'<a href="#run-{esc(r["run_id"])}"><code>{esc(r["run_id"])}</code></a>', "kind": esc(r["kind"]),
              "name": esc(r["name"]), "status": _status(r), "verdict": esc(r.get("verdict") or ""),
              "created": esc((r.get("created_at") or "").replace("T", " ")[:19]), "updates": esc(r.get("updates_done")),
              "final": esc(r.get("final") or ""), "overrides": esc(r.get("overrides") or ""),
              "sweep": esc(r.get("sweep_id") or ""), "arm": esc(r.get("arm") or "")} for r in reversed(runs)]
    # a run id, a time and a status are never broken across lines (at 1280 px they were: issue 43); the columns
    # no run fills are left out, as `runs` does; a table still wider than the page scrolls inside its box
    columns = [c for c in index[0] if c == "run" or any(row[c] for row in index)]
    nowrap = {"run": ' class="id"', "created": ' class="time"', "status": ' class="status"'}
    head = "".join(f"<th>{c}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td{nowrap.get(c, '')}>{row[c]}</td>" for c in columns) + "</tr>"
                   for row in index)
    many = f"{len(runs)} runs, newest first; each links" if len(runs) > 1 else "1 run; it links"
    out = [f'<p class="muted">{many} to its own part below.</p>'
           f'<div class="scroll"><table class="runs"><tr>{head}</tr>{body}</table></div>']
    for n, run in enumerate(reversed(runs)):
        note(f"run {n + 1}/{len(runs)}", done=n, total=len(runs))
        out.append(f'<details class="run"{" open" if n < RUNS_OPEN else ""}>{_one_run(journal, run)}</details>')
    return "".join(out)


def _status(run: dict) -> str:
    """A run's status as runs and show print it (journal.runs.shown_status), styled by it."""
    shown = shown_status(run)
    return f'<span class="status-{esc(shown.replace(" ", "-"))}">{esc(shown)}</span>'


def _one_run(journal, run) -> str:
    rid = run["run_id"]
    reason = (run.get("summary") or {}).get("reason")
    parts = [f'<summary id="run-{esc(rid)}"><code>{esc(rid)}</code> {esc(run["kind"])} · {esc(run["name"])} · '
             f'{_status(run)}</summary>',
             f'<p class="muted">{esc(run.get("command") or "")}' + (f" — {esc(reason)}" if reason else "") + "</p>"]
    train = journal.metrics(rid, "train", "loss")
    val = journal.metrics(rid, "validation", "val_loss")
    if train or val:
        series = [{"arm": run["kind"], "seed": run.get("seed") or 0, "status": run["status"],
                   "train_steps": [m["step"] for m in train], "train_loss": [m["value"] for m in train],
                   "val_steps": [m["step"] for m in val], "val_values": [m["value"] for m in val]}]
        parts.append('<div class="plot">' + loss_curves(series, {run["kind"]: run["name"]}, [run["kind"]],
                                                        title=f"loss curve of {rid}") + "</div>")
    else:
        parts.append('<p class="muted">no loss logged.</p>')
    rows = journal.phase_rows(rid)
    if rows:
        parts.append('<div class="plot">' + phase_ledger(rows, title=f"phase ledger of {rid}") + "</div>")
        top = max(rows, key=lambda r: peak_of(r) or 0)
        bound = (run.get("summary") or {}).get("memory_bound") or {}
        if bound.get("max_ratio") is not None:
            text = (f"memory bound: observed peak ÷ pilot {bound['pilot_run']} peak ≤ {bound['max_ratio']:.3f}"
                    + "".join(f"; WARNING {w}" for w in bound.get("warnings", [])))
        else:
            text = (f"memory: this run's peak is {fmt_bytes(peak_of(top) or 0)} of {figure(top)} at {top['phase']} "
                    f"(rank {top['rank']})" + ("; a GPU holds that allocated, plus its allocator's reserve and the "
                                               "CUDA context: the sheet's GPU figure" if top.get("counter") != "cuda"
                                               else ""))
        host = max(rows, key=lambda r: host_peak(r) or 0)
        if host_peak(host) is not None:
            text += f"; host memory (process RSS, not a GPU figure) peaked at {fmt_bytes(host_peak(host))}"
        parts.append(f"<p>{esc(text)}</p>")
        shown = [dict(r, inputs=", ".join(f"{k} {v}" for k, v in (r.get("inputs") or {}).items()),
                      **{k: fmt_bytes(r[k]) if r.get(k) is not None else "—" for k in
                         ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved")})
                 for r in rows]
        parts.append(f"<details><summary>ledger rows ({len(rows)})</summary>"
                     f"{table(LEDGER_COLUMNS, shown)}</details>")
    else:
        parts.append('<p class="muted">no phase rows.</p>')
    return "".join(parts)


SECTIONS: list[Section] = [
    ("Runs: every run, with its loss curve, ledger and memory bound", section_runs),
    ("Sweep: loss curves and validation points", section_curves),
    ("Sweep: comparison", section_comparison),
    ("Pilot: phase ledger", section_ledger),
    ("Notes and decisions", section_notes),
    ("Campaign against the pilot: memory bound and time plan", section_promises),
]


REPORT_HEAD = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>pilotrun report</title>"


def build_report(journal, sections: list[Section] | None = None) -> str:
    sections = SECTIONS if sections is None else sections
    kinds: dict[str, int] = {}
    for r in journal.list_runs():
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    made = datetime.now(timezone.utc).isoformat(timespec="seconds")
    header = (f"<h1>pilotrun report</h1><p class=\"muted\">journal {esc(journal.path)} · generated {esc(made)} · "
              f"runs: {esc(', '.join(f'{k} {n}' for k, n in sorted(kinds.items())) or 'none')}</p>")
    body = [header]
    for i, (title, fn) in enumerate(sections):
        short = title if len(title) <= 40 else title.partition(":")[0]  # with its counts, one line of an 80-column log
        head(f"section {i + 1}/{len(sections)}: {short}")
        body.append(f'<section id="s{i}"><h2>{esc(title)}</h2>{fn(journal)}</section>')
    return f"{REPORT_HEAD}<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"


def write_report(journal, out: str | Path, sections: list[Section] | None = None) -> Path:
    """Build the report and write it atomically (complete or absent, never half-written; a device or a pipe such as
    /dev/stdout is written into, as ``write_output`` says). A file there that is no report of pilotrun's is exit 2
    before the report is built (``refuse_replacing``)."""
    out = Path(out).expanduser().absolute()
    refuse_replacing(out, "--out", lambda first: first.startswith(REPORT_HEAD.encode()), "report")
    write_output(out, build_report(journal, sections), "--out")
    return out
