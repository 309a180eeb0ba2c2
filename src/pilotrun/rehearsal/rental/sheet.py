"""sheet: the selection sheet and rental time plan, from the pilot's ledger rows in the journal.

The pilot is found by campaign name, preferring one with the same config sha256. No pilot is a
failing verdict (exit 1), not a bad input: the campaign is fine, a stage it depends on has not run,
and inside ``all`` a failing verdict lets the summary table still print where BadInput would stop it.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.campaign.importers import not_reproduced_lines
from pilotrun.campaign.arithmetic import data_parallel_ranks, examples_per_update
from pilotrun.phases import PHASES, REGISTRY
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE, get_gpu, match_gpu
from pilotrun.sheet.stack import check_stack, needs_bf16, read_target_env, required_stack
from pilotrun.verdicts import StageResult, worst

# Keys a variant may change without changing what one update costs (the pilot measured the control).
COST_FREE = ("train.lr", "train.weight_decay", "train.schedule", "train.warmup", "train.max_grad_norm",
             "train.optimizer", "train.stop", "seed")


def find_pilot(journal, name: str, sha: str | None) -> tuple[dict | None, str | None]:
    """The latest pilot of the campaign with phase rows, preferring the same config sha256."""
    runs = [r for r in journal.list_runs(kind="pilot", name=name) if journal.phase_rows(r["run_id"])]
    same = [r for r in runs if r["config_sha256"] == sha]
    if same:
        return same[-1], None
    if runs:
        return runs[-1], (f"the latest pilot {runs[-1]['run_id']} measured another version of the campaign "
                          f"(config sha256 {runs[-1]['config_sha256'][:12]} vs {str(sha)[:12]}); rerun "
                          f"`pilotrun pilot` for numbers of this version")
    return None, None


def _count_records(path: str | None) -> int | None:
    if not path:
        return None
    try:
        from pilotrun.data.readers import read_records

        return len(read_records(path))
    except Exception:  # noqa: BLE001 - a data file that moved since the pilot: the count is shown as unknown
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


def _rate_key(g, precision):
    return (g.memory_bytes, -g.rate_tflops(precision))


def _prediction(loaded, rows: list[dict], sheet: dict):
    """The encoded data (for the size caps and probes) and, for a pilot without CUDA counters, the
    estimate's per-phase rows for CUDA; (None, None) with a problem named when they cannot be had."""
    from pilotrun.sheet.gpu_memory import predict_rows
    from pilotrun.rehearsal.prepare import prepare

    try:
        prep = prepare(loaded, splits=("train", "validation"))
        if rows[0].get("counter") == "cuda":
            return prep, None
        predicted, sheet["_trace"] = predict_rows(loaded, prep)
        return prep, predicted
    except Exception as e:  # noqa: BLE001 - a campaign fake tensors cannot build is named, not fatal
        if rows[0].get("counter") != "cuda":
            sheet["problems"].append(
                f"no GPU memory figure: the pilot ran on CPU (its RSS is not GPU memory) and `pilotrun estimate` "
                f"could not predict it ({type(e).__name__}: {e}); pilot on one GPU, or fix what stops the estimate")
        return None, None


