"""The one training loop. Every check (overfit, pilot, resume, sweep) runs through these functions.

Reading order: ``TrainState`` (what a run is), ``run_update`` (one optimizer update),
``evaluate`` (validation loss), ``train`` (the loop: sample → update → log → eval → stop rules →
checkpoint).

The loss of an update is the sum of per-target losses over all its micro-batches and ranks divided
by the number of targets in the whole update. Counting the targets first and dividing each
micro-batch's sum by that total makes K accumulated micro-batches equal one batch of K·m, even
when their lengths differ — a per-micro-batch mean would weight short batches' tokens more.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable

from pilotrun import signals
from pilotrun.console.progress import note
from pilotrun.engine.distributed import agree_max, all_reduce_sum, world_rank
from pilotrun.engine.oom import is_oom
from pilotrun.engine.optim import make_optimizer, make_scheduler
from pilotrun.engine.precision import autocast, make_scaler
from pilotrun.engine.sampler import UpdateSampler, update_key
from pilotrun.engine.state import retain_checkpoints, save_state
from pilotrun.errors import BadInput
from pilotrun.journal.store import check_fence
from pilotrun.tasks.base import loss_parts
from pilotrun.verdicts import plural

OOM_ENV = "PILOTRUN_TEST_OOM_AT_UPDATE"  # test switch only: see _planted_oom


def _planted_oom(update: int, loss) -> None:
    """Test switch: ``$PILOTRUN_TEST_OOM_AT_UPDATE=K`` raises a CUDA-style out-of-memory error inside the
    K-th optimizer update of every run (after its first backward pass), because a CPU box cannot be made to
    run out of memory on cue; tests use it to prove each stage turns it into a verdict. Never set it outside tests.
    Fake tensors (``estimate``) allocate nothing, so nothing is planted there."""
    planted = os.environ.get(OOM_ENV)
    if planted and planted.strip() == str(update) and getattr(loss, "fake_mode", None) is None:
        import torch

        raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB (planted at update {update} "
                                     f"by the test switch {OOM_ENV})")


def out_of_memory_reason(state: "TrainState", where: str, exc: BaseException) -> str:
    """Free what the failed update held and say what to change; the run ends as failed, with this reason."""
    state.optimizer.zero_grad(set_to_none=True)
    if getattr(state.device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.empty_cache()
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return (f"out of memory at {where}: {first} — lower train.micro_batch (raise train.accumulation to keep the "
            "effective batch) or train.eval_batch, or set model.gradient_checkpointing=true; "
            "`pilotrun fit CAMPAIGN --memory-limit SIZE` measures the variants that fit")


@dataclass
class TrainState:
    model: Any
    optimizer: Any
    scheduler: Any
    scaler: Any
    sampler: UpdateSampler
    precision: str
    device: Any
    total_updates: int
    update: int = 0
    examples_seen: int = 0
    initial_loss: float | None = None
    best_metric: float | None = None
    evals_without_improvement: int = 0
    best_checkpoint: dict | None = None  # {"update", "metric"}: the saved checkpoint best by plan.metric
    attempts: int = 0  # updates tried, skipped ones included: the key of the journal's "skipped" rows
    bound: bool = False  # total_updates is a ceiling the run may stop before (overfit): said "≤", "at most … left"

    def counters(self) -> dict:
        return {"update": self.update, "examples_seen": self.examples_seen, "initial_loss": self.initial_loss,
                "best_metric": self.best_metric, "evals_without_improvement": self.evals_without_improvement,
                "total_updates": self.total_updates, "attempts": self.attempts,
                "best_checkpoint": self.best_checkpoint}

    def load_counters(self, d: dict) -> None:
        for k in ("update", "examples_seen", "initial_loss", "best_metric", "evals_without_improvement"):
            setattr(self, k, d[k])
        self.attempts = int(d.get("attempts", self.update))  # states saved before attempts were counted
        self.best_checkpoint = d.get("best_checkpoint")

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])


def make_state(model, t, *, n_train: int, seed: int, total_updates: int, device=None,
               kernel_device: str | None = None, sharded: bool = False) -> TrainState:
    """A fresh state for a model: optimizer, schedule, scaler and sampler from the train section ``t``.
    ``kernel_device`` and ``sharded``: the device whose optimizer kernel to step with (``optim.kernel``) and
    whether its parameters would be FSDP's shards, where fake parameters stand for them (the estimator)."""
    import torch

    world, rank = world_rank()
    device = device or torch.device("cpu")
    optimizer = make_optimizer(model, t, kernel_device, sharded)
    return TrainState(model=model, optimizer=optimizer, scheduler=make_scheduler(optimizer, t, total_updates),
                      scaler=make_scaler(t.precision, device.type),
                      sampler=UpdateSampler.for_train(t, n_train, seed, rank, world),
                      precision=t.precision, device=device, total_updates=total_updates)


