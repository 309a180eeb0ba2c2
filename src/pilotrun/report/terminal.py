"""Terminal rendering of stage results and journal records (rich)."""

from __future__ import annotations

import json

from pilotrun.probe.sizes import fmt_bytes

STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return "" if v is None else str(v)


def render_result(r, con) -> None:
    from rich.table import Table

    con.print(f"[{STYLE[r.verdict]}]{r.verdict.upper():4}[/] [bold]{r.stage}[/]: {r.summary}")
    for m in r.messages:
        con.print(f"     {m}", markup=False)
    if r.rows and r.columns:
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for c in r.columns:
            table.add_column(c)
        for row in r.rows:
            cells = []
            for c in r.columns:
                v = row.get(c)
                cells.append(f"[{STYLE[v]}]{v}[/]" if c == "verdict" and v in STYLE else _fmt(v))
            table.add_row(*cells)
        con.print(table)


def render_summary(results, con) -> None:
    from rich.table import Table

    table = Table(title="rehearsal summary", show_header=True, header_style="bold")
    table.add_column("stage")
    table.add_column("verdict")
    table.add_column("summary")
    for r in results:
        table.add_row(r.stage, f"[{STYLE[r.verdict]}]{r.verdict}[/]", r.summary)
    con.print(table)


RUN_COLUMNS = ("run_id", "kind", "name", "status", "updates_done", "examples_seen", "created_at", "supersedes")


def render_runs(con, runs) -> None:
    from rich.table import Table

    if not runs:
        con.print("no runs yet")
        return
    table = Table(show_header=True, header_style="bold", box=None)
    for c in RUN_COLUMNS:
        table.add_column(c.replace("_done", "").replace("_", " "))
    for r in runs:
        table.add_row(*(_fmt(r.get(c)) for c in RUN_COLUMNS))
    con.print(table)


def render_run(con, data) -> None:
    run = data["run"]
    con.print(f"[bold]run {run['run_id']}[/] ({run['kind']}, {run['name']}): [bold]{run['status']}[/]")
    for k in ("created_at", "ended_at", "updates_done", "examples_seen", "seed", "config_sha256", "git_rev",
              "supersedes", "sweep_id", "command"):
        if run.get(k) is not None:
            con.print(f"  {k}: {run[k]}", markup=False)
    if run.get("trust_remote_code"):
        con.print("  trust_remote_code: ON (model code from the model folder ran)")
    summary = run.get("summary") or {}
    for k, v in summary.items():
        if k not in ("arithmetic", "memory_bound", "timing", "counts"):
            con.print(f"  {k}: {_fmt(v)}", markup=False)
    if summary.get("timing"):
        flat = {k: v for k, v in summary["timing"].items() if isinstance(v, (int, float))}
        flat.update({f"{k} blocks_s": v for k, v in (summary["timing"].get("blocks_s") or {}).items()})
        con.print("  timing: " + ", ".join(f"{k} {v:.3g}" for k, v in flat.items()), markup=False)
    if summary.get("memory_bound"):
        from pilotrun.stages.train import bound_lines

        for line in bound_lines(summary["memory_bound"]):
            con.print(f"  {line}", style="yellow" if line.startswith("WARNING") else None, markup=False)
    if data["validation"]:
        # SQLite keeps a NaN as NULL: a None value is a loss that was not a number
        pts = ", ".join(f"{m['step']}: {'nan' if m['value'] is None else format(m['value'], '.4f')}"
                        for m in data["validation"] if m["name"] == "val_loss")
        con.print(f"  validation ({data['train_updates']} updates logged): {pts}", markup=False)
    if data["phases"]:
        con.print(f"  phase rows: {len(data['phases'])}")
        for p in data["phases"]:
            peak = max((v for v in (p.get("peak_allocated"), p.get("peak_reserved")) if v is not None), default=None)
            both = p.get("counter") == "tensors+rss" and p.get("peak_allocated") is not None
            shown = (f"  peak tensors {fmt_bytes(p['peak_allocated'])}, RSS {fmt_bytes(p.get('peak_reserved'))}" if both
                     else f"  peak {fmt_bytes(peak)} ({p.get('counter')})" if peak is not None else "")
            con.print(f"    {p['phase']:17} rank {p['rank']} {p['verdict']:11} {_fmt(p['duration_s'])}s" + shown
                      + (f"  — {p['note']}" if p.get("note") and p["phase"].startswith("observed_") else ""),
                      markup=False)
    for n in data["notes"]:
        con.print(f"  {'decision' if n['decision'] else 'note'} {n['id']}: {n['text']}", markup=False)
    if data["files"]:
        con.print(f"  files ({len(data['files'])}): " + ", ".join(data["files"][:12]) +
                  (" …" if len(data["files"]) > 12 else ""), markup=False)
