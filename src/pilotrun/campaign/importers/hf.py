"""Hugging Face ``TrainingArguments`` / TRL ``SFTConfig`` dicts → campaign."""

from __future__ import annotations

import json
from typing import Any

from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.keys import HF_OLD_KEYS, TRL_DEFAULTS, TRL_KEYS, typos
from pilotrun.campaign.importers.reasons import HF_NOTHING_PREFIXES, HF_REASONS, NOTHING
from pilotrun.campaign.importers.settings import optimizer, precision, schedule, strategy_from_deepspeed

def hf_defaults() -> dict[str, Any]:
    import dataclasses

    from transformers import TrainingArguments

    out = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def accelerator_defaults() -> dict[str, Any]:
    """What ``to_dict`` writes for an accelerator_config nobody set (the AcceleratorConfig defaults)."""
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    return json.loads(json.dumps(dataclasses.asdict(AcceleratorConfig()), default=str))


def same(v: Any, d: Any) -> bool:
    if empty(v) and empty(d):
        return True
    try:
        return v == d or str(v) == str(d) or (isinstance(v, (int, float)) and float(v) == float(d))
    except (TypeError, ValueError):
        return False


def import_hf(raw: dict[str, Any], b: Builder) -> None:
    defaults = hf_defaults()
    defaults["accelerator_config"] = accelerator_defaults()
    defaults.update({k: v for k, v in TRL_DEFAULTS.items() if k not in defaults})
    known = set(defaults) | TRL_KEYS | HF_OLD_KEYS
    b.problems += typos(raw, known, b.source, "TrainingArguments/SFTConfig")
    used: set[str] = set()

    def val(k: str, default: Any = None) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not empty(raw[k]):
            return raw[k], k
        d = defaults.get(k, default)
        return d, f"{k} (the Trainer's default)"

    b.to_set += ["model.path", "data.train", "data.validation"]
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
    ckpt = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if raw.get(k)), None)
    if ckpt:  # transformers 5 renames gradient_checkpointing to activation_checkpointing (its dump has both)
        b.put(ckpt, "model.gradient_checkpointing", True)
    used.update(("gradient_checkpointing", "activation_checkpointing"))
    used.update(("bf16", "fp16"))
    precision(b, "bf16", raw.get("bf16"), "fp16", raw.get("fp16"), False)
    s, src = val("seed", 42)
    b.put(src, "seed", int(s))
    # warmup: warmup_steps below 1 is a ratio in transformers 5; warmup_ratio in 4.x
    used.update(("warmup_steps", "warmup_ratio"))
    ws, wr = raw.get("warmup_steps") or 0, raw.get("warmup_ratio") or 0
    if ws and float(ws) >= 1:
        b.put("warmup_steps", "train.warmup", int(ws))
    elif ws or wr:
        b.in_updates("warmup_steps" if ws else "warmup_ratio", "train.warmup", float(ws or wr), ratio_of="total",
                     minimum=0)
    for k, key in (("eval_steps", "train.eval_every"), ("save_steps", "train.save_every")):
        used.add(k)
        v = raw.get(k)
        if v is None and k == "eval_steps" and str(raw.get("eval_strategy") or raw.get("evaluation_strategy")) \
                == "steps":
            v = raw.get("logging_steps")  # the Trainer's eval_steps defaults to logging_steps
        if v is None or (k == "save_steps" and k not in raw):
            continue
        if float(v) < 1:
            b.in_updates(k, key, float(v), ratio_of="total")
        else:
            b.put(k, key, int(float(v)))
    used.add("fsdp")
    fsdp = raw.get("fsdp")
    if fsdp and fsdp not in ("", []) and fsdp is not False:
        b.put("fsdp", "train.strategy", "fsdp")
        b.to_set.append("train.nproc")
        if "offload" in str(fsdp):
            b.skip("fsdp", fsdp, "parameters offloaded to CPU in the source: memory per GPU there is smaller than "
                                 "rehearsed; `estimate --options` prices offload")
    used.add("fsdp_config")
    used.add("deepspeed")
    if raw.get("deepspeed"):
        strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])
    # TRL's loss masks
    used.update(("completion_only_loss", "assistant_only_loss"))
    if raw.get("completion_only_loss") is False:
        b.skip("completion_only_loss", False, HF_REASONS["completion_only_loss"])
    elif raw.get("completion_only_loss"):
        b.skip("completion_only_loss", True, "nothing to rehearse: the rehearsal's loss is on the completion "
                                             "(data.response) only, as the source's")
    if raw.get("assistant_only_loss"):
        b.put("assistant_only_loss", "data.messages", "messages", "the loss on the assistant turns only; the field "
                                                                  "holding the turns is TRL's default 'messages'")
        b.to_set.remove("data.train")
        b.to_set.append("data.train (conversations in a 'messages' field)")
    if raw.get("eval_strategy") in ("no",) or raw.get("evaluation_strategy") in ("no",):
        pass
    used.add("trust_remote_code")
    if raw.get("trust_remote_code"):
        b.put("trust_remote_code", "model.trust_remote_code", True)

    for k, v in raw.items():
        if k in used or k not in known or empty(v) or v is False or same(v, defaults.get(k, None)):
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
