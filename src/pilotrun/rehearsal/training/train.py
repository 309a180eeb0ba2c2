"""train: one run through the loop, with a new run id; checkpoint, artifact and control predictions."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pilotrun import startup
from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.prepare import Prepared, prepare, require_weights
from pilotrun.console.progress import note
from pilotrun.engine.artifact import export_artifact
from pilotrun.engine.control import control_predictions, store_control_predictions
from pilotrun.engine.distributed import check_strategy, default_device, gather_to_rank0, launch, world_rank, wrap_model
from pilotrun.engine.launcher import Ranks
from pilotrun.engine.loop import Hooks, make_state, train, update_line
from pilotrun.engine.state import save_final
from pilotrun.journal.files import atomic_write_text
from pilotrun.journal.runs import RunRecorder, find_pilot
from pilotrun.journal.store import Journal, check_fence
from pilotrun import jsonsafe
from pilotrun.probe.memory import release_free_memory
from pilotrun.probe.watch import PeakWatch, bound_rows, pilot_routing, routing_worst
from pilotrun.rehearsal.training.val_predictions import store_validation_predictions
from pilotrun.scratch import make_dir
from pilotrun.tasks.preference_ref import table_of
from pilotrun.verdicts import StageResult


@dataclass
class TrainJob:
    """What every rank of a multi-process run needs (picklable: it crosses into spawned processes)."""

    loaded: object
    home: str
    run_id: str
    kind: str
    save_artifact: bool
    validation_predictions: bool
    result_path: str | None = None  # where rank 0 leaves its outcome for the parent (spawned ranks only)


def train_run(loaded, home, *, kind: str = "train", supersedes: str | None = None, sweep_id: str | None = None,
              arm: str | None = None, hooks: Hooks | None = None, progress: bool = True, prep: Prepared | None = None,
              save_artifact: bool = True, command: str | None = None,
              validation_predictions: bool = False, prepare_s: float | None = None) -> StageResult:
    """Prepare everything that can fail on bad input first; only then create the run.

    With ``train.strategy`` ddp/fsdp and ``train.nproc`` > 1 the run has that many ranks, as the batch
    arithmetic says: spawned here (rank 0 records; this process owns and finishes the run), or, under
    torchrun, this process is one of them (rank 0 creates the run, the others join it).
    """
    require_weights(loaded)
    t_start = time.perf_counter() - (prepare_s or 0.0)  # a caller that prepared for us says how long it took
    startup_s = startup.take(t_start)  # the first run of a pilotrun process: its start-up is this run's to plan
    check_strategy(loaded.c.train)  # ranks this machine cannot run: before reading anything
    prep = prep or prepare(loaded, splits=("train", "validation"))
    t_prepared = time.perf_counter()
    c = prep.c
    prep.arithmetic()  # too few examples for one update is bad input, before any run exists
    world = data_parallel_ranks(c.train)
    ranks = Ranks(world)
    spawn = ranks.spawn
    if spawn and hooks is not None:
        raise ValueError("hooks cannot follow a run into spawned ranks; run under torchrun to use them")

    t_release = time.perf_counter()
    release_free_memory()  # a sweep's runs share a process: start this one without the last one's leftovers
    t_load = time.perf_counter()
    overhead = {"startup_s": startup_s, "run_overhead_s": t_load - t_release}
    # a model that cannot be built (no weights, a vocabulary too small) is bad input: before the run exists
    if progress:
        note("building the model", log=True)  # not the data's encoding, which is done
    built = (prep.task.build_model(), time.perf_counter() - t_load)
    if spawn:
        built = None  # each spawned rank builds its own; this process only proved that it can be built
    if ranks.follower:
        job = ranks.share()
        _ranked_run(job, prep, None, None, progress=False, t_start=t_start, t_prepared=t_prepared, built=built,
                    overhead=overhead)
        rank = ranks.rank
        return StageResult(kind, "ok", f"rank {rank}: joined {kind} run {job.run_id}",
                           data={"run_id": job.run_id, "rank": rank})
    t_record = time.perf_counter()
    journal = Journal(home)
    with RunRecorder(journal, loaded, kind=kind, supersedes=supersedes, sweep_id=sweep_id, arm=arm,
                     command=command) as rec:
        overhead["run_overhead_s"] += time.perf_counter() - t_record  # the run's journal entry and folder
        job = TrainJob(loaded, str(journal.home), rec.run_id, kind, save_artifact, validation_predictions)
        if spawn:
            import shutil

            tmp = make_dir("pilotrun-ranks-")  # named for this process: a killed parent's is removed next time
            try:
                job.result_path = str(tmp / "rank0.json")
                launch(_spawned_rank, world, (job,), spawn=True)  # a run the time plan predicts: as on the rental
                out = jsonsafe.loads(Path(job.result_path).read_text())  # we wrote it a moment ago
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        else:
            ranks.share(job)
            out = _ranked_run(job, prep, rec, hooks, progress=progress, t_start=t_start, t_prepared=t_prepared,
                              built=built, overhead=overhead)
        rec.finish(out["status"], out["summary"])
    return _result(kind, rec.run_id, str(rec.dir), out, world)


def _spawned_rank(job: TrainJob) -> None:
    """One spawned rank: prepare (each process encodes its own copy), train; rank 0 writes the outcome."""
    import json

    t_start = time.perf_counter()
    prep = prepare(job.loaded, splits=("train", "validation"))
    t_prepared = time.perf_counter()
    rank = world_rank()[1]
    rec = RunRecorder.attach(Journal(job.home), job.run_id) if rank == 0 else None
    try:
        out = _ranked_run(job, prep, rec, None, progress=rank == 0, t_start=t_start, t_prepared=t_prepared)
    finally:
        if rec is not None:
            rec.flush()
    if rank == 0:
        atomic_write_text(Path(job.result_path), json.dumps(out))


def _ranked_run(job: TrainJob, prep: Prepared, rec: RunRecorder | None, hooks: Hooks | None, *, progress: bool,
                t_start: float, t_prepared: float, built: tuple | None = None, overhead: dict | None = None) -> dict:
    """The run on this process (one of its ranks, or the whole of it): loop, final checkpoint, artifact,
    control predictions, memory bound. Only the process with ``rec`` (rank 0) writes to the journal;
    ``built``: the model already built here and the seconds it took. Returns ``{"status", "summary", "evals",
    "control"}``."""
    c = prep.c
    arith = prep.arithmetic()
    world, rank = world_rank()
    model, wrapped, state, load_s = _placed(prep, arith, built, progress)
    timing = {"prepare_s": t_prepared - t_start, "load_s": load_s, **(overhead or {})}
    watch = PeakWatch(state.device, rank=rank)
    watch.track(wrapped, state.optimizer)
    run_dir = Journal(job.home).run_dir(job.run_id)
    user = hooks or Hooks()
    result = train(state, prep.task, prep.train, prep.validation, c.train, plan_metric=c.plan.metric,
                   goal=c.plan.goal, checkpoint_dir=run_dir / "checkpoints", hooks=_journal_hooks(rec, user, watch),
                   progress=None, keep_history=False)  # a long run: the journal has each update's numbers
    timing["loop_s"] = result.wall_s
    if result.reference_s:  # the reference's precomputation, before the first update (the time plan's own term)
        timing["reference_s"] = result.reference_s

    def phase(doing: str) -> None:  # what follows the loop, on the stage's line after the last update
        if progress:
            last = update_line(state, result.history[-1]) if result.history else None
            note(f"{last}; {doing}" if last else doing, log=True)

    check_fence()  # a run the journal reaped while this process was stopped gets no final checkpoint
    _save_final(state, result, run_dir, watch, phase, timing)
    ran_out = result.status == "failed"  # out of memory: no artifact or predictions a later stage could trust
    artifact = _export(job, prep, wrapped, state, run_dir, rank, watch, phase, timing) if not ran_out else []
    # under FSDP every rank takes part in the forward passes; otherwise rank 0 alone, on the plain module
    predicting = not ran_out and (rank == 0 or c.train.strategy == "fsdp")
    pred_model = wrapped if c.train.strategy == "fsdp" else model
    if predicting:
        phase("predicting the control examples" + (" and the validation split" if job.validation_predictions else ""))
    t0 = time.perf_counter()
    computed = control_predictions(prep, pred_model) if predicting else None
    timing["control_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    observed = gather_to_rank0(watch.rows())
    if predicting and job.validation_predictions:  # stored by rank 0 (rec); the others only take part
        store_validation_predictions(rec, prep, pred_model)
    timing["predictions_s"] = time.perf_counter() - t0
    timing["blocks_s"] = dict(watch.seconds)  # every update, validation, save and export, timed by the watch
    if rec is None:
        return {}
    control = store_control_predictions(rec, prep, model, computed) if computed else []
    loaded = job.loaded
    bound = record_memory_bound(rec.journal, rec.run_id, c.name, loaded.config_sha256(),
                                [row for rows in observed for row in rows], loaded.resolved_dict())
    summary = _summary(job, prep.c.train, state, result, world, arith=arith, artifact=artifact, bound=bound,
                       timing=timing)
    timing["total_s"] = time.perf_counter() - t_start
    rec.seal()
    evals = [{"update": e["update"], **{k: v for k, v in e.items() if k.startswith("val_")},
              "examples_seen": e["examples_seen"]} for e in result.evals]
    return {"status": result.status, "summary": summary, "evals": evals, "control": len(control)}


def _placed(prep: Prepared, arith: dict, built: tuple | None, progress: bool):
    """The model built (unless ``built`` brings it), on the device, wrapped for the strategy, and its training
    state: ``(model, wrapped, state, load_s)``, the load timed from the build to the state."""
    c = prep.c
    if built is None:
        release_free_memory()
        if progress:
            note("building the model", log=True)
        t_load = time.perf_counter()
        built = (prep.task.build_model(), time.perf_counter() - t_load)
    model, load_s = built
    t_load = time.perf_counter()
    device = default_device()
    if c.train.strategy != "fsdp":  # fully_shard moves each block to the device as it cuts it
        model.to(device)
    wrapped = wrap_model(model, c.train.strategy, device)
    state = make_state(wrapped, c.train, n_train=len(prep.train), seed=c.seed,
                       total_updates=arith["updates"], device=device)
    return model, wrapped, state, load_s + time.perf_counter() - t_load


def _journal_hooks(rec: RunRecorder | None, user: Hooks, watch) -> Hooks:
    """The loop's hooks: each update, validation and checkpoint logged to the journal (rank 0, ``rec``), then the
    caller's own hooks; the caller's stop and the memory watch passed on."""

    def on_update(st, out):
        if rec is not None:
            rec.log("train", out["update"], {"loss": out["loss"], **out.get("loss_parts", {}), "lr": out["lr"],
                                             "grad_norm": out["grad_norm"], "targets": out["targets"],
                                             **out.get("metrics", {})},
                    examples_seen=out["examples_seen"], wall_s=out["wall_s"])
            rec.progress(st.update, st.examples_seen)
            if out.get("skipped"):  # keyed by attempt: a skipped update shares its number with the next one
                rec.log("skipped", out["attempt"], {"loss": out["loss"], "update": out["update"],
                                                    "grad_norm": out["grad_norm"]},
                        examples_seen=out["examples_seen"], wall_s=out["wall_s"], flush=True)
        if user.on_update:
            user.on_update(st, out)

    def on_eval(st, ev):
        if rec is not None:
            rec.log("validation", ev["update"], {k: v for k, v in ev.items() if k.startswith("val_")},
                    examples_seen=ev["examples_seen"],
                    wall_s=ev["wall_s"], flush=True)
        if user.on_eval:
            user.on_eval(st, ev)

    def on_checkpoint(st, path):
        if rec is not None:
            rec.flush()  # a checkpoint's metrics are in the journal before anything resumes from it
        if user.on_checkpoint:
            user.on_checkpoint(st, path)

    return Hooks(on_update=on_update, on_eval=on_eval, on_checkpoint=on_checkpoint, stop_at=user.stop_at,
                 watch=watch)


def _save_final(state, result, run_dir: Path, watch, phase, timing: dict) -> None:
    """``checkpoints/final``: a save of its own, timed as every save, unless the loop's last act saved this very
    state (then final stands for that checkpoint, no second copy)."""
    t0 = time.perf_counter()
    if result.saved_last is None:
        phase("saving checkpoints/final")
        with watch("save", {"update": state.update, "path": "checkpoints/final"}):
            save_final(state, run_dir / "checkpoints" / "final", None)
    else:
        phase(f"checkpoints/final stands for {Path(result.saved_last).name}")
        save_final(state, run_dir / "checkpoints" / "final", result.saved_last)
        timing["final_ref_s"] = time.perf_counter() - t0  # the time plan's final-reference term (sheet/plan.py)
    timing["final_save_s"] = time.perf_counter() - t0


def _export(job: TrainJob, prep: Prepared, wrapped, state, run_dir: Path, rank: int, watch, phase,
            timing: dict) -> list:
    """The artifact, when the job saves one: the parts written (timed as ``export_s``)."""
    if not job.save_artifact:
        return []
    phase("exporting the artifact")
    t0 = time.perf_counter()
    with watch("export", {"update": state.update, "path": "artifact"}):
        artifact = export_artifact(prep.task, wrapped, run_dir / "artifact", rank, prep.c.train.strategy)
    timing["export_s"] = time.perf_counter() - t0
    return artifact


def _summary(job: TrainJob, t, state, result, world: int, *, arith: dict, artifact: list, bound,
             timing: dict) -> dict:
    """The run's summary in the journal: its outcome, arithmetic, timing and the counts the time check reads
    (``t``: the campaign's train section)."""
    return {"reason": result.reason, "updates": state.update, "examples_seen": state.examples_seen,
            "wall_s": result.wall_s, "final_val_loss": result.evals[-1]["val_loss"] if result.evals else None,
            "first_val_loss": result.evals[0]["val_loss"] if result.evals else None,
            "best_metric": state.best_metric, "artifact": artifact, "arithmetic": arith, "ranks": world,
            "seconds_per_update": _median(result.seconds[1:] or result.seconds),
            "memory_bound": bound, "timing": timing, "skipped_updates": result.skipped,
            "counts": {"updates": state.update, "evals": len(result.evals),
                       "checkpoints": (state.update // t.save_every if t.save_every else 0)
                       + (result.saved_last is None),  # final is a save only when it is no reference
                       "exports": int(bool(job.save_artifact))},
            **_reference_said(state.model)}


def _reference_said(model) -> dict:
    """A precomputed reference's pairs and their data fingerprint (the values are in each checkpoint)."""
    table = table_of(model)
    return {"reference_logps": {"pairs": len(table), "fingerprint": table.fingerprint()}} if table else {}



def _result(kind: str, run_id: str, run_dir: str, out: dict, world: int) -> StageResult:
    summary, evals = out["summary"], out["evals"]
    bound = summary["memory_bound"]
    status = out["status"]
    skip_warn, skip_msgs = skipped_lines(summary.get("skipped_updates") or [], summary["updates"])
    verdict = "fail" if status != "completed" else "warn" if bound["warnings"] or skip_warn else "ok"
    msgs = [f"run {run_id}: {status} — {summary['reason']}",
            f"{summary['updates']} updates, {summary['examples_seen']} examples seen in {summary['wall_s']:.1f}s"
            + (f" on {world} ranks" if world > 1 else "")]
    if evals:
        msgs.append(f"val_loss {evals[0]['val_loss']:.4f} (update {evals[0]['update']}) → "
                    f"{evals[-1]['val_loss']:.4f} (update {evals[-1]['update']})")
    msgs += skip_msgs
    msgs += bound_lines(bound)
    return StageResult(kind, verdict, f"{kind} run {run_id} {status}", msgs,
                       {"run_id": run_id, "status": status, "reason": summary["reason"],
                        "updates": summary["updates"], "examples_seen": summary["examples_seen"], "validation": evals,
                        "control_predictions": out["control"], "run_dir": run_dir},
                       columns=["update", "val_loss", "examples_seen"], rows=evals)


OVERFLOW_SHARE = 0.25  # fp16 overflow skips above this share of the updates: the scale never settled


def skipped_lines(skipped: list[dict], updates: int, show: int = 5) -> tuple[bool, list[str]]:
    """(worth a warning, what ``train`` prints) about updates whose optimizer step was skipped; the journal has
    them too (split "skipped", keyed by attempt). A non-finite loss always warns. fp16 overflow skips are
    GradScaler settling its scale (65536 halves until the gradients fit: a handful of updates at the start);
    they warn only when they are over OVERFLOW_SHARE of the updates."""
    bad = [s for s in skipped if s.get("kind") != "overflow"]
    overflow = [s for s in skipped if s.get("kind") == "overflow"]
    lines = []
    if bad:
        lines.append(f"{len(bad)} update(s) skipped for a non-finite loss (train.stop.on_nan=false), no optimizer "
                     "step (journal split 'skipped', by attempt):")
        for s in bad[:show]:
            ids = ", ".join(str(i) for i in s["ids"][:4]) + (" …" if len(s["ids"]) > 4 else "")
            lines.append(f"  attempt {s['attempt']} (update {s['update']}): loss {s['loss']:.4g} — {s['reason']}; "
                         f"records {ids}")
        if len(bad) > show:
            lines.append(f"  … and {len(bad) - show} more")
    too_many = bool(overflow) and len(overflow) > OVERFLOW_SHARE * max(updates, 1)
    if overflow:
        last = overflow[-1]["reason"].rsplit("→", 1)[-1].strip()
        lines.append(f"{len(overflow)} of {updates} updates skipped by the fp16 grad scaler (gradient overflow), "
                     f"the last at update {overflow[-1]['update']}; loss scale now {last}"
                     + (f" — over {OVERFLOW_SHARE:.0%} of the budget: train in bf16-mixed, or lower train.lr"
                        if too_many else " (the scale settling: expected in the first updates)"))
    return bool(bad) or too_many, lines


def record_memory_bound(journal, run_id: str, name: str, sha: str, observed: list[dict],
                        run_config: dict | None = None) -> dict:
    """The run's observed peaks (``PeakWatch.rows()``, every rank's) as ledger rows, each against the pilot's
    peak for the same phase kind and rank: for a mixture of experts, the peak of the worst routing the pilot
    measured, as the sheet sizes it (``routing_worst``): the router's choice moves with the data and the weights."""
    pilot, stale = find_pilot(journal, name, sha, run_config)
    pilot_rows = routing_worst(journal.phase_rows(pilot["run_id"]), pilot_routing(pilot)) if pilot else []
    rows, bound = bound_rows(observed, pilot_rows, pilot["run_id"] if pilot else None)
    if stale and run_config is not None:  # find_pilot took it for want of one that measured this config
        bound["stale"] = f"{stale} (the ratio compares different work)"
    journal.add_phase_rows(run_id, rows)
    return bound


def bound_lines(bound: dict) -> list[str]:
    """What ``train``, ``sweep`` and ``show`` print about the memory bound."""
    if not bound:
        return []
    if not bound.get("pilot_run"):
        return ["memory bound: no pilot of this campaign in the journal to compare the run's peaks with"]
    ratio = bound.get("max_ratio")
    counter = next((k.get("counter") for k in (bound.get("kinds") or {}).values()), None)
    what = {"tensors+rss": " (live tensor bytes, exact)", "cuda": " (CUDA allocated bytes)",
            "rss": " (RSS, 10% allowance)"}.get(counter, "")
    verdict = " — exceeded: the pilot did not see the worst case" if bound.get("warnings") else " — held"
    head = (f"memory bound{what}: observed peak / pilot {bound['pilot_run']} peak ≤ {ratio:.3f}{verdict}"
            if ratio is not None else f"memory bound: nothing comparable with pilot {bound['pilot_run']}")
    return [head] + [f"WARNING {w}" for w in bound.get("warnings", [])] + ([bound["stale"]] if bound.get("stale")
                                                                           else [])


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


