"""overfit: can the loop learn at all? Two checks on the campaign's own task, through the one loop.

1. Accumulation arithmetic: the gradients of two micro-batches of different target counts (a few short examples),
   accumulated by ``run_update(step=False)``, against one batch of the same examples. Equal when
   the task's loss is a sum over targets (the loop divides by the update's target count); a task
   that averages per micro-batch weights short batches' tokens more and fails here.
2. Memorise N examples: a setting that should drive the loss to ~0 (all N in one micro-batch, no
   accumulation, lr raised, constant schedule, no weight decay, no dropout), run through the one loop
   (``train`` with ``Hooks(stop_when=...)``), which hands back as soon as the loss is under the threshold;
   the predictions are checked then, and the run ends when they reproduce the targets — argmax at every
   target under teacher forcing, then greedy generation for a few examples (causal-lm) or the class ids
   (seq-cls). The update budget bounds only a run that does not memorise: ``--max-updates`` when given,
   else sized to BUDGET_SECONDS from a pilot's seconds per update (UpdateBudget).
"""

from __future__ import annotations

import math

from pilotrun.campaign.prepare import prepare, require_weights
from pilotrun.console.progress import head, say
from pilotrun.engine.distributed import default_device
from pilotrun.engine.loop import (Hooks, make_state, out_of_memory_reason, precompute_reference, run_update, to_device,
                                  train)
from pilotrun.engine.oom import is_oom
from pilotrun.engine.precision import campaign_compute_dtype
from pilotrun.journal.runs import RunRecorder, find_pilot
from pilotrun.journal.store import Journal
from pilotrun.rehearsal.mechanics.overfit_pairs import is_pair_task, pair_check, pair_findings, pair_state
from pilotrun.rehearsal.mechanics.plateau import conflict_text, conflicting_inputs, plateau_causes
from pilotrun.sheet.shape import padded_tokens
from pilotrun.tasks.base import IGNORE
from pilotrun.tasks.loading import no_dropout
from pilotrun.tasks.moe import without_router_aux
from pilotrun.verdicts import StageResult, headline, plural

TOLERANCE = {"float32": 1e-5}  # relative gradient difference; rounding alone stays far below 1e-5 in fp32
LOW_PRECISION_TOLERANCE = 2e-2  # bf16/fp16 round each micro-batch's gradients to ~3 significant digits
LOSS_THRESHOLD = 0.05  # nats per target: memorised examples sit far below, an unlearned byte model near 5
FLAT_RELATIVE = 0.02  # a loss within 2% of its start after the whole budget has not moved
MAX_LR = 5e-3  # 10 × a fine-tuning lr memorises quickly; above ~1e-2 AdamW spikes on small models
CHUNK = 10  # the most updates between two prediction checks once the loss is under LOSS_THRESHOLD
MAX_UPDATES = 150  # the most updates of a memorising run (--max-updates)
BUDGET_SECONDS = 120.0  # a sized run's time: as many updates as fit, MIN_UPDATES..MAX_UPDATES (UpdateBudget)
MIN_UPDATES = 40  # a sized run never takes fewer, however slow its updates: the demo memorises its 8 examples in 37
SIZE_AFTER = 3  # without a pilot, the median of the run's updates 2..SIZE_AFTER+1 sizes it (1: a warm-up)
SPIKE = 10.0  # a loss 10× the best so far (and over the threshold) is a bounce of too high an lr, not noise
BACK_OFF = 0.5  # the lr is halved on each spike, down to train.lr
SPIKE_GAP = 3  # updates after a back-off before another: the loss needs a few to come down
GENERATE_EXAMPLES = 3
ACCUM_MICRO_BATCHES = 2
ACCUM_PER_MICRO_BATCH = 2


def _grads(model):
    import torch

    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None])