def to_device(batch: dict, device) -> dict:
    """A collated batch on the device (what is not a tensor stays as it is)."""
    return {k: (v.to(device) if hasattr(v, "to") else v) for k, v in batch.items()}


class NoTargets(BadInput):
    """An update whose every label is masked: no loss to train on. The data's fault in a campaign (exit 2); in
    ``fit``'s probe of a shorter data.max_length, that candidate's (rehearsal/memory/fit_probe.probe)."""


def run_update(state: TrainState, task, micro_batches: list[list], *, max_grad_norm: float | None,
               step: bool = True, zero_grad: bool = True) -> dict:
    """One optimizer update over this rank's micro-batches (lists of encoded examples).

    Returns the update's loss (normalised over all its targets on all ranks), its target count,
    the gradient norm before clipping, the lr used and whether the loss was finite. A non-finite
    loss skips the optimizer step. ``step=False, zero_grad=False`` leaves the accumulated gradients
    in place for checks that compare them.
    """
    import torch

    model, opt = state.model, state.optimizer
    world, _ = world_rank()
    batches = [to_device(task.collate(mb), state.device) for mb in micro_batches if mb]
    local_targets = sum(task.count_targets(b) for b in batches)
    total_targets = all_reduce_sum(local_targets, state.device)
    if total_targets == 0:  # the data's fault, not pilotrun's: exit 2 naming the examples (exit 3 before)
        rids = [e.rid for mb in micro_batches for e in mb]
        files = {r.rpartition(":")[0] for r in rids}  # "file:line": one file's lines said as lines, not paths
        shown = [r.rpartition(":")[2] for r in rids] if len(files) == 1 and ":" in rids[0] else rids
        raise NoTargets(f"update {state.update + 1} has no target tokens: every label of its "
                       f"{plural(len(rids), 'example')} is masked ({'lines ' if shown is not rids else ''}"
                       f"{', '.join(shown[:8])}{' …' if len(rids) > 8 else ''}), so there is no loss to train on",
                       where=rids[0] if rids else "data.max_length",
                       fix="raise data.max_length so that each answer keeps its tokens, or check data.response / "
                           "data.messages (the assistant turns); `pilotrun inspect` names every such example and "
                           "the data.max_length that keeps them")
    loss_sum = 0.0
    part_sums: dict[str, float] = {}
    model.train()
    for i, batch in enumerate(batches):
        # DDP averages gradients over ranks; multiplying by world turns that back into the global sum.
        sync = i == len(batches) - 1 or not hasattr(model, "no_sync")
        with (contextlib.nullcontext() if sync else model.no_sync()):
            with autocast(state.precision, state.device.type):
                s, _, parts = loss_parts(task.loss(model, batch))
            scaled = s * (world / total_targets)
            (state.scaler.scale(scaled) if state.scaler is not None else scaled).backward()
        loss_sum += float(s.detach())
        for k, v in parts.items():
            part_sums[k] = part_sums.get(k, 0.0) + float(v)
        if i == 0:
            _planted_oom(state.update + 1, s)
    loss = all_reduce_sum(loss_sum, state.device) / total_targets
    # the parts of the loss besides the targets' (a router's auxiliary loss), on the same scale: loss includes them
    loss_parts_ = {k: all_reduce_sum(v, state.device) / total_targets for k, v in sorted(part_sums.items())}
    finite = math.isfinite(loss)
    lr = state.lr
    params = [p for p in model.parameters() if p.requires_grad]
    # The scaler unscales, clips, steps and updates its scale once per update, after all passes.
    if state.scaler is not None:
        state.scaler.unscale_(opt)
    if step:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf")))
    else:  # measure without clipping, so the gradients stay as accumulated
        grads = [p.grad.detach().norm() for p in params if p.grad is not None]
        grad_norm = float(torch.stack(grads).norm()) if grads else 0.0
    why = "non-finite loss"
    if finite and state.scaler is None and not math.isfinite(grad_norm):
        # a finite loss with inf/NaN gradients would write NaN into every weight; with a scaler it is an overflow
        finite, why = False, f"non-finite gradient norm ({grad_norm}) with a finite loss"
    skipped = None
    if step:
        state.attempts += 1
        skipped = _step(state, finite, why)
        if finite:  # an fp16 overflow counts as an update, as in torch's AMP recipe: the schedule moves on
            with warnings.catch_warnings():  # torch's "lr_scheduler.step() before optimizer.step()": the skip is ours
                warnings.simplefilter("ignore", UserWarning)
                state.scheduler.step()
    if zero_grad:
        opt.zero_grad(set_to_none=True)
    n_examples = int(all_reduce_sum(sum(len(mb) for mb in micro_batches), state.device))
    if step and finite:
        state.update += 1
        state.examples_seen += n_examples
    return {"loss": loss, **({"loss_parts": loss_parts_} if loss_parts_ else {}),
            "targets": int(total_targets), "grad_norm": grad_norm, "lr": lr, "finite": finite,
            "examples": n_examples, "skipped": skipped, "attempt": state.attempts,
            "metrics": task_metrics(task, state.device), **({} if finite else {"why": why})}


