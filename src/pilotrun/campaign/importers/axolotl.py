"""Axolotl's YAML → campaign: the model, the adapter, the batch and budget, the optimizer, precision, sharding."""

from __future__ import annotations

from typing import Any

from pilotrun.campaign.importers import preference, rl, schemas
from pilotrun.campaign.importers.axolotl_data import axolotl_data
from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.keys import check_keys, unknown_reason
from pilotrun.campaign.importers.reasons import PACKED_VALIDATION, AXOLOTL_REASONS, PLUGIN_ARGUMENT_REASONS, reason
from pilotrun.campaign.importers.settings import optimizer, precision, schedule, strategy_from_deepspeed
from pilotrun.campaign.importers.values import check_values
from pilotrun.tasks.hub import is_hub_id

# the defaults Axolotl applies when a key is absent, which differ from pilotrun's and move the rehearsal (its
# schema's own, read at import: schemas.default)
DEFAULTED = ("micro_batch_size", "gradient_accumulation_steps", "num_epochs", "sequence_len", "lr_scheduler",
             "optimizer", "weight_decay", "bf16")
FALLBACK = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1.0, "sequence_len": 512,
            "lr_scheduler": "cosine", "optimizer": "adamw_torch_fused", "weight_decay": 0.0, "bf16": "auto"}


def axolotl_default(key: str):
    value = schemas.default("axolotl", key)
    return FALLBACK[key] if value is None else value


def _plugins(raw: dict[str, Any]) -> list[str]:
    p = raw.get("plugins") or []
    return [str(x) for x in (p if isinstance(p, list) else [p])]


def check_axolotl_keys(raw: dict[str, Any], b: Builder) -> set[str]:
    """Typos are problems; unknown keys are named; keys of Axolotl's plugins are named with their plugin (loaded by
    the file or not). Returns the keys handled here (not to be named again)."""
    core, plugin_keys = schemas.known("axolotl"), schemas.known("axolotl", "plugin:")
    typos, unknown = check_keys(raw, core | plugin_keys, b.source, schemas.label("axolotl"))
    b.problems += typos
    handled = set(unknown)
    for k in unknown:
        if not empty(raw[k]):
            b.skip(k, raw[k], unknown_reason("axolotl"))
    loaded = _plugins(raw)
    for k in raw:
        if k in core or k not in plugin_keys or empty(raw[k]):
            continue
        handled.add(k)
        plugin = schemas.plugin_of(k) or "a plugin"
        if any(p.startswith(plugin) for p in loaded):
            b.skip(k, raw[k], PLUGIN_ARGUMENT_REASONS.get(k) or f"an argument of the plugin {plugin}, which the "
                                                                "rehearsal does not run")
        else:
            b.skip(k, raw[k], f"an argument of the plugin {plugin}, which the file does not load (plugins:): "
                              "Axolotl ignores it too")
    ds_known = schemas.known("axolotl", "datasets")
    for group in ("datasets", "test_datasets"):
        for i, d in enumerate(raw.get(group) or []):
            if not isinstance(d, dict):
                continue
            typos, unknown = check_keys(d, ds_known, b.source, schemas.label("axolotl"), where_prefix="datasets[].")
            b.problems += typos
            for k in unknown:
                if not empty(d[k]):
                    b.skip(f"{group}[{i}].{k}", d[k], unknown_reason("axolotl"))
    return handled