def _largest(loaded, prep, rows, target, kind, ranks, t, c) -> dict:
    """The largest sizes on ``target``: bisection over the estimator, else the measured growth, else why not."""
    from pilotrun.sheet.gpu_memory import reserved_limit
    from pilotrun.sheet.sizes import largest_sizes

    peaks = P.phase_peaks(rows)
    su = (peaks.get("steady_step") or {}).get("inputs", {})
    ev = (peaks.get("eval_longest") or {}).get("inputs", {})
    if prep is not None:
        try:
            from pilotrun.rehearsal.reuse import kept_result

            asked = {"limit": reserved_limit(target, "predicted", ranks), "micro_batch": t.micro_batch,
                     "eval_batch": t.eval_batch, "seq_len": su.get("seq_len") or c.data.max_length,
                     "eval_seq_len": ev.get("seq_len") or c.data.max_length}
            return kept_result(loaded, {"largest_sizes": asked}, lambda: largest_sizes(
                loaded, prep, asked["limit"], micro_batch=asked["micro_batch"], eval_batch=asked["eval_batch"],
                seq_len=asked["seq_len"], eval_seq_len=asked["eval_seq_len"]))
        except Exception as e:  # noqa: BLE001 - fall back to the measured growth, saying why
            why = f"{type(e).__name__}: {e}"
    else:
        why = "the data could not be prepared"
    limit = reserved_limit(target, "measured", ranks)
    out = {}
    for name, phase, key in (("micro_batch", "steady_step", "micro_batch"), ("eval_batch", "eval_longest",
                                                                            "eval_batch"),
                             ("seq_len", "steady_step", "seq_len")):
        r = peaks.get(phase)
        out[name] = P.largest_by_growth(r, limit, key) if r else {"value": None, "source": f"no {phase} row"}
        out[name]["fallback"] = f"the estimator could not run ({why})"
    return out


def build_sheet(cfg: dict, journal, pilot: dict, *, target_env: dict | None = None, gpu: str | None = None,
                rates: dict | None = None, predict: bool = True, options: bool = False) -> dict:
    """Everything the sheet shows, as data; every number names its ledger row, prediction or constant.

    ``predict``: run the estimator (GPU memory of a CPU pilot, the largest sizes); the time check,
    which only needs the time plan, passes False. ``options``: add the options table (per GPU and
    count, what each option changes), from the pilot's figures where they exist. The estimator's traces are
    kept in the journal's home and read back for the same campaign, files and pilotrun (``rehearsal/reuse``)."""
    from pilotrun.rehearsal.reuse import keeping_traces

    with keeping_traces(journal.home):
        return _build_sheet(cfg, journal, pilot, target_env=target_env, gpu=gpu, rates=rates, predict=predict,
                            options=options)