def task_metrics(task, device, prefix: str = "") -> dict:
    """What a task says its loss saw since it last said (``take_metrics``, optional: preference's reward accuracy and
    margin), summed over the ranks (every rank reduces the same sums, seen or not); ``{}`` for a task that says
    nothing."""
    take = getattr(task, "take_metrics", None)
    if take is None:
        return {}
    return {prefix + k: v for k, v in take(lambda x: all_reduce_sum(x, device)).items()}


def _step(state: TrainState, finite: bool, why: str) -> str | None:
    """The optimizer step of one update, or its skip; returns why it was skipped (None when it stepped).

    With a grad scaler, ``update()`` runs after every unscaled update, skipped or not: it is what lowers the
    scale after an overflow and resets the scaler for the next ``unscale_`` (an update left out makes the next
    one raise "unscale_() has already been called"). ``scaler.step`` itself skips when the gradients hold
    inf/NaN; a non-finite loss never steps, even where its gradients happen to be finite."""
    scaler, opt = state.scaler, state.optimizer
    if scaler is None:
        if finite:
            opt.step()
        return None if finite else why
    before = float(scaler.get_scale())
    if finite:
        scaler.step(opt)
    scaler.update()
    after = float(scaler.get_scale())
    scale = f"fp16 loss scale {before:g} → {after:g}"
    if not finite:
        return f"{why}; {scale}"
    return f"inf/NaN gradients (fp16 overflow); {scale}" if after < before else None


def evaluate(state: TrainState, task, examples: list, batch_size: int) -> dict:
    """Validation loss over the examples (this rank's shard under torch.distributed), per target."""
    import torch

    world, rank = world_rank()
    mine = examples[rank::world]
    model = state.model
    was_training = model.training
    model.eval()
    if hasattr(task, "take_metrics"):
        task.take_metrics()  # what the task's loss saw before this validation is not its (here: no collective)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(mine), batch_size):
            batch = to_device(task.collate(mine[i: i + batch_size]), state.device)
            with autocast(state.precision, state.device.type):
                s, n, parts = loss_parts(task.loss(model, batch))
            total += float(s)
            count += int(n)
            # not held through the next batch's forward: every batch starts from the same tensors (a router's
            # auxiliary term in ``parts`` too: kept, it put 4 bytes over the pilot's one batch)
            del batch, s, n, parts
    if was_training:
        model.train()
    _reshard(model)
    total, count = all_reduce_sum(total, state.device), all_reduce_sum(count, state.device)
    return {"val_loss": total / count if count else float("nan"), "targets": int(count), "examples": len(examples),
            **task_metrics(task, state.device, "val_")}


