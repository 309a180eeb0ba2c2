"""The selection sheet and rental time plan as a dict, from the pilot's ledger rows in the journal (``build_sheet``):
the sheet stage (rehearsal/rental/sheet.py) renders and writes it; the sweep's time check reads its time plan."""

from __future__ import annotations

import os
from pathlib import Path

from pilotrun.campaign.arithmetic import data_parallel_ranks, examples_per_update
from pilotrun.campaign.load import campaign_from_dict
from pilotrun.campaign.reuse import keeping_traces
from pilotrun.phases import phases_of
from pilotrun.probe.alloc_conf import settings_from_env
from pilotrun.sizes import parse_size
from pilotrun.probe.watch import pilot_routing, routing_worst
from pilotrun.sheet import estimates as E, gpu_memory as GM, plan as P
from pilotrun.sheet.catalogue import CATALOGUE, get_gpu, match_gpu
from pilotrun.sheet.render import to_html
from pilotrun.sheet.stack import check_stack, needs_bf16, required_stack
from pilotrun.sheet.time_plan import time_plan
from pilotrun.signals import unless_stopping


def _rate_key(g, precision):
    return (g.memory_bytes, -g.rate_tflops(precision))


def build_sheet(cfg: dict, journal, pilot: dict, *, target_env: dict | None = None, gpu: str | None = None,
                rates: dict | None = None, predict: bool = True, options: bool = False) -> dict:
    """Everything the sheet shows, as data; every number names its ledger row, prediction or constant.

    ``predict``: run the estimator (GPU memory of a CPU pilot, the largest sizes); the time check,
    which only needs the time plan, passes False. ``options``: add the options table (per GPU and
    count, what each option changes), from the pilot's figures where they exist. The estimator's traces are
    kept in the journal's home and read back for the same campaign, files and pilotrun (``campaign/reuse``)."""
    with keeping_traces(journal.home):
        return _build_sheet(cfg, journal, pilot, target_env=target_env, gpu=gpu, rates=rates, predict=predict,
                            options=options)


def _build_sheet(cfg: dict, journal, pilot: dict, *, target_env, gpu, rates, predict: bool, options: bool) -> dict:
    loaded = campaign_from_dict(cfg, Path(pilot.get("campaign_path") or ".").parent)
    c = loaded.campaign
    t = c.train
    rows = [dict(r, run_id=pilot["run_id"]) for r in journal.phase_rows(pilot["run_id"])]
    rows = routing_worst(rows, pilot_routing(pilot))
    sheet: dict = {"campaign": c.name, "pilot_run": pilot["run_id"], "config_sha256": pilot["config_sha256"],
                   "pilot_device": rows[0].get("device"), "counter": rows[0].get("counter"), "problems": [],
                   "warnings": []}
    _ledger_problems(sheet, rows, pilot, c)
    # --- GPU memory: the CUDA counters, else the estimate for CUDA (never the CPU's RSS) -----------------
    ranks = data_parallel_ranks(t)
    settings, variable = settings_from_env(os.environ)  # the allocator the launch files set (sheet/launch.py)
    sheet["allocator"] = {"settings": settings.text, "variable": variable, "said": settings.said()}
    prep, predicted = E.prediction(loaded, rows, sheet, settings) if predict else (None, None)
    gpu_rows, kind = GM.gpu_rows(rows, predicted)
    limit = _memory(sheet, c, rows, gpu_rows, kind, ranks)
    if kind == "measured" and predicted:
        sheet["memory"]["fragmentation"] = GM.fragmentation(rows, predicted)
    sheet["settings"] = _settings(c, ranks)
    cards = sheet.get("_cards") if kind == "predicted" else None
    fits = GM.fit_table(gpu_rows, kind, CATALOGUE, needs_bf16=needs_bf16(cfg), ranks=ranks, cards=cards)
    sheet["fit"] = fits
    target = _stack_and_target(sheet, cfg, pilot, target_env, gpu, fits, limit, c)
    if predict and kind == "predicted" and not settings.expandable_segments:
        E.expandable_advice(sheet, loaded, fits, gpu_rows, ranks, t, needs_bf16(cfg))
    _launch_env(sheet, target, variable, settings)
    sizes = target is not None and predict
    # the largest sizes' bisection in a forked worker while this process traces the options table, where both run
    ahead = E.largest_ahead(loaded, prep, rows, target, ranks, t, c, settings) if sizes and options else None
    try:
        if sizes:
            sheet["largest"] = None  # its place among the sheet's keys; filled below
        time_plan(sheet, c, t, rows, P.phase_peaks(rows), pilot, fits, target, ranks, rates)
        if options and predict:
            E.options(sheet, loaded, prep, rates, gpu_rows, kind, ranks)
        if sizes:
            sheet["largest"] = E.largest(loaded, prep, rows, target, kind, ranks, t, c, settings, ahead=ahead)
    finally:
        if ahead is not None:
            ahead.cancel()
    for k in ("_trace", "_cards", "_prep"):
        sheet.pop(k, None)
    (sheet.get("time") or {}).pop("_terms", None)
    return sheet


def _launch_env(sheet: dict, target, variable: str | None, settings) -> None:
    """The allocator setting the launch files export: the one this sheet was replayed with (the launch's own), or
    expandable_segments:True where only it makes the target fit (``sheet["advice"]``)."""
    env = {variable: settings.text} if variable else {}
    advised = next((a for a in sheet.get("advice") or [] if target is not None and a["gpu"] == target.key), None)
    if advised:
        env = {advised["variable"]: advised["setting"]}
        sheet["warnings"].append(
            f"the {advised['name']} holds this campaign only with {advised['variable']}={advised['setting']}: "
            f"{advised['reserved'] / 2**30:.2f} GiB reserved against {advised['default_reserved'] / 2**30:.2f} GiB "
            f"without it; the launch files set it")
    sheet["launch_env"] = env


def _ledger_problems(sheet: dict, rows: list[dict], pilot: dict, c) -> None:
    """The pilot's phases that did not end ok (problems when unmeasured, else warnings) and those it lacks."""
    for r in (r for r in rows if r["verdict"] != "ok"):
        (sheet["problems"] if r["verdict"] in P.NOT_MEASURED else sheet["warnings"]).append(
            f"pilot phase {r['phase']} rank {r['rank']} ended with {r['verdict']}: {r.get('note') or ''}".strip())
    missing = [p for p in phases_of(c) if p not in {r["phase"] for r in rows}]
    if missing:
        sheet["problems"].append(f"the pilot {pilot['run_id']} has no row for {', '.join(missing)}")


def _memory(sheet: dict, c, rows, gpu_rows, kind: str, ranks: int) -> int:
    """``sheet["memory"]`` (the need per GPU and what sets it), each rank's measured peak, the campaign's hardware,
    and a problem when the need exceeds hardware.memory_per_gpu; returns that limit in bytes."""
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


def sheet_section_html(journal) -> str:
    """The sheet of each campaign's latest pilot in ``journal``, as an HTML fragment for the report
    (report/html.py wraps it in its own section and title)."""
    import html

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
            unless_stopping(e)
            parts.append(html.escape(f"sheet of {pilot['name']} ({pilot['run_id']}) could not be built: "
                                     f"{type(e).__name__}: {e}").join(("<p>", "</p>")))
    return "".join(parts)
