"""sweep: the control and each variant of ``plan``, for every seed, each its own run through the one loop.

Before the first run the resolved plan (budget, effective batch, eval_every, stop rules, metric,
arms, seeds, config sha256) is frozen in the journal with its sha256: a changed campaign file is a
new sweep, never a silent edit of the old one. A variant is applied on top of the control and may
only change what it compares: one that moves the effective batch, the budget, the validation
frequency, the validation examples or their encoding, the stop rules or the seed is refused before
anything runs (``campaign/arms.py``; ``validate`` runs the same checks).

``--continue SWEEP_ID`` skips finished runs (completed, diverged, stopped) and reruns the others
(failed, interrupted) as new runs naming the run they supersede; the superseded run stays.
``--id SWEEP_ID`` starts the sweep under that id, or continues it when the journal has it already: the
launch files fix it, so a requeued or recovered job runs the same command and picks the plan up.
"""

from __future__ import annotations

import math
from typing import Callable

from pilotrun.campaign.arms import Arm, effective_batch, plan_arms  # noqa: F401  (plan_arms: validate shares it)
from pilotrun.errors import BadInput
from pilotrun.journal.store import Journal, lease_s, wall_time
from pilotrun.provenance import config_sha256
from pilotrun.rehearsal.training import compare as cmp
from pilotrun.campaign.sweep_runs import arm_command, check_sweep_id, encoded_for, launch_sweep_id  # noqa: F401
from pilotrun.verdicts import StageResult, plural
from pilotrun.campaign.consistency import check_campaign
from pilotrun.engine.distributed import (broadcast_from_rank0, check_strategy, init_from_launcher, under_launcher,
    world_rank)
from pilotrun.journal.runs import find_pilot, still_alive
from pilotrun.rehearsal.training.sweep_ray import require_ray, run_remote
from pilotrun.rehearsal.training.timecheck import sweep_time_check, time_lines, time_plan_warning
from pilotrun.rehearsal.training.train import train_run
from pilotrun.sheet.build import build_sheet

DONE = ("completed", "diverged", "stopped")


def frozen_plan(loaded, arms: list[Arm]) -> dict:
    c, t = loaded.c, arms[0].loaded.c.train
    mb, acc, ranks = effective_batch(t)
    return {"campaign": c.name, "campaign_path": str(loaded.source) if loaded.source else None,
            "config_sha256": loaded.config_sha256(), "metric": c.plan.metric, "goal": c.plan.goal,
            "budget": {"updates": t.updates, "epochs": t.epochs},
            "effective_batch": {"micro_batch": mb, "accumulation": acc, "ranks": ranks,
                                "examples_per_update": mb * acc * ranks},
            "eval_every": t.eval_every, "stop": t.stop.model_dump(mode="json"), "seeds": list(c.plan.seeds),
            "arms": [{"name": a.name, "overrides": a.overrides, "label": a.label,
                      "config_sha256": a.loaded.config_sha256()} for a in arms]}


def _differences(old: dict, new: dict) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def sweep(loaded, home, *, continue_id: str | None = None, progress: bool = True,
          on_run: Callable[[dict], None] | None = None, sets: tuple[str, ...] = (),
          on_start: Callable[[dict], None] | None = None, ray_address: str | None = None,
          fixed_id: str | None = None) -> StageResult:
    """Run (or continue) the sweep of ``loaded``'s plan; returns the comparison as the stage's table.
    ``sets``: the command line's ``--set`` items ``loaded`` was loaded with (for each run's own command).
    ``on_start`` sees each run before it starts: index, of, arm, label, seed and ``eta_s`` (the time left
    for this run and the ones after it: the pilot's time plan per run, then the runs' own mean).
    ``ray_address``: run on that Ray cluster ("auto": the one this machine is attached to), one journal here.
    ``fixed_id``: start the sweep under this id, or continue it if the journal has it (start-or-continue)."""
    if ray_address is not None:
        require_ray()  # before anything is frozen: without Ray the plan would sit in the journal, never run

    arms = plan_arms(loaded)
    for arm in arms:  # ranks this machine cannot run are bad input before the plan is frozen
        check_strategy(arm.loaded.c.train)
    check_campaign(arms[0].loaded)  # what validate refuses fails here, before anything is frozen
    plan = frozen_plan(loaded, arms)
    sha = config_sha256(plan)
    journal = Journal(home)
    sweep_id, todo, taken, follower = _started(journal, loaded, arms, plan, sha, continue_id, fixed_id)
    if follower:  # one rank of several under torchrun: it joins each run rank 0 starts
        for arm, seed, supersedes in todo:
            run_loaded = arm.loaded.with_overrides({"seed": seed})
            train_run(run_loaded, home, kind="sweep", sweep_id=sweep_id, arm=arm.name, supersedes=supersedes,
                      progress=False, save_artifact=False, validation_predictions=True,
                      **encoded_for(run_loaded, {}))
        return StageResult("sweep", "ok", f"joined sweep {sweep_id}: {len(todo)} run(s)",
                           data={"sweep_id": sweep_id, "follower": True})
    try:
        _run_todo(todo, journal=journal, home=home, loaded=loaded, sweep_id=sweep_id, plan=plan, sets=sets,
                  total=len(plan["seeds"]) * len(arms), progress=progress, on_run=on_run, on_start=on_start,
                  ray_address=ray_address)
    finally:
        journal.release_claims(sweep_id)
    return sweep_result(journal, sweep_id, ran=len(todo), taken=taken)


