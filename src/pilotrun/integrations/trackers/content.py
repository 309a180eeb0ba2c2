"""What a run, a sweep and a campaign are in any tracker, read from the journal alone.

A run: its resolved config flattened to dotted keys (``train.lr``) as params; its identity and outcome as tags
(the journal's status, the shown status, the verdict, the reason; a diverged arm or a failed check is a
failure, never a finished run); every metric at its update (``train/loss``, ``validation/val_loss``); its phase
ledger as a table and, per phase and rank, its peak memory and duration as metrics; its notes; its files. A
sweep: the frozen plan and the comparison of its arms. A campaign: its sheet, launch files, the HTML report and
the journal's notes and decisions.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import datetime
from pathlib import Path

from pilotrun.journal.runs import flat, shown_status
from pilotrun import jsonsafe

RUN_FILES = ("config.yaml", "revisions.json", "README.md")
"""The run folder's files a tracker gets (checkpoints and the artifact stay in the run folder: too large)."""
SHEET_SUFFIXES = (".md", ".commands.sh", ".sky.yaml", ".sbatch")
"""The sheet and its launch files, as `all` writes them beside HOME/sheet.md."""
LEDGER_COLUMNS = ("phase", "rank", "device", "counter", "inputs", "baseline", "peak_allocated", "peak_reserved",
                  "end_allocated", "end_reserved", "duration_s", "verdict", "note")
LEDGER_METRICS = ("peak_allocated", "peak_reserved", "duration_s")
FAILED = ("diverged", "failed", "check failed")


def param_value(v) -> str:
    """A param as trackers show it: JSON for lists and dicts, ``None`` for null (MLflow params are strings)."""
    if isinstance(v, (list, dict)):
        return json.dumps(v, sort_keys=True)
    return "None" if v is None else str(v)


def params(run: dict) -> dict[str, str]:
    return {k: param_value(v) for k, v in sorted(flat(run.get("config") or {}).items())}


def outcome(run: dict) -> dict:
    """The run's status (the journal's), the status the journal's tables show, its verdict and reason, and whether
    it is a failure (diverged, failed, a check that failed) or was stopped from outside (interrupted)."""
    shown = shown_status(run)
    summary = run.get("summary") or {}
    verdict = summary.get("verdict") or {"completed": "ok", "stopped": "ok", "diverged": "fail",
                                          "failed": "fail"}.get(run["status"])
    return {"status": run["status"], "shown_status": shown, "verdict": verdict, "reason": summary.get("reason"),
            "failed": shown in FAILED, "interrupted": run["status"] == "interrupted",
            "running": run["status"] in ("created", "running")}


def run_name(run: dict) -> str:
    if run.get("sweep_id") and run.get("arm"):
        return f"{run['arm']} seed {run['seed']}"
    return f"{run['kind']} {run['run_id']}"


def tags(run: dict, arm_label: str | None = None) -> dict[str, str]:
    """The run's identity and outcome, keyed ``pilotrun.*``: what a dashboard filters and groups by."""
    o = outcome(run)
    out = {"run_id": run["run_id"], "kind": run["kind"], "campaign": run["name"], "status": o["status"],
           "shown_status": o["shown_status"], "verdict": o["verdict"], "reason": o["reason"],
           "config_sha256": run.get("config_sha256"), "seed": run.get("seed"), "sweep_id": run.get("sweep_id"),
           "arm": run.get("arm"), "arm_overrides": arm_label, "supersedes": run.get("supersedes"),
           "command": run.get("command"), "git_rev": run.get("git_rev"), "created_at": run.get("created_at")}
    return {f"pilotrun.{k}": str(v) for k, v in out.items() if v is not None}


def epoch_s(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso).timestamp() if iso else None


def metric_key(split: str, name: str) -> str:
    return f"{split}/{name}"


def metric_points(journal, run: dict) -> list[dict]:
    """Every metric row of the run as ``{key, step, value, time}``: its update, its value (NaN where the journal
    holds a non-finite value as NULL), the wall time it was recorded (the run's start plus its ``wall_s``)."""
    start = epoch_s(run.get("started_at") or run.get("created_at")) or 0.0
    out = []
    for m in journal.metrics(run["run_id"]):
        value = float("nan") if m["value"] is None else float(m["value"])
        out.append({"key": metric_key(m["split"], m["name"]), "step": int(m["step"]), "value": value,
                    "time": start + float(m["wall_s"] or 0.0), "examples_seen": m["examples_seen"]})
    return out


def ledger(journal, run_id: str) -> tuple[list[str], list[list]]:
    """The run's phase ledger as (columns, rows); the inputs as JSON."""
    rows = journal.phase_rows(run_id)
    data = [[json.dumps(r.get("inputs") or {}, sort_keys=True) if c == "inputs" else r.get(c)
             for c in LEDGER_COLUMNS] for r in rows]
    return list(LEDGER_COLUMNS), data


