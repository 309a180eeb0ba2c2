"""Axolotl's YAML → campaign: the model, the adapter, the batch and budget, the optimizer, precision, sharding."""

from __future__ import annotations

import difflib
from typing import Any

from pilotrun.campaign.importers.axolotl_data import axolotl_data
from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.keys import AXOLOTL_DATASET_KEYS, AXOLOTL_KEYS, typos
from pilotrun.campaign.importers.reasons import AXOLOTL_REASONS, reason
from pilotrun.campaign.importers.settings import optimizer, precision, schedule, strategy_from_deepspeed
from pilotrun.tasks.hub import is_hub_id

# the defaults Axolotl applies when a key is absent, which differ from pilotrun's and move the rehearsal
AXOLOTL_DEFAULTS = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1.0,
                    "sequence_len": 512, "lr_scheduler": "cosine", "optimizer": "adamw_torch_fused",
                    "weight_decay": 0.0, "bf16": "auto"}



def import_axolotl(raw: dict[str, Any], b: Builder) -> None:
    plugin_args: set[str] = set()
    if raw.get("plugins"):  # plugins add their own keys: one far from every core key is a plugin's, not a typo
        plugin_args = {k for k in raw if k not in AXOLOTL_KEYS
                       and not difflib.get_close_matches(str(k), sorted(AXOLOTL_KEYS), n=1, cutoff=0.8)}
    b.problems += typos({k: v for k, v in raw.items() if k not in plugin_args}, AXOLOTL_KEYS, b.source, "Axolotl")
    for k in plugin_args:
        if not empty(raw[k]):
            b.skip(k, raw[k], f"not a key of Axolotl's core: an argument of a plugin ({', '.join(map(str, raw['plugins']))}), "
                              "which the rehearsal does not run")
    for i, d in enumerate((raw.get("datasets") or []) + (raw.get("test_datasets") or [])):
        if isinstance(d, dict):
            b.problems += typos(d, AXOLOTL_DATASET_KEYS, b.source, "Axolotl", where_prefix="datasets[].")
    used: set[str] = set()

    def get(k: str) -> Any:
        used.add(k)
        return raw.get(k)

    def value_or_default(k: str) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not empty(raw[k]):
            return raw[k], k
        return AXOLOTL_DEFAULTS[k], f"{k} (Axolotl's default)"

    # the model
    base = get("base_model")
    if base:
        b.put("base_model", "model.path", base if is_hub_id(base, b.source.parent) else b.local_path("base_model", base))
    else:
        b.to_set.append("model.path")
    tok = get("tokenizer_config")
    if tok:
        b.put("tokenizer_config", "model.tokenizer", tok if is_hub_id(tok, b.source.parent)
              else b.local_path("tokenizer_config", tok))
    if get("trust_remote_code"):
        b.put("trust_remote_code", "model.trust_remote_code", True)
    gc = get("gradient_checkpointing")
    if gc:
        b.put("gradient_checkpointing", "model.gradient_checkpointing", True,
              "" if gc is True else f"{gc}: activations offloaded in the source; kept on the device here")

    # the adapter
    adapter = get("adapter")
    for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear"):
        used.add(k)
    if adapter in ("lora", "qlora"):
        b.put("adapter", "model.adapter.kind", "lora", "QLoRA's 4-bit base: see load_in_4bit" if adapter == "qlora" else "")
        if raw.get("lora_r") is not None:
            b.put("lora_r", "model.adapter.r", int(raw["lora_r"]))
        if raw.get("lora_alpha") is not None:
            b.put("lora_alpha", "model.adapter.alpha", float(raw["lora_alpha"]))
        if raw.get("lora_dropout") is not None:
            b.put("lora_dropout", "model.adapter.dropout", float(raw["lora_dropout"]))
        if raw.get("lora_target_linear"):
            b.put("lora_target_linear", "model.adapter.target_modules", "all-linear")
            if raw.get("lora_target_modules"):
                b.skip("lora_target_modules", raw["lora_target_modules"],
                       "lora_target_linear adapts every linear layer, these named ones included")
        elif raw.get("lora_target_modules"):
            tm = raw["lora_target_modules"]
            b.put("lora_target_modules", "model.adapter.target_modules", [tm] if isinstance(tm, str) else list(tm))
        if adapter == "qlora" and not raw.get("load_in_4bit"):
            b.skip("adapter", adapter, AXOLOTL_REASONS["load_in_4bit"])
    elif adapter:
        b.skip("adapter", adapter, f"the {adapter} adapter is not rehearsed: the rehearsal trains the full model, so "
                                   "its gradient and optimizer memory is far larger than the rental's")

    # the data
    axolotl_data(raw, b, used)
    seq, src = value_or_default("sequence_len")
    b.put(src, "data.max_length", int(seq))
    if get("train_on_inputs"):
        b.skip("train_on_inputs", True, "the source's loss includes the prompt tokens; the rehearsal's loss sees only "
                                        "the response (and the assistant turns): loss values differ, memory does not")

    # the batch and the budget
    mb, src = value_or_default("micro_batch_size")
    b.put(src, "train.micro_batch", int(mb))
    ga, src = value_or_default("gradient_accumulation_steps")
    if "gradient_accumulation_steps" not in raw and raw.get("batch_size") and raw.get("micro_batch_size"):
        used.add("batch_size")
        ga = max(1, int(raw["batch_size"]) // int(raw["micro_batch_size"]))
        src = "batch_size / micro_batch_size"
    b.put(src, "train.accumulation", int(ga))
    if get("eval_batch_size"):
        b.put("eval_batch_size", "train.eval_batch", int(raw["eval_batch_size"]))
    if get("max_steps"):
        b.put("max_steps", "train.updates", int(raw["max_steps"]))
        if raw.get("num_epochs") is not None:
            used.add("num_epochs")
            b.skip("num_epochs", raw["num_epochs"], "max_steps fixes the budget (the source stops at max_steps too)")
    else:
        ep, src = value_or_default("num_epochs")
        b.put(src, "train.epochs", float(ep))
        b.c["train"]["updates"] = None  # the budget is the epochs

    # the optimizer and the schedule
    lr = get("learning_rate")
    if lr is not None:
        b.put("learning_rate", "train.lr", float(lr))
    else:
        b.to_set.append("train.lr")
    name, src = value_or_default("optimizer")
    optimizer(b, src, name)
    wd, src = value_or_default("weight_decay")
    b.put(src, "train.weight_decay", float(wd))
    if get("max_grad_norm") is not None:
        b.put("max_grad_norm", "train.max_grad_norm", float(raw["max_grad_norm"]) or None)
    else:
        b.put("max_grad_norm (the Trainer's default)", "train.max_grad_norm", 1.0)
    name, src = value_or_default("lr_scheduler")
    schedule(b, src, name)
    b.read_examples()
    if get("warmup_steps") is not None:
        b.put("warmup_steps", "train.warmup", int(raw["warmup_steps"]))
    elif get("warmup_ratio") is not None:
        b.in_updates("warmup_ratio", "train.warmup", float(raw["warmup_ratio"]), ratio_of="total", minimum=0)

    # validation and checkpoints: every N updates, a share of the budget, or N per epoch
    for steps, per_epoch, key in (("eval_steps", "evals_per_epoch", "train.eval_every"),
                                  ("save_steps", "saves_per_epoch", "train.save_every")):
        if get(steps) is not None:
            v = raw[steps]
            if isinstance(v, float) and v < 1:
                b.in_updates(steps, key, v, ratio_of="total")
            else:
                b.put(steps, key, int(v))
        elif get(per_epoch):
            b.in_updates(per_epoch, key, int(raw[per_epoch]), ratio_of="epoch")
    if get("early_stopping_patience"):
        b.put("early_stopping_patience", "train.stop.patience", int(raw["early_stopping_patience"]))

    # precision, seed, distribution
    bf16_default = "bf16" not in raw
    precision(b, "bf16", raw.get("bf16", "auto"), "fp16", raw.get("fp16"), bf16_default)
    used.update(("bf16", "fp16"))
    if b.c["train"]["precision"] == "bf16-mixed":
        b.put("bf16" + (" (the source's default)" if bf16_default else ""), "model.dtype", "bfloat16",
              "Axolotl loads the weights in bf16 when training in bf16")
    if get("bfloat16"):
        b.put("bfloat16", "train.precision", "bf16-true")
    if get("seed") is not None:
        b.put("seed", "seed", int(raw["seed"]))
    fsdp = get("fsdp")
    fsdp_config = get("fsdp_config")
    if fsdp or fsdp_config:
        b.put("fsdp" if fsdp else "fsdp_config", "train.strategy", "fsdp")
        b.to_set.append("train.nproc")
        cfg = fsdp_config if isinstance(fsdp_config, dict) else {}
        if cfg.get("offload_params") or cfg.get("fsdp_offload_params") or "offload" in str(fsdp):
            b.skip("fsdp_config.offload_params", True, "parameters offloaded to CPU in the source: memory per GPU "
                                                       "there is smaller than rehearsed; `estimate --options` prices "
                                                       "offload")
        if cfg.get("activation_checkpointing") or cfg.get("fsdp_activation_checkpointing"):
            b.put("fsdp_config.activation_checkpointing", "model.gradient_checkpointing", True)
    if get("deepspeed"):
        strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])

    for k, v in raw.items():
        if k in used or k not in AXOLOTL_KEYS or empty(v) or v is False:
            continue
        b.skip(k, v, reason(k, AXOLOTL_REASONS))
