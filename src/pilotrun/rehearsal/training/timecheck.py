"""The time plan checked against the clock: the sheet's prediction for each sweep run, from the pilot's
measured seconds (per update, per evaluation batch, per save, per load), against the run's wall time.

The prediction is made on the pilot's own machine (``sheet["time"]["here"]``: nothing scaled, batch
shapes from sheet/shape.py) and for the work each run did: its updates, validations and checkpoints
as logged, plus what a sweep run adds (one pass of validation predictions; no export unless it
exported). So a run stopped early by a rule is compared for the work it did, and the total is the
sum over runs. A sweep run started with ``sweep --continue`` in a new process is counted as warm:
its cold start is not predicted.
"""

from __future__ import annotations

from pilotrun.journal.runs import find_pilot
from pilotrun.sheet import plan as P
from pilotrun.sheet.build import build_sheet


def run_prediction(units: dict, counts: dict, n_val_batches: int, validation_predictions: bool, *,
                   first: bool = True, prepare_s: float | None = None, startup_s: float | None = None,
                   control_passes: float = 0.0, reference_batches: int = 0, final_ref: bool = False) -> list[dict]:
    """The predicted terms of one run that did ``counts`` (updates, evals, checkpoints, exports).

    The runs of a sweep share one process: the first pays the process's start-up (``startup_s``, the pilot's
    own, given when the run recorded one), reads and encodes the data (the pilot's ``prepare_s``) and builds
    the model cold (its ``load``); later ones reuse the encoded data and build warm: the pilot's second build
    of a model made from a config (``warm_load``), else its ``reload`` (the artifact read from disk in a warm
    process), which a pretrained model's warm load is; and they hand memory back in a process that built models,
    which walks more objects (``warm_run_overhead``: the pilot's release after its phases). Every run, warm or not,
    precomputes a preference reference over its pairs (``reference_batches``) before its first update: its model
    starts anew. ``final_ref``: the run wrote checkpoints/final as a reference to its last checkpoint, whose files
    it checked first."""
    c = {"updates": counts["updates"], "evals": counts["evals"], "eval_batches": n_val_batches,
         "checkpoints": counts["checkpoints"], "exports": counts.get("exports", 0), "reloads": 0,
         "control_passes": control_passes, "reference_batches": reference_batches, "final_refs": int(final_ref),
         "exact_updates": counts.get("exact_updates", 0)}
    warm = dict(units) if first else dict(units, load=units.get("warm_load", units["reload"]),
                                          **({"run_overhead": units["warm_run_overhead"]}
                                             if "warm_run_overhead" in units else {}))
    terms = [t for t in P.run_terms(c, warm) if t["count"]]
    for i, t in enumerate(terms):
        if t["unit"] == "load":
            terms[i] = dict(t, unit="load_cold", term="load (cold: the pilot's load)") if first else \
                dict(t, term="load (warm: the pilot's second build)" if "warm_load" in units
                     else "load (warm: the pilot's reload)")
    if first and prepare_s:
        terms.insert(0, {"term": "read and encode the data", "unit": "prepare", "each_s": prepare_s, "count": 1,
                         "count_text": "1", "seconds": prepare_s})
    if first and startup_s:
        terms.insert(0, {"term": "start-up (process start, imports, the command's checks)", "unit": "startup",
                         "each_s": startup_s, "count": 1, "count_text": "1", "seconds": startup_s})
    if validation_predictions and n_val_batches:
        terms.append({"term": "validation predictions", "unit": "eval_batch", "each_s": units["eval_batch"],
                      "count": n_val_batches, "count_text": f"{n_val_batches} batches",
                      "seconds": units["eval_batch"] * n_val_batches})
    return terms


def actual_seconds(timing: dict) -> float:
    """A run's wall time as the plan counts it: from the process's start for the first run of a pilotrun
    process (its start-up recorded), else from reading its data; to its last record."""
    return float(timing["total_s"]) + float(timing.get("startup_s") or 0.0)


