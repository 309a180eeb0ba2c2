"""Terminal rendering of stage results and journal records (rich)."""

from __future__ import annotations

from pilotrun.probe.sizes import fmt_bytes
from pilotrun.report.table import cell, render_table

STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def _fmt(v) -> str:
    return cell(v)


def render_result(r, con) -> None:
    con.print(f"[{STYLE[r.verdict]}]{r.verdict.upper():4}[/] [bold]{r.stage}[/]: ", end="")
    con.print(r.summary, markup=False, highlight=False)
    for m in r.messages:
        con.print(f"     {m}", markup=False)
    if r.rows and r.columns:
        render_table(con, r.columns, r.rows)


def render_summary(results, con) -> None:
    rows = [{"stage": r.stage, "verdict": r.verdict, "summary": r.summary} for r in results]
    render_table(con, ["stage", "verdict", "summary"], rows, title="rehearsal summary")


RUN_COLUMNS = ("run_id", "kind", "name", "status", "updates", "examples", "created_at", "supersedes")


def render_runs(con, runs) -> None:
    """Every run id whole (a prefix of it is what the other verbs take)."""
    if not runs:
        con.print("no runs yet")
        return
    rows = [{"run_id": r["run_id"], "kind": r.get("kind"), "name": r.get("name"), "status": r.get("status"),
             "updates": r.get("updates_done"), "examples": r.get("examples_seen"),
             "created_at": (r.get("created_at") or "").replace("T", " ")[:19], "supersedes": r.get("supersedes")}
            for r in runs]
    render_table(con, RUN_COLUMNS, rows)


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
        con.print("  timing: " + ", ".join(f"{k} {v:.3g}" for k, v in summary["timing"].items()), markup=False)
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
            con.print(f"    {p['phase']:17} rank {p['rank']} {p['verdict']:11} {_fmt(p['duration_s'])}s"
                      + (f"  peak {fmt_bytes(peak)} ({p.get('counter')})" if peak is not None else "")
                      + (f"  — {p['note']}" if p.get("note") and p["phase"].startswith("observed_") else ""),
                      markup=False)
    for n in data["notes"]:
        con.print(f"  {'decision' if n['decision'] else 'note'} {n['id']}: {n['text']}", markup=False)
    if data["files"]:
        con.print(f"  files ({len(data['files'])}): " + ", ".join(data["files"][:12]) +
                  (" …" if len(data["files"]) > 12 else ""), markup=False)
