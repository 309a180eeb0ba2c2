"""Hugging Face ``TrainingArguments`` / TRL ``SFTConfig`` and ``DPOConfig`` dicts, and ``trl sft --config`` files →
campaign (a DPOConfig's own keys: ``preference.py``).

The keys are those of the tools' own schemas (``schemas.py``: TrainingArguments of the installed transformers and
of the stored versions, TRL's SFTConfig, DPOConfig, ModelConfig and ScriptArguments). A value equal to the tool's
default is what ``to_dict`` writes for a key nobody set, and sets nothing; the model, the adapter and the data
of a TRL CLI file (ModelConfig, ScriptArguments) are ``trl_cli.py``'s.
"""

from __future__ import annotations

import json
from typing import Any

from pilotrun.campaign.importers import preference, rl, schemas, trl_cli
from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.keys import check_keys, unknown_reason
from pilotrun.campaign.importers.reasons import HF_NOTHING_PREFIXES, HF_REASONS, NOTHING
from pilotrun.campaign.importers.settings import optimizer, precision, schedule, strategy_from_deepspeed
from pilotrun.campaign.importers.values import check_values
from pilotrun import jsonsafe

TOOL_LABEL = "TrainingArguments/TRL"


def hf_defaults() -> dict[str, Any]:
    """Every known key's default: the installed TrainingArguments' first, then TRL's (the first schema that
    knows a key wins), then the stored older versions'."""
    out: dict[str, Any] = {}
    for tool in ("transformers", "trl"):
        for s in schemas.schemas(tool):
            for k, entry in s.keys.items():
                d = entry["default"]
                out.setdefault(k, None if isinstance(d, dict) and "expr" in d else d)
    return out


def accelerator_defaults() -> dict[str, Any]:
    """What ``to_dict`` writes for an accelerator_config nobody set (the AcceleratorConfig defaults)."""
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    return jsonsafe.loads(json.dumps(dataclasses.asdict(AcceleratorConfig()), default=str))


def same(v: Any, d: Any) -> bool:
    if empty(v) and empty(d):
        return True
    try:
        return v == d or str(v) == str(d) or (isinstance(v, (int, float)) and float(v) == float(d))
    except (TypeError, ValueError):
        return False


def preference_key(raw: dict[str, Any]) -> str | None:
    """A key only TRL's DPOConfig has (beta, max_prompt_length ...), set in ``raw``: a preference config."""
    dpo = schemas.known("trl", "DPOConfig") - schemas.known("trl", "SFTConfig") - schemas.known("transformers")
    return next((k for k in raw if k in dpo), None)