def _run_todo(todo, *, journal, home, loaded, sweep_id, plan, sets, total, progress, on_run, on_start,
              ray_address) -> None:
    if ray_address is not None:
        run_remote(todo, journal=journal, sweep_id=sweep_id, plan=plan, sets=sets, address=ray_address,
                   progress=progress, on_run=on_run, total=total)
        return
    encoded: dict[str, object] = {}  # the data is read and encoded once per distinct task/model/data setting
    planned = _planned_run_s(journal, loaded) if on_start is not None else None
    took: list[float] = []
    for i, (arm, seed, supersedes) in enumerate(todo):
        import time

        each = sum(took) / len(took) if took else planned
        if on_start is not None:
            on_start({"index": i + 1, "of": len(todo), "total": total, "arm": arm.name, "label": arm.label,
                      "seed": seed, "eta_s": each * (len(todo) - i) if each else None})
        t0 = time.monotonic()
        run_loaded = arm.loaded.with_overrides({"seed": seed})
        r = train_run(run_loaded, home, kind="sweep", sweep_id=sweep_id, arm=arm.name, supersedes=supersedes,
                      progress=progress, save_artifact=False, validation_predictions=True,
                      command=arm_command(plan["campaign_path"], arm, seed, sets), **encoded_for(run_loaded, encoded))
        took.append(time.monotonic() - t0)
        journal.release_claims(sweep_id, (arm.name, seed))  # the cell's run has its final status
        if on_run is not None:
            on_run({"index": i + 1, "of": len(todo), "total": total, "arm": arm.name, "label": arm.label,
                    "seed": seed, "run_id": r.data["run_id"], "status": r.data["status"],
                    "reason": r.data["reason"], "supersedes": supersedes})


def _create_or_continue(journal: Journal, loaded, arms: list[Arm], plan: dict, sha: str, continue_id: str | None,
                        fixed_id: str | None) -> tuple[str, list, list]:
    """A new sweep, the one ``--continue`` names, or (``--id``) the one of that id, created if new; the
    runs this process claimed, and those other processes hold."""
    if fixed_id is not None:
        if continue_id is not None:
            raise BadInput("--id and --continue together", where="--id",
                           fix="pass one: --id ID starts the sweep under ID or continues it if it exists")
        check_sweep_id(fixed_id)
        continue_id = journal.create_sweep(plan, sha, plan["campaign_path"], sweep_id=fixed_id)
    again = ("`pilotrun sheet CAMPAIGN --out ...` writes launch files with a new --id for it" if fixed_id else
             "run `pilotrun sweep CAMPAIGN` without --continue")
    if continue_id is None:
        sweep_id = journal.create_sweep(plan, sha, plan["campaign_path"])
    else:
        continue_id = journal.resolve_sweep_id(continue_id, where="--continue")
        frozen = journal.get_sweep(continue_id)
        if frozen["plan_sha256"] != sha:
            changed = ", ".join(_differences(frozen["plan"], plan))
            raise BadInput(f"the campaign changed since sweep {continue_id} was frozen (differs in: {changed})",
                           where=str(loaded.source or "campaign"),
                           fix=f"a changed campaign is a new sweep: {again}, or restore the campaign file")
        sweep_id = continue_id
    todo, taken = claim_todo(journal, sweep_id, arms, plan["seeds"])
    return sweep_id, todo, taken


