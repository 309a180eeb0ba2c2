"""sheet: the selection sheet and rental time plan, from the pilot's ledger rows in the journal.

The pilot is found by campaign name, preferring one with the same config sha256. No pilot is a
failing verdict (exit 1), not a bad input: the campaign is fine, a stage it depends on has not run,
and inside ``all`` a failing verdict lets the summary table still print where BadInput would stop it.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.campaign.importers import not_reproduced_lines
from pilotrun.campaign.arithmetic import data_parallel_ranks, examples_per_update
from pilotrun.phases import PHASES
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import CATALOGUE, get_gpu, match_gpu
from pilotrun.sheet.stack import check_stack, needs_bf16, read_target_env, required_stack
from pilotrun.verdicts import StageResult, worst


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


def _rate_key(g, precision):
    return (g.memory_bytes, -g.rate_tflops(precision))


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
    from pilotrun.campaign.load import campaign_from_dict
    from pilotrun.rehearsal.rental import estimates as E
    from pilotrun.rehearsal.rental.time_plan import time_plan
    from pilotrun.sheet import gpu_memory as GM

    loaded = campaign_from_dict(cfg, Path(pilot.get("campaign_path") or ".").parent)
    c = loaded.campaign
    t = c.train
    rows = [dict(r, run_id=pilot["run_id"]) for r in journal.phase_rows(pilot["run_id"])]
    sheet: dict = {"campaign": c.name, "pilot_run": pilot["run_id"], "config_sha256": pilot["config_sha256"],
                   "pilot_device": rows[0].get("device"), "counter": rows[0].get("counter"), "problems": [],
                   "warnings": []}
    _ledger_problems(sheet, rows, pilot)
    # --- GPU memory: the CUDA counters, else the estimate for CUDA (never the CPU's RSS) -----------------
    ranks = data_parallel_ranks(t)
    prep, predicted = E.prediction(loaded, rows, sheet) if predict else (None, None)
    gpu_rows, kind = GM.gpu_rows(rows, predicted)
    limit = _memory(sheet, c, rows, gpu_rows, kind, ranks)
    sheet["settings"] = _settings(c, ranks)
    fits = GM.fit_table(gpu_rows, kind, CATALOGUE, needs_bf16=needs_bf16(cfg), ranks=ranks)
    sheet["fit"] = fits
    target = _stack_and_target(sheet, cfg, pilot, target_env, gpu, fits, limit, c)
    if target is not None and predict:
        sheet["largest"] = E.largest(loaded, prep, rows, target, kind, ranks, t, c)
    time_plan(sheet, c, t, rows, P.phase_peaks(rows), pilot, fits, target, ranks, rates)
    if options and predict:
        E.options(sheet, loaded, prep, rates, gpu_rows, kind, ranks)
    sheet.pop("_trace", None)
    (sheet.get("time") or {}).pop("_terms", None)
    return sheet


def _ledger_problems(sheet: dict, rows: list[dict], pilot: dict) -> None:
    """The pilot's phases that did not end ok (problems when unmeasured, else warnings) and those it lacks."""
    for r in (r for r in rows if r["verdict"] != "ok"):
        (sheet["problems"] if r["verdict"] in P.NOT_MEASURED else sheet["warnings"]).append(
            f"pilot phase {r['phase']} rank {r['rank']} ended with {r['verdict']}: {r.get('note') or ''}".strip())
    missing = [p for p in PHASES if p not in {r["phase"] for r in rows}]
    if missing:
        sheet["problems"].append(f"the pilot {pilot['run_id']} has no row for {', '.join(missing)}")


def _memory(sheet: dict, c, rows, gpu_rows, kind: str, ranks: int) -> int:
    """``sheet["memory"]`` (the need per GPU and what sets it), each rank's measured peak, the campaign's hardware,
    and a problem when the need exceeds hardware.memory_per_gpu; returns that limit in bytes."""
    from pilotrun.probe.sizes import parse_size
    from pilotrun.sheet import gpu_memory as GM

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
    return limit


def _settings(c, ranks: int) -> dict:
    t = c.train
    return {"precision": t.precision, "dtype": c.model.dtype, "micro_batch": t.micro_batch,
            "accumulation": t.accumulation, "ranks": ranks, "effective_batch": examples_per_update(t),
            "strategy": t.strategy, "nproc": t.nproc, "gradient_checkpointing": c.model.gradient_checkpointing,
            "adapter": c.model.adapter.model_dump() if c.model.adapter else None, "eval_batch": t.eval_batch,
            "max_length": c.data.max_length}


def _stack_and_target(sheet: dict, cfg: dict, pilot: dict, target_env, gpu, fits, limit: int, c):
    """The software stack (checked against ``target_env`` when given) and the target GPU: ``--gpu``, else the
    target env's first device, else the catalogue's choice (``_default_target``); returns it (None: none fits)."""
    req = required_stack(cfg, pilot.get("packages") or {})
    sheet["stack"] = {"required": req, "target": None, "checks": [], "piloted": dict(pilot.get("packages") or {})}
    target = get_gpu(gpu) if gpu else None
    if target_env is not None:
        d0 = (target_env.get("devices") or [{}])[0]
        checks = check_stack(req, target_env, sheet["memory"]["need"],
                             target or match_gpu(d0.get("name"), d0.get("memory_bytes")))
        sheet["stack"].update(target=[d.get("name") for d in target_env.get("devices", [])] or "no CUDA device",
                              checks=checks)
        for ch in checks:
            if ch["verdict"] == "fail":
                sheet["problems"].append(f"target env: {ch['check']}: {ch['message']}")
            elif ch["verdict"] == "warn":
                sheet["warnings"].append(f"target env: {ch['check']}: {ch['message']}")
        if target is None and target_env.get("devices"):
            target = match_gpu(d0.get("name"), d0.get("memory_bytes"))
    if target is None:
        target = _default_target(sheet, fits, limit, c)
    else:
        sheet["target_from"] = "--gpu" if gpu else "the target env's first device"
    if not any(f["fits"] for f in fits):
        sheet["problems"].append("no GPU of the catalogue fits every phase (see the fit table)")
    sheet["target"] = target.to_json() if target else None
    return target


def _default_target(sheet: dict, fits, limit: int, c):
    """The fastest catalogue GPU of hardware.memory_per_gpu that fits every phase, else the smallest that does."""
    precision = c.train.precision
    ok = sorted((g for g, f in zip(CATALOGUE, fits) if f["fits"]), key=lambda g: _rate_key(g, precision))
    stated = [g for g in ok if abs(g.memory_bytes - limit) <= 2**30]
    target = (stated or ok or [None])[0]
    sheet["target_from"] = (
        f"the fastest catalogue GPU of hardware.memory_per_gpu={c.hardware.memory_per_gpu} that fits every phase"
        if stated else "the smallest catalogue GPU that fits every phase (ties: the fastest)" if target
        else "no catalogue GPU fits every phase")
    return target


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
