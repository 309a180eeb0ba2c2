"""The phase ledger inside a Hugging Face ``Trainer``: one callback, no change to the user's loop.

    from pilotrun.integrations.hf_trainer import PilotrunCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[PilotrunCallback(home=".pilotrun")])
    trainer.train()

It opens a journal run of kind "hf-trainer" and writes, per rank, the ledger rows of the phases
``load`` (end of ``Trainer.__init__`` → ``on_train_begin``), ``first_step`` and ``steady_step``
(the first and second optimizer steps, ``on_step_begin`` → ``on_step_end``), ``evaluation``
(from the step that triggers it, or the first prediction step, → ``on_evaluate``) and ``save``
(→ ``on_save``), with the probes of ``probe.memory``. Rank 0 logs the Trainer's logs as the run's
metrics (train loss/lr/grad_norm, validation val_loss) and finishes the run at ``on_train_end``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from transformers import TrainerCallback

from pilotrun.probe.recorder import Phase

KIND = "hf-trainer"
_TRAIN_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}


class PilotrunCallback(TrainerCallback):
    def __init__(self, home, name: str = "hf-trainer", memory_limit: int | None = None):
        from pilotrun.journal.store import Journal

        self.journal = Journal(Path(home))
        self.name, self.memory_limit = name, memory_limit
        self.run_id: str | None = None
        self._open: Phase | None = None
        self._steps_seen = 0

    # --- the run ------------------------------------------------------------------------------------
    def _create_run(self, args, state) -> None:
        from pilotrun.stages.prepare import package_versions
        from pilotrun.stages.runs import command_line

        run_id = None
        if state.is_world_process_zero:
            config = json.loads(json.dumps(args.to_dict(), default=str))
            sha = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()
            run_id = self.journal.create_run(kind=KIND, name=self.name, config=config, config_sha256=sha,
                                             campaign_path=None, seed=args.seed, git_rev=None,
                                             packages=package_versions(), data={}, trust_remote_code=False,
                                             command=command_line())
        self.run_id = _broadcast(run_id)

    def _start(self, name: str, inputs: dict | None = None) -> None:
        self._end()
        self._open = Phase(name, inputs, rank=_rank(), memory_limit=self.memory_limit,
                           journal=self.journal if self.run_id else None, run_id=self.run_id).__enter__()

    def _end(self, name: str | None = None) -> None:
        if self._open is not None and (name is None or self._open.name == name):
            phase, self._open = self._open, None
            if phase.run_id is None and self.run_id is not None:  # load began before the run existed
                phase.journal, phase.run_id = self.journal, self.run_id
            phase.__exit__(None, None, None)

    # --- Trainer events -----------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kw):
        self._start("load", {"model": type(kw.get("model")).__name__})

    def on_train_begin(self, args, state, control, **kw):
        if self.run_id is None:
            self._create_run(args, state)
        if self._open is None or self._open.name != "load":
            self._start("load", {"model": type(kw.get("model")).__name__})
        self._end("load")

    def on_step_begin(self, args, state, control, **kw):
        if self._steps_seen < 2:
            inputs = {"micro_batch": args.per_device_train_batch_size,
                      "accumulation": args.gradient_accumulation_steps, "step": state.global_step + 1}
            self._start("first_step" if self._steps_seen == 0 else "steady_step", inputs)

    def on_step_end(self, args, state, control, **kw):
        if self._open is not None and self._open.name in ("first_step", "steady_step"):
            self._end()
            self._steps_seen += 1
        if self.run_id and state.is_world_process_zero:
            self.journal.update_progress(self.run_id, updates_done=state.global_step,
                                         examples_seen=state.global_step * args.per_device_train_batch_size
                                         * args.gradient_accumulation_steps * args.world_size)
        if control.should_evaluate:
            self._start("evaluation", {"eval_batch": args.per_device_eval_batch_size, "step": state.global_step})
        elif control.should_save:
            self._start("save", {"step": state.global_step})

    def on_prediction_step(self, args, state, control, **kw):
        if self._open is None:  # an evaluate() called outside a training step
            self._start("evaluation", {"eval_batch": args.per_device_eval_batch_size, "step": state.global_step})

    def on_evaluate(self, args, state, control, **kw):
        self._end("evaluation")
        if control.should_save:
            self._start("save", {"step": state.global_step})

    def on_save(self, args, state, control, **kw):
        if self._open is None:
            return
        self._end("save")

    def on_log(self, args, state, control, logs=None, **kw):
        if not (self.run_id and state.is_world_process_zero and logs):
            return
        step = state.global_step
        train = {_TRAIN_KEYS[k]: v for k, v in logs.items() if k in _TRAIN_KEYS and _is_number(v)}
        if train:
            self.journal.add_metrics(self.run_id, [("train", k, step, float(v), None, None) for k, v in train.items()])
        if _is_number(logs.get("eval_loss")):
            self.journal.add_metrics(self.run_id, [("validation", "val_loss", step, float(logs["eval_loss"]), None,
                                                    None)])

    def on_train_end(self, args, state, control, **kw):
        self._end()
        if self.run_id and state.is_world_process_zero:
            verdicts = [r["verdict"] for r in self.journal.phase_rows(self.run_id)]
            self.journal.finish_run(self.run_id, "completed", {"updates": state.global_step, "phases": len(verdicts),
                                                               "failing": sum(v != "ok" for v in verdicts)})


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _rank() -> int:
    from pilotrun.engine.distributed import world_rank

    return world_rank()[1]


def _broadcast(run_id: str | None) -> str | None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [run_id]
        dist.broadcast_object_list(box, src=0)
        return box[0]
    return run_id