def precompute_reference(model, task, examples: list, *, device, precision: str, batch_size: int,
                         update: int = 0, shared: bool = False) -> int:
    """``preference.reference: precomputed``: the model's no-grad forward over the pairs of ``examples`` that have
    no reference log-probabilities yet (or whose tokens changed), longest first, ``batch_size`` pairs a batch, under
    the run's precision, into the table the model carries (tasks/preference_ref.py). ``shared``: every rank passed
    the same ``examples`` (a run's whole data): under DDP each rank computes its share, the values then gathered, so
    every rank's table is whole; otherwise (the pilot's worst case, a rank's own sampled updates) each rank computes
    what it was given. Only the starting model may be
    the reference: at ``update`` > 0 (a resumed run, whose table came with its checkpoint) a missing or changed pair is
    exit 2, never recomputed with the trained policy. Returns the pairs computed (0 for any other task)."""
    import torch

    from pilotrun.tasks.preference_loss import unwrapped
    from pilotrun.tasks.preference_ref import stale

    if not getattr(task, "precomputes_reference", lambda m: False)(model):
        return 0
    table = task.reference_table(model)
    absent, changed = table.missing(examples)
    if not absent and not changed:
        return 0
    if update > 0:
        raise stale(absent, changed, table, update)
    todo = sorted(absent + changed, key=lambda e: e.length, reverse=True)
    world, rank = world_rank() if shared else (1, 0)
    mine = todo[rank::world]  # under DDP each rank its share (the longest first on every rank), then all of them
    inner = unwrapped(model)
    was = inner.training
    inner.eval()
    try:
        with torch.no_grad():
            for i in range(0, len(mine), batch_size):
                part = mine[i: i + batch_size]
                batch = to_device(task.collate(part), device)
                with autocast(precision, device.type):
                    task.store_reference(inner, batch, part)
                del batch
    finally:
        inner.train(was)
    if world > 1:
        _share_reference(task.reference_table(model), todo, world, rank, device)
    return len(todo)


def _share_reference(table, todo: list, world: int, rank: int, device) -> None:
    """The other ranks' shares of the precomputed pairs (``todo[r::world]``) into this rank's table, which holds its
    own: one all-gather of the values (each rank knows which pairs the others computed, so only the numbers travel,
    no pickle)."""
    import torch
    import torch.distributed as dist

    size = -(-len(todo) // world)
    mine = [table.entries[e.rid][1] for e in todo[rank::world]]
    values = torch.tensor(mine + [(0.0, 0.0)] * (size - len(mine)), dtype=torch.float32, device=device)
    parts = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(parts, values)
    for r, part in enumerate(parts):
        if r == rank:  # already in the table, fingerprinted when computed
            continue
        share = todo[r::world]
        table.put(share, part[:len(share), 0].cpu(), part[:len(share), 1].cpu())


def rate_text(examples: int, seconds: float) -> str:
    """Examples per second for a progress line, never ``0.0`` for a rate above zero: a large model on a CPU
    takes minutes per update (0.04 ex/s), which one decimal place rounded to nothing."""
    if not seconds or not examples:
        return "0 ex/s" if seconds else "? ex/s"
    rate = examples / seconds
    return f"{rate:.1f} ex/s" if rate >= 1 else f"{rate:.2g} ex/s ({seconds / examples:.3g} s/ex)"


def update_line(state, out: dict) -> str:
    """The progress line of one update: its number, loss, learning rate and examples per second."""
    parts = "".join(f" ({k} {v:.4f})" for k, v in out.get("loss_parts", {}).items())
    total = f"≤{state.total_updates}" if state.bound else state.total_updates
    return (f"update {state.update}/{total}, loss {out['loss']:.4f}{parts}, lr {out['lr']:.2e}, "
            f"{rate_text(out['examples'], out['seconds'])}")


def _reshard(model) -> None:
    """FSDP2 keeps the root module's parameters gathered after a forward without backward: free them, so
    what follows a validation (a save, an export) does not hold the root's full weights."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return
    if isinstance(model, FSDPModule):
        model.reshard()


@dataclass
class LoopResult:
    status: str  # completed | diverged | stopped | failed (out of memory) | interrupted
    reason: str
    history: list[dict] = field(default_factory=list)
    """Each update's record (loss, lr, the micro-batches' example ids, ...); with ``train(keep_history=False)``
    only the latest: a run of a million updates would otherwise hold ~1 KB per update until it ends."""
    seconds: array = field(default_factory=lambda: array("d"))  # every update's seconds, 8 bytes each
    evals: list[dict] = field(default_factory=list)
    wall_s: float = 0.0
    skipped: list[dict] = field(default_factory=list)  # updates whose optimizer step was skipped, and why
    saved_last: str | None = None  # the numbered checkpoint saved as the loop's last act: it is the end state
    reference_s: float = 0.0  # preference.reference: precomputed, the pass over the pairs before the first update


@dataclass
class Hooks:
    """Optional callbacks; a stage that needs something unusual gets it here, never by copying the loop."""

    on_update: Callable[[TrainState, dict], None] | None = None
    on_eval: Callable[[TrainState, dict], None] | None = None
    on_checkpoint: Callable[[TrainState, Any], None] | None = None
    stop_at: int | None = None  # end the loop after this update (resume tests)
    at_checkpoint: Callable[[TrainState], None] | None = None
    """Called after every update where the loop saves its checkpoints (after the update's validation and stop
    rules): the state is then what a checkpoint of that update holds. Resume's reference saves its state at K
    there and goes on."""
    stop_when: Callable[[TrainState, dict], bool] | None = None
    """End the loop after an update for which it returns True (overfit: the loss under its threshold)."""
    watch: Callable[[str, dict], Any] | None = None
    """A context manager factory ``watch(kind, inputs)`` wrapped around every update ("train"),
    validation ("evaluation") and checkpoint ("save"): probe.watch.PeakWatch keeps their peaks."""


def _unwatched(kind: str, inputs: dict):
    return contextlib.nullcontext()


class _RanOut(Exception):
    def __init__(self, where: str, exc: BaseException):
        super().__init__(where)
        self.where, self.exc = where, exc


@contextlib.contextmanager
def _out_of_memory_ends_run(where: str):
    """An out-of-memory error inside the block ends the run (``train`` catches ``_RanOut`` once); others propagate."""
    try:
        yield
    except Exception as e:
        if not is_oom(e):
            raise
        raise _RanOut(where, e) from e


def plan_value(ev: dict, metric: str) -> float:
    """plan.metric's value in a validation's results; a metric the validation did not log is bad input (a custom
    task's ``take_metrics`` without it: ``validate`` knows the built-in tasks' names), never another metric in its
    place, whose direction the plan's goal may not share."""
    if not metric.startswith("val_") or metric not in ev:
        logged = sorted(k for k in ev if k.startswith("val_"))
        raise BadInput(f"{metric!r} is not among the metrics this validation logged ({', '.join(logged)})",
                       where="plan.metric", fix=f"set plan.metric to one of {', '.join(logged)}, or report it from "
                                                "the task's take_metrics (as <name>: logged as val_<name>)")
    return ev[metric]


