"""train: one run through the loop, with a new run id; checkpoint, artifact and control predictions."""

from __future__ import annotations

import time
from pathlib import Path

from pilotrun.engine.distributed import default_device
from pilotrun.engine.loop import Hooks, make_state, train
from pilotrun.journal.files import write_manifest
from pilotrun.journal.store import Journal
from pilotrun.stages.prepare import Prepared, prepare
from pilotrun.stages.result import StageResult
from pilotrun.stages.runs import RunRecorder, write_run_readme

CONTROL_EXAMPLES = 4  # validation examples whose predictions are stored with every run


def store_control_predictions(recorder: RunRecorder, prep: Prepared, model) -> list[dict]:
    """Predictions (journal) and top logits (control.safetensors) on the control inputs; before the manifest."""
    import torch

    from pilotrun.stages.control import save_control, target_logits, tokenizer_facts

    pool = prep.validation or prep.train
    control = pool[:CONTROL_EXAMPLES]
    if not control:
        return []
    model.eval()
    with torch.no_grad():
        batch = prep.task.collate(control)
        device = next(model.parameters()).device
        batch = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}
        preds = prep.task.predict(model, batch)
        logits = target_logits(prep.task, model, batch)
    items = [(e.rid, {"input_ids": e.input_ids, "labels": e.labels, "pred": p, **({"meta": e.meta} if e.meta else {})})
             for e, p in zip(control, preds)]
    recorder.journal.add_predictions(recorder.run_id, "control", items)
    if logits is not None:  # verify compares the reloaded artifact's logits with these
        save_control(recorder.dir, [e.rid for e in control], logits,
                     {"dtype": str(next(model.parameters()).dtype), "tokenizer": tokenizer_facts(prep.task)})
    return [{"rid": rid, **v} for rid, v in items]


