"""The phase ledger inside a Hugging Face ``Trainer``: one callback, no change to the user's loop.

    from pilotrun.integrations.hf_trainer import PilotrunTrainerCallback
    trainer = Trainer(model, args, train_dataset=..., callbacks=[PilotrunTrainerCallback()])
    trainer.train()

It opens a journal run of kind "hf-trainer" and writes, per rank, the ledger rows of the phases
``load`` (end of ``Trainer.__init__`` → ``on_train_begin``), ``first_step`` and ``steady_step``
(the first and second optimizer steps, ``on_step_begin`` → ``on_step_end``), ``evaluation``
(from the step that triggers it, or the first prediction step, → ``on_evaluate``) and ``save``
(→ ``on_save``), with the probes of ``probe.memory``. Rank 0 creates the run (its id is broadcast
to the other ranks), logs the Trainer's logs as the run's metrics (train loss/lr/grad_norm,
validation val_loss) and finishes the run at ``on_train_end``, after every rank wrote its rows:
"completed", or "diverged" naming the first step whose logged training loss, gradient norm or
validation loss is not finite. The Trainer has no exception hook: an exception that escapes
``train()`` and ends the process ends the run "failed" with it (at exit); where the process goes on (a
notebook), ``callback.failed(exc)`` records it at once.
The shared machinery is in ``integrations._common``.
"""

from __future__ import annotations

from transformers import TrainerCallback

from pilotrun.engine.distributed import barrier, broadcast_from_rank0, world_rank
from pilotrun.integrations._common import STEP_NAMES, Recorder, is_number

KIND = "hf-trainer"
_TRAIN_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad_norm"}


class PilotrunTrainerCallback(TrainerCallback):
    def __init__(self, home=None, name: str = "hf-trainer", memory_limit: int | None = None, stop_on_nan: bool = True,
                 config: dict | None = None):
        """``stop_on_nan``: a non-finite training loss or gradient norm stops training (as pilotrun's loop
        does: the updates after it are paid for and learn nothing); False only records it. ``config``: what
        the run records as its config (e.g. a campaign's ``resolved_dict()``, so the run carries the
        campaign's config hash); default the ``TrainingArguments``."""
        self.rec = Recorder(home, kind=KIND, name=name, memory_limit=memory_limit)
        self.config = config
        self.stop_on_nan = stop_on_nan
        self.journal, self.name, self.memory_limit = self.rec.journal, name, memory_limit

    @property
    def run_id(self) -> str | None:
        return self.rec.run_id

    def _start(self, name: str, inputs: dict | None = None) -> None:
        self.rec.start(name, inputs, rank=_rank())

    # --- Trainer events -----------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kw):
        self._start("load", {"model": type(kw.get("model")).__name__})

    def on_train_begin(self, args, state, control, **kw):
        if self.rec.run_id is None:
            config = self.config if self.config is not None else args.to_dict()
            self.rec.create_run(config, seed=args.seed, is_rank0=state.is_world_process_zero,
                                broadcast=broadcast_from_rank0)
            self.rec.end_run_at_exit(is_rank0=state.is_world_process_zero)
        if not self.rec.is_open("load"):
            self._start("load", {"model": type(kw.get("model")).__name__})
        self.rec.end("load")

    def on_step_begin(self, args, state, control, **kw):
        if self.rec.steps_seen < 2:
            inputs = {"micro_batch": args.per_device_train_batch_size,
                      "accumulation": args.gradient_accumulation_steps, "step": state.global_step + 1}
            self._start(STEP_NAMES[min(self.rec.steps_seen, 1)], inputs)

    def on_step_end(self, args, state, control, **kw):
        if self.rec.is_open(*STEP_NAMES):
            self.rec.end()
        self.rec.progress(state.global_step, state.global_step * args.per_device_train_batch_size
                          * args.gradient_accumulation_steps * args.world_size, is_rank0=state.is_world_process_zero)
        if control.should_evaluate:
            self._start("evaluation", {"eval_batch": args.per_device_eval_batch_size, "step": state.global_step})
        elif control.should_save:
            self._start("save", {"step": state.global_step})

    def on_prediction_step(self, args, state, control, **kw):
        if not self.rec.is_open():  # an evaluate() called outside a training step
            self._start("evaluation", {"eval_batch": args.per_device_eval_batch_size, "step": state.global_step})

    def on_evaluate(self, args, state, control, **kw):
        self.rec.end("evaluation")
        if control.should_save:
            self._start("save", {"step": state.global_step})

    def on_save(self, args, state, control, **kw):
        self.rec.end("save")

    def on_log(self, args, state, control, logs=None, **kw):
        if not logs:
            return
        step = state.global_step
        # the same numbers on every rank; the Trainer's logging_nan_inf_filter (on by default) keeps a
        # NaN step out of "loss", but not out of "grad_norm" (clipping on) or "eval_loss"
        for key, what in (("loss", "training loss"), ("grad_norm", "gradient norm"), ("eval_loss", "validation loss")):
            if is_number(logs.get(key)) and not self.rec.check_finite(float(logs[key]), step, what) \
                    and self.stop_on_nan and key != "eval_loss":
                control.should_training_stop = True  # every rank logs the same reduced numbers
        rank0 = state.is_world_process_zero
        self.rec.log("train", step, {_TRAIN_KEYS[k]: v for k, v in logs.items() if k in _TRAIN_KEYS}, is_rank0=rank0)
        self.rec.log("validation", step, {"val_loss": logs.get("eval_loss")}, is_rank0=rank0)

    def on_train_end(self, args, state, control, **kw):
        self.rec.finish(updates=state.global_step, is_rank0=state.is_world_process_zero, barrier=_barrier)

    def failed(self, exc: BaseException) -> None:
        """``trainer.train()`` raised ``exc`` and this process goes on: the open phase gets its error row and
        the run ends "failed" (or "interrupted" for Ctrl-C) now, not at exit."""
        self.rec.fail(exc, is_rank0=world_rank()[1] == 0)


PilotrunCallback = PilotrunTrainerCallback  # the earlier name, kept for scripts that import it


def _rank() -> int:
    return world_rank()[1]


def _barrier() -> None:
    barrier()