def _build_sheet(cfg: dict, journal, pilot: dict, *, target_env, gpu, rates, predict: bool, options: bool) -> dict:
    from pilotrun.campaign.arithmetic import batch_arithmetic
    from pilotrun.campaign.load import campaign_from_dict
    from pilotrun.probe.sizes import parse_size
    from pilotrun.sheet import gpu_memory as GM

    loaded = campaign_from_dict(cfg, Path(pilot.get("campaign_path") or ".").parent)
    c = loaded.campaign
    t, precision = c.train, c.train.precision
    rows = [dict(r, run_id=pilot["run_id"]) for r in journal.phase_rows(pilot["run_id"])]
    sheet: dict = {"campaign": c.name, "pilot_run": pilot["run_id"], "config_sha256": pilot["config_sha256"],
                   "pilot_device": rows[0].get("device"), "counter": rows[0].get("counter"), "problems": [],
                   "warnings": []}
    bad = [r for r in rows if r["verdict"] != "ok"]
    for r in bad:
        (sheet["problems"] if r["verdict"] in P.NOT_MEASURED else sheet["warnings"]).append(
            f"pilot phase {r['phase']} rank {r['rank']} ended with {r['verdict']}: {r.get('note') or ''}".strip())
    missing = [p for p in PHASES if p not in {r["phase"] for r in rows}]
    if missing:
        sheet["problems"].append(f"the pilot {pilot['run_id']} has no row for {', '.join(missing)}")

    # --- GPU memory: the CUDA counters, else the estimate for CUDA (never the CPU's RSS) -----------------
    ranks = data_parallel_ranks(t)
    prep, predicted = _prediction(loaded, rows, sheet) if predict else (None, None)
    gpu_rows, kind = GM.gpu_rows(rows, predicted)
    need = GM.memory_summary(rows, gpu_rows, kind, ranks)
    sheet["memory"] = need
    sheet["per_rank"] = [{"rank": k, "peak": max((P.row_peak(r) or 0) for r in rows if r["rank"] == k),
                          "phase": max((r for r in rows if r["rank"] == k), key=lambda r: P.row_peak(r) or 0)["phase"]}
                         for k in sorted({r["rank"] for r in rows})] if kind == "measured" else []
    limit = parse_size(c.hardware.memory_per_gpu, where="hardware.memory_per_gpu")
    sheet["hardware"] = {"memory_per_gpu": c.hardware.memory_per_gpu, "memory_bytes": limit, "gpus": c.hardware.gpus,
                         "rental_days": list(c.hardware.rental_days), "reserve": c.hardware.reserve}
    if need["need"] is not None and need["need"] > limit:
        sheet["problems"].append(
            f"the campaign needs {need['need'] / 2**30:.2f} GiB per GPU (phase {need['phase']}, {need['source']}) "
            f"and hardware.memory_per_gpu is {c.hardware.memory_per_gpu}; rent a larger GPU (see the fit table) or "
            f"lower train.micro_batch / train.eval_batch and rerun `pilotrun pilot`")

    sheet["settings"] = {"precision": precision, "dtype": c.model.dtype, "micro_batch": t.micro_batch,
                         "accumulation": t.accumulation, "ranks": ranks,
                         "effective_batch": examples_per_update(t), "strategy": t.strategy,
                         "nproc": t.nproc, "gradient_checkpointing": c.model.gradient_checkpointing,
                         "adapter": c.model.adapter.model_dump() if c.model.adapter else None,
                         "eval_batch": t.eval_batch, "max_length": c.data.max_length}

    fits = GM.fit_table(gpu_rows, kind, CATALOGUE, needs_bf16=needs_bf16(cfg), ranks=ranks)
    sheet["fit"] = fits
    peaks = P.phase_peaks(rows)

    req = required_stack(cfg, pilot.get("packages") or {})
    sheet["stack"] = {"required": req, "target": None, "checks": [], "piloted": dict(pilot.get("packages") or {})}
    target = get_gpu(gpu) if gpu else None
    if target_env is not None:
        d0 = (target_env.get("devices") or [{}])[0]
        checks = check_stack(req, target_env, need["need"], target or match_gpu(d0.get("name"), d0.get("memory_bytes")))
        sheet["stack"].update(target=[d.get("name") for d in target_env.get("devices", [])] or "no CUDA device",
                              checks=checks)
        for ch in checks:
            if ch["verdict"] == "fail":
                sheet["problems"].append(f"target env: {ch['check']}: {ch['message']}")
            elif ch["verdict"] == "warn":
                sheet["warnings"].append(f"target env: {ch['check']}: {ch['message']}")
        if target is None and target_env.get("devices"):
            d0 = target_env["devices"][0]
            target = match_gpu(d0.get("name"), d0.get("memory_bytes"))
    if target is None:
        ok = sorted((g for g, f in zip(CATALOGUE, fits) if f["fits"]), key=lambda g: _rate_key(g, precision))
        stated = [g for g in ok if abs(g.memory_bytes - limit) <= 2**30]
        target = (stated or ok or [None])[0]
        sheet["target_from"] = (
            f"the fastest catalogue GPU of hardware.memory_per_gpu={c.hardware.memory_per_gpu} that fits every phase"
            if stated else "the smallest catalogue GPU that fits every phase (ties: the fastest)" if target
            else "no catalogue GPU fits every phase")
    else:
        sheet["target_from"] = "--gpu" if gpu else "the target env's first device"
    if not any(f["fits"] for f in fits):
        sheet["problems"].append("no GPU of the catalogue fits every phase (see the fit table)")
    sheet["target"] = target.to_json() if target else None
    if target is not None and predict:
        sheet["largest"] = _largest(loaded, prep, rows, target, kind, ranks, t, c)
    _time_plan(sheet, c, t, rows, peaks, pilot, fits, target, ranks, rates, batch_arithmetic)
    if options and predict:
        _options(sheet, loaded, prep, rates, gpu_rows, kind, ranks)
    sheet.pop("_trace", None)
    (sheet.get("time") or {}).pop("_terms", None)
    return sheet