def import_axolotl(raw: dict[str, Any], b: Builder) -> None:
    check_values(raw, ("axolotl",), b)  # the numbers the mappers compute with, and the data sets they walk
    if b.problems:  # a datasets: 3 is no list to check the keys of
        return
    handled = check_axolotl_keys(raw, b)
    for key in ("rl", "reward_model", "process_reward_model"):  # never a supervised campaign (rl.py)
        if raw.get(key) and not (key == "rl" and preference.carries(raw[key])):  # dpo, ipo, orpo, simpo: preference.py
            rl.refuse(b, key, raw[key])
            return
    if raw.get("processor_type") or raw.get("is_multimodal"):
        key = "processor_type" if raw.get("processor_type") else "is_multimodal"
        b.ask(f"{key} = {raw[key]!r}: a multimodal model (images or audio beside the text); pilotrun rehearses text "
              "models", "rehearse the language model alone on the text of the data (its own base_model), or leave "
              "this config out")
        return
    used: set[str] = set()

    def get(k: str) -> Any:
        used.add(k)
        return raw.get(k)

    def value_or_default(k: str) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not empty(raw[k]):
            return raw[k], k
        return axolotl_default(k), f"{k} (Axolotl's default)"

    _model(raw, b, get)

    # the batch, the ranks and the budget: the data's updates are counted over them
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
    _distribution(raw, b, get)

    # the data
    if preference.carries(raw.get("rl")):
        preference.axolotl(raw, b, used)  # rl: its keys, and the data set's prompt and two answers
    else:
        axolotl_data(raw, b, used)
    seq, src = value_or_default("sequence_len")
    b.put(src, "data.max_length", int(seq))
    if b.c["task"] == "causal-lm" and get("sample_packing"):  # rows of sequence_len tokens, several examples each
        b.put("sample_packing", "data.packing", True)
        if get("eval_sample_packing") is False:
            b.skip("eval_sample_packing", False, PACKED_VALIDATION)
    if get("train_on_inputs"):
        b.skip("train_on_inputs", True, "the source's loss includes the prompt tokens; the rehearsal's loss sees only "
                                        "the response (and the assistant turns): loss values differ, memory does not")
    b.read_examples(None if raw.get("test_datasets") else raw.get("val_set_size"))

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
    _warmup(raw, b, get)

    # validation and checkpoints: every N updates, a share of the budget, or N per epoch (Axolotl turns N per
    # epoch into the share 1 / (N x epochs), which the Trainer rounds up)
    for steps, per_epoch, key in (("eval_steps", "evals_per_epoch", "train.eval_every"),
                                  ("save_steps", "saves_per_epoch", "train.save_every")):
        if get(steps) is not None:
            v = raw[steps]
            if float(v) < 1:
                b.share(steps, key, float(v))
            else:
                b.put(steps, key, int(v))
        elif get(per_epoch):
            b.per_epoch(per_epoch, key, int(raw[per_epoch]))
    if get("early_stopping_patience"):
        b.put("early_stopping_patience", "train.stop.patience", int(raw["early_stopping_patience"]))

    # precision, seed
    bf16_default = "bf16" not in raw
    precision(b, "bf16", raw.get("bf16", axolotl_default("bf16")), "fp16", raw.get("fp16"), bf16_default)
    used.update(("bf16", "fp16"))
    if b.c["train"]["precision"] == "bf16-mixed":
        b.put("bf16" + (" (the source's default)" if bf16_default else ""), "model.dtype", "bfloat16",
              "Axolotl loads the weights in bf16 when training in bf16")
    if get("bfloat16"):
        b.put("bfloat16", "train.precision", "bf16-true")
    if get("seed") is not None:
        b.put("seed", "seed", int(raw["seed"]))
    _quantized_base(raw, b, get)

    for k, v in raw.items():
        if k in used or k in handled or empty(v) or v is False:
            continue
        b.skip(k, v, reason(k, AXOLOTL_REASONS))


def _model(raw: dict[str, Any], b: Builder, get) -> None:
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
    for key in ("overrides_of_model_config", "model_config"):  # model_config: Axolotl's alias
        overrides = get(key)
        if isinstance(overrides, dict) and overrides:  # e.g. a mixture of experts' output_router_logits
            b.put(key, "model.config_overrides", dict(overrides))
    gc = get("gradient_checkpointing")
    if gc:
        b.put("gradient_checkpointing", "model.gradient_checkpointing", True,
              "" if gc is True else f"{gc}: activations offloaded in the source; kept on the device here")

    # the adapter
    adapter = get("adapter")
    for k in ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_target_linear"):
        get(k)
    if adapter in ("lora", "qlora"):
        b.put("adapter", "model.adapter.kind", "lora", "" if adapter == "lora" else "QLoRA: the 4-bit base is "
              "load_in_4bit's (model.quantization)" if raw.get("load_in_4bit") else "qlora without load_in_4bit: "
              "Axolotl loads the base unquantised, and so does the rehearsal")
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
    elif adapter:
        b.skip("adapter", adapter, f"the {adapter} adapter is not rehearsed: the rehearsal trains the full model, so "
                                   "its gradient and optimizer memory is far larger than the rental's")


FSDP_QUANTIZED = ("the source shards a quantised base with FSDP (FSDP-QLoRA: 4-bit weights stored in bf16 so FSDP "
                  "can shard them), which the rehearsal does not: it holds the base in model.dtype under FSDP, so "
                  "its weight memory is about 4x (bf16) the rental's; `pilotrun estimate --options` prices QLoRA")
_BNB_4BIT = {"bnb_4bit_quant_type": "type", "bnb_4bit_use_double_quant": "double_quant",
             "bnb_4bit_compute_dtype": "compute_dtype"}