def sweep_time_check(journal, sweep_id: str) -> dict | None:
    """Predicted against actual seconds for every finished run of the sweep, and in total.

    None when the sweep's campaign has no pilot with a time plan in the journal."""
    runs = [r for r in journal.list_runs(sweep_id=sweep_id) if (r.get("summary") or {}).get("timing")]
    if not runs:
        return None
    pilot, stale = find_pilot(journal, runs[0]["name"], runs[0]["config_sha256"], runs[0]["config"])
    if pilot is None:
        return {"pilot_run": None, "runs": [], "why": f"no pilot of campaign {runs[0]['name']!r} in the journal"}
    sheet = build_sheet(runs[0]["config"], journal, pilot, predict=False)
    if not sheet.get("time"):
        return {"pilot_run": pilot["run_id"], "runs": [], "why": "; ".join(sheet["problems"]) or "no time plan"}
    here, counts = sheet["time"]["here"], sheet["time"]["counts"]
    out = []
    prepare_s, pilot_startup = sheet["time"].get("prepare_s"), sheet["time"].get("startup_s")
    for i, r in enumerate(runs):
        s = r["summary"]
        started = s["timing"].get("startup_s") is not None  # this run paid its process's start-up
        terms = run_prediction(here["units"], dict(s["counts"], **exact_blocks(journal, r["run_id"])),
                               counts["eval_batches"], r["kind"] == "sweep",
                               first=i == 0, prepare_s=prepare_s, startup_s=pilot_startup if started else None,
                               control_passes=counts.get("control_passes", 0.0),
                               reference_batches=counts.get("reference_batches", 0),
                               final_ref=s["timing"].get("final_ref_s") is not None)
        predicted = sum(t["seconds"] for t in terms)
        actual = actual_seconds(s["timing"])
        out.append({"run_id": r["run_id"], "arm": r["arm"], "seed": r["seed"], "status": r["status"],
                    "updates": s["counts"]["updates"], "predicted_s": predicted, "actual_s": actual,
                    "ratio": predicted / actual if actual else None, "terms": terms,
                    "measured": {k: s["timing"].get(k) for k in ("load_s", "loop_s", "final_save_s", "export_s")},
                    "breakdown": breakdown(terms, s["timing"])})
    pt, at = sum(r["predicted_s"] for r in out), sum(r["actual_s"] for r in out)
    return {"pilot_run": pilot["run_id"], "stale": stale, "runs": out, "predicted_s": pt, "actual_s": at,
            "ratio": pt / at if at else None, "per_run_plan_s": here["per_run_s"],
            "units": here["units"], "goal": (0.9, 1.1), "breakdown": _summed([r["breakdown"] for r in out])}


def exact_blocks(journal, run_id: str) -> dict:
    """The updates the run's watch applied the exact counter to (its observed train row's ``probed``)."""
    probed = {r["phase"]: r["inputs"].get("probed") or 0 for r in journal.phase_rows(run_id)}
    return {"exact_updates": probed.get("observed_train", 0)}


# The plan's terms against what the run timed itself (rehearsal/training/train.py ``timing``; "blocks_s" from the watch
# around every update, validation, save and export): (group, plan units, the run's measured keys). The first
# run's start-up, data and cold load are one group: where an import happens (the pilot's load, the sweep's
# checks) moves time between them, not in or out of the plan. The units of a phase kind are the plan's
# (``plan.KIND_UNITS``), so a train or eval phase added to the registry lands in its group; a validation batch is
# counted apart from the control and validation predictions, which are timed in eval batches too.
GROUPS = (("start-up, data and cold load (1st run)",
           ("startup", "prepare", "load_cold"), ("startup_s", "prepare_s", "load_s:cold")),
          ("run start (memory freed, journal entry)", ("run_overhead",), ("run_overhead_s",)),
          ("load the model (warm)", P.KIND_UNITS["load"], ("load_s:warm",)),
          ("updates (the first's optimizer state)", P.KIND_UNITS["train"] + ("exact_update",), ("blocks_s.train",)),
          ("validations", tuple(f"{u}:validations" for u in P.KIND_UNITS["eval"]), ("blocks_s.evaluation",)),
          (P.REFERENCE_TERM, tuple(f"{u}:{P.REFERENCE_TERM}" for u in P.KIND_UNITS["eval"]), ("reference_s",)),
          ("checkpoints", P.KIND_UNITS["save"] + ("final_ref",), ("blocks_s.save", "final_ref_s")),
          ("export", P.KIND_UNITS["export"], ("blocks_s.export",)),
          ("control predictions", ("control", "eval_batch:control predictions"), ("control_s",)),
          ("validation predictions", ("eval_batch:validation predictions",), ("predictions_s",)))
OTHER = "not planned (records, between blocks)"  # per-update journal and metrics, batches drawn


def _measured(timing: dict, key: str, cold: bool) -> float | None:
    if key.startswith("load_s:"):  # the load is the start-up group's in a run that read the data, else warm
        return float(timing.get("load_s") or 0.0) if (key == "load_s:cold") == cold else 0.0
    if key.startswith("blocks_s."):
        blocks = timing.get("blocks_s")
        return None if blocks is None else float(blocks.get(key.split(".", 1)[1], 0.0))
    v = timing.get(key)
    return None if v is None else float(v)


