"""The phase ledger inside a Lightning ``Trainer``: one callback, no change to the user's module.

    from pilotrun.integrations.lightning import PilotrunLightningCallback
    trainer = lightning.pytorch.Trainer(max_steps=..., callbacks=[PilotrunLightningCallback()])
    trainer.fit(module, train_loader, val_loader)

It opens a journal run of kind "lightning" and writes, per rank (``trainer.global_rank``), the ledger
rows of the phases

- ``load``: ``setup("fit")`` → the sanity check or the first training batch (model to its device,
  optimizers, the DDP wrap, the dataloaders);
- ``first_step`` and ``steady_step``: the first and second *optimizer* updates, from the first
  micro-batch of the update to the batch after which ``trainer.global_step`` moved — with
  ``accumulate_grad_batches=k`` that is k micro-batches (fewer at an epoch's short end, and then the
  row's inputs say ``micro_batches``);
- ``evaluation``: each validation run (``on_validation_start`` → ``on_validation_end``; the sanity
  check is one, with ``sanity_check: true`` in its inputs). A validation inside an update (a
  ``val_check_interval`` that does not fall on an update boundary) stays inside that step's row,
  which says so in its note;
- ``save``: each ``trainer.save_checkpoint`` (what ``ModelCheckpoint`` calls), write included,

with the probes of ``probe.memory`` on ``trainer.strategy.root_device``. Rank 0 creates the run (its id
is broadcast with ``trainer.strategy.broadcast``) and records the loss curve: per optimizer update the
mean training loss of its micro-batches (averaged over ranks) and the learning rate, and after each
validation the logged ``val*`` metrics (``val/loss`` is stored as ``val_loss``). A non-finite training
loss gives that step's row the verdict "nan" and the run the status "diverged" with the step named;
an exception in ``fit`` ends the run "failed" (Ctrl-C: "interrupted").

Lightning is imported here only (``lightning``, else ``pytorch_lightning``); install it with
``pip install pilotrun[lightning]``. One callback instance records one ``fit``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from pilotrun.integrations._common import STEP_NAMES, Recorder, is_number

try:
    from lightning.pytorch import Callback
except ImportError:  # the older package name
    try:
        from pytorch_lightning import Callback
    except ImportError as e:
        raise ImportError("pilotrun.integrations.lightning needs Lightning: pip install 'pilotrun[lightning]' "
                          "(or lightning>=2.2)") from e

KIND = "lightning"
_INSIDE_STEP = "includes a validation run that started inside this update"


class PilotrunLightningCallback(Callback):
    def __init__(self, home=None, name: str = "lightning", memory_limit: int | None = None, stop_on_nan: bool = True,
                 config: dict | None = None):
        """``stop_on_nan``: a non-finite training loss (the mean over ranks) stops ``fit`` (as pilotrun's
        loop does); False only records it. ``config``: what the run records as its config (e.g. a
        campaign's ``resolved_dict()``); default the trainer's and module's settings."""
        self.rec = Recorder(home, kind=KIND, name=name, memory_limit=memory_limit)
        self.config = config
        self.stop_on_nan = stop_on_nan
        self.journal, self.name, self.memory_limit = self.rec.journal, name, memory_limit
        self._device = None
        self._update_from = 0  # trainer.global_step when the current update's first micro-batch began
        self._in_update = False  # a micro-batch of the current update has begun
        self._losses: list[float] = []  # this rank's micro-batch losses of the current update
        self._micro_batches = 0  # micro-batches of the current update
        self._examples = 0  # examples this rank has trained on
        self._lr: float | None = None

    @property
    def run_id(self) -> str | None:
        return self.rec.run_id

    def _start(self, trainer, name: str, inputs: dict | None = None) -> None:
        self.rec.start(name, inputs, rank=trainer.global_rank, device=self._device)

    # --- fit: the run, load -------------------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit":
            return
        self._device = trainer.strategy.root_device
        if self.rec.run_id is None:
            config = self.config if self.config is not None else _config(trainer, pl_module)
            self.rec.create_run(config, seed=_seed(), is_rank0=trainer.is_global_zero,
                                broadcast=lambda obj: trainer.strategy.broadcast(obj, src=0))
        _wrap_save_checkpoint(trainer, self)
        self._start(trainer, "load", {"model": type(pl_module).__name__})

    def on_sanity_check_start(self, trainer, pl_module) -> None:
        self.rec.end("load")

    def on_train_start(self, trainer, pl_module) -> None:
        self.rec.end("load")
        self._update_from = trainer.global_step

    # --- optimizer updates --------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self._in_update:
            return
        self._in_update = True
        if self.rec.steps_seen < 2:
            inputs = {"micro_batch": _batch_size(batch), "accumulation": trainer.accumulate_grad_batches,
                      "step": trainer.global_step + 1}
            self._start(trainer, STEP_NAMES[min(self.rec.steps_seen, 1)], inputs)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        groups = getattr(optimizer, "param_groups", None)
        self._lr = float(groups[0]["lr"]) if groups and is_number(groups[0].get("lr")) else None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        loss = _loss_of(outputs)
        if loss is not None:
            # automatic optimization hands back the loss divided by accumulate_grad_batches
            self._losses.append(loss * trainer.accumulate_grad_batches if pl_module.automatic_optimization else loss)
        self._micro_batches += 1
        self._examples += _batch_size(batch) or 0
        if trainer.global_step == self._update_from:
            return  # gradients accumulate: the update is not done
        step, self._update_from, self._in_update = trainer.global_step, trainer.global_step, False
        mean = _mean_over_ranks(trainer, self._losses)
        if self.rec.is_open(*STEP_NAMES) and self._micro_batches != trainer.accumulate_grad_batches:
            self.rec.open.inputs["micro_batches"] = self._micro_batches  # a short update at an epoch's end
        self._losses, self._micro_batches = [], 0
        if mean is not None and not self.rec.check_finite(mean, step, "training loss") and self.stop_on_nan:
            trainer.should_stop = True  # the mean is over ranks: every rank stops at the same update
        for name in STEP_NAMES:
            self.rec.end(name)
        rank0 = trainer.is_global_zero
        values = {"loss": mean} if mean is not None else {}
        if self._lr is not None:
            values["lr"] = self._lr
        self.rec.log("train", step, values, is_rank0=rank0)
        self.rec.progress(step, self._examples * trainer.world_size, is_rank0=rank0)

    # --- validation ---------------------------------------------------------------------------------
    def on_validation_start(self, trainer, pl_module) -> None:
        if self.rec.is_open(*STEP_NAMES):
            self.rec.open.note = _INSIDE_STEP
            return
        self.rec.end("load")
        inputs = {"eval_batch": None, "step": trainer.global_step}
        if trainer.sanity_checking:
            inputs["sanity_check"] = True
        self._start(trainer, "evaluation", inputs)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if self.rec.is_open("evaluation") and self.rec.open.inputs.get("eval_batch") is None:
            self.rec.open.inputs["eval_batch"] = _batch_size(batch)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.rec.end("evaluation")
        if trainer.sanity_checking:
            return
        step = trainer.global_step
        values = {}
        for key, value in trainer.callback_metrics.items():
            if key.lower().startswith("val"):
                v = _number(value)
                if v is not None:
                    values[key.replace("/", "_")] = v
        for key, v in values.items():
            if "loss" in key:
                self.rec.check_finite(v, step, f"validation {key}")
        self.rec.log("validation", step, values, is_rank0=trainer.is_global_zero)

    # --- the end ------------------------------------------------------------------------------------
    def on_train_end(self, trainer, pl_module) -> None:
        self.rec.finish(updates=trainer.global_step, is_rank0=trainer.is_global_zero,
                        barrier=lambda: trainer.strategy.barrier("pilotrun-finish"))

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.rec.fail(exception, is_rank0=trainer.is_global_zero)


def _wrap_save_checkpoint(trainer, callback: "PilotrunLightningCallback") -> None:
    """Every ``trainer.save_checkpoint`` (ModelCheckpoint's, or the user's) becomes a save phase.
    Lightning has no hook after the file is written, hence the wrapper on this trainer instance."""
    original = trainer.save_checkpoint
    if getattr(original, "_pilotrun_callback", None) is callback:
        return

    def save_checkpoint(filepath, *args, **kwargs):
        rec = callback.rec
        if rec.is_open(*STEP_NAMES):  # a save inside an update: part of that step's row
            return original(filepath, *args, **kwargs)
        callback._start(trainer, "save", {"step": trainer.global_step})
        result = original(filepath, *args, **kwargs)
        rec.end("save")
        return result

    save_checkpoint._pilotrun_callback = callback
    trainer.save_checkpoint = save_checkpoint


def _config(trainer, pl_module) -> dict:
    hparams = getattr(pl_module, "hparams", None)
    return {"module": type(pl_module).__name__, "hparams": dict(hparams) if hparams else {},
            "max_steps": trainer.max_steps, "max_epochs": trainer.max_epochs,
            "accumulate_grad_batches": trainer.accumulate_grad_batches, "precision": str(trainer.precision),
            "world_size": trainer.world_size, "strategy": type(trainer.strategy).__name__,
            "accelerator": type(trainer.accelerator).__name__, "gradient_clip_val": trainer.gradient_clip_val,
            "val_check_interval": trainer.val_check_interval}


def _seed() -> int | None:
    seed = os.environ.get("PL_GLOBAL_SEED")  # set by lightning's seed_everything
    return int(seed) if seed is not None and seed.lstrip("-").isdigit() else None


def _batch_size(batch) -> int | None:
    """The leading dimension of the first tensor in a batch (a tensor, a mapping or a sequence)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else None
    if isinstance(batch, Mapping):
        items = batch.values()
    elif isinstance(batch, (list, tuple)):
        items = batch
    else:
        return None
    for item in items:
        n = _batch_size(item)
        if n is not None:
            return n
    return None


def _number(value) -> float | None:
    import torch

    if isinstance(value, torch.Tensor):
        return float(value.detach().float()) if value.numel() == 1 else None
    return float(value) if is_number(value) else None


def _loss_of(outputs) -> float | None:
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    return _number(outputs)


def _mean_over_ranks(trainer, losses: list[float]) -> float | None:
    """The mean micro-batch loss of this update over every rank (a collective when world_size > 1)."""
    if trainer.world_size > 1:
        import torch

        t = torch.tensor([sum(losses), float(len(losses))], dtype=torch.float64, device=trainer.strategy.root_device)
        total, count = (float(x) for x in trainer.strategy.reduce(t, reduce_op="sum"))
    else:
        total, count = sum(losses), float(len(losses))
    return total / count if count else None


PilotrunCallback = PilotrunLightningCallback  # the earlier name, kept for scripts that import it
