"""sweep: the control and each variant of ``plan``, for every seed, each its own run through the one loop.

Before the first run the resolved plan (budget, effective batch, eval_every, stop rules, metric,
arms, seeds, config sha256) is frozen in the journal with its sha256: a changed campaign file is a
new sweep, never a silent edit of the old one. A variant is applied on top of the control and may
only change what it compares: one that moves the effective batch, the budget, the validation
frequency or set, the stop rules or the seed is refused before anything runs.

``--continue SWEEP_ID`` skips finished runs (completed, diverged, stopped) and reruns the others
(failed, interrupted) as new runs naming the run they supersede; the superseded run stays.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.load import sha256_of_config
from pilotrun.errors import BadInput
from pilotrun.journal.store import Journal
from pilotrun.stages import compare as cmp
from pilotrun.stages.result import StageResult

DONE = ("completed", "diverged", "stopped")
BATCH_KEYS = ("train.micro_batch", "train.accumulation", "train.nproc", "train.strategy")
BUDGET_KEYS = ("train.updates", "train.epochs")


@dataclass
class Arm:
    name: str
    overrides: dict[str, Any]  # control's overrides, then the variant's on top
    own: dict[str, Any]  # what this arm itself says it changes
    arm_id: str  # plan.control | plan.variants[i]
    where: str
    loaded: Any

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.own.items()) or "(the campaign as written)"


def _line_of(loaded, path: tuple) -> int | None:
    from pilotrun.campaign.load import _line_index

    if loaded.source is None or not loaded.source.is_file():
        return None
    return _line_index(loaded.source.read_text(encoding="utf-8")).get(path)


def _effective_batch(t) -> tuple[int, int, int]:
    return t.micro_batch, t.accumulation, data_parallel_ranks(t)


def _touching(own: dict, keys: tuple[str, ...]) -> list[str]:
    """The arm's own keys that set one of ``keys`` (or a whole section above them)."""
    return [k for k in own if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for key in keys)]


def _refuse(arm_id: str, where: str, own: dict, keys: tuple[str, ...], what: str, fix: str) -> BadInput:
    named = _touching(own, keys) or list(own)
    return BadInput(f"{arm_id} changes {what} through {', '.join(named)}; a variant may only change what the "
                    f"plan compares", where=f"{where} (key {named[0]})", fix=fix)