def note_best_checkpoint(state: TrainState, evals: list[dict], metric: str, goal: str) -> None:
    """Before a checkpoint of ``state.update`` is saved: it becomes the best checkpoint when a validation of this
    very update beats the best one saved so far (train.keep_checkpoints keeps it)."""
    ev = evals[-1] if evals and evals[-1]["update"] == state.update else None
    if ev is None:
        return
    value = plan_value(ev, metric)
    best = state.best_checkpoint
    if best is None or (value < best["metric"] if goal == "minimize" else value > best["metric"]):
        state.best_checkpoint = {"update": state.update, "metric": float(value)}


def train(state: TrainState, task, train_examples: list, val_examples: list, t, *, plan_metric: str = "val_loss",
          goal: str = "minimize", checkpoint_dir=None, hooks: Hooks | None = None, progress=None,
          keep_history: bool = True) -> LoopResult:
    """The loop. ``t`` is the campaign's train section; the budget is ``state.total_updates``.
    ``keep_history=False``: ``result.history`` keeps the latest update's record only (a long run; the journal
    has each update's numbers), ``result.seconds`` every update's time.

    An out-of-memory error in an update or a validation ends the run as ``failed`` with a reason that
    says what to change (the state stays at the last complete update); any other exception propagates."""
    run = _Loop(state, task, train_examples, val_examples, t, plan_metric=plan_metric, goal=goal,
                checkpoint_dir=checkpoint_dir, hooks=hooks or Hooks(), progress=progress, keep_history=keep_history)
    result = run.result
    try:  # preference.reference: precomputed, before the first update (a resumed run's came with its checkpoint)
        t0 = time.perf_counter()
        with _out_of_memory_ends_run("the reference's precomputation"):
            done = precompute_reference(state.model, task, train_examples + val_examples, device=state.device,
                                        precision=state.precision, batch_size=t.eval_batch, update=state.update,
                                        shared=True)
        result.reference_s = time.perf_counter() - t0 if done else 0.0
    except _RanOut as r:
        result.status, result.reason = "failed", out_of_memory_reason(state, r.where, r.exc)
        return result
    if done:
        note(f"reference log-probabilities of {plural(done, 'pair')} precomputed", log=True, spent="work")
    try:
        run.loop()
    except _RanOut as r:
        result.status, result.reason = "failed", out_of_memory_reason(state, r.where, r.exc)
        result.wall_s = time.perf_counter() - run.started
        return result
    if result.status == "completed" and run.hooks.stop_at is not None and state.update < state.total_updates:
        result.reason = f"stopped at update {state.update} as asked"
    result.wall_s = time.perf_counter() - run.started
    return result