def import_hf(raw: dict[str, Any], b: Builder) -> None:
    known = schemas.known("transformers") | schemas.known("trl")
    other = rl.trl_trainer_key(raw, known)
    if other:  # a GRPOConfig (it has DPOConfig's beta too), PPOConfig, KTOConfig ...: never SFT or DPO (rl.py)
        rl.refuse_trl(b, other, raw[other])  # the refusal alone: no side key named
        return
    defaults = hf_defaults()
    defaults["accelerator_config"] = accelerator_defaults()
    typos, unknown = check_keys(raw, known, b.source, f"{schemas.label('transformers')} / {schemas.label('trl')}")
    b.problems += typos
    check_values(raw, ("transformers", "trl"), b, none_is_unset=False)  # what the mappers compute with
    if b.problems:
        return
    used: set[str] = set(unknown)
    if preference_key(raw):  # a DPOConfig: the preference task (importers/preference.py)
        preference.trl_dpo(raw, b, used, lambda v, k: same(v, defaults.get(k)))
    for k in unknown:
        if not empty(raw[k]):
            b.skip(k, raw[k], unknown_reason("transformers") + "; unknown to " + schemas.label("trl") + " too")

    def val(k: str, default: Any = None) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not empty(raw[k]):
            return raw[k], k
        d = defaults.get(k, default)
        return d, f"{k} (the Trainer's default)"

    used |= trl_cli.model_and_data(raw, b, defaults)
    mb, src = val("per_device_train_batch_size", 8)
    b.put(src, "train.micro_batch", int(mb))
    ga, src = val("gradient_accumulation_steps", 1)
    b.put(src, "train.accumulation", int(ga))
    eb, src = val("per_device_eval_batch_size", 8)
    b.put(src, "train.eval_batch", int(eb))
    lr, src = val("learning_rate", 5e-5)
    b.put(src, "train.lr", float(lr))
    name, src = val("lr_scheduler_type", "linear")
    schedule(b, src, name.get("value", name) if isinstance(name, dict) else name)
    name, src = val("optim", "adamw_torch")
    optimizer(b, src, name)
    wd, src = val("weight_decay", 0.0)
    b.put(src, "train.weight_decay", float(wd))
    g, src = val("max_grad_norm", 1.0)
    b.put(src, "train.max_grad_norm", float(g) or None)
    used.update(("max_steps", "num_train_epochs"))
    if raw.get("max_steps") and int(raw["max_steps"]) > 0:
        b.put("max_steps", "train.updates", int(raw["max_steps"]))
        if "num_train_epochs" in raw and not same(raw["num_train_epochs"], defaults.get("num_train_epochs")):
            b.skip("num_train_epochs", raw["num_train_epochs"], "max_steps fixes the budget (it overrides epochs in "
                                                                "the Trainer too)")
    else:
        ep, src = val("num_train_epochs", 3.0)
        b.put(src, "train.epochs", float(ep))
        b.c["train"]["updates"] = None  # the budget is the epochs
    ml = None
    for k in ("max_length", "max_seq_length"):
        used.add(k)
        if raw.get(k) and ml is None:
            ml = k
    if ml:
        b.put(ml, "data.max_length", int(raw[ml]))
    if raw.get("packing") and b.c["task"] == "causal-lm":  # SFTConfig: rows of max_length tokens, several examples
        used.add("packing")
        b.put("packing", "data.packing", True)
    ckpt = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if raw.get(k)), None)
    if ckpt:  # transformers 5 renames gradient_checkpointing to activation_checkpointing (its dump has both)
        b.put(ckpt, "model.gradient_checkpointing", True)
    used.update(("gradient_checkpointing", "activation_checkpointing"))
    used.update(("bf16", "fp16"))
    precision(b, "bf16", raw.get("bf16"), "fp16", raw.get("fp16"), False)
    s, src = val("seed", 42)
    b.put(src, "seed", int(s))
    _distribution(raw, b, used)
    b.read_examples()
    _warmup(raw, b, used)
    _evals_and_saves(raw, b, used)
    _loss_masks(raw, b, used)
    used.add("trust_remote_code")
    if raw.get("trust_remote_code"):
        b.put("trust_remote_code", "model.trust_remote_code", True)

    for k, v in raw.items():
        if k in used or empty(v) or v is False or same(v, defaults.get(k, None)):
            continue
        if isinstance(v, str) and v.startswith("<") and v.endswith(">") and v[1:-1].replace("_", "").isupper():
            continue  # to_json_string's placeholder for a secret (<HUB_TOKEN>): nothing the user set here
        if k == "accelerator_config" and isinstance(v, dict) and all(
                same(x, defaults[k].get(n)) for n, x in v.items()):
            continue  # to_dict writes the defaults of an accelerator_config nobody set
        if k in ("packing", "padding_free") and not v:
            continue
        reason = HF_REASONS.get(k) or (NOTHING if k.startswith(HF_NOTHING_PREFIXES) else
                                       "pilotrun has no such setting: the rehearsal runs as if it were unset")
        b.skip(k, v, reason)


def _distribution(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    used.update(("fsdp", "fsdp_config", "deepspeed"))
    fsdp = raw.get("fsdp")
    if fsdp and fsdp not in ("", []) and fsdp is not False:
        b.put("fsdp", "train.strategy", "fsdp")
        if "offload" in str(fsdp):
            b.skip("fsdp", fsdp, "parameters offloaded to CPU in the source: memory per GPU there is smaller than "
                                 "rehearsed; `estimate --options` prices offload")
    if raw.get("deepspeed"):
        strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])
    if b.c["train"].get("strategy") in ("fsdp", "ddp"):
        b.put("fsdp/deepspeed (no count in the source)", "train.nproc", 2,
              "the GPU count comes from the launcher (torchrun, accelerate): rehearsed on 2 ranks, the fewest that "
              "shard; memory per GPU at more ranks is smaller; set train.nproc to the count")
        b.to_set.append("train.nproc")


