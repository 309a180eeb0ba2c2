"""sheet: the selection sheet and rental time plan, from the pilot's ledger rows in the journal.

The pilot is found by campaign name, preferring one with the same config sha256. No pilot is a
failing verdict (exit 1), not a bad input: the campaign is fine, a stage it depends on has not run,
and inside ``all`` a failing verdict lets the summary table still print where BadInput would stop it.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE, get_gpu, match_gpu
from pilotrun.sheet.stack import check_stack, needs_bf16, read_target_env, required_stack
from pilotrun.stages.result import StageResult, worst

PHASES = ("load", "first_step", "steady_step", "eval_longest", "save", "export", "reload")
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


def build_sheet(cfg: dict, journal, pilot: dict, *, target_env: dict | None = None, gpu: str | None = None) -> dict:
    """Everything the sheet shows, as data; every number names its ledger row or constant."""
    from pilotrun.campaign.arithmetic import batch_arithmetic
    from pilotrun.campaign.load import campaign_from_dict
    from pilotrun.probe.sizes import parse_size

    c = campaign_from_dict(cfg, Path(pilot.get("campaign_path") or ".").parent).campaign
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

    need = P.memory_need(rows)
    sheet["memory"] = need
    sheet["per_rank"] = [{"rank": k, "peak": max((P.row_peak(r) or 0) for r in rows if r["rank"] == k),
                          "phase": max((r for r in rows if r["rank"] == k), key=lambda r: P.row_peak(r) or 0)["phase"]}
                         for k in sorted({r["rank"] for r in rows})]
    limit = parse_size(c.hardware.memory_per_gpu, where="hardware.memory_per_gpu")
    sheet["hardware"] = {"memory_per_gpu": c.hardware.memory_per_gpu, "memory_bytes": limit, "gpus": c.hardware.gpus,
                         "rental_days": list(c.hardware.rental_days), "reserve": c.hardware.reserve}
    if need["need"] is not None and need["need"] > limit:
        sheet["problems"].append(
            f"the campaign needs {need['need'] / 2**30:.2f} GiB per GPU (phase {need['phase']}, {need['source']}) "
            f"and hardware.memory_per_gpu is {c.hardware.memory_per_gpu}; rent a larger GPU (see the fit table) or "
            f"lower train.micro_batch / train.eval_batch and rerun `pilotrun pilot`")

    ranks = data_parallel_ranks(t)
    sheet["settings"] = {"precision": precision, "dtype": c.model.dtype, "micro_batch": t.micro_batch,
                         "accumulation": t.accumulation, "ranks": ranks,
                         "effective_batch": t.micro_batch * t.accumulation * ranks, "strategy": t.strategy,
                         "nproc": t.nproc, "gradient_checkpointing": c.model.gradient_checkpointing,
                         "adapter": c.model.adapter.model_dump() if c.model.adapter else None,
                         "eval_batch": t.eval_batch, "max_length": c.data.max_length}

    bf16 = needs_bf16(cfg)
    fits = P.fit_table(rows, CATALOGUE, needs_bf16=bf16)
    sheet["fit"] = fits
    peaks = P.phase_peaks(rows)

    req = required_stack(cfg, pilot.get("packages") or {})
    sheet["stack"] = {"required": req, "target": None, "checks": []}
    target = get_gpu(gpu) if gpu else None
    if target_env is not None:
        checks = check_stack(req, target_env, need["need"])
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
            f"the fastest catalogue GPU of hardware.memory_per_gpu={c.hardware.memory_per_gpu} (it fits every phase)"
            if stated else "the smallest catalogue GPU that fits every phase (ties: the fastest)" if target
            else "no catalogue GPU fits every phase")
    else:
        sheet["target_from"] = "--gpu" if gpu else "the target env's first device"
    if not any(f["fits"] for f in fits):
        sheet["problems"].append("no GPU of the catalogue fits every phase (see the fit table)")
    sheet["target"] = target.to_json() if target else None
    if target is not None:
        sheet["largest"] = {
            "micro_batch": P.largest_micro_batch(peaks["steady_step"], target.memory_bytes)
            if "steady_step" in peaks else None,
            "eval_batch": P.largest_micro_batch(peaks["eval_longest"], target.memory_bytes, "eval_batch")
            if "eval_longest" in peaks else None,
            "seq_len": P.largest_micro_batch(peaks["steady_step"], target.memory_bytes, "seq_len")
            if "steady_step" in peaks else None}

    # --- the time plan ----------------------------------------------------------------------------
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
    if missing or not all(p in measured for p in PHASES) or not n_train:
        sheet["time"] = None
        sheet["problems"].append("no time plan: the pilot lacks a measured duration of "
                                 + ", ".join(p for p in PHASES if p not in measured)
                                 if not all(p in measured for p in PHASES) else
                                 "no time plan: the training data could not be counted")
        return sheet
    updates = batch_arithmetic(t, n_train)["updates"]
    counts = P.run_counts(updates, t.eval_every, t.save_every, n_val or 0, t.eval_batch, ranks, bool(n_val))
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
    from pilotrun.sheet.shape import scaled_units

    model = (pilot.get("summary") or {}).get("time_model")
    # the pilot's bare timings of its worst case, when it has them: its phases ran under the memory counter
    shape = scaled_units(model, model.get("worst_update_s") or measured["steady_step"]["seconds"],
                         model.get("worst_eval_s") or measured["eval_longest"]["seconds"]) if model else None
    if shape:
        work["tokens_update"] = shape["mean_update_tokens"]

    def plan_for(g):
        u = P.unit_seconds(measured, source_gpu=source_gpu, target_gpu=g, precision=precision, work=work,
                           shape=shape)
        terms = P.run_terms(counts, u["units"])
        per_run = sum(x["seconds"] for x in terms)
        return u, terms, per_run

    u, terms, per_run = plan_for(target)
    lanes = max(1, c.hardware.gpus // ranks)
    for r in runs:
        r["seconds"] = per_run
        unmeasured = [k for k in r["overrides"] if not any(k == f or k.startswith(f + ".") for f in COST_FREE)]
        if unmeasured and r["arm"] != "control":
            r["note"] = (f"{', '.join(unmeasured)} not piloted: time assumed equal to the control's; pilot it with "
                         f"`pilotrun pilot CAMPAIGN --set ...`")
    plans = P.pack(runs, c.hardware.rental_days, c.hardware.reserve, lanes)
    total = per_run * len(runs)
    sheet["time"] = {"measured": measured, "units": u["units"], "scaling": u["scaling"], "shape": shape,
                     "prepare_s": (pilot.get("summary") or {}).get("prepare_s"), "counts": counts,
                     "work": work, "terms": terms, "per_run_s": per_run, "runs": runs, "total_s": total,
                     "lanes": lanes, "plans": plans, "target": target.key if target else None,
                     "source_gpu": source_gpu if isinstance(source_gpu, str) or source_gpu is None else source_gpu.key}
    u_here, terms_here, per_run_here = plan_for(None)  # the pilot's own machine: nothing scaled
    sheet["time"]["here"] = {"units": u_here["units"], "terms": terms_here, "per_run_s": per_run_here}
    for f, g in zip(fits, CATALOGUE):
        f["campaign_s"] = plan_for(g)[2] * len(runs) / lanes if f["fits"] else None
    if c.hardware.gpus < ranks:
        sheet["problems"].append(f"hardware.gpus={c.hardware.gpus} is fewer than the {ranks} ranks of a run "
                                 f"(train.nproc); set hardware.gpus: {ranks}")
    if plans and not plans[-1]["fits_all"]:
        sheet["warnings"].append(f"{len(plans[-1]['not_fitting'])} run(s) do not fit even the {plans[-1]['days']}-day "
                                 f"plan: {', '.join(plans[-1]['not_fitting'])}")
    return sheet


def sheet_stage(loaded, home, *, target_env_path: str | None = None, gpu: str | None = None,
                out: str | None = None) -> StageResult:
    from pilotrun.journal.files import atomic_write_text
    from pilotrun.journal.store import Journal
    from pilotrun.sheet.render import to_lines, to_markdown

    target_env = read_target_env(target_env_path) if target_env_path else None
    if gpu:
        get_gpu(gpu)  # a bad --gpu is a bad input before anything else
    journal = Journal(home)
    c = loaded.campaign
    pilot, stale = find_pilot(journal, c.name, loaded.config_sha256())
    if pilot is None:
        return StageResult("sheet", "fail", f"no pilot run for campaign {c.name!r} in {journal.path}",
                           [f"the sheet is built from the pilot's measurements; run `pilotrun pilot "
                            f"{loaded.source or 'CAMPAIGN'}` first (with the same --home)"], {"pilot_run": None})
    sheet = build_sheet(loaded.resolved_dict() if not stale else pilot["config"], journal, pilot,
                        target_env=target_env, gpu=gpu)
    if stale:
        sheet["warnings"].insert(0, stale)
    markdown = to_markdown(sheet)
    if out:
        atomic_write_text(out, markdown)
        sheet["written"] = str(out)
    verdict = worst(["fail" if sheet["problems"] else "warn" if sheet["warnings"] else "ok"])
    need = sheet["memory"]
    tgt = sheet.get("target")
    summary = (f"needs {need['need'] / 2**30:.2f} GiB per GPU (peak at {need['phase']})" if need["need"] else
               "no memory measured") + (f"; target {tgt['name']}" if tgt else "; no GPU fits")
    if sheet.get("time"):
        summary += f"; campaign {P.fmt_duration(sheet['time']['total_s'] / sheet['time']['lanes'])}"
    fit_cols = ["gpu", "memory", *PHASES, "verdict", "campaign time"]
    fit_rows = [{"gpu": f["name"], "memory": f"{f['memory_bytes'] / 2**30:g} GiB", **f["phases"],
                 "verdict": f["verdict"], "campaign time": P.fmt_duration(f.get("campaign_s"))} for f in sheet["fit"]]
    sheet["markdown"] = markdown
    lines = to_lines(sheet) + ([f"sheet written to {out}"] if out else [])
    return StageResult("sheet", verdict, summary, lines, sheet, fit_cols, fit_rows)


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