def accumulation_micro_batches(examples: list, micro_batch: int, accumulation: int) -> list[list]:
    """Two micro-batches whose target counts differ, cut from the shortest training examples.

    The question is the loop's arithmetic, not the model's: two micro-batches of a few short examples
    answer it (a per-micro-batch mean weights them differently) at a small part of the cost of a
    campaign-sized update on a real model. Among the shortest examples, sorted by target count and cut
    in order; the last micro-batch is one example short when that is what it takes to make the counts
    differ (equal-length examples, seq-cls).
    """
    k = ACCUM_MICRO_BATCHES
    mb = max(1, min(micro_batch, ACCUM_PER_MICRO_BATCH))
    pool = sorted((e for e in examples if e.n_targets > 0), key=lambda e: e.length)
    if len(pool) < k:
        return []
    shortest = sorted(pool[: 4 * k * mb], key=lambda e: e.n_targets)
    step = max(1, len(shortest) // (k * mb))
    chosen = shortest[::step][: k * mb]
    mb = max(1, len(chosen) // k)
    batches = [chosen[i * mb: (i + 1) * mb] for i in range(k)]
    if len({sum(e.n_targets for e in b) for b in batches}) == 1 and len(batches[-1]) > 1:
        batches[-1] = batches[-1][:-1]
    return batches


def accumulation_check(prep, model=None) -> dict:
    """Relative difference between accumulated and one-batch gradients on the campaign's task.

    One model: both passes run without an optimizer step, so the second sees the same weights — and so
    does the memorising run that follows, which ``overfit`` gives the same model (one build, not two:
    on a real model the build costs more than the passes)."""
    import time

    import torch

    t = prep.c.train
    batches = accumulation_micro_batches(prep.train, t.micro_batch, t.accumulation)
    tol = TOLERANCE.get(campaign_compute_dtype(prep.c), LOW_PRECISION_TOLERANCE)  # the dtype it rounds in
    if not batches:
        return {"verdict": "warn", "message": "accumulation check skipped: fewer than 2 training examples with targets",
                "tolerance": tol}
    targets = [sum(e.n_targets for e in b) for b in batches]
    grads = []
    if model is None:
        torch.manual_seed(prep.c.seed)
        model = prep.task.build_model()
    if not any(p.requires_grad for p in model.parameters()):
        return {"verdict": "warn", "message": "accumulation check skipped: no trainable parameters",
                "tolerance": tol}
    no_dropout(model)
    state = make_state(model, t, n_train=len(prep.train), seed=prep.c.seed, total_updates=1)
    precompute_reference(model, prep.task, [e for b in batches for e in b], device=state.device,
                         precision=t.precision, batch_size=t.eval_batch)  # preference.reference: precomputed
    started = time.perf_counter()
    with without_router_aux(model) as aux_left_out:  # a load-balancing term is per micro-batch by definition
        for micro in (batches, [[e for b in batches for e in b]]):
            model.zero_grad(set_to_none=True)
            try:
                run_update(state, prep.task, micro, max_grad_norm=None, step=False, zero_grad=False)
            except Exception as e:
                if not is_oom(e):
                    raise
                return {"verdict": "fail", "tolerance": tol, "micro_batch_targets": targets,
                        "headline": "the accumulation check ran out of memory",
                        "message": out_of_memory_reason(state, "the accumulation check", e)}
            grads.append(_grads(model))
    seconds = time.perf_counter() - started
    model.zero_grad(set_to_none=True)
    del state
    ref = float(grads[1].norm())
    rel = float((grads[0] - grads[1]).norm()) / ref if ref else float("nan")
    setting = (f"{len(batches)} micro-batches of {[len(b) for b in batches]} examples ({targets} targets) "
               f"against one batch of {sum(len(b) for b in batches)}, {t.precision}"
               + ("; the targets' loss alone: the router's auxiliary loss is computed per micro-batch, as the "
                  "trainers do" if aux_left_out else ""))
    n_ex = sum(len(b) for b in batches)
    out = {"relative_difference": rel, "tolerance": tol, "micro_batch_targets": targets, "setting": setting,
           "seconds": seconds, "cost": f"{2 * n_ex} examples' forward and backward ({n_ex} twice, "
                                      f"{2 * sum(e.length for b in batches for e in b)} tokens) in {seconds:.1f} s"}
    if not math.isfinite(ref) or ref == 0:
        out.update(verdict="warn", message=f"accumulation check cannot tell: the one-batch gradient norm is {ref} "
                                           f"({setting}); see the memorising run below")
    elif len(set(targets)) == 1:
        out.update(verdict="warn", message=f"accumulation check cannot tell: every micro-batch has {targets[0]} "
                                           f"targets ({setting}); relative difference {rel:.2e}")
    elif not math.isfinite(rel) or rel > tol:
        out.update(verdict="fail", message=(
            f"accumulated gradients differ from one batch of the same examples by {rel:.2e} (relative; tolerance "
            f"{tol:.0e}; {setting}): likely a per-micro-batch mean where a sum over targets is needed — "
            "Task.loss must return (sum of per-target losses, number of targets)"))
    else:
        out.update(verdict="ok", message=f"accumulation arithmetic holds: relative gradient difference {rel:.2e} "
                                         f"≤ {tol:.0e} ({setting})")
    return out


def memorise_setting(t, n: int, max_updates: int):
    """The train section for memorising n examples, and its description for the output."""
    lr = max(t.lr, min(10 * t.lr, MAX_LR))
    stop = t.stop.model_copy(update={"on_nan": True, "diverge_factor": None, "patience": None})
    mt = t.model_copy(update={"micro_batch": n, "accumulation": 1, "lr": lr, "schedule": "constant", "warmup": 0,
                              "weight_decay": 0.0, "drop_last": True, "eval_every": max_updates + 1,
                              "save_every": None, "stop": stop})
    text = (f"{n} examples in one micro-batch, accumulation 1, lr {lr:.2e} (train.lr {t.lr:.2e} × 10, at most "
            f"{MAX_LR:g}; halved on a loss spike, down to train.lr), constant schedule, weight decay 0, dropout 0, {t.optimizer}, {t.precision}, "
            f"max_grad_norm {t.max_grad_norm}, up to {max_updates} updates")
    return mt, text


class BackOff:
    """Halves the lr when the loss spikes to SPIKE × its best so far: Adam at 10 × a fine-tuning lr can
    bounce out of a memorised minimum (0.0012 → 0.55 on SmolLM2), and at a constant lr it may not come
    back within the budget. Never below train.lr; each back-off is said."""

    def __init__(self, floor: float):
        self.floor, self.best, self.last, self.events = floor, math.inf, -SPIKE_GAP, []

    def __call__(self, state, out) -> None:
        loss = out["loss"]
        if not out["finite"]:
            return
        spiked = loss > max(SPIKE * self.best, LOSS_THRESHOLD) and out["update"] - self.last >= SPIKE_GAP
        if spiked and state.lr > self.floor:
            new = max(self.floor, state.lr * BACK_OFF)
            for g in state.optimizer.param_groups:
                g["lr"] = new
            state.scheduler.base_lrs = [new for _ in state.scheduler.base_lrs]  # constant schedule: lr = base
            self.events.append(f"loss spiked to {loss:.4g} at update {out['update']} from its best {self.best:.4g}: "
                               f"lr backed off to {new:.2e}")
            self.last = out["update"]
        self.best = min(self.best, loss)


def _targets(task, batch, examples) -> list[list[int]]:
    if hasattr(task, "targets"):
        return task.targets(batch)
    shift = 1 if task.kind == "causal-lm" else 0
    return [[x for x in e.labels[shift:] if x != IGNORE] for e in examples]


def prediction_check(task, model, examples, device) -> dict:
    """Teacher-forced argmax at every target; greedy generation for a few causal-lm examples; for preference pairs,
    the reward's preference of each pair (``overfit_pairs.pair_check``)."""
    import torch

    if is_pair_task(task):
        return pair_check(task, model, examples, device)

    model.eval()
    with torch.no_grad():
        batch = to_device(task.collate(examples), device)
        preds = task.predict(model, batch)
        wanted = _targets(task, batch, examples)
    wrong = [(e.rid, sum(a != b for a, b in zip(p, w)) + abs(len(p) - len(w)), len(w))
             for e, p, w in zip(examples, preds, wanted) if p != w]
    out = {"teacher_forced_wrong": wrong, "generation_wrong": [], "generated": 0}
    if task.kind == "causal-lm" and not wrong and hasattr(model, "generate"):
        out["generation_wrong"], out["generated"] = _generation_check(task, model, examples, device)
    model.train()
    return out


def end_ids(task, model) -> list[int]:
    """Every id generation treats as the end of an answer: the tokenizer's EOS and each of the model's
    ``generation_config.eos_token_id`` (Llama 3 and Qwen list the end-of-turn marker there)."""
    found = [getattr(task, "eos", None), getattr(getattr(task, "tokenizer", None), "eos_token_id", None)]
    gen = getattr(model, "generation_config", None)
    value = getattr(gen, "eos_token_id", None)
    found += value if isinstance(value, (list, tuple)) else [value]
    return sorted({int(i) for i in found if i is not None})


def _show(tok, ids: list[int]) -> str:
    return ", ".join(f"{tok.decode([t])!r} ({t})" for t in ids)


def generation_target(e, ends: list[int]) -> tuple[list[int], list[int], bool]:
    """(asked, after, stops): what greedy generation from the prompt is asked to produce — the first run of
    targets through its first end id —, what the template trains after that end (ChatML's "\\n" after
    <|im_end|>: generation never reaches it), and whether generation must stop there. A run cut by
    data.max_length before its end is compared as far as it goes."""
    start = end = e.prompt_len
    while end < len(e.labels) and e.labels[end] != IGNORE:
        end += 1
    run = e.input_ids[start:end]
    k = next((i for i, t in enumerate(run) if t in ends), None)
    if k is not None:
        return run[: k + 1], run[k + 1:], True
    cut = end == len(e.input_ids) and e.n_targets < e.target_len_full
    return run, [], not cut


def _generation_check(task, model, examples, device) -> tuple[list, int]:
    """Greedy generation from the prompt reproduces the first answer through its end id, and stops there.

    The examples are generated together, their prompts padded on the left and masked: one forward pass per new
    token for all of them, not one per example (SmolLM2-135M's 3 examples on 2 CPU cores: 3.7–3.9 → 3.0 s).
    Greedy is causal: a row's tokens after its end id (the pad generate fills in once it ended) change nothing
    before it."""
    import torch

    ends = end_ids(task, model)
    tok = task.tokenizer
    asked = [(e, *generation_target(e, ends)) for e in examples[:GENERATE_EXAMPLES] if e.prompt_len > 0]
    if not asked:
        return [], 0
    width = max(e.prompt_len for e, *_ in asked)
    pad = getattr(task, "pad", None)
    fill = pad if pad is not None else (ends[0] if ends else 0)  # any id: the mask hides it
    ids = torch.tensor([[fill] * (width - e.prompt_len) + e.input_ids[:e.prompt_len] for e, *_ in asked],
                       device=device)
    mask = torch.tensor([[0] * (width - e.prompt_len) + [1] * e.prompt_len for e, *_ in asked], device=device)
    longest = max(len(want) for _, want, _, _ in asked)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(1, longest), do_sample=False,
                             eos_token_id=ends or None, pad_token_id=pad)
    wrong = []
    for row, (e, want, after, stops) in enumerate(asked):
        got = out[row, width:width + len(want)].tolist()
        stop = next((i for i, t in enumerate(got) if t in ends), None)
        got = got[: stop + 1] if stop is not None else got
        if got == want and (not stops or (want and want[-1] in ends)):
            continue
        p = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        if p == len(want):  # every token reproduced, but the target has no end id to stop at
            message = (f"the target of {e.rid} ({len(want)} tokens, reproduced by greedy generation) ends without an "
                       f"end id ({_show(tok, ends)}), so generation never stops: the response needs the EOS (a "
                       "custom task's encode, or a chat template whose turns end in none of these ids)")
        else:
            before = f" (after {tok.decode(want[max(0, p - 8):p])!r})" if p else ""
            what = (f"generation gives {_show(tok, [got[p]])} where the target has {_show(tok, [want[p]])}"
                    if p < len(got) else
                    f"generation stops ({_show(tok, [got[-1]])} ends it) where the target goes on with "
                    f"{_show(tok, want[p:p + 3])}")
            message = f"greedy generation of {e.rid} differs from its target at token {p} of {len(want)}{before}: {what}"
        wrong.append({"rid": e.rid, "position": p, "generated": got, "target": want, "after_end": after,
                      "never_stops": p == len(want), "message": message})
    return wrong, len(asked)


class UpdateBudget:
    """How many updates the memorising run may take, and where that number comes from.

    Given (``--max-updates``): that many. Sized (the default): as many as BUDGET_SECONDS hold at the seconds one
    memorising update takes — estimated from the time model of a pilot of the same campaign in the journal, else
    measured on the run's own first updates —, never fewer than MIN_UPDATES nor more than ``ceiling``. A run that
    memorises stops at once either way: the budget only bounds a run that does not."""

    def __init__(self, ceiling: int, sized: bool):
        self.ceiling, self.sized, self.updates = ceiling, sized, ceiling
        self.per_update: float | None = None
        self.source = "" if sized else "--max-updates"

    def size(self, per_update: float, source: str) -> None:
        self.per_update, self.source = per_update, source
        fits = int(BUDGET_SECONDS // max(per_update, 1e-9))
        self.updates = max(min(MIN_UPDATES, self.ceiling), min(self.ceiling, fits))

    def text(self) -> str:
        if not self.sized:
            return f"update budget: {self.updates} (--max-updates)"
        if self.per_update is None:
            return (f"update budget: to be sized from the run's own updates {2}..{SIZE_AFTER + 1} (no pilot of this "
                    f"campaign's config in the journal); at most {self.ceiling}")
        return (f"update budget: {self.updates} — {BUDGET_SECONDS:g} s at {self.per_update:.3g} s per update "
                f"({self.source}), at least {min(MIN_UPDATES, self.ceiling)}, at most {self.ceiling}; "
                "--max-updates sets it")

    def data(self) -> dict:
        return {"updates": self.updates, "ceiling": self.ceiling, "sized": self.sized,
                "seconds_per_update": self.per_update, "source": self.source, "seconds": BUDGET_SECONDS}


def pilot_update_seconds(home, loaded, chosen: list) -> tuple[float, str] | None:
    """(seconds, where from) of one memorising update — every chosen example in one micro-batch — from the time
    model of the latest pilot that measured this config (``find_pilot``: under any name) in the journal: a line
    through the pilot's timed updates (seconds against padded tokens: a fixed cost, the optimizer's step, and a
    cost per token), read at the memorising batch's padded tokens. None when no such pilot measured its updates."""
    run, stale = find_pilot(Journal(home), loaded.campaign.name, loaded.config_sha256(), loaded.resolved_dict())
    model = ((run or {}).get("summary") or {}).get("time_model") or {}
    if run is None or stale or not model.get("typical"):  # a pilot of this config (by what it measured), timed
        return None
    points = [(p["tokens"], p["seconds"]) for p in model["typical"]]
    if model.get("worst_update_s") and model.get("worst_update_tokens"):
        points.append((model["worst_update_tokens"], model["worst_update_s"]))
    tokens = padded_tokens([chosen])
    n, mx, my = len(points), sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points)
    var = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / var if var else 0.0
    if slope <= 0 or my - slope * mx < 0:  # one size of update, or noise: proportional to tokens
        slope, fixed = (my / mx if mx else 0.0), 0.0
    else:
        fixed = my - slope * mx
    seconds = fixed + slope * tokens
    return seconds, (f"pilot {run['run_id']}: {n} timed updates, read at this run's {tokens} padded tokens")


class _StopRule:
    """When the loop hands back to ``overfit``: the loss under LOSS_THRESHOLD (the predictions are checked at once;
    after a miss, the next check waits 1, 2, 4 … up to CHUNK updates), a zero gradient at the first update, or the
    budget spent."""

    def __init__(self, budget: UpdateBudget):
        self.budget, self.check_from, self.gap = budget, 0, 1

    def __call__(self, state, out) -> bool:
        return (state.update >= self.budget.updates or (out["update"] == 1 and out["grad_norm"] == 0)
                or (out["loss"] < LOSS_THRESHOLD and state.update >= self.check_from))

    def due(self, state, history) -> bool:
        return bool(history) and history[-1]["loss"] < LOSS_THRESHOLD and state.update >= self.check_from

    def missed(self, state) -> None:
        self.check_from, self.gap = state.update + self.gap, min(2 * self.gap, CHUNK)


def _memorised(checks: dict, chosen: list) -> bool:
    """Stop checking: reproduced; or what no further update mends (no end id to stop at, one input with two targets)."""
    if not (checks["teacher_forced_wrong"] or checks["generation_wrong"]):
        return True
    return (not checks["teacher_forced_wrong"] and all(w["never_stops"] for w in checks["generation_wrong"])) \
        or ("pairs" not in checks and bool(conflicting_inputs(chosen)))


def _checked_model(prep):
    """The model both checks share (one build: the accumulation check leaves the weights as built) and the
    accumulation check's result; the memorising run draws the random numbers it drew before they shared it."""
    import torch

    head("accumulation check")
    torch.manual_seed(prep.c.seed)
    model = prep.task.build_model()
    rng = torch.get_rng_state()
    acc = accumulation_check(prep, model)
    torch.set_rng_state(rng)
    return model, acc


def _cannot_memorise(pool: list, chosen: list, model) -> list[str]:
    """Why no run can memorise the chosen examples, before one starts; empty when one can."""
    if not chosen:
        return [f"every label of the first {len(pool)} training examples is masked (no target tokens): "
                "nothing reaches the loss — check data.response / data.messages (assistant turns) and "
                "data.max_length (a prompt longer than it truncates the whole response away)"]
    if not any(p.requires_grad for p in model.parameters()):
        return ["no trainable parameters: every parameter has requires_grad=False — check "
                "model.adapter.target_modules, or unfreeze the model"]
    return []


def _memorise(loaded, home, prep, model, chosen: list, mt, budget: UpdateBudget, acc: dict, setting: str) -> dict:
    """The memorising run, journalled as a run of kind overfit: chunks of the one loop, each ended by _StopRule,
    until the predictions reproduce the targets or the budget is spent. Returns what it learnt."""
    c, task = prep.c, prep.task
    zeroed = no_dropout(model)
    device = default_device()
    model.to(device)
    state = make_state(model, mt, n_train=len(chosen), seed=c.seed, total_updates=budget.ceiling, device=device)
    state.bound, state.total_updates = True, budget.updates  # a run that memorises stops before its budget
    history, checks, back_off, stop = [], {}, BackOff(c.train.lr), _StopRule(budget)
    precompute_reference(model, task, chosen, device=device, precision=mt.precision, batch_size=mt.eval_batch)
    pairs = pair_state(task, model, chosen, device) if is_pair_task(task) else None  # margins and the reference
    head(f"memorising {plural(len(chosen), 'pair' if pairs else 'example')}")
    with RunRecorder(Journal(home), loaded, kind="overfit") as rec:
        def on_update(st, out):
            parts = out.get("loss_parts") or {}
            if parts:  # the targets' loss is what memorises; a router's auxiliary loss is trained but has a floor
                out.update(loss_trained=out["loss"], loss=out["loss"] - sum(parts.values()))
            history.append(out)
            back_off(st, out)
            rec.log("train", out["update"], {"loss": out["loss"], **parts, "lr": out["lr"],
                                             "grad_norm": out["grad_norm"]},
                    examples_seen=out["examples_seen"], wall_s=out["wall_s"])
            if budget.sized and budget.per_update is None and len(history) == SIZE_AFTER + 1:
                seconds = sorted(h["seconds"] for h in history[1:])[SIZE_AFTER // 2]  # the first: a warm-up
                budget.size(seconds, f"the median of its own updates 2..{SIZE_AFTER + 1}: no pilot of this "
                                     "campaign's config in the journal")
                st.total_updates = budget.updates  # the progress line's total, from now on the sized one
                say(f"update budget sized: ≤ {budget.updates} updates ({BUDGET_SECONDS:g} s at {seconds:.3g} s "
                    f"each; the ceiling was {budget.ceiling})")

        status, res = "completed", None
        while state.update < budget.updates:
            res = train(state, task, chosen, [], mt,
                        hooks=Hooks(on_update=on_update, stop_at=budget.ceiling, stop_when=stop))
            if res.status != "completed" or not history or history[0]["grad_norm"] == 0:
                status = res.status
                break
            if stop.due(state, history):
                checks = prediction_check(task, model, chosen, device)
                if _memorised(checks, chosen):
                    break
                stop.missed(state)
        failed = [res.reason] if status == "failed" else _diagnose(
            history, checks, state, mt, causes=lambda: plateau_causes(task, chosen, model), examples=chosen,
            budget=budget)
        pair_lines = []
        if pairs is not None and status != "failed":
            pair_lines, found = pair_findings(task, pairs, pair_state(task, model, chosen, device), chosen, history)
            failed = found + [f for f in failed if not found or not f.startswith("loss flat")]
        summary = {"verdict": "fail" if failed or acc["verdict"] == "fail" else acc["verdict"],
                   "accumulation": acc, "setting": setting, "updates": state.update, "budget": budget.data(),
                   "first_loss": history[0]["loss"] if history else None,
                   "last_loss": history[-1]["loss"] if history else None, "failed": failed}
        rec.progress(state.update, state.examples_seen)
        rec.finish(status, summary)
    return {"run_id": rec.run_id, "updates": state.update, "history": history, "checks": checks,
            "back_offs": back_off.events, "failed": failed, "dropout_zeroed": zeroed, "pair_lines": pair_lines}


def _closing_lines(task, chosen: list, run: dict, acc: dict, budget: UpdateBudget) -> list[str]:
    """What the run showed: memorised in how many updates, the budget it was sized to, the check's cost."""
    history, lines = run["history"], []
    if not run["failed"] and history:
        n_gen = run["checks"].get("generated", 0)
        reproduced = (f"argmax reproduces every target; greedy generation reproduces {n_gen} of {n_gen} examples"
                      if task.kind == "causal-lm" else "the reward prefers the chosen answer of every pair"
                      if is_pair_task(task) else "the predicted ids reproduce every target")
        what = plural(len(chosen), "pair" if is_pair_task(task) else "example")
        lines.append(f"memorised {what} in {plural(run['updates'], 'update')}: loss "
                     f"{history[0]['loss']:.3f} → {history[-1]['loss']:.4f} < {LOSS_THRESHOLD}; {reproduced}")
    lines += run.get("pair_lines", [])
    for part in (history[-1].get("loss_parts") or {}) if history else ():
        first, last = history[0]["loss_parts"][part], history[-1]["loss_parts"][part]
        lines.append(f"{part}: {first:.4g} → {last:.4g}, finite in every update: trained with the targets' loss "
                     "(the loss above is the targets' alone; the update's loss adds it)")
    if budget.sized and budget.source.startswith("the median"):
        lines.append(budget.text())  # sized during the run: said once it was
    if "seconds" in acc and history:
        per_update = sum(h.get("seconds", 0.0) for h in history) / len(history)
        lines.append(f"accumulation check cost: {acc['cost']}, about {acc['seconds'] / max(per_update, 1e-9):.1f} "
                     f"memorising updates ({per_update:.2f} s each)")
    lines.append(f"run {run['run_id']} (kind overfit)")
    return lines


def overfit(loaded, home, *, examples: int = 8, max_updates: int = MAX_UPDATES, sized: bool = True,
            prep=None) -> StageResult:
    """The accumulation check, then memorising ``examples`` training examples: at most ``max_updates`` updates,
    fewer when ``sized`` and BUDGET_SECONDS hold fewer (UpdateBudget); the run stops as soon as they are memorised."""
    require_weights(loaded)
    prep = prep or prepare(loaded, splits=("train",))
    model, acc = _checked_model(prep)
    pool = prep.train[:examples]
    chosen = [e for e in pool if e.n_targets > 0]
    budget = UpdateBudget(max_updates, sized)
    if sized and chosen:
        found = pilot_update_seconds(home, loaded, chosen)
        if found:
            budget.size(*found)
    mt, setting = memorise_setting(prep.c.train, len(chosen) or examples, budget.updates)
    msgs, data = [acc["message"], f"memorise setting: {setting}"], {"accumulation": acc, "setting": setting}
    if budget.per_update is not None or not sized:
        msgs.append(budget.text())
    refused = _cannot_memorise(pool, chosen, model)
    if refused:
        return _result(acc, msgs + refused, data, refused)
    if len(chosen) < len(pool):
        msgs.append(f"{len(pool) - len(chosen)} of the first {len(pool)} examples have every label masked; "
                    f"memorising the other {len(chosen)}")
    run = _memorise(loaded, home, prep, model, chosen, mt, budget, acc, setting)
    history = run["history"]
    data.update(run_id=run["run_id"], updates=run["updates"], losses=[h["loss"] for h in history],
                checks=run["checks"], back_offs=run["back_offs"], dropout_zeroed=run["dropout_zeroed"],
                budget=budget.data())
    msgs += run["back_offs"] + _closing_lines(prep.task, chosen, run, acc, budget)
    rows = [{"update": h["update"], "loss": h["loss"], "grad_norm": h["grad_norm"], "lr": h["lr"]}
            for h in history if h["update"] % CHUNK == 0 or h is history[-1]]
    return _result(acc, msgs + run["failed"], data, run["failed"], rows)


def _diagnose(history: list[dict], checks: dict, state, mt, causes=None, examples=None,
              budget: UpdateBudget | None = None) -> list[str]:
    """Why the loop did not memorise, from what it recorded; empty when it did."""
    if not history:
        return ["no update ran"]
    bad = next((h for h in history if not h["finite"]), None)
    if bad is not None:
        return [f"non-finite loss ({bad['loss']}) at update {bad['update']}: check train.precision "
                f"(fp16 overflow), the lr ({mt.lr:.2e}) and the inputs of that update"]
    if history[0]["grad_norm"] == 0:
        return ["gradient norm is 0 at update 1: the loss does not reach the trainable parameters (a detached "
                "loss, frozen layers, or a loss that ignores the model's output)"]
    first, last = history[0]["loss"], history[-1]["loss"]
    if abs(last - first) <= FLAT_RELATIVE * abs(first):
        why = ("the lr is 0 (train.lr = 0): the optimizer never moves the parameters" if mt.lr == 0 else
               f"the parameters barely move at lr {mt.lr:.2e}: check that the optimizer holds the model's parameters")
        return [f"loss flat at its start value: {first:.4f} → {last:.4f} over {state.update} updates; {why}"]
    if last >= LOSS_THRESHOLD:
        listed = causes() if causes else ["capacity: raise --max-updates, check the model's size and data.max_length"]
        cut = (f" (its budget, sized to {BUDGET_SECONDS:g} s at {budget.per_update:.3g} s per update: "
               f"--max-updates {budget.ceiling} gives it the whole ceiling)"
               if budget and budget.sized and budget.updates < budget.ceiling else "")
        return [f"loss fell from {first:.4f} to {last:.4f} in {state.update} updates{cut} but not under "
                f"{LOSS_THRESHOLD}: the model cannot memorise these examples at this setting; likely causes, most "
                "evidence first: " + "; ".join(listed)]
    if checks.get("pairs") is not None and checks.get("teacher_forced_wrong"):
        wrong = checks["teacher_forced_wrong"]
        return [f"loss {last:.4f} is under {LOSS_THRESHOLD} but the reward still prefers the rejected answer of "
                f"{plural(len(wrong), 'pair')} (first {wrong[0][0]}): the loss and the reward disagree"]
    if checks.get("teacher_forced_wrong") or checks.get("generation_wrong"):
        clash = conflicting_inputs(examples or [])
        if clash:  # measured before any position or format is blamed: no model reproduces both targets
            missed = checks.get("teacher_forced_wrong") or checks["generation_wrong"]
            first = missed[0][0] if isinstance(missed[0], tuple) else missed[0]["rid"]
            return [f"{conflict_text(clash, len(examples))}: loss {last:.4f} is under {LOSS_THRESHOLD} but no model "
                    f"reproduces both targets of one input ({len(missed)} examples not reproduced, first {first}) — "
                    "keep one answer per prompt in the data, or merge the answers"]
    if checks.get("teacher_forced_wrong"):
        rid, n, of = checks["teacher_forced_wrong"][0]
        return [f"loss {last:.4f} is under {LOSS_THRESHOLD} but argmax misses {n} of {of} targets of {rid} "
                f"({len(checks['teacher_forced_wrong'])} examples wrong): predict and loss disagree on positions"]
    if checks.get("generation_wrong"):
        wrong = checks["generation_wrong"]
        first, of = wrong[0], f"{len(wrong)} of {checks['generated']} generated examples"
        if first["never_stops"]:
            return [f"generation never stops: teacher forcing reproduces every target, but {first['message']} "
                    f"({of})"]
        return [f"greedy generation differs from what training taught: teacher forcing reproduces every target but "
                f"{first['message']} ({of}) — generation does not see what training saw: check the prompt format, "
                "the EOS and the padding side"]
    return []


def _result(acc, msgs, data, failed, rows=None) -> StageResult:
    verdict = "fail" if failed or acc["verdict"] == "fail" else acc["verdict"]
    if verdict == "fail":
        parts = ([acc.get("headline", "accumulation arithmetic is wrong")] if acc["verdict"] == "fail" else []) + \
            ([headline(failed[0])] if failed else ["the loop memorises the examples"])
        summary = "; ".join(parts)
    else:
        summary = "the loop memorises the examples"
        if verdict == "warn":
            summary += " (accumulation check inconclusive)"
    return StageResult("overfit", verdict, summary, msgs, data, columns=["update", "loss", "grad_norm", "lr"],
                       rows=rows or [])