def plan_arms(loaded) -> list[Arm]:
    """Every arm, validated; raises BadInput naming the variant and the key."""
    plan, src = loaded.c.plan, str(loaded.source or "campaign")
    specs = [("control", "plan.control", ("plan", "control"), dict(plan.control))]
    specs += [(f"variant-{i + 1}", f"plan.variants[{i}]", ("plan", "variants", i), dict(v))
              for i, v in enumerate(plan.variants)]
    if not plan.seeds or len(set(plan.seeds)) != len(plan.seeds):
        line = _line_of(loaded, ("plan", "seeds"))
        raise BadInput(f"plan.seeds = {plan.seeds}: a sweep needs at least one seed, each listed once",
                       where=f"{src}:{line}" if line else src, fix="list distinct seeds, e.g. plan.seeds: [0, 1, 2]")
    arms: list[Arm] = []
    for name, arm_id, path, own in specs:
        line = _line_of(loaded, path)
        where = f"{src}:{line}" if line else src
        for k in own:
            if k == "plan" or k.startswith("plan."):
                raise BadInput(f"{arm_id} sets {k}: an arm cannot change the plan itself", where=f"{where} (key {k})",
                               fix=f"remove {k} from {arm_id}")
            if k == "seed":
                raise BadInput(f"{arm_id} sets seed: every arm runs with each seed of plan.seeds",
                               where=f"{where} (key seed)", fix="remove seed from the arm; list seeds in plan.seeds")
        overrides = {**(arms[0].overrides if arms else {}), **own}
        try:
            arm_loaded = loaded.with_overrides(overrides)
        except BadInput as e:
            raise BadInput(f"{arm_id}: {e.detail}", where=where, fix=e.fix) from None
        arms.append(Arm(name, overrides, own, arm_id, where, arm_loaded))
    ref = arms[0].loaded.c.train
    mb, acc, ranks = _effective_batch(ref)
    for arm in arms[1:]:
        t, arm_id = arm.loaded.c.train, arm.arm_id
        if math.prod(_effective_batch(t)) != mb * acc * ranks:
            a, b, r = _effective_batch(t)
            raise _refuse(arm_id, arm.where, arm.own, BATCH_KEYS,
                          f"the effective batch (micro_batch × accumulation × ranks = {a} × {b} × {r} = {a * b * r}; "
                          f"the control has {mb} × {acc} × {ranks} = {mb * acc * ranks})",
                          f"keep micro_batch × accumulation × ranks = {mb * acc * ranks} (compensate with "
                          "train.accumulation), or compare batch sizes in a campaign of their own")
        if (t.updates, t.epochs) != (ref.updates, ref.epochs):
            raise _refuse(arm_id, arm.where, arm.own, BUDGET_KEYS,
                          f"the budget (updates={t.updates}, epochs={t.epochs}; the control has "
                          f"updates={ref.updates}, epochs={ref.epochs})",
                          "every arm trains for the same budget; remove the budget key from the variant")
        if t.eval_every != ref.eval_every:
            raise _refuse(arm_id, arm.where, arm.own, ("train.eval_every",), "the validation frequency",
                          "validations are fixed before launch for every arm; remove train.eval_every from it")
        if t.stop != ref.stop:
            raise _refuse(arm_id, arm.where, arm.own, ("train.stop",), "the stop rules",
                          "stop rules are declared once for the whole sweep; remove train.stop from it")
        if arm.loaded.c.data.validation != arms[0].loaded.c.data.validation:
            raise _refuse(arm_id, arm.where, arm.own, ("data.validation",), "the validation set",
                          "every arm is measured on the same validation records; remove data.validation from it")
    return arms


def frozen_plan(loaded, arms: list[Arm]) -> dict:
    c, t = loaded.c, arms[0].loaded.c.train
    mb, acc, ranks = _effective_batch(t)
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
          on_run: Callable[[dict], None] | None = None, sets: tuple[str, ...] = ()) -> StageResult:
    """Run (or continue) the sweep of ``loaded``'s plan; returns the comparison as the stage's table.
    ``sets``: the command line's ``--set`` items ``loaded`` was loaded with (for each run's own command)."""
    from pilotrun.stages.validate import validate

    arms = plan_arms(loaded)
    validate(arms[0].loaded)  # files, fields and batch arithmetic fail here, before anything is frozen
    plan = frozen_plan(loaded, arms)
    sha = sha256_of_config(plan)
    journal = Journal(home)
    if continue_id is None:
        sweep_id = journal.create_sweep(plan, sha, plan["campaign_path"])
    else:
        frozen = journal.get_sweep(continue_id)
        if frozen is None:
            raise BadInput(f"sweep {continue_id} is not in {journal.path}", where="--continue",
                           fix="pass a sweep id printed by `pilotrun sweep` (and the same --home)")
        if frozen["plan_sha256"] != sha:
            changed = ", ".join(_differences(frozen["plan"], plan))
            raise BadInput(f"the campaign changed since sweep {continue_id} was frozen (differs in: {changed})",
                           where=str(loaded.source or "campaign"),
                           fix="a changed campaign is a new sweep: run `pilotrun sweep CAMPAIGN` without --continue, "
                               "or restore the campaign file")
        sweep_id = continue_id
    todo = _todo(journal, sweep_id, arms, plan["seeds"])
    total = len(plan["seeds"]) * len(arms)
    encoded: dict[str, object] = {}  # the data is read and encoded once per distinct task/model/data setting
    for i, (arm, seed, supersedes) in enumerate(todo):
        from pilotrun.stages.train import train_run

        run_loaded = arm.loaded.with_overrides({"seed": seed})
        r = train_run(run_loaded, home, kind="sweep", sweep_id=sweep_id, arm=arm.name, supersedes=supersedes,
                      progress=progress, save_artifact=False, validation_predictions=True,
                      command=arm_command(plan["campaign_path"], arm, seed, sets), **_encoded_for(run_loaded, encoded))
        if on_run is not None:
            on_run({"index": i + 1, "of": len(todo), "total": total, "arm": arm.name, "label": arm.label,
                    "seed": seed, "run_id": r.data["run_id"], "status": r.data["status"],
                    "reason": r.data["reason"], "supersedes": supersedes})
    return sweep_result(journal, sweep_id, ran=len(todo))