def train_run(loaded, home, *, kind: str = "train", supersedes: str | None = None, sweep_id: str | None = None,
              arm: str | None = None, hooks: Hooks | None = None, progress: bool = True, prep: Prepared | None = None,
              save_artifact: bool = True, command: str | None = None,
              validation_predictions: bool = False, prepare_s: float | None = None) -> StageResult:
    """Prepare everything that can fail on bad input first; only then create the run."""
    from pilotrun.engine.distributed import world_rank
    from pilotrun.probe.memory import release_free_memory
    from pilotrun.probe.watch import PeakWatch

    t_start = time.perf_counter() - (prepare_s or 0.0)  # a caller that prepared for us says how long it took
    prep = prep or prepare(loaded, splits=("train", "validation"))
    c = prep.c
    arith = prep.arithmetic()
    t_prepared = time.perf_counter()
    release_free_memory()  # a sweep's runs share a process: start this one without the last one's leftovers
    t_load = time.perf_counter()
    model = prep.task.build_model()
    device = default_device()
    model.to(device)
    state = make_state(model, c.train, n_train=len(prep.train), seed=c.seed, total_updates=arith["updates"],
                       device=device)
    timing = {"prepare_s": t_prepared - t_start, "load_s": time.perf_counter() - t_load}
    watch = PeakWatch(device, rank=world_rank()[1])
    journal = Journal(home)
    with RunRecorder(journal, loaded, kind=kind, supersedes=supersedes, sweep_id=sweep_id, arm=arm,
                     command=command) as rec:
        user = hooks or Hooks()

        def on_update(st, out):
            rec.log("train", out["update"], {"loss": out["loss"], "lr": out["lr"], "grad_norm": out["grad_norm"],
                                             "targets": out["targets"]},
                    examples_seen=out["examples_seen"], wall_s=out["wall_s"])
            rec.progress(st.update, st.examples_seen)
            if user.on_update:
                user.on_update(st, out)

        def on_eval(st, ev):
            rec.log("validation", ev["update"], {"val_loss": ev["val_loss"]}, examples_seen=ev["examples_seen"],
                    wall_s=ev["wall_s"], flush=True)
            if user.on_eval:
                user.on_eval(st, ev)

        def on_checkpoint(st, path):
            rec.flush()  # a checkpoint's metrics are in the journal before anything resumes from it
            if user.on_checkpoint:
                user.on_checkpoint(st, path)

        loop_hooks = Hooks(on_update=on_update, on_eval=on_eval, on_checkpoint=on_checkpoint,
                           stop_at=user.stop_at, watch=watch)
        bar = _progress_bar(arith["updates"]) if progress else None
        try:
            result = train(state, prep.task, prep.train, prep.validation, c.train, plan_metric=c.plan.metric,
                           goal=c.plan.goal, checkpoint_dir=rec.dir / "checkpoints", hooks=loop_hooks,
                           progress=bar.advance if bar else None)
        finally:
            if bar:
                bar.close()
        from pilotrun.engine.state import save_state

        timing["loop_s"] = result.wall_s
        t0 = time.perf_counter()
        with watch("save", {"update": state.update, "path": "checkpoints/final"}):
            save_state(state, rec.dir / "checkpoints" / "final")
        timing["final_save_s"] = time.perf_counter() - t0
        artifact = []
        ran_out = result.status == "failed"  # out of memory: no artifact or predictions a later stage could trust
        if save_artifact and not ran_out:
            t0 = time.perf_counter()
            with watch("export", {"update": state.update, "path": "artifact"}):
                artifact = prep.task.save_artifact(model, rec.dir / "artifact")
            timing["export_s"] = time.perf_counter() - t0
        control = [] if ran_out else store_control_predictions(rec, prep, model)
        bound = record_memory_bound(journal, rec.run_id, c.name, loaded.config_sha256(), watch,
                                    loaded.resolved_dict())
        if validation_predictions and not ran_out:
            from pilotrun.stages.val_predictions import store_validation_predictions

            store_validation_predictions(rec, prep, model)
        summary = {"reason": result.reason, "updates": state.update, "examples_seen": state.examples_seen,
                   "wall_s": result.wall_s, "final_val_loss": result.evals[-1]["val_loss"] if result.evals else None,
                   "first_val_loss": result.evals[0]["val_loss"] if result.evals else None,
                   "best_metric": state.best_metric, "artifact": artifact, "arithmetic": arith,
                   "seconds_per_update": _median([h["seconds"] for h in result.history[1:]] or
                                                 [h["seconds"] for h in result.history]),
                   "memory_bound": bound, "timing": timing,
                   "counts": {"updates": state.update, "evals": len(result.evals),
                              "checkpoints": (state.update // c.train.save_every if c.train.save_every else 0) + 1,
                              "exports": int(bool(save_artifact))}}
        timing["total_s"] = time.perf_counter() - t_start
        write_run_readme(rec.dir, journal.get_run(rec.run_id))
        write_manifest(rec.dir, {"kind": "pilotrun-run", "run_id": rec.run_id})
        rec.finish(result.status, summary)
    verdict = "fail" if result.status != "completed" else "warn" if bound["warnings"] else "ok"
    evals = [{"update": e["update"], "val_loss": e["val_loss"], "examples_seen": e["examples_seen"]}
             for e in result.evals]
    msgs = [f"run {rec.run_id}: {result.status} — {result.reason}",
            f"{state.update} updates, {state.examples_seen} examples seen in {result.wall_s:.1f}s"]
    if evals:
        msgs.append(f"val_loss {evals[0]['val_loss']:.4f} (update {evals[0]['update']}) → "
                    f"{evals[-1]['val_loss']:.4f} (update {evals[-1]['update']})")
    msgs += bound_lines(bound)
    return StageResult(kind, verdict, f"{kind} run {rec.run_id} {result.status}", msgs,
                       {"run_id": rec.run_id, "status": result.status, "reason": result.reason,
                        "updates": state.update, "examples_seen": state.examples_seen, "validation": evals,
                        "control_predictions": len(control), "run_dir": str(rec.dir)},
                       columns=["update", "val_loss", "examples_seen"], rows=evals)


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def memory_keys_changed(a: dict, b: dict) -> list[str]:
    """Keys that differ between two resolved configs, except those that cannot change memory per step."""
    from pilotrun.stages.sheet import COST_FREE

    fa, fb = _flat(a), _flat(b)
    free = COST_FREE + ("plan", "hardware", "name", "train.updates", "train.epochs", "train.eval_every",
                        "train.save_every")
    return sorted(k for k in set(fa) | set(fb) if fa.get(k) != fb.get(k)
                  and not any(k == f or k.startswith(f + ".") for f in free))


def record_memory_bound(journal, run_id: str, name: str, sha: str, watch, run_config: dict | None = None) -> dict:
    """The run's observed peaks as ledger rows, each against the pilot's peak for the same phase kind."""
    from pilotrun.probe.watch import bound_rows
    from pilotrun.stages.sheet import find_pilot

    pilot, stale = find_pilot(journal, name, sha)
    pilot_rows = journal.phase_rows(pilot["run_id"]) if pilot else []
    rows, bound = bound_rows(watch.rows(), pilot_rows, pilot["run_id"] if pilot else None)
    if stale and run_config is not None:
        changed = memory_keys_changed(pilot["config"], run_config)
        if changed:
            bound["stale"] = (f"the pilot {pilot['run_id']} measured another setting of "
                              f"{', '.join(changed[:5])}: the ratio compares different work")
    journal.add_phase_rows(run_id, rows)
    return bound


def bound_lines(bound: dict) -> list[str]:
    """What ``train``, ``sweep`` and ``show`` print about the memory bound."""
    if not bound:
        return []
    if not bound.get("pilot_run"):
        return ["memory bound: no pilot of this campaign in the journal to compare the run's peaks with"]
    ratio = bound.get("max_ratio")
    head = (f"memory bound: observed peak / pilot {bound['pilot_run']} peak ≤ {ratio:.3f}"
            if ratio is not None else f"memory bound: nothing comparable with pilot {bound['pilot_run']}")
    return [head] + [f"WARNING {w}" for w in bound.get("warnings", [])] + ([bound["stale"]] if bound.get("stale")
                                                                           else [])


def _median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


class _progress_bar:
    """A rich progress bar on stderr: loss, lr and examples per second."""

    def __init__(self, total: int):
        import sys

        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[stats]}"), TimeRemainingColumn(),
                                 console=Console(file=sys.stderr), transient=False,
                                 disable=not sys.stderr.isatty())
        self.task = self.progress.add_task("train", total=total, stats="")
        self.progress.start()

    def advance(self, state, out) -> None:
        rate = out["examples"] / out["seconds"] if out["seconds"] else 0.0
        self.progress.update(self.task, completed=state.update,
                             stats=f"loss {out['loss']:.4f}  lr {out['lr']:.2e}  {rate:.1f} ex/s")

    def close(self) -> None:
        self.progress.stop()