class _Loop:
    """One call of ``train``: sample → update → log → stop rules → validation → checkpoint, each a method."""

    def __init__(self, state: TrainState, task, train_examples: list, val_examples: list, t, *, plan_metric: str,
                 goal: str, checkpoint_dir, hooks: Hooks, progress, keep_history: bool = True):
        self.state, self.task, self.t = state, task, t
        self.keep_history = keep_history
        self.train_examples, self.val_examples = train_examples, val_examples
        self.plan_metric, self.goal, self.checkpoint_dir = plan_metric, goal, checkpoint_dir
        self.hooks, self.progress = hooks, progress
        self.watch = hooks.watch or _unwatched
        self.started = time.perf_counter()
        self.result = LoopResult("completed", f"budget of {state.total_updates} updates reached")
        self.end = state.total_updates if hooks.stop_at is None else min(hooks.stop_at, state.total_updates)
        self.said: str | None = None  # the latest update's progress line: what a phase after it extends

    def phase(self, doing: str) -> None:
        """Say a phase of the run on the stage's line, after the update it follows (never the stale label of
        whatever ran before the loop, such as the data's encoding); a milestone, logged at once."""
        note(f"{self.said}; {doing}" if self.said else doing, log=True, spent="work")

    def loop(self) -> None:
        state, t, result = self.state, self.t, self.result
        in_a_row = 0  # consecutive updates with a non-finite loss
        several = world_rank()[0] > 1
        if state.update == 0:
            with _out_of_memory_ends_run("the validation before update 1"):
                self.validate()
        while state.update < self.end:
            out = self.update()
            if out["finite"] and self.hooks.stop_when and self.hooks.stop_when(state, out):
                break
            if not out["finite"]:
                in_a_row += 1
                why = self.non_finite(out, in_a_row)
                if why:
                    result.status, result.reason = "diverged", why
                    break
                continue
            in_a_row = 0
            why = self.grew(out)
            if why:
                result.status, result.reason = "diverged", why
                break
            why = self.validation_stops()
            if why:
                result.status, result.reason = "stopped", why
                break
            asked = signals.pending()  # a SIGTERM under a grace: one more checkpoint, here, then stop
            if several:  # every rank stops after the same update, the one where any rank was asked to
                asked = agree_max(asked or 0, state.device) or None
            if self.checkpoint_dir is not None and ((t.save_every and state.update % t.save_every == 0) or asked):
                self.save()
            if self.hooks.at_checkpoint:
                self.hooks.at_checkpoint(state)
            if asked:
                signals.raise_now(asked)

    def update(self) -> dict:
        """The next update, run and told: its record in the history, the hooks, the stage's line."""
        state, t, result = self.state, self.t, self.result
        result.saved_last = None  # an update follows the last save: the state is no longer that checkpoint's
        micro_batches = [[self.train_examples[i] for i in mb] for mb in state.sampler.next_update()]
        t0 = time.perf_counter()
        seq_len, tokens = update_key(micro_batches)
        seen = {"update": state.update + 1, "micro_batch": t.micro_batch, "seq_len": seq_len, "tokens": tokens}
        with _out_of_memory_ends_run(f"update {state.update + 1}"), self.watch("train", seen):
            out = run_update(state, self.task, micro_batches, max_grad_norm=t.max_grad_norm)
            seen["targets"] = out["targets"]
        out.update(update=state.update if out["finite"] else state.update + 1, examples_seen=state.examples_seen,
                   seconds=time.perf_counter() - t0, wall_s=time.perf_counter() - self.started,
                   ids=[[e.rid for e in mb] for mb in micro_batches],
                   epoch=state.sampler.epoch)
        if not self.keep_history:
            result.history.clear()
        result.history.append(out)
        result.seconds.append(out["seconds"])
        if out["skipped"]:
            result.skipped.append({"attempt": out["attempt"], "update": out["update"], "loss": out["loss"],
                                   "kind": "non-finite" if not out["finite"] else "overflow",
                                   "reason": out["skipped"], "ids": [i for mb in out["ids"] for i in mb]})
        if state.initial_loss is None and out["finite"]:
            state.initial_loss = out["loss"]
        if self.hooks.on_update:
            self.hooks.on_update(state, out)
        self.said = update_line(state, out)
        note(self.said, done=state.update, total=state.total_updates, at_most=state.bound, log=state.update == self.end,
             spent="work")
        if self.progress is not None:
            self.progress(state, out)
        return out

    def non_finite(self, out: dict, in_a_row: int) -> str | None:
        """Why a non-finite update ends the run (train.stop.on_nan, or an epoch of them in a row), else None:
        the update is skipped and the loop goes on."""
        if self.t.stop.on_nan:
            return (f"loss is {out['loss']} at update {out['update']}" if not math.isfinite(out["loss"])
                    else f"gradient norm is {out['grad_norm']} at update {out['update']} (loss {out['loss']:.4g})")
        if in_a_row >= max(self.state.sampler.updates_per_epoch, 2):  # never a hang on data that is all inf
            return (f"{in_a_row} updates in a row (an epoch) had a non-finite loss, the last at "
                    f"update {out['update']}; train.stop.on_nan=false skips such updates one at a time")
        return None

    def grew(self, out: dict) -> str | None:
        """Why the loss counts as diverged (train.stop.diverge_factor × the first update's), else None."""
        factor, state = self.t.stop.diverge_factor, self.state
        if factor and state.initial_loss and out["loss"] > factor * state.initial_loss:
            return (f"loss {out['loss']:.4g} at update {state.update} is above {factor} × the first "
                    f"update's {state.initial_loss:.4g} (train.stop.diverge_factor)")
        return None

    def validation_stops(self) -> str | None:
        """The validation due after this update (every train.eval_every, and after the budget's last); why the
        patience rule stops the run after it, else None."""
        state, t = self.state, self.t
        last = state.update == self.end
        if not (state.update % t.eval_every == 0 or (last and state.update == state.total_updates)):
            return None
        with _out_of_memory_ends_run(f"the validation after update {state.update}"):
            patience_stop = self.validate()
        if patience_stop:
            return (f"{t.stop.patience} validations without improvement of {self.plan_metric} "
                    f"(train.stop.patience) at update {state.update}")
        return None

    def validate(self) -> bool:
        """A validation, logged and told to the hooks; True when the patience rule stops the run."""
        state, t, val = self.state, self.t, self.val_examples
        if not val:
            return False
        self.phase(f"validation of {plural(len(val), 'example')}" if state.update else
                   f"validation of {plural(len(val), 'example')} before update 1")
        with self.watch("evaluation", {"update": state.update, "eval_batch": t.eval_batch,
                                       "seq_len": max(e.length for e in val)}):
            ev = evaluate(state, self.task, val, t.eval_batch)
        ev.update(update=state.update, examples_seen=state.examples_seen, wall_s=time.perf_counter() - self.started)
        self.result.evals.append(ev)
        if self.hooks.on_eval:
            self.hooks.on_eval(state, ev)
        value = plan_value(ev, self.plan_metric)
        better = state.best_metric is None or (value < state.best_metric if self.goal == "minimize"
                                               else value > state.best_metric)
        if better:
            state.best_metric, state.evals_without_improvement = value, 0
        elif state.update > 0:
            state.evals_without_improvement += 1
        patience = t.stop.patience
        return bool(patience and state.evals_without_improvement >= patience)

    def save(self) -> None:
        """A numbered checkpoint of this update (the best one kept by train.keep_checkpoints)."""
        state, t = self.state, self.t
        check_fence()  # a run the journal reaped while this process was stopped: no checkpoint into it
        note_best_checkpoint(state, self.result.evals, self.plan_metric, self.goal)
        self.phase(f"saving checkpoint update-{state.update:06d}")
        with self.watch("save", {"update": state.update}):
            path = save_state(state, f"{self.checkpoint_dir}/update-{state.update:06d}")
        if t.keep_checkpoints and world_rank()[1] == 0:
            best = state.best_checkpoint["update"] if state.best_checkpoint else None
            retain_checkpoints(self.checkpoint_dir, t.keep_checkpoints, best)
        self.result.saved_last = str(path)
        if self.hooks.on_checkpoint:
            self.hooks.on_checkpoint(state, path)
