"""The arms of a sweep's plan, each checked before anything runs (``sweep`` and ``validate`` both call
``plan_arms``; no torch here).

A variant is applied on top of the control and may only change what it compares. Refused with exit 2,
naming the arm and the key: the effective batch, the budget, the validation frequency, the stop rules,
the seed, and anything that changes how validation records are encoded (``ENCODING_KEYS``) — arms
measured on different validation examples would be compared as if nothing changed. An arm that trains exactly
what another trains is refused too (a copy compared as a variant), and an arm that changes the data, the model or
the task is checked as ``validate`` checks the campaign (its files, fields and records).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.consistency import check_campaign
from pilotrun.campaign.load import line_index
from pilotrun.errors import BadInput, BadInputs

BATCH_KEYS = ("train.micro_batch", "train.accumulation", "train.nproc", "train.strategy")
BUDGET_KEYS = ("train.updates", "train.epochs")
# Keys a variant may change without changing what one update costs (the pilot measured the control).
COST_FREE = ("train.lr", "train.weight_decay", "train.schedule", "train.warmup", "train.max_grad_norm",
             "train.optimizer", "train.stop", "seed", "preference.beta", "preference.gamma")


@dataclass
class Arm:
    name: str
    overrides: dict[str, Any]  # control's overrides, then the variant's on top
    own: dict[str, Any]  # what this arm itself says it changes
    arm_id: str  # plan.control | plan.variants[i]
    where: str
    loaded: Any

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.own.items()) or "(the campaign as written)"


def _line_of(loaded, path: tuple) -> int | None:
    if loaded.source is None or not loaded.source.is_file():
        return None
    return line_index(loaded.source.read_text(encoding="utf-8")).get(path)


def effective_batch(t) -> tuple[int, int, int]:
    return t.micro_batch, t.accumulation, data_parallel_ranks(t)


def _touching(own: dict, keys: tuple[str, ...]) -> list[str]:
    """The arm's own keys that set one of ``keys`` (or a whole section above them)."""
    return [k for k in own if any(key == k or key.startswith(k + ".") or k.startswith(key + ".") for key in keys)]


def _refuse(arm_id: str, where: str, own: dict, keys: tuple[str, ...], what: str, fix: str) -> BadInput:
    named = _touching(own, keys) or list(own)
    return BadInput(f"{arm_id} changes {what} through {', '.join(named)}; a variant may only change what the "
                    f"plan compares", where=f"{where} (key {named[0]})", fix=fix)


def plan_arms(loaded) -> list[Arm]:
    """Every arm, validated; raises BadInput naming the variant and the key."""
    plan, src = loaded.c.plan, str(loaded.source or "campaign")
    specs = [("control", "plan.control", ("plan", "control"), dict(plan.control))]
    specs += [(f"variant-{i + 1}", f"plan.variants[{i}]", ("plan", "variants", i), dict(v))
              for i, v in enumerate(plan.variants)]
    if not plan.seeds or len(set(plan.seeds)) != len(plan.seeds):
        line = _line_of(loaded, ("plan", "seeds"))
        raise BadInput(f"plan.seeds = {plan.seeds}: a sweep needs at least one seed, each listed once",
                       where=f"{src}:{line}" if line else src, fix="list distinct seeds, e.g. plan.seeds: [0, 1, 2]")
    arms: list[Arm] = []
    for name, arm_id, path, own in specs:
        line = _line_of(loaded, path)
        where = f"{src}:{line}" if line else src
        for k in own:
            if k == "plan" or k.startswith("plan."):
                raise BadInput(f"{arm_id} sets {k}: an arm cannot change the plan itself", where=f"{where} (key {k})",
                               fix=f"remove {k} from {arm_id}")
            if k == "seed":
                raise BadInput(f"{arm_id} sets seed: every arm runs with each seed of plan.seeds",
                               where=f"{where} (key seed)", fix="remove seed from the arm; list seeds in plan.seeds")
        overrides = {**(arms[0].overrides if arms else {}), **own}
        try:
            arm_loaded = loaded.with_overrides(overrides)
        except BadInput as e:
            raise BadInput(f"{arm_id}: {e.detail}", where=where, fix=e.fix) from None
        arms.append(Arm(name, overrides, own, arm_id, where, arm_loaded))
    ref = arms[0].loaded.c.train
    mb, acc, ranks = effective_batch(ref)
    for arm in arms[1:]:
        t, arm_id = arm.loaded.c.train, arm.arm_id
        if math.prod(effective_batch(t)) != mb * acc * ranks:
            a, b, r = effective_batch(t)
            raise _refuse(arm_id, arm.where, arm.own, BATCH_KEYS,
                          f"the effective batch (micro_batch × accumulation × ranks = {a} × {b} × {r} = {a * b * r}; "
                          f"the control has {mb} × {acc} × {ranks} = {mb * acc * ranks})",
                          f"keep micro_batch × accumulation × ranks = {mb * acc * ranks} (compensate with "
                          "train.accumulation), or compare batch sizes in a campaign of their own")
        if (t.updates, t.epochs) != (ref.updates, ref.epochs):
            raise _refuse(arm_id, arm.where, arm.own, BUDGET_KEYS,
                          f"the budget (updates={t.updates}, epochs={t.epochs}; the control has "
                          f"updates={ref.updates}, epochs={ref.epochs})",
                          "every arm trains for the same budget; remove the budget key from the variant")
        if t.eval_every != ref.eval_every:
            raise _refuse(arm_id, arm.where, arm.own, ("train.eval_every",), "the validation frequency",
                          "validations are fixed before launch for every arm; remove train.eval_every from it")
        if t.stop != ref.stop:
            raise _refuse(arm_id, arm.where, arm.own, ("train.stop",), "the stop rules",
                          "stop rules are declared once for the whole sweep; remove train.stop from it")
        _same_validation_encoding(arms[0], arm)
    _no_copies(arms, len(plan.seeds))
    for arm in arms:
        if any(k not in COST_FREE for k in arm.own):  # its data, model or task: checked as validate checks the campaign
            _checked(arm)
    return arms