def breakdown(terms: list[dict], timing: dict) -> list[dict]:
    """One row per group of the plan's terms: predicted and measured seconds, and the rest of the run's wall
    time that no term covers. Measured is None for a run recorded before the watch timed its blocks."""
    rows, covered = [], 0.0
    cold = any(t["unit"] == "load_cold" for t in terms)
    for group, units, keys in GROUPS:
        pred = sum(t["seconds"] for t in terms if t["unit"] in units or f"{t['unit']}:{t['term']}" in units)
        vals = [_measured(timing, k, cold) for k in keys]
        if units[0] in ("startup", "run_overhead"):  # older runs lack these keys: 0 then
            vals = [0.0 if v is None else v for v in vals]
        vals = [0.0 if v is None and k == "final_ref_s" else v for v, k in zip(vals, keys)]  # none written
        meas = None if any(v is None for v in vals) else sum(vals)
        covered += meas or 0.0
        if pred or meas:
            rows.append({"term": group, "predicted_s": pred, "actual_s": meas})
    total = timing.get("total_s")
    if total is not None and timing.get("blocks_s") is not None:
        rows.append({"term": OTHER, "predicted_s": 0.0, "actual_s": max(0.0, actual_seconds(timing) - covered)})
    return rows


def _summed(per_run: list[list[dict]]) -> list[dict]:
    out: dict[str, dict] = {}
    for rows in per_run:
        for r in rows:
            o = out.setdefault(r["term"], {"term": r["term"], "predicted_s": 0.0, "actual_s": 0.0})
            o["predicted_s"] += r["predicted_s"]
            o["actual_s"] = None if o["actual_s"] is None or r["actual_s"] is None else o["actual_s"] + r["actual_s"]
    return list(out.values())


def breakdown_lines(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    width = max(len(r["term"]) for r in rows)
    lines = ["  term by term (all runs): predicted / actual seconds"]
    for r in rows:
        act = "—" if r["actual_s"] is None else f"{r['actual_s']:.1f}s"
        ratio = (f"  ({r['predicted_s'] / r['actual_s']:.2f})" if r["actual_s"] and r["predicted_s"] else "")
        lines.append(f"    {r['term']:<{width}}  {r['predicted_s']:7.1f}s / {act:>7}{ratio}")
    return lines


def time_plan_warning(check: dict | None) -> str | None:
    """The warning when the sweep's own time-plan check is out of its range (predicted ÷ actual outside
    the goal): the sweep is then WARN, not OK."""
    if not check or not check.get("runs") or check.get("ratio") is None:
        return None
    lo, hi = check["goal"]
    if lo <= check["ratio"] <= hi:
        return None
    head = f"WARNING time plan out of range: predicted ÷ actual {check['ratio']:.2f} is outside {lo}–{hi}; "
    term = dominant_term(check.get("breakdown") or [])
    if term is not None:  # one term holds the gap: that term's figure is off, a rerun would change nothing
        act = "not timed" if term["actual_s"] is None else f"{term['actual_s']:.1f}s"
        return (head + f"most of the gap is one term, {term['term']} (predicted {term['predicted_s']:.1f}s, actual "
                f"{act}): the plan's figure for it is off, not the machine's speed; the rest agrees within "
                f"{lo}–{hi}")
    return head + "the sheet's rental hours are off by as much (rerun `pilotrun pilot` on an idle machine)"


def dominant_term(rows: list[dict], share: float = 0.6) -> dict | None:
    """The breakdown row holding at least ``share`` of the gap between predicted and actual seconds, when
    the other rows together agree (their own predicted ÷ actual within 0.9–1.1); None when the gap is
    spread over the terms, which is what a busy or noisy machine does."""
    rows = [r for r in rows if r.get("actual_s") is not None or r.get("predicted_s")]
    gaps = [abs((r.get("predicted_s") or 0.0) - (r.get("actual_s") or 0.0)) for r in rows]
    total = sum(gaps)
    if not rows or total <= 0:
        return None
    top = max(range(len(rows)), key=gaps.__getitem__)
    if gaps[top] < share * total:
        return None
    rest = [r for i, r in enumerate(rows) if i != top]
    pred = sum(r.get("predicted_s") or 0.0 for r in rest)
    act = sum(r.get("actual_s") or 0.0 for r in rest)
    if act > 0 and not 0.9 <= pred / act <= 1.1:
        return None
    return rows[top]


def time_lines(check: dict | None) -> list[str]:
    if not check:
        return []
    if not check.get("runs"):
        return [f"time plan: not compared — {check.get('why')}"]
    lo, hi = check["goal"]
    ok = lo <= check["ratio"] <= hi
    lines = [f"time plan (pilot {check['pilot_run']}, this machine): predicted {P.fmt_duration(check['predicted_s'])}"
             f" for {len(check['runs'])} run(s), actual {P.fmt_duration(check['actual_s'])}: predicted ÷ actual "
             f"{check['ratio']:.2f} ({'within' if ok else 'OUTSIDE'} {lo}–{hi})"]
    for r in check["runs"]:
        lines.append(f"  {r['run_id']}  {r['arm'] or '':<10} seed {r['seed']}: predicted {r['predicted_s']:.1f}s, "
                     f"actual {r['actual_s']:.1f}s ({r['ratio']:.2f}; {r['updates']} updates, {r['status']})")
    lines += breakdown_lines(check.get("breakdown") or [])
    if check.get("stale"):
        lines.append(check["stale"])
    return lines
