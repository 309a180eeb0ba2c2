"""train: one run through the loop, with a new run id; checkpoint, artifact and control predictions."""

from __future__ import annotations

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
              validation_predictions: bool = False) -> StageResult:
    """Prepare everything that can fail on bad input first; only then create the run."""
    prep = prep or prepare(loaded, splits=("train", "validation"))
    c = prep.c
    arith = prep.arithmetic()
    model = prep.task.build_model()
    device = default_device()
    model.to(device)
    state = make_state(model, c.train, n_train=len(prep.train), seed=c.seed, total_updates=arith["updates"],
                       device=device)
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
                    wall_s=ev["wall_s"])
            if user.on_eval:
                user.on_eval(st, ev)

        loop_hooks = Hooks(on_update=on_update, on_eval=on_eval, on_checkpoint=user.on_checkpoint,
                           stop_at=user.stop_at)
        bar = _progress_bar(arith["updates"]) if progress else None
        try:
            result = train(state, prep.task, prep.train, prep.validation, c.train, plan_metric=c.plan.metric,
                           goal=c.plan.goal, checkpoint_dir=rec.dir / "checkpoints", hooks=loop_hooks,
                           progress=bar.advance if bar else None)
        finally:
            if bar:
                bar.close()
        from pilotrun.engine.state import save_state

        save_state(state, rec.dir / "checkpoints" / "final")
        artifact = prep.task.save_artifact(model, rec.dir / "artifact") if save_artifact else []
        control = store_control_predictions(rec, prep, model)
        if validation_predictions:
            from pilotrun.stages.val_predictions import store_validation_predictions

            store_validation_predictions(rec, prep, model)
        summary = {"reason": result.reason, "updates": state.update, "examples_seen": state.examples_seen,
                   "wall_s": result.wall_s, "final_val_loss": result.evals[-1]["val_loss"] if result.evals else None,
                   "first_val_loss": result.evals[0]["val_loss"] if result.evals else None,
                   "best_metric": state.best_metric, "artifact": artifact, "arithmetic": arith,
                   "seconds_per_update": _median([h["seconds"] for h in result.history[1:]] or
                                                 [h["seconds"] for h in result.history])}
        write_run_readme(rec.dir, journal.get_run(rec.run_id))
        write_manifest(rec.dir, {"kind": "pilotrun-run", "run_id": rec.run_id})
        rec.finish(result.status, summary)
    verdict = "ok" if result.status == "completed" else "fail"
    evals = [{"update": e["update"], "val_loss": e["val_loss"], "examples_seen": e["examples_seen"]}
             for e in result.evals]
    msgs = [f"run {rec.run_id}: {result.status} — {result.reason}",
            f"{state.update} updates, {state.examples_seen} examples seen in {result.wall_s:.1f}s"]
    if evals:
        msgs.append(f"val_loss {evals[0]['val_loss']:.4f} (update {evals[0]['update']}) → "
                    f"{evals[-1]['val_loss']:.4f} (update {evals[-1]['update']})")
    return StageResult(kind, verdict, f"{kind} run {rec.run_id} {result.status}", msgs,
                       {"run_id": rec.run_id, "status": result.status, "reason": result.reason,
                        "updates": state.update, "examples_seen": state.examples_seen, "validation": evals,
                        "control_predictions": len(control), "run_dir": str(rec.dir)},
                       columns=["update", "val_loss", "examples_seen"], rows=evals)


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
