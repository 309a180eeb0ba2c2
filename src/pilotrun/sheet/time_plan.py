"""The sheet's time plan: each phase's slowest measured duration in the pilot's ledger, scaled to a GPU
(``sheet/plan.unit_seconds``), counted over the campaign's updates, validations and checkpoints
(``plan.run_counts``), times every run of the plan, packed into the rental's day plans (``plan.pack``); per
catalogue GPU that fits, and the launch's choice of GPU and plan (sheet/build.py builds the rest)."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import batch_arithmetic
from pilotrun.campaign.arms import COST_FREE
from pilotrun.engine.control import CONTROL_EXAMPLES
from pilotrun.phases import REGISTRY, phases_of
from pilotrun.phases.registry import precomputes
from pilotrun.probe.watch import EXACT, exact_updates
from pilotrun.records.readers import read_records
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE, match_gpu
from pilotrun.sheet.rates import costs
from pilotrun.sheet.shape import scaled_units
from pilotrun.signals import unless_stopping


def _count_records(path: str | None) -> int | None:
    if not path:
        return None
    try:
        return len(read_records(path))
    except Exception as e:  # noqa: BLE001 - a data file that moved since the pilot: the count is shown as unknown
        unless_stopping(e)
        return None


def _measured_gpu(pilot: dict, rows: list[dict]):
    """"cpu", the catalogue GPU the pilot ran on, or None (a CUDA device not identified)."""
    device = str(rows[0].get("device") or "cpu")
    if device.startswith("cpu"):
        return "cpu"
    s = pilot.get("summary") or {}
    name = s.get("device_name") or (s.get("env") or {}).get("devices", [{}])[0].get("name")
    return match_gpu(name)


def _slowest(rows: list[dict]) -> dict[str, dict]:
    out = {}
    for r in rows:
        if r.get("duration_s") is None or r["verdict"] in P.NOT_MEASURED:
            continue
        if r["phase"] not in out or r["duration_s"] > out[r["phase"]]["seconds"]:
            out[r["phase"]] = {"seconds": float(r["duration_s"]), "source": P.source(r)}
    return out


def expected(c) -> dict:
    """What the campaign compares (the sheet's "Expected result")."""
    return {"metric": c.plan.metric, "goal": c.plan.goal, "control": c.plan.control, "variants": c.plan.variants,
            "seeds": c.plan.seeds,
            "statement": (f"the campaign compares {len(c.plan.variants)} variant(s) with the control "
                          f"{c.plan.control or '(the campaign as written)'} on {c.plan.metric} ({c.plan.goal}), "
                          f"over seeds {c.plan.seeds}")}


def time_plan(sheet, c, t, rows, peaks, pilot, fits, target, ranks, rates) -> None:
    """``sheet["time"]`` (None with a problem named when the pilot lacks a duration), each fitting GPU's campaign
    time in ``fits``, the costs with ``rates`` and ``sheet["launch"]``."""
    measured = _slowest(rows)
    arith = (pilot.get("summary") or {}).get("arithmetic")
    n_train = (arith or {}).get("train_examples") or _count_records(c.data.train)
    rows_val = (pilot.get("summary") or {}).get("validation_rows")  # as prepared (packed rows), when recorded
    n_val = rows_val if rows_val is not None and c.data.validation else _count_records(c.data.validation)
    runs = P.run_list(c.plan.control, c.plan.variants, c.plan.seeds)
    sheet["expected"] = expected(c)
    sheet["time"] = None
    phases = phases_of(c)
    if not all(p in measured for p in phases) or not n_train:
        sheet["problems"].append("no time plan: the pilot lacks a measured duration of "
                                 + ", ".join(p for p in phases if p not in measured)
                                 if not all(p in measured for p in phases) else
                                 "no time plan: the training data could not be counted")
        return
    counts = _counts(c, t, n_train, n_val, ranks)
    model = (pilot.get("summary") or {}).get("time_model") or {}
    if model.get("budget_update_tokens"):  # on CPU the watch's exact blocks (probe/watch.py): the pilot's count over
        # its budget's draws, else (a pilot recorded before it counted them) records of the updates' padded tokens
        n = model.get("exact_updates")
        counts["exact_updates"] = n if n is not None else exact_updates([(x, x) for x in model["budget_update_tokens"]])
    plan_for, work, shape = _unit_plan(c, t, rows, peaks, pilot, measured, counts)
    u, terms, per_run = plan_for(target)
    # runs side by side, one per lane of `ranks` GPUs; a lane beyond the number of runs has none to take
    lanes = min(max(1, c.hardware.gpus // ranks), len(runs))
    _priced_runs(runs, per_run)
    plans = P.pack(runs, c.hardware.rental_days, c.hardware.reserve, lanes)
    plans_by_gpu, wall = _per_gpu(fits, runs, lanes, plan_for, c)
    summary = pilot.get("summary") or {}
    source_gpu = _measured_gpu(pilot, rows)
    sheet["time"] = {"measured": measured, "units": u["units"], "scaling": u["scaling"], "shape": shape,
                     "prepare_s": summary.get("prepare_s"), "startup_s": summary.get("startup_s"), "counts": counts,
                     "work": work, "terms": terms, "per_run_s": per_run, "runs": runs,
                     "total_s": per_run * len(runs), "lanes": lanes, "plans": plans,
                     "campaign_s": _wall(len(runs), lanes, per_run),
                     "target": target.key if target else None,
                     "why": P.time_reasons(u["scaling"], terms, [f["campaign_s"] for f in fits if f["fits"]]),
                     "source_gpu": source_gpu if isinstance(source_gpu, str) or source_gpu is None else source_gpu.key}
    routing = (summary.get("time_model") or {}).get("routing")
    if routing:  # a mixture of experts: which routing the update times are of
        sheet["time"]["why"].append(
            "Routing (a mixture of experts): the update times are those of the routing the model's router chose in "
            f"the pilot (its worst-case update {P.fmt_duration(measured['steady_step']['seconds'])}); forced, the "
            "same update took " + ", ".join(f"{P.fmt_duration(v['seconds'])} {mode}" for mode, v in routing.items())
            + " (skewed: every token to the same top-k experts); the memory figures take the highest of the three")
    sheet["time"]["_terms"] = {g.key: plan_for(g)[1] for g in CATALOGUE}  # for the options table
    u_here, terms_here, per_run_here = plan_for(None)  # the pilot's own machine: nothing scaled
    sheet["time"]["here"] = {"units": u_here["units"], "terms": terms_here, "per_run_s": per_run_here}
    if rates is not None:
        sheet["costs"] = costs(rates, plans_by_gpu, c.hardware.gpus, wall, c.hardware.reserve)
    idle = c.hardware.gpus - lanes * ranks
    if c.hardware.gpus >= ranks and lanes == len(runs) and idle >= ranks:
        sheet["warnings"].append(f"hardware.gpus={c.hardware.gpus}: {len(runs)} run(s) of {ranks} GPU(s) each keep "
                                 f"{lanes * ranks} busy, and {idle} would stay idle the whole rental (paid for); set "
                                 f"hardware.gpus: {lanes * ranks}, or give each run more ranks (train.nproc)")
    if c.hardware.gpus < ranks:
        sheet["problems"].append(f"hardware.gpus={c.hardware.gpus} is fewer than the {ranks} ranks of a run "
                                 f"(train.nproc); set hardware.gpus: {ranks}")
    if plans and not plans[-1]["fits_all"]:
        sheet["warnings"].append(f"{len(plans[-1]['not_fitting'])} run(s) do not fit even the {plans[-1]['days']}-day "
                                 f"plan: {', '.join(plans[-1]['not_fitting'])}")
    sheet["launch"] = choose_launch(sheet, target, plans, plans_by_gpu)


def _counts(c, t, n_train: int, n_val: int | None, ranks: int) -> dict:
    """Updates, validations, checkpoints and control passes of one run, and where they come from."""
    updates = batch_arithmetic(t, n_train)["updates"]
    counts = P.run_counts(updates, t.eval_every, t.save_every, n_val or 0, t.eval_batch, ranks, bool(n_val),
                          control=min(CONTROL_EXAMPLES, n_val or n_train))
    counts["from"] = (f"train.updates/epochs → {updates} updates ({n_train} training examples), train.eval_every="
                      f"{t.eval_every}, train.save_every={t.save_every}, {n_val or 0} validation examples / "
                      f"(train.eval_batch={t.eval_batch} × {ranks} ranks)")
    if precomputes(c):  # every run's pass over all its pairs before the first update
        counts["reference_batches"] = P.reference_batches(n_train + (n_val or 0), t.eval_batch, ranks)
        counts["from"] += (f"; preference.reference: precomputed → {n_train + (n_val or 0)} pairs / "
                           f"(train.eval_batch={t.eval_batch} × {ranks} ranks)")
    return counts


def _unit_plan(c, t, rows, peaks, pilot, measured, counts):
    """``plan_for(gpu)`` -> (unit seconds, the run's terms, seconds per run) on a GPU (None: the pilot's own
    machine), the work an update and a validation compute, and the pilot's time model's shape of its worst case
    (None without one)."""
    load_in = peaks["load"].get("inputs", {})
    su = peaks["steady_step"].get("inputs", {})
    ev = peaks["eval_longest"].get("inputs", {})
    # a mixture of experts computes with the parameters a token runs through (the pilot's load row says them)
    params = load_in.get("active_params") or load_in.get("params")
    per_example = 2 if "reference" in load_in else 1  # a preference pair is two sequences (chosen, rejected)
    work = {"params": params, "trainable": load_in.get("active_trainable") or load_in.get("trainable") or params,
            "tokens_update": su.get("micro_batch", t.micro_batch) * su.get("accumulation", t.accumulation)
            * su.get("seq_len", c.data.max_length) * per_example,
            "tokens_eval": ev.get("eval_batch", t.eval_batch) * ev.get("seq_len", c.data.max_length) * per_example,
            "passes_update": su.get("accumulation", t.accumulation), "checkpointing": c.model.gradient_checkpointing,
            "reference": load_in.get("reference") in ("copy", "adapter")}  # its no-grad forward in every step
    source_gpu = _measured_gpu(pilot, rows)
    summary = pilot.get("summary") or {}
    model = summary.get("time_model")
    # the pilot's bare timings of its worst case, when it has them: its phases ran under the memory counter
    shape = scaled_units(model, model.get("worst_update_s") or measured["steady_step"]["seconds"],
                         model.get("worst_eval_s") or measured["eval_longest"]["seconds"]) if model else None
    if shape:
        work["tokens_update"] = shape["mean_update_tokens"]

    def plan_for(g):
        u = P.unit_seconds(measured, phases=REGISTRY, source_gpu=source_gpu, target_gpu=g, precision=t.precision,
                           work=work, shape=shape)
        if summary.get("run_overhead_s") is not None:  # host work: kept as measured on any GPU
            u["units"]["run_overhead"] = summary["run_overhead_s"]
        if summary.get("warm_run_overhead_s") is not None:  # a later run of a sweep's process (training/timecheck)
            u["units"]["warm_run_overhead"] = summary["warm_run_overhead_s"]
        if summary.get("final_ref_s") is not None:  # host work: the checkpoint's files hashed, as measured
            u["units"]["final_ref"] = summary["final_ref_s"]
        if (model or {}).get("control_s") is not None:  # two forward passes: scaled like a validation batch
            ratio = u["units"]["eval_batch"] / measured["eval_longest"]["seconds"] \
                if measured["eval_longest"]["seconds"] and g is not None else 1.0
            u["units"]["control"] = model["control_s"] * ratio
        if (model or {}).get("warm_load_s") is not None:
            u["units"]["warm_load"] = model["warm_load_s"]
        if g is None:  # the pilot's own machine: a run's exact blocks pay the counter the bare timings leave out
            u["units"].update(exact_units(rows, measured, model))
        terms = P.run_terms(counts, u["units"])
        return u, terms, sum(x["seconds"] for x in terms)

    return plan_for, work, shape


def exact_units(rows: list[dict], measured: dict, model: dict | None) -> dict:
    """On CPU, the seconds the exact tensor counter adds to an update where a run's watch applies it (probe/watch.py
    ``exact_block``): the pilot's steady_step ran under it, and its time model timed the same inputs bare (the time
    plan's update unit). Empty on CUDA (the allocator's counters cost nothing per operator) or for a pilot without
    a bare timing."""
    counted = {r["phase"] for r in rows if r.get("counter") == EXACT}
    if "steady_step" in counted and "steady_step" in measured and (model or {}).get("worst_update_s"):
        return {"exact_update": max(0.0, measured["steady_step"]["seconds"] - model["worst_update_s"])}
    return {}


def _priced_runs(runs: list[dict], per_run: float) -> None:
    """Every run takes the control's seconds; a variant changing what an update costs says it was not piloted."""
    for r in runs:
        r["seconds"] = per_run
        unmeasured = [k for k in r["overrides"] if not any(k == f or k.startswith(f + ".") for f in COST_FREE)]
        if unmeasured and r["arm"] != "control":
            r["note"] = (f"{', '.join(unmeasured)} not piloted: time assumed equal to the control's; pilot it with "
                         f"`pilotrun pilot CAMPAIGN --set ...`")


def _wall(n_runs: int, lanes: int, per_run: float) -> float:
    """The campaign's wall time: ``n_runs`` runs of ``per_run`` each, side by side on ``lanes`` lanes, each lane's
    runs one after another (6 runs on 4 lanes take two runs' time, not one and a half)."""
    return -(-n_runs // lanes) * per_run


def _per_gpu(fits, runs, lanes, plan_for, c) -> tuple[dict, dict]:
    """Per catalogue GPU that fits: its campaign time (into ``fits``: the wall a rental must hold, the busiest
    lane's runs one after another) and its packed plans."""
    plans_by_gpu, wall = {}, {}
    for f, g in zip(fits, CATALOGUE):
        if f["fits"]:
            g_per_run = plan_for(g)[2]
            wall[g.key] = f["campaign_s"] = _wall(len(runs), lanes, g_per_run)
            plans_by_gpu[g.key] = P.pack([dict(r, seconds=g_per_run) for r in runs], c.hardware.rental_days,
                                         c.hardware.reserve, lanes)
        else:
            f["campaign_s"] = None
    return plans_by_gpu, wall


def choose_launch(sheet, target, plans, plans_by_gpu) -> dict | None:
    """The GPU and plan the launch files are for: the cheapest plan placing every run when rates are
    given, else the target GPU's shortest plan that places every run (its longest when none does)."""
    cheapest = (sheet.get("costs") or {}).get("cheapest")
    if cheapest:
        packed = plans_by_gpu[cheapest["gpu"]]
        plan = next((p for p in packed if p["days"] == cheapest["days"]), None) or \
            next((p for p in packed if p["fits_all"]), packed[-1])  # the hourly plan: the shortest tier's limit
        return {"gpu": cheapest["gpu"], "days": plan["days"], "plan": plan,
                "why": f"the cheapest plan that places every run ({sheet['costs']['path']})" if cheapest["days"]
                else f"the cheapest is the hourly plan ({sheet['costs']['path']}); its time limit is this plan's"}
    if target is None or not plans:
        return None
    plan = next((p for p in plans if p["fits_all"]), plans[-1])
    return {"gpu": target.key, "days": plan["days"], "plan": plan,
            "why": ("the target GPU's shortest plan that places every run" if plan["fits_all"]
                    else "the target GPU's longest plan (no plan places every run)")
            + ("" if sheet.get("costs") else "; pass --rates FILE to choose by cost")}
