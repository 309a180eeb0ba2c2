"""Terminal rendering of stage results and journal records (rich)."""

from __future__ import annotations

from pilotrun.console.progress import SPENT
from pilotrun.sizes import fmt_bytes
from pilotrun.report.table import cell, print_wrapped, render_table, wrap
from pilotrun.sheet.plan import fmt_duration

STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red"}


def _fmt(v) -> str:
    return cell(v)


def render_result(r, con) -> None:
    from rich.text import Text

    head = f"{r.verdict.upper():4} {r.stage}: "
    lines = wrap(head + r.summary, max(int(con.width), 20), "", hang=5)
    first = Text(lines[0])
    first.stylize(STYLE[r.verdict], 0, 4)
    first.stylize("bold", 5, len(head) - 2)
    con.print(first, highlight=False)
    for line in lines[1:]:
        con.print(line, markup=False, highlight=False)
    for m in r.messages:
        print_wrapped(con, m, "     ")
    if r.rows and r.columns:
        render_table(con, r.columns, r.rows)


def render_summary(results, con, notes: list[str] | None = None, breakdown: bool = False) -> None:
    """One row per stage; a time column where the stages were timed; ``notes`` (the budgets used) under it;
    ``breakdown``: where each stage's time went (``render_breakdown``)."""
    timed = any(r.seconds is not None for r in results)
    rows = [{"stage": r.stage, "verdict": r.verdict, "time": "" if r.seconds is None else fmt_duration(r.seconds),
             "summary": r.summary} for r in results]
    columns = ["stage", "verdict"] + (["time"] if timed else []) + ["summary"]
    render_table(con, columns, rows, title="rehearsal summary")
    if timed:
        print_wrapped(con, f"total {fmt_duration(sum(r.seconds or 0.0 for r in results))}")
    for line in notes or []:
        print_wrapped(con, line)
    if breakdown:
        render_breakdown(results, con)


SPENT_COLUMNS = {"startup": "start-up", "campaign": "campaign", "data": "data", "model": "model", "work": "work"}


def render_breakdown(results, con) -> None:
    """Where each stage's time went (``all --verbose``): its wall and the accounts of console/progress.SPENT."""
    timed = [r for r in results if r.spent]
    if not timed:
        return
    def shown(s: float) -> str:
        return fmt_duration(s) if s >= 0.0005 else ""  # under a millisecond: nothing worth a figure

    rows = [{"stage": r.stage, "wall": fmt_duration(r.seconds or sum(r.spent.values())),
             **{SPENT_COLUMNS[k]: shown(r.spent.get(k, 0.0)) for k in SPENT}} for r in timed]
    total = {k: sum(r.spent.get(k, 0.0) for r in timed) for k in SPENT}
    rows.append({"stage": "total", "wall": fmt_duration(sum(r.seconds or 0.0 for r in timed)),
                 **{SPENT_COLUMNS[k]: shown(v) for k, v in total.items()}})
    render_table(con, ["stage", "wall"] + [SPENT_COLUMNS[k] for k in SPENT], rows, title="where the time went")
    print_wrapped(con, "start-up: the stage's imports and its fresh processes' start; campaign: reading and "
                       "checking the campaign; data: reading, tokenizing and encoding records; model: building it and "
                       "reading its weights or a saved state; work: the rest (the checks, updates and traces)")


RUN_COLUMNS = ("run_id", "kind", "name", "status", "verdict", "updates", "examples", "final", "overrides", "created_at",
               "supersedes")


def render_runs(con, runs) -> None:
    """Every run id whole (a prefix of it is what the other verbs take); ``runs`` as journal.runs.run_table_rows
    gives them (the shown status, the verdict, the final metric, the overrides)."""
    if not runs:
        con.print("no runs yet")
        return
    rows = [{"run_id": r["run_id"], "kind": r.get("kind"), "name": r.get("name"),
             "status": r.get("shown_status", r.get("status")), "verdict": r.get("verdict"),
             "updates": r.get("updates_done"), "examples": r.get("examples_seen"), "final": r.get("final"),
             "overrides": r.get("overrides"),
             "created_at": (r.get("created_at") or "").replace("T", " ")[:19], "supersedes": r.get("supersedes")}
            for r in runs]
    columns = [c for c in RUN_COLUMNS if c == "run_id" or any(row[c] not in (None, "") for row in rows)]
    render_table(con, columns, rows)