def _started(journal: Journal, loaded, arms: list[Arm], plan: dict, sha: str, continue_id: str | None,
             fixed_id: str | None) -> tuple[str, list, list, bool]:
    """The sweep's id, the runs this process claimed, those others hold, and whether this process is a
    follower rank. Under torchrun (a sweep over several processes or nodes, each run on all of them) rank 0
    alone creates or continues the sweep and claims its runs, and hands its list to the others, who raise
    its bad input as their own."""
    joined = under_launcher()
    if joined:
        init_from_launcher()
    rank = world_rank()[1] if joined else 0
    shared, error = None, None
    if rank == 0:
        try:
            sweep_id, todo, taken = _create_or_continue(journal, loaded, arms, plan, sha, continue_id, fixed_id)
            shared = ("ok", sweep_id, [(a.name, seed, sup) for a, seed, sup in todo], taken)
        except Exception as e:  # noqa: BLE001 - told to the followers (which would wait forever), then raised
            if not joined:
                raise
            error = e
            shared = (("bad", e.detail, e.where, e.fix) if isinstance(e, BadInput)
                      else ("error", f"{type(e).__name__}: {e}"))
    if joined:
        shared = broadcast_from_rank0(shared)
    if error is not None:
        raise error
    if shared[0] == "bad":
        raise BadInput(shared[1], where=shared[2], fix=shared[3])
    if shared[0] == "error":
        raise RuntimeError(f"rank 0 could not start the sweep: {shared[1]}")
    by_name = {a.name: a for a in arms}
    return shared[1], [(by_name[n], seed, sup) for n, seed, sup in shared[2]], shared[3], rank != 0


def _planned_run_s(journal: Journal, loaded) -> float | None:
    """Seconds per run of this campaign (its budget, as ``--set`` left it) by the pilot's measured units: the
    campaign's latest pilot on this machine, if there is one, as the time check at the sweep's end does."""
    try:
        pilot, _ = find_pilot(journal, loaded.campaign.name, loaded.config_sha256(),
                               loaded.resolved_dict())
        if pilot is None:
            return None
        # the time plan only: the estimator's traces (GPU memory, largest sizes) took ~10 s of every sweep's
        # start-up for a progress line's ETA, seconds no term of the plan holds
        sheet = build_sheet(loaded.resolved_dict(), journal, pilot, predict=False)
        return (sheet.get("time") or {}).get("here", {}).get("per_run_s")
    except Exception:  # noqa: BLE001 - an estimate for a progress line must never stop the sweep
        return None


def _cells(runs: list[dict], arms: list[Arm], seeds: list[int]) -> list[tuple[Arm, int, str | None, dict | None]]:
    """The cells that need work, from the sweep's runs (journal order): (arm, seed, the run to supersede, the
    cell's run still 'running' if it is)."""
    latest = _latest_of(runs)
    out = []
    for seed in seeds:  # seed-major: an interrupted sweep already holds complete pairs
        for arm in arms:
            run = latest.get((arm.name, seed))
            if run is None:
                out.append((arm, seed, None, None))
            elif run["status"] == "running":
                out.append((arm, seed, None, run))
            elif run["status"] not in DONE:
                out.append((arm, seed, run["run_id"], None))
    return out


def _still_running(run: dict, sweep_id: str) -> BadInput:
    return BadInput(f"run {run['run_id']} of sweep {sweep_id} is still running: {still_alive(run)}",
                    where="--continue", fix=f"wait for it to end, or stop it (SIGTERM ends it 'interrupted'), then "
                    f"continue the sweep; a process that is gone is reaped when its lease lapses, {lease_s():g}s "
                    "after its last heartbeat")


def _todo(journal: Journal, sweep_id: str, arms: list[Arm], seeds: list[int]) -> list[tuple[Arm, int, str | None]]:
    todo = []
    for arm, seed, supersedes, running in _cells(journal.list_runs(sweep_id=sweep_id), arms, seeds):
        if running is not None:
            raise _still_running(running, sweep_id)
        todo.append((arm, seed, supersedes))
    return todo