def arm_command(campaign_path, arm: Arm, seed: int, sets: tuple[str, ...] = ()) -> str | None:
    """The `pilotrun train` line that repeats this one run of the sweep (the run README's "Reproduce"):
    the sweep's own ``--set`` items, then the arm's overrides, then the seed."""
    import json
    import shlex

    from pilotrun.stages.runs import command_line

    if campaign_path is None:
        return command_line()
    items = [*sets, *(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in arm.overrides.items())]
    return " ".join(["pilotrun train", shlex.quote(str(campaign_path)), *(f"--set {shlex.quote(i)}" for i in items),
                     f"--seed {seed}"])


def _encoded_for(loaded, cache: dict):
    """train_run's ``prep`` and ``prepare_s``: the encoded examples of an earlier run with the same task, model and data
    sections (train.*, seed and plan keys do not change encoding), under this run's own task object."""
    from pilotrun.stages.prepare import Prepared, prepare
    from pilotrun.tasks import make_task

    import time

    d = loaded.resolved_dict()
    key = sha256_of_config({k: d.get(k) for k in ("task", "model", "data")})
    if key not in cache:
        t0 = time.perf_counter()
        cache[key] = prepare(loaded, splits=("train", "validation"))
        return {"prep": cache[key], "prepare_s": time.perf_counter() - t0}
    return {"prep": Prepared(loaded, make_task(loaded), cache[key].examples), "prepare_s": 0.0}


def _todo(journal: Journal, sweep_id: str, arms: list[Arm], seeds: list[int]) -> list[tuple[Arm, int, str | None]]:
    latest = _latest_runs(journal, sweep_id)
    todo = []
    for seed in seeds:  # seed-major: an interrupted sweep already holds complete pairs
        for arm in arms:
            run = latest.get((arm.name, seed))
            if run is None:
                todo.append((arm, seed, None))
            elif run["status"] == "running":
                raise BadInput(f"run {run['run_id']} of sweep {sweep_id} is still running (pid {run['pid']} on "
                               f"{run['host']})", where="--continue",
                               fix="wait for that process to end (or stop it), then continue the sweep")
            elif run["status"] not in DONE:
                todo.append((arm, seed, run["run_id"]))
    return todo


def _latest_runs(journal: Journal, sweep_id: str) -> dict[tuple[str, int], dict]:
    """Per (arm, seed) the run that counts: the newest, which supersedes any earlier one."""
    out: dict[tuple[str, int], dict] = {}
    for run in journal.list_runs(sweep_id=sweep_id):
        out[(run["arm"], run["seed"])] = run  # list_runs is oldest first
    return out


def run_points(journal: Journal, run: dict, metric: str, goal: str) -> dict:
    """The run's numbers for the comparison: the metric at its last validation and its best so far."""
    vals = journal.metrics(run["run_id"], "validation", metric) or journal.metrics(run["run_id"], "validation",
                                                                                     "val_loss")
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


def sweep_result(journal: Journal, sweep_id: str, ran: int) -> StageResult:
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
    n_done = sum(s in DONE for s in statuses)
    if n_done < expected:
        verdict = "fail"
        msgs.append(f"{expected - n_done} of {expected} runs did not finish; continue with "
                    f"`pilotrun sweep CAMPAIGN --continue {sweep_id}`")
    elif "diverged" in statuses:
        verdict = "warn"
        msgs.append(f"{statuses.count('diverged')} run(s) diverged; they count as failures of their arm and stay "
                    "in every table and plot")
    else:
        verdict = "ok"
    from pilotrun.stages.timecheck import sweep_time_check, time_lines

    data["time_check"] = sweep_time_check(journal, sweep_id)
    msgs += time_lines(data["time_check"])
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