def render_run(con, data) -> None:
    run = data["run"]
    from rich.markup import escape

    verdict = (run.get("summary") or {}).get("verdict")
    con.print(f"[bold]run {escape(run['run_id'])}[/] ({escape(run['kind'])}, {escape(run['name'])}): "
              f"[bold]{escape(str(run.get('shown_status', run['status'])))}[/]"
              + (f" (verdict {escape(str(verdict))})" if verdict else ""), highlight=False)
    said = ("created_at", "ended_at", "updates_done", "examples_seen", "seed", "config_sha256", "git_rev",
            "supersedes", "sweep_id", "command", "final", "overrides")
    for k in said:
        if run.get(k) is not None:
            print_wrapped(con, f"{k}: {run[k]}", "  ")
    if run.get("trust_remote_code"):
        con.print("  trust_remote_code: ON (model code from the model folder ran)")
    summary = run.get("summary") or {}
    for k, v in summary.items():  # what the run's own row said above is not said twice
        if k not in ("arithmetic", "memory_bound", "timing", "counts", "verdict") and \
                not (k in said and run.get(k) is not None):
            print_wrapped(con, f"{k}: {_fmt(v)}", "  ")
    if summary.get("timing"):
        flat = {k: v for k, v in summary["timing"].items() if isinstance(v, (int, float))}
        flat.update({f"{k} blocks": v for k, v in (summary["timing"].get("blocks_s") or {}).items()})
        print_wrapped(con, "timing: " + ", ".join(f"{k.removesuffix('_s')} {fmt_duration(v)}" for k, v in flat.items()),
                      "  ")
    if summary.get("memory_bound"):
        from pilotrun.rehearsal.training.train import bound_lines  # lazy: pulls in numpy, which `validate` does without

        for line in bound_lines(summary["memory_bound"]):
            con.print(f"  {line}", style="yellow" if line.startswith("WARNING") else None, markup=False)
    loss = data.get("train_loss")
    if loss:
        print_wrapped(con, f"training loss ({loss['updates']} updates logged): first {_loss(loss['first'])}, "
                           f"last {_loss(loss['last'])}, lowest {_loss(loss['min'])} at update {loss['min_step']}"
                           + (f"; {loss['non_finite']} not finite" if loss.get("non_finite") else ""), "  ")
    elif data.get("train_updates"):
        print_wrapped(con, f"training loss: {data['train_updates']} updates logged", "  ")
    if data["validation"]:
        # SQLite keeps a NaN as NULL: a None value is a loss that was not a number
        pts = ", ".join(f"{m['step']}: {_loss(m['value'])}" for m in data["validation"] if m["name"] == "val_loss")
        print_wrapped(con, f"validation: {pts}", "  ")
    if data["phases"]:
        con.print(f"  phase rows: {len(data['phases'])}")
        for p in data["phases"]:
            peak = max((v for v in (p.get("peak_allocated"), p.get("peak_reserved")) if v is not None), default=None)
            both = p.get("counter") == "tensors+rss" and p.get("peak_allocated") is not None
            shown = (f"  peak tensors {fmt_bytes(p['peak_allocated'])}, host RSS {fmt_bytes(p.get('peak_reserved'))}"
                     if both
                     else f"  peak {fmt_bytes(peak)} ({p.get('counter')})" if peak is not None else "")
            print_wrapped(con, f"{p['phase']:19} rank {p['rank']} {p['verdict']:11} {fmt_duration(p['duration_s']):>8}"
                          + shown + (f"  — {p['note']}" if p.get("note") and p["verdict"] != "ok" else ""), "    ")
    for n in data["notes"]:
        print_wrapped(con, f"{'decision' if n['decision'] else 'note'} {n['id']}: {n['text']}", "  ")
    if data["files"]:
        print_wrapped(con, f"files ({len(data['files'])}): " + ", ".join(data["files"][:12]) +
                      (" …" if len(data["files"]) > 12 else ""), "  ")


def _loss(v) -> str:
    return "nan" if v is None else format(v, ".4f")


def train_loss_summary(points: list[dict]) -> dict | None:
    """First, last and lowest training loss of a run's logged points (a NULL value: not finite)."""
    if not points:
        return None
    finite = [m for m in points if m["value"] is not None]
    low = min(finite, key=lambda m: m["value"]) if finite else None
    return {"updates": len(points), "first": points[0]["value"], "last": points[-1]["value"],
            "min": low["value"] if low else None, "min_step": low["step"] if low else None,
            "non_finite": len(points) - len(finite)}