def claim_todo(journal: Journal, sweep_id: str, arms: list[Arm], seeds: list[int]) -> tuple[list, list[dict]]:
    """The cells this process runs, claimed in one journal transaction before any work (two `--continue` at
    once never train the same cell), and the claims of other live processes on the rest. A cell whose run is
    still running and that nobody claims (a run started without claims) is bad input, as before."""
    mine, taken = journal.claim_cells(sweep_id, lambda runs: [(a.name, s, a, sup, running) for a, s, sup, running
                                                             in _cells(runs, arms, seeds)])
    running = [c[4] for c in mine if c[4] is not None]
    if running:
        journal.release_claims(sweep_id)
        raise _still_running(running[0], sweep_id)
    return [(c[2], c[1], c[3]) for c in mine], taken


def taken_lines(taken: list[dict]) -> list[str]:
    """What a sweep says about cells another process took."""
    return [f"  {c['arm']:<10} seed {c['seed']}: taken by another sweep process (pid {c['pid']} on host {c['host']}, "
            f"claimed {c['claimed_at']}, heartbeat {wall_time() - c['heartbeat_at']:.0f}s ago): not run here"
            for c in taken]


def _latest_runs(journal: Journal, sweep_id: str) -> dict[tuple[str, int], dict]:
    return _latest_of(journal.list_runs(sweep_id=sweep_id))  # in the journal's sequence


def _latest_of(runs: list[dict]) -> dict[tuple[str, int], dict]:
    """Per (arm, seed) the run that counts: the end of the cell's supersedes chain (a run no other run of the
    cell supersedes), the last in the journal's sequence if there are several — never by a clock."""
    out: dict[tuple[str, int], dict] = {}
    superseded = {r["supersedes"] for r in runs if r["supersedes"]}
    for run in runs:
        if run["run_id"] not in superseded:
            out[(run["arm"], run["seed"])] = run
    return out


def run_points(journal: Journal, run: dict, metric: str, goal: str) -> dict:
    """The run's numbers for the comparison: the metric at its last validation and its best so far; none where its
    validations did not log the metric (never another metric in its place: the goal's direction is the metric's)."""
    vals = journal.metrics(run["run_id"], "validation", metric)
    finite = [m["value"] for m in vals if m["value"] is not None and math.isfinite(m["value"])]
    best = (min(finite) if goal == "minimize" else max(finite)) if finite else None
    return {"run_id": run["run_id"], "arm": run["arm"], "seed": run["seed"], "status": run["status"],
            "at_budget": vals[-1]["value"] if vals else None, "best": best,
            "last_validation_update": vals[-1]["step"] if vals else None, "updates": run["updates_done"],
            "reason": (run.get("summary") or {}).get("reason")}


def sweep_comparison(journal: Journal, sweep_id: str) -> dict:
    """Everything a table or a plot of the sweep needs, read from the journal."""
    frozen = journal.get_sweep(sweep_id)
    if frozen is None:
        raise BadInput(f"sweep {sweep_id} is not in {journal.path}", where="SWEEP_ID", fix="see `pilotrun runs`")
    plan = frozen["plan"]
    arm_names = [a["name"] for a in plan["arms"]]
    labels = {a["name"]: a["label"] for a in plan["arms"]}
    latest = _latest_runs(journal, sweep_id)
    points = [run_points(journal, r, plan["metric"], plan["goal"]) for r in latest.values()]
    comparison = cmp.compare(points, arm_names, goal=plan["goal"])
    effective = {p["run_id"] for p in points}
    superseded = [r for r in journal.list_runs(sweep_id=sweep_id) if r["run_id"] not in effective]
    return {"sweep_id": sweep_id, "plan": plan, "plan_sha256": frozen["plan_sha256"], "labels": labels,
            "runs": points, "comparison": comparison, "rows": cmp.table_rows(comparison, labels),
            "superseded": [{"run_id": r["run_id"], "arm": r["arm"], "seed": r["seed"], "status": r["status"]}
                           for r in superseded]}