def ledger_points(journal, run: dict) -> list[dict]:
    """Per phase: its peak allocated and reserved bytes and its duration, as metrics at step = rank
    (``ledger/steady_step/peak_allocated``)."""
    end = epoch_s(run.get("ended_at") or run.get("started_at")) or 0.0
    out = []
    for r in journal.phase_rows(run["run_id"]):
        for field in LEDGER_METRICS:
            v = r.get(field)
            if v is not None and math.isfinite(float(v)):
                out.append({"key": f"ledger/{r['phase']}/{field}", "step": int(r.get("rank") or 0),
                            "value": float(v), "time": end})
    return out


def notes_text(notes: list[dict], extra: list[str] = ()) -> str:
    """Notes and decisions as Markdown (MLflow shows a run's ``mlflow.note.content`` as its description)."""
    lines = list(extra)
    for n in notes:
        lines.append(f"- {'**decision**' if n['decision'] else 'note'} ({n['created_at']}): {n['text']}")
    return "\n".join(lines)


def run_description(journal, run: dict) -> str:
    o = outcome(run)
    head = [f"pilotrun {run['kind']} run `{run['run_id']}` of campaign `{run['name']}`: **{o['shown_status']}**"
            + (f" — {o['reason']}" if o["reason"] else ""), "", f"Repeat it: `{run.get('command')}`", ""]
    return notes_text(journal.notes(run["run_id"]), head)


def run_files(journal, run_id: str) -> list[Path]:
    folder = journal.run_dir(run_id)
    return [folder / f for f in RUN_FILES if (folder / f).is_file()]


def digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def run_digest(journal, run: dict) -> str:
    """What a complete export of the run holds: its final status and notes (a note added later is sent again)."""
    return digest(run["status"], [(n["id"], n["text"], n["decision"]) for n in journal.notes(run["run_id"])])


def finished(run: dict) -> bool:
    return run["status"] not in ("created", "running")


def sweep_content(journal, sweep_id: str) -> dict:
    """The sweep's plan, its arms' labels and its comparison (``rehearsal/training/sweep.sweep_comparison``)."""
    from pilotrun.rehearsal.training.sweep import DONE, sweep_comparison

    data = sweep_comparison(journal, sweep_id)
    plan = data["plan"]
    statuses = [r["status"] for r in data["runs"]]
    expected = len(plan["seeds"]) * len(plan["arms"])
    done = sum(s in DONE for s in statuses)
    running = any(s in ("created", "running") for s in statuses)
    state = "running" if running else "failed" if done < expected else "finished"
    sweep_params = {"metric": plan["metric"], "goal": plan["goal"], "seeds": param_value(plan["seeds"]),
                    "budget.updates": param_value(plan["budget"]["updates"]),
                    "budget.epochs": param_value(plan["budget"]["epochs"]),
                    "effective_batch": str(plan["effective_batch"]["examples_per_update"]),
                    "eval_every": str(plan["eval_every"]), "plan_sha256": data["plan_sha256"],
                    **{f"arm.{a['name']}": a["label"] for a in plan["arms"]}}
    columns = ["arm", "overrides", "seeds", "at_budget", "vs_control", "verdict", "why"]
    rows = [[param_value(r.get(c)) if isinstance(r.get(c), (list, dict)) else r.get(c) for c in columns]
            for r in data["rows"]]
    sweep_tags = {"pilotrun.sweep_id": sweep_id, "pilotrun.kind": "sweep-plan", "pilotrun.campaign": plan["campaign"],
                  "pilotrun.status": state, "pilotrun.diverged": str(statuses.count("diverged")),
                  "pilotrun.runs": f"{done} of {expected} finished"}
    return {"sweep_id": sweep_id, "plan": plan, "labels": data["labels"], "state": state, "params": sweep_params,
            "tags": sweep_tags, "comparison": (columns, rows), "runs": data["runs"],
            "superseded": data["superseded"], "name": f"sweep {sweep_id}", "campaign": plan["campaign"],
            "digest": digest(state, statuses, [s["run_id"] for s in data["superseded"]])}


def sheet_files(home: Path) -> list[Path]:
    """The sheet `all` writes (HOME/sheet.md) and its launch files, where they are."""
    return [home / f"sheet{s}" for s in SHEET_SUFFIXES if (home / f"sheet{s}").is_file()]


def campaign_digest(journal, name: str) -> str:
    files = sheet_files(journal.home)
    runs = journal.list_runs(name=name)
    return digest([(r["run_id"], r["status"]) for r in runs], [n["id"] for n in journal.notes()],
                  [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files])


def sweeps_of(journal, name: str) -> list[str]:
    """The ids of campaign ``name``'s sweeps, in the journal's order."""
    with journal.connect() as db:
        rows = db.execute(f"SELECT sweep_id, plan_json FROM sweeps ORDER BY {journal.order}").fetchall()
    return [r["sweep_id"] for r in rows if jsonsafe.loads(r["plan_json"]).get("campaign") == name]


def campaigns(journal) -> list[str]:
    """Every campaign name of the journal's runs, in the order of their first run."""
    names: list[str] = []
    for r in journal.list_runs():
        if r["name"] not in names:
            names.append(r["name"])
    return names