def _quantized_base(raw: dict[str, Any], b: Builder, get) -> None:
    """load_in_4bit / load_in_8bit: the base as Axolotl's QLoRA loads it (BitsAndBytesConfig: nf4, double-quantised,
    computing in the training dtype), with bnb_config_kwargs' 4-bit settings over those defaults."""
    four, eight, kwargs = get("load_in_4bit"), get("load_in_8bit"), get("bnb_config_kwargs")
    if not (four or eight):
        if kwargs:
            b.skip("bnb_config_kwargs", kwargs, "no load_in_4bit or load_in_8bit: nothing is quantised in the source")
        return
    if b.c["train"].get("strategy") == "fsdp":  # FSDP-QLoRA: bf16-stored 4-bit shards, which pilotrun does not shard
        b.skip("load_in_4bit" if four else "load_in_8bit", True, FSDP_QUANTIZED)
        return
    if four and eight:
        b.skip("load_in_8bit", True, "load_in_4bit wins: the base is rehearsed in 4 bits")
    if not four:
        b.put("load_in_8bit", "model.quantization", {"bits": 8}, "bitsandbytes LLM.int8()")
        if kwargs:
            b.skip("bnb_config_kwargs", kwargs, "8-bit's settings (thresholds, fp16 weights) are bitsandbytes' "
                                                "defaults in the rehearsal")
        return
    dtype = b.c["model"].get("dtype") or "float32"
    q = {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": dtype}
    b.put("load_in_4bit", "model.quantization", q, f"Axolotl's QLoRA base: nf4, double-quantised, computing in "
                                                   f"the training dtype ({dtype})")
    for k, v in (kwargs or {}).items() if isinstance(kwargs, dict) else []:
        key = _BNB_4BIT.get(k)
        if key is None:
            b.skip(f"bnb_config_kwargs.{k}", v, "bnb_4bit_quant_storage packs the same 4-bit bytes in another dtype "
                   "(memory alike)" if k == "bnb_4bit_quant_storage" else "a bitsandbytes setting the rehearsal "
                   "keeps at its default")
            continue
        value = str(v).removeprefix("torch.") if key == "compute_dtype" else v
        if key == "compute_dtype" and value not in ("float32", "bfloat16", "float16"):
            value = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(str(value), value)
        q[key] = value
        b.put(f"bnb_config_kwargs.{k}", f"model.quantization.{key}", value)


def _distribution(raw: dict[str, Any], b: Builder, get) -> None:
    """FSDP or DeepSpeed: the strategy and its ranks. The data-parallel ranks are the source's when it names them
    (world_size, or dp_shard_size x dp_replicate_size); a sharded config that names none is rehearsed on 2 ranks,
    the fewest that shard (memory per GPU at more ranks is smaller), and says so."""
    fsdp, fsdp_config = get("fsdp"), get("fsdp_config")
    if fsdp or fsdp_config or raw.get("fsdp_version"):
        b.put("fsdp" if fsdp else "fsdp_config" if fsdp_config else "fsdp_version", "train.strategy", "fsdp")
        cfg = fsdp_config if isinstance(fsdp_config, dict) else {}
        if cfg.get("offload_params") or cfg.get("fsdp_offload_params") or "offload" in str(fsdp):
            b.skip("fsdp_config.offload_params", True, "parameters offloaded to CPU in the source: memory per GPU "
                                                       "there is smaller than rehearsed; `estimate --options` prices "
                                                       "offload")
        if cfg.get("activation_checkpointing") or cfg.get("fsdp_activation_checkpointing"):
            b.put("fsdp_config.activation_checkpointing", "model.gradient_checkpointing", True)
    if get("deepspeed"):
        strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])
    for k in ("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree"):
        if (raw.get(k) or 1) > 1:
            get(k)
            b.skip(k, raw[k], "model or sequence parallelism is not rehearsed: each GPU of the rental holds a share "
                              "of each layer (or of each sequence) that the rehearsal's ranks hold whole, so memory "
                              "per GPU there is smaller; `estimate --options` prices tensor parallel x FSDP")
    dp = None
    if raw.get("dp_shard_size") or raw.get("dp_replicate_size"):
        dp = int(raw.get("dp_shard_size") or 1) * int(raw.get("dp_replicate_size") or 1)
        src = " x ".join(k for k in ("dp_shard_size", "dp_replicate_size") if raw.get(k))
        get("dp_shard_size"), get("dp_replicate_size")
    elif raw.get("world_size"):
        dp, src = int(get("world_size")), "world_size"
    strategy = b.c["train"].get("strategy")
    if dp and dp > 1:
        if not strategy:
            b.put(src, "train.strategy", "ddp", "several data-parallel ranks and no sharding named")
        b.put(src, "train.nproc", dp)
    elif strategy in ("fsdp", "ddp"):
        b.put(f"{'fsdp' if strategy == 'fsdp' else 'deepspeed'} (no count in the source)", "train.nproc", 2,
              "the source's GPU count comes from its launcher: rehearsed on 2 ranks, the fewest that shard; memory "
              "per GPU at more ranks is smaller; set train.nproc to the count")
        b.to_set.append("train.nproc")


def _warmup(raw: dict[str, Any], b: Builder, get) -> None:
    """Axolotl's rule: warmup_steps as given, else floor(warmup_ratio x updates), else its default of 3% of the
    updates (at most 100); one warmup step becomes two."""
    if get("warmup_steps") is not None:
        n = int(raw["warmup_steps"])
        b.put("warmup_steps", "train.warmup", 2 if n == 1 else n, "1 warmup step is 2 in Axolotl" if n == 1 else "")
        return
    ratio = get("warmup_ratio")
    total = b.total_updates()
    if ratio is None and total is not None:
        n = min(int(0.03 * total), 100)
        b.put("warmup (Axolotl's default: 3% of the updates, at most 100)", "train.warmup", 2 if n == 1 else n,
              f"of {total} updates, from {b.counted()}")
        return
    if ratio is None:
        return
    n = b.share("warmup_ratio", "train.warmup", float(ratio), rounding="floor", minimum=0, tool="Axolotl")
    if n == 1:
        b.put("warmup_ratio", "train.warmup", 2, "1 warmup step is 2 in Axolotl")