def sweep_result(journal: Journal, sweep_id: str, ran: int, taken: list[dict] = ()) -> StageResult:
    data = sweep_comparison(journal, sweep_id)
    plan, runs = data["plan"], data["runs"]
    expected = len(plan["seeds"]) * len(plan["arms"])
    statuses = [r["status"] for r in runs]
    eb = plan["effective_batch"]
    msgs = [f"sweep {sweep_id}: plan sha256 {data['plan_sha256'][:16]}…; {len(plan['arms'])} arms × "
            f"{len(plan['seeds'])} seeds (seeds {plan['seeds']}); {ran} run(s) now",
            f"fixed for every arm: budget updates={plan['budget']['updates']} epochs={plan['budget']['epochs']}, "
            f"effective batch {eb['micro_batch']} × {eb['accumulation']} × {eb['ranks']} = "
            f"{eb['examples_per_update']}, eval_every {plan['eval_every']}, stop {plan['stop']}, "
            f"metric {plan['metric']} ({plan['goal']})"]
    for r in sorted(runs, key=lambda r: (r["seed"], r["arm"])):
        msgs.append(f"  {r['run_id']}  {r['arm']:<10} seed {r['seed']}: {r['status']}"
                    + (f" — {r['reason']}" if r["status"] != "completed" and r["reason"] else ""))
    for s in data["superseded"]:
        msgs.append(f"  {s['run_id']}  {s['arm']:<10} seed {s['seed']}: {s['status']} (superseded, kept)")
    for row in data["rows"]:
        msgs.append(f"{row['arm']} [{row['overrides']}]: {row['seeds']}; {row['verdict']}"
                    + ("" if row["arm"] == "control" else f" — {row['why']}"))
    unlogged = [r["run_id"] for r in runs if r["status"] in DONE and r["last_validation_update"] is None
                and journal.metrics(r["run_id"], "validation", "val_loss")]
    n_done = sum(s in DONE for s in statuses)
    msgs += taken_lines(list(taken))
    if taken and n_done + len(taken) >= expected:
        verdict = "warn"  # nothing left for this process: the other one is running the rest
        msgs.append(f"{len(taken)} of {expected} runs are being run by another process, which claimed them first; "
                    f"`pilotrun sweep CAMPAIGN --continue {sweep_id}` once it ends shows the whole comparison")
    elif n_done < expected:
        verdict = "fail"
        msgs.append(f"{expected - n_done} of {expected} runs did not finish; continue with "
                    f"`pilotrun sweep CAMPAIGN --continue {sweep_id}`")
    elif unlogged:
        verdict = "fail"
        msgs.append(f"{plural(len(unlogged), 'run')} validated without logging plan.metric {plan['metric']} "
                    f"({', '.join(unlogged)}): they have no value to compare (a journal written before pilotrun "
                    "checked plan.metric, which compared val_loss in its place); a new sweep with plan.metric: "
                    "val_loss, or a metric the task logs, compares them")
    elif "diverged" in statuses:
        verdict = "warn"
        msgs.append(f"{statuses.count('diverged')} run(s) diverged; they count as failures of their arm and stay "
                    "in every table and plot")
    else:
        verdict = "ok"

    data["time_check"] = sweep_time_check(journal, sweep_id)
    msgs += time_lines(data["time_check"])
    late = time_plan_warning(data["time_check"])
    if late:
        msgs.append(late)
        verdict = "warn" if verdict == "ok" else verdict
    bounds = [(r["run_id"], (journal.get_run(r["run_id"]).get("summary") or {}).get("memory_bound") or {})
              for r in runs]
    flagged = [(rid, b) for rid, b in bounds if b.get("warnings")]
    ratios = [b["max_ratio"] for _, b in bounds if b.get("max_ratio") is not None]
    if ratios:
        exact = all(k.get("counter") in ("tensors+rss", "cuda") for _, b in bounds
                    for k in (b.get("kinds") or {}).values())
        msgs.append(f"memory bound: the largest observed ÷ pilot peak over {len(ratios)} run(s) is {max(ratios):.3f}"
                    + (f" ({'exact counters, ' if exact else ''}{'held' if not flagged else 'EXCEEDED'})"))
    for rid, b in flagged:
        msgs += [f"WARNING run {rid}: {w}" for w in b["warnings"]]
    if flagged and verdict == "ok":
        verdict = "warn"
    summary = f"sweep {sweep_id}: {statuses.count('completed')} completed, {statuses.count('diverged')} diverged, " \
              f"{statuses.count('stopped')} stopped of {expected}"
    return StageResult("sweep", verdict, summary, msgs, data, columns=list(cmp.TERMINAL_COLUMNS), rows=data["rows"])