def _options(sheet, loaded, prep, rates, gpu_rows, kind, ranks) -> None:
    """The options table, the campaign as written taking the pilot's memory (CUDA) and time plan."""
    from pilotrun.sheet.gpu_memory import phase_needs
    from pilotrun.sheet.options import TRAINING, options_table

    needs = {}
    for g in CATALOGUE:
        train = [p for p in phase_needs(gpu_rows, kind, g, ranks) if p["phase"] in TRAINING and p["need"] is not None]
        if train:
            needs[g.key] = max(train, key=lambda p: p["need"])
    tm = sheet.get("time") or {}
    pilot = {"run": sheet["pilot_run"], "ranks": ranks, "runs": len(tm.get("runs") or []) or 1, "kind": kind,
             "needs": needs, "terms": tm.get("_terms") or {}}
    try:
        sheet["options"] = options_table(loaded, prep=prep, rates=rates, written=sheet.get("_trace"), pilot=pilot)
    except Exception as e:  # noqa: BLE001 - the sheet stands without its options table; say why
        sheet["options"] = None
        sheet["warnings"].append(f"no options table: the estimator could not run ({type(e).__name__}: {e})")


def _time_plan(sheet, c, t, rows, peaks, pilot, fits, target, ranks, rates, batch_arithmetic) -> None:
    from pilotrun.sheet.shape import scaled_units

    precision = t.precision
    measured = _slowest(rows)
    arith = (pilot.get("summary") or {}).get("arithmetic")
    n_train = (arith or {}).get("train_examples") or _count_records(c.data.train)
    n_val = _count_records(c.data.validation)
    runs = P.run_list(c.plan.control, c.plan.variants, c.plan.seeds)
    sheet["expected"] = {"metric": c.plan.metric, "goal": c.plan.goal, "control": c.plan.control,
                         "variants": c.plan.variants, "seeds": c.plan.seeds,
                         "statement": (f"the campaign compares {len(c.plan.variants)} variant(s) with the control "
                                       f"{c.plan.control or '(the campaign as written)'} on {c.plan.metric} "
                                       f"({c.plan.goal}), over seeds {c.plan.seeds}")}
    sheet["time"] = None
    if not all(p in measured for p in PHASES) or not n_train:
        sheet["problems"].append("no time plan: the pilot lacks a measured duration of "
                                 + ", ".join(p for p in PHASES if p not in measured)
                                 if not all(p in measured for p in PHASES) else
                                 "no time plan: the training data could not be counted")
        return
    updates = batch_arithmetic(t, n_train)["updates"]
    from pilotrun.rehearsal.mechanics.control import CONTROL_EXAMPLES

    counts = P.run_counts(updates, t.eval_every, t.save_every, n_val or 0, t.eval_batch, ranks, bool(n_val),
                          control=min(CONTROL_EXAMPLES, n_val or n_train))
    counts["from"] = (f"train.updates/epochs → {updates} updates ({n_train} training examples), train.eval_every="
                      f"{t.eval_every}, train.save_every={t.save_every}, {n_val or 0} validation examples / "
                      f"(train.eval_batch={t.eval_batch} × {ranks} ranks)")
    load_in = peaks["load"].get("inputs", {})
    su = peaks["steady_step"].get("inputs", {})
    ev = peaks["eval_longest"].get("inputs", {})
    work = {"params": load_in.get("params"), "trainable": load_in.get("trainable") or load_in.get("params"),
            "tokens_update": su.get("micro_batch", t.micro_batch) * su.get("accumulation", t.accumulation)
            * su.get("seq_len", c.data.max_length),
            "tokens_eval": ev.get("eval_batch", t.eval_batch) * ev.get("seq_len", c.data.max_length),
            "passes_update": su.get("accumulation", t.accumulation), "checkpointing": c.model.gradient_checkpointing}
    source_gpu = _measured_gpu(pilot, rows)
    summary = pilot.get("summary") or {}
    model = summary.get("time_model")
    # the pilot's bare timings of its worst case, when it has them: its phases ran under the memory counter
    shape = scaled_units(model, model.get("worst_update_s") or measured["steady_step"]["seconds"],
                         model.get("worst_eval_s") or measured["eval_longest"]["seconds"]) if model else None
    if shape:
        work["tokens_update"] = shape["mean_update_tokens"]

    def plan_for(g):
        u = P.unit_seconds(measured, phases=REGISTRY, source_gpu=source_gpu, target_gpu=g, precision=precision,
                           work=work, shape=shape)
        if summary.get("run_overhead_s") is not None:  # host work: kept as measured on any GPU
            u["units"]["run_overhead"] = summary["run_overhead_s"]
        if (model or {}).get("control_s") is not None:  # two forward passes: scaled like a validation batch
            ratio = u["units"]["eval_batch"] / measured["eval_longest"]["seconds"] \
                if measured["eval_longest"]["seconds"] and g is not None else 1.0
            u["units"]["control"] = model["control_s"] * ratio
        if (model or {}).get("warm_load_s") is not None:
            u["units"]["warm_load"] = model["warm_load_s"]
        terms = P.run_terms(counts, u["units"])
        return u, terms, sum(x["seconds"] for x in terms)

    u, terms, per_run = plan_for(target)
    lanes = max(1, c.hardware.gpus // ranks)
    for r in runs:
        r["seconds"] = per_run
        unmeasured = [k for k in r["overrides"] if not any(k == f or k.startswith(f + ".") for f in COST_FREE)]
        if unmeasured and r["arm"] != "control":
            r["note"] = (f"{', '.join(unmeasured)} not piloted: time assumed equal to the control's; pilot it with "
                         f"`pilotrun pilot CAMPAIGN --set ...`")
    plans = P.pack(runs, c.hardware.rental_days, c.hardware.reserve, lanes)
    plans_by_gpu, wall = {}, {}  # wall: the busiest lane's runs one after another, what a rental must hold
    for f, g in zip(fits, CATALOGUE):
        if f["fits"]:
            g_per_run = plan_for(g)[2]
            wall[g.key] = -(-len(runs) // lanes) * g_per_run
            f["campaign_s"] = g_per_run * len(runs) / lanes
            plans_by_gpu[g.key] = P.pack([dict(r, seconds=g_per_run) for r in runs], c.hardware.rental_days,
                                         c.hardware.reserve, lanes)
        else:
            f["campaign_s"] = None
    sheet["time"] = {"measured": measured, "units": u["units"], "scaling": u["scaling"], "shape": shape,
                     "prepare_s": summary.get("prepare_s"), "startup_s": summary.get("startup_s"), "counts": counts,
                     "work": work, "terms": terms, "per_run_s": per_run, "runs": runs,
                     "total_s": per_run * len(runs), "lanes": lanes, "plans": plans,
                     "target": target.key if target else None,
                     "why": P.time_reasons(u["scaling"], terms, [f["campaign_s"] for f in fits if f["fits"]]),
                     "source_gpu": source_gpu if isinstance(source_gpu, str) or source_gpu is None else source_gpu.key}
    sheet["time"]["_terms"] = {g.key: plan_for(g)[1] for g in CATALOGUE}  # for the options table
    u_here, terms_here, per_run_here = plan_for(None)  # the pilot's own machine: nothing scaled
    sheet["time"]["here"] = {"units": u_here["units"], "terms": terms_here, "per_run_s": per_run_here}
    if rates is not None:
        from pilotrun.sheet.rates import costs

        sheet["costs"] = costs(rates, plans_by_gpu, c.hardware.gpus, wall, c.hardware.reserve)
    if c.hardware.gpus < ranks:
        sheet["problems"].append(f"hardware.gpus={c.hardware.gpus} is fewer than the {ranks} ranks of a run "
                                 f"(train.nproc); set hardware.gpus: {ranks}")
    if plans and not plans[-1]["fits_all"]:
        sheet["warnings"].append(f"{len(plans[-1]['not_fitting'])} run(s) do not fit even the {plans[-1]['days']}-day "
                                 f"plan: {', '.join(plans[-1]['not_fitting'])}")
    sheet["launch"] = _choose_launch(sheet, target, plans, plans_by_gpu)


def _choose_launch(sheet, target, plans, plans_by_gpu) -> dict | None:
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


def sheet_stage(loaded, home, *, target_env_path: str | None = None, gpu: str | None = None,
                out: str | None = None, rates_path: str | None = None, sets: tuple[str, ...] = (),
                options: bool = True, say_imported: bool = True) -> StageResult:
    """The sheet; for an imported campaign it says once which of the source's settings the rehearsal does not
    reproduce (``say_imported``: `all` says it itself)."""
    result = _sheet_stage(loaded, home, target_env_path=target_env_path, gpu=gpu, out=out, rates_path=rates_path,
                          sets=sets, options=options)
    lines = not_reproduced_lines(loaded.campaign) if say_imported else []
    if lines:
        result.messages[:0] = lines
        result.data["not_reproduced"] = lines
        if "markdown" in result.data:
            md = "\n".join(["## Not reproduced by the rehearsal", "", lines[0], ""] +
                            [f"- {x.strip()}" for x in lines[1:]]) + "\n\n"
            result.data["markdown"] = md + result.data["markdown"]
            if out:
                from pilotrun.journal.files import atomic_write_text

                atomic_write_text(out, result.data["markdown"])
    return result


def _sheet_stage(loaded, home, *, target_env_path: str | None = None, gpu: str | None = None,
                 out: str | None = None, rates_path: str | None = None, sets: tuple[str, ...] = (),
                 options: bool = True) -> StageResult:
    from pilotrun.journal.files import atomic_write_text
    from pilotrun.journal.store import Journal
    from pilotrun.sheet.render import to_lines, to_markdown
    from pilotrun.sheet.sections import size

    target_env = read_target_env(target_env_path) if target_env_path else None
    if gpu:
        get_gpu(gpu)  # a bad --gpu is a bad input before anything else
    rates = None
    if rates_path:
        from pilotrun.sheet.rates import read_rates

        rates = read_rates(rates_path)
    journal = Journal(home)
    c = loaded.campaign
    pilot, stale = find_pilot(journal, c.name, loaded.config_sha256())
    if pilot is None:
        from pilotrun.sheet.options_view import no_pilot_blocks, no_pilot_sheet, too_large_here

        size = too_large_here(loaded)  # the estimator knows the model's size before anything is loaded
        if size is not None:
            result = no_pilot_sheet(loaded, size, rates=rates)
            if out and loaded.source is not None:
                from pilotrun.sheet.launch import options_launch

                result.data["launch"] = options_launch(result.data, loaded, sets, str(journal.home))
            result.data["markdown"] = to_markdown({"blocks": no_pilot_blocks(result.data)})
            if out:
                atomic_write_text(out, result.data["markdown"])
                written = [Path(out)]
                if (result.data.get("launch") or {}).get("files"):
                    from pilotrun.sheet.launch import write_launch

                    written += write_launch(result.data, loaded, Path(out), result.data["launch"]["files"])
                result.data["written"] = [str(p) for p in written]
                result.messages.append(f"written to {Path(out).parent}: " + ", ".join(p.name for p in written))
            return result
        return StageResult("sheet", "fail", f"no pilot run for campaign {c.name!r} in {journal.path}",
                           [f"the sheet is built from the pilot's measurements; run `pilotrun pilot "
                            f"{loaded.source or 'CAMPAIGN'}` first (with the same --home)"], {"pilot_run": None})
    sheet = build_sheet(loaded.resolved_dict() if not stale else pilot["config"], journal, pilot,
                        target_env=target_env, gpu=gpu, rates=rates, options=options)
    sheet["home"] = str(journal.home)
    if stale:
        sheet["warnings"].insert(0, stale)
    written = []
    if out:
        written = _write(sheet, loaded, Path(out), sets, atomic_write_text, to_markdown)
    verdict = worst(["fail" if sheet["problems"] else "warn" if sheet["warnings"] else "ok"])
    need = sheet["memory"]
    tgt = sheet.get("target")
    summary = (f"needs {size(need['need'])} per GPU (peak at {need['phase']}, {need['kind']})"
               if need["need"] else "no GPU memory figure") + (f"; target {tgt['name']}" if tgt else "; no GPU fits")
    if sheet.get("time"):
        summary += f"; campaign {P.fmt_duration(sheet['time']['total_s'] / sheet['time']['lanes'])}"
    if (sheet.get("costs") or {}).get("cheapest"):
        ch = sheet["costs"]["cheapest"]
        summary += f"; cheapest {ch['plan']} plan {ch['gpu']} {ch['cost']:,.2f} {sheet['costs']['currency']}".rstrip()
    fit_cols = ["gpu", "memory", "need", "verdict", "campaign time"]
    fit_rows = [{"gpu": f["name"], "memory": f"{f['memory_bytes'] / 2**30:g} GiB",
                 "need": size(f["need"]),
                 "verdict": f["verdict"], "campaign time": P.fmt_duration(f.get("campaign_s"))} for f in sheet["fit"]]
    sheet["markdown"] = to_markdown(sheet)
    lines = to_lines(sheet) + ([f"written to {Path(out).parent}: " + ", ".join(p.name for p in written)]
                               if written else [])
    return StageResult("sheet", verdict, summary, lines, sheet, fit_cols, fit_rows)


def _write(sheet, loaded, out: Path, sets, atomic_write_text, to_markdown) -> list[Path]:
    """sheet.md and, for the chosen GPU and plan, the launch files next to it."""
    from pilotrun.sheet.catalogue import BY_KEY
    from pilotrun.sheet.launch import launch_plan, write_launch

    files = []
    ch = sheet.get("launch")
    if ch and loaded.source is not None:
        try:
            sheet["launch"]["files"] = launch_plan(sheet, loaded, BY_KEY[ch["gpu"]], ch["plan"], sets)
        except Exception as e:  # noqa: BLE001 - the sheet stands without its launch files; say why
            sheet["warnings"].append(f"no launch files: {type(e).__name__}: {e}")
    elif not ch:
        sheet["warnings"].append("no launch files: no GPU and plan to launch (see the problems above)")
    atomic_write_text(out, to_markdown(sheet))
    files.append(out)
    if (sheet.get("launch") or {}).get("files"):
        files += write_launch(sheet, loaded, out, sheet["launch"]["files"])
    sheet["written"] = [str(p) for p in files]
    return files


def sheet_section_html(journal) -> str:
    """The sheet of each campaign's latest pilot in ``journal``, as an HTML fragment for the report
    (report/html.py wraps it in its own section and title)."""
    import html

    from pilotrun.sheet.render import to_html

    latest: dict[str, dict] = {}
    for run in journal.list_runs(kind="pilot"):
        if journal.phase_rows(run["run_id"]):
            latest[run["name"]] = run
    if not latest:
        return "<p>No pilot run in this journal: run <code>pilotrun pilot CAMPAIGN</code> first.</p>"
    parts = []
    for pilot in latest.values():
        try:
            parts.append(to_html(build_sheet(pilot["config"], journal, pilot)))
        except Exception as e:  # noqa: BLE001 - one unreadable pilot must not take the whole report down
            parts.append(html.escape(f"sheet of {pilot['name']} ({pilot['run_id']}) could not be built: "
                                     f"{type(e).__name__}: {e}").join(("<p>", "</p>")))
    return "".join(parts)