def _warmup(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    """The Trainer's rule: warmup_steps of 1 or more as given; below 1 (transformers 5) or warmup_ratio (4.x), the
    ceiling of that share of the updates."""
    used.update(("warmup_steps", "warmup_ratio"))
    ws, wr = raw.get("warmup_steps") or 0, raw.get("warmup_ratio") or 0
    if ws and float(ws) >= 1:
        b.put("warmup_steps", "train.warmup", int(ws))
    elif ws or wr:
        b.share("warmup_steps" if ws else "warmup_ratio", "train.warmup", float(ws or wr), minimum=0)


def _evals_and_saves(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    """eval/save strategy "steps": every eval_steps (its default: logging_steps) / save_steps updates, a share of the
    budget below 1 (rounded up, as the Trainer does); "epoch": once per epoch; save "no": only at the end; save
    "best": at each validation."""
    used.update(("eval_steps", "save_steps", "eval_strategy", "evaluation_strategy", "save_strategy"))
    ev = str(_strategy(raw.get("eval_strategy") or raw.get("evaluation_strategy") or "no"))
    sv = str(_strategy(raw.get("save_strategy") or "steps"))
    ev_src = "eval_strategy" if raw.get("eval_strategy") else "evaluation_strategy"
    if ev == "steps":
        v, src = raw.get("eval_steps"), "eval_steps"
        if v is None:
            v, src = raw.get("logging_steps"), "logging_steps (eval_steps defaults to it)"
        if v is not None:
            _every(b, src, "train.eval_every", v)
    elif ev == "epoch":
        b.per_epoch(ev_src, "train.eval_every", 1)
    elif ev_src in raw:
        b.skip(ev_src, ev, "the source never validates; the rehearsal validates every train.eval_every updates")
    if sv == "steps" and "save_steps" in raw:
        _every(b, "save_steps", "train.save_every", raw["save_steps"])
    elif sv == "epoch":
        b.per_epoch("save_strategy", "train.save_every", 1)
    elif sv == "no":
        b.put("save_strategy", "train.save_every", None, "no: the source saves no checkpoint during training; the "
                                                           "rehearsal saves only at the end")
    elif sv == "best" and b.c["train"].get("eval_every"):
        b.put("save_strategy", "train.save_every", b.c["train"]["eval_every"], "best: at each validation")
    if sv != "steps" and raw.get("save_steps") is not None:
        b.skip("save_steps", raw["save_steps"], f"nothing to rehearse: save_strategy is {sv}, so the Trainer does "
                                                "not read it")


def _strategy(v: Any) -> str:
    return v.get("value", v) if isinstance(v, dict) else v


def _every(b: Builder, src: str, key: str, v: Any) -> None:
    if float(v) < 1:
        b.share(src, key, float(v))
    else:
        b.put(src, key, int(float(v)))


def _loss_masks(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    """TRL's loss masks."""
    used.update(("completion_only_loss", "assistant_only_loss"))
    if raw.get("completion_only_loss") is False:
        b.skip("completion_only_loss", False, HF_REASONS["completion_only_loss"])
    elif raw.get("completion_only_loss"):
        b.skip("completion_only_loss", True, "nothing to rehearse: the rehearsal's loss is on the completion "
                                             "(data.response) only, as the source's")
    if raw.get("assistant_only_loss") and not b.c["data"].get("messages"):
        b.put("assistant_only_loss", "data.messages", "messages", "the loss on the assistant turns only; the field "
                                                                  "holding the turns is TRL's default 'messages'")
        if "data.train" in b.to_set:
            b.to_set.remove("data.train")
            b.to_set.append("data.train (conversations in a 'messages' field)")