UNTRAINED = {"name": None, "hardware": None, "track": None, "imported": None,
             "train": ("save_every", "keep_checkpoints", "eval_batch")}
"""What no weight of a run depends on (its name, the rental, the tracker, where it was imported from, how often it
saves, the validation's batch size): an arm differing only there trains what another arm trains."""


def _trained(campaign) -> str:
    out = campaign.model_dump(mode="json")
    for section, keys in UNTRAINED.items():
        if keys is None:
            out.pop(section, None)
        else:
            for k in keys:
                (out.get(section) or {}).pop(k, None)
    return json.dumps(out, sort_keys=True, default=str)


def _untrained_key(key: str) -> bool:
    section, _, name = key.partition(".")
    return section in UNTRAINED and (UNTRAINED[section] is None or name in UNTRAINED[section])


def _no_copies(arms: list[Arm], seeds: int) -> None:
    """Exit 2 for an arm that trains exactly what an earlier one trains (an empty variant, one that sets the control's
    own values, or one that changes only what no weight depends on: ``UNTRAINED``): the sweep would spend its runs on
    a copy and compare it as if it changed something."""
    seen: dict[str, Arm] = {}
    for arm in arms:
        key = _trained(arm.loaded.campaign)
        if key in seen:
            said = ("sets nothing" if not arm.own else f"sets only {arm.label}, which no weight of a run depends on"
                    if all(map(_untrained_key, arm.own)) else f"sets {arm.label}")
            raise BadInput(f"{arm.arm_id} {said}, so it trains exactly what {seen[key].arm_id} trains: the sweep "
                           f"would spend {seeds} run{'s' if seeds != 1 else ''} of the rental on a copy and compare "
                           "it as a variant", where=f"{arm.where} ({arm.arm_id})",
                           fix=f"remove {arm.arm_id}, or set a value the plan compares")
        seen[key] = arm


def _checked(arm: Arm) -> None:
    """An arm that changes the data, the model or the task, checked as ``validate`` checks the campaign (files,
    fields, records, the batch arithmetic): a missing file of one arm would otherwise stop the sweep at that arm."""
    try:
        check_campaign(arm.loaded)
    except BadInput as e:
        problems = e.problems if isinstance(e, BadInputs) else [e]
        wrapped = [BadInput(f"{arm.arm_id} ({arm.label}): {p.detail}", where=p.where or arm.where, fix=p.fix)
                   for p in problems]
        raise wrapped[0] if len(wrapped) == 1 else BadInputs(wrapped) from None


# What decides how a validation record becomes the tokens the loss sees. data.train/test, group_by and
# period_by do not touch validation's encoding; model.path does only through the tokenizer it supplies.
ENCODING_KEYS = ("task", "model.tokenizer", "data.validation", "data.prompt", "data.response", "data.messages",
                 "data.chat_template", "data.text", "data.label", "data.labels", "data.max_length")


def validation_encoding(loaded) -> dict[str, Any]:
    """The settings that fix validation's encoding, resolved (the tokenizer defaults to model.path)."""
    c = loaded.c
    out = {k: getattr(getattr(c, k.split(".")[0]), k.split(".")[1]) if "." in k else getattr(c, k)
           for k in ENCODING_KEYS}
    out["model.tokenizer"] = c.model.tokenizer or c.model.path
    return out


def _same_validation_encoding(control: Arm, arm: Arm) -> None:
    ref, mine = validation_encoding(control.loaded), validation_encoding(arm.loaded)
    changed = [k for k in ENCODING_KEYS if ref[k] != mine[k]]
    if not changed:
        return
    k = changed[0]
    via = ([k] if k in arm.own else _touching(arm.own, (k,)) or
           (["model.path"] if k == "model.tokenizer" and "model.path" in arm.own else list(arm.own)))
    why = (f"{k} is {mine[k]!r} here and {ref[k]!r} in the control" +
           (" (model.tokenizer is not set, so it follows model.path)" if via == ["model.path"] else ""))
    raise BadInput(f"{arm.arm_id} changes the validation set or how its records are encoded: {why}; "
                   f"its val_loss would be measured on other validation examples (other tokens, other "
                   f"truncation or other targets) than the control's, so the comparison would not be like for like",
                   where=f"{arm.where} (key {via[0]})",
                   fix=(f"remove {via[0]} from {arm.arm_id}, or compare it in a campaign of its own"
                        + ("; to compare models with one tokenizer, set model.tokenizer in the campaign"
                           if via == ["model.path"] else "")))


