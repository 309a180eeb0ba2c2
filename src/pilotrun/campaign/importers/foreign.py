"""Configs of tools the import does not read, each refused (exit 2) with what to do instead.

LLaMA-Factory's YAML (``stage``, ``finetuning_type``, ``template``, ``cutoff_len`` beside TrainingArguments keys),
torchtune's recipe configs (``_component_`` builders), accelerate's launch configs (``distributed_type``,
``num_processes``), DeepSpeed's JSON (``zero_optimization``) and Axolotl's cloud configs (``gpu``, ``volumes``,
``secrets``: where ``axolotl train --cloud`` runs) are told by keys only they have. They are refused
whatever ``--from`` says: read as Axolotl or TrainingArguments they would import as half a campaign.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotrun.errors import BadInput

LLAMA_FACTORY = ("finetuning_type", "cutoff_len", "lora_rank", "dataset_dir", "quantization_bit", "template")
ACCELERATE = ("distributed_type", "compute_environment", "num_processes", "machine_rank", "num_machines")
DEEPSPEED = ("zero_optimization", "train_micro_batch_size_per_gpu", "train_batch_size")
AXOLOTL_CLOUD = ("provider", "gpu", "gpu_count", "node_count", "volumes", "secrets", "dockerfile_commands",
                 "memory_preprocess", "timeout_preprocess")
"""Keys of the file ``axolotl train config.yml --cloud cloud.yaml`` takes (examples/cloud: Modal, Baseten)."""
BY_HAND = ("start from `pilotrun init` and copy the values over: cutoff_len → data.max_length, "
           "per_device_train_batch_size → train.micro_batch, gradient_accumulation_steps → train.accumulation, "
           "learning_rate → train.lr, num_train_epochs → train.epochs, lora_rank → model.adapter.r, "
           "model_name_or_path → model.path")


def _components(raw: Any, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(raw, dict):
        return "_component_" in raw or any(_components(v, depth + 1) for v in raw.values())
    return False


TRAINING_KEYS = {"base_model", "datasets", "micro_batch_size", "per_device_train_batch_size", "learning_rate",
                 "model_name_or_path", "dataset_name", "output_dir"}
"""Keys a training config has (Axolotl's, the Trainer's, TRL's): a file holding one is never a model folder's file."""
MODEL_SHAPE = ("hidden_size", "n_embd", "d_model", "num_hidden_layers", "n_layer", "vocab_size")
GENERATION = ("max_new_tokens", "do_sample", "temperature", "top_p", "top_k", "num_beams", "repetition_penalty")


def folder_file(raw: dict[str, Any]) -> str | None:
    """Which file of a Hugging Face model or output folder ``raw`` is (its config.json, generation_config.json,
    a PEFT adapter_config.json, tokenizer_config.json, the Trainer's trainer_state.json), by its keys; else None.
    Each describes a model or records a run: none says how to train (a trainer_state.json's train_batch_size was
    taken for a DeepSpeed config's)."""
    keys = set(raw)
    if keys & TRAINING_KEYS:
        return None
    if {"log_history", "global_step"} <= keys:
        return "trainer-state"
    if "peft_type" in keys:
        return "adapter"
    if "model_type" in keys and (keys & set(MODEL_SHAPE) or "architectures" in keys):
        return "model"
    if "tokenizer_class" in keys or "added_tokens_decoder" in keys or "model_max_length" in keys:
        return "tokenizer"
    if "transformers_version" in keys and keys & set(GENERATION + ("bos_token_id", "eos_token_id")):
        return "generation"
    return None


def which(raw: dict[str, Any]) -> str | None:
    """The foreign tool a config is from, by keys only it has, else None."""
    keys = set(raw)
    if len(keys & {"model", "data", "train", "plan", "hardware"}) >= 2 and not keys & TRAINING_KEYS:
        return "pilotrun"
    if folder_file(raw):
        return "folder-file"
    if _components(raw):
        return "torchtune"
    if len(keys & set(LLAMA_FACTORY)) >= 2 or "stage" in keys and keys & set(LLAMA_FACTORY):
        return "llama-factory"
    if len(keys & set(ACCELERATE)) >= 2:
        return "accelerate"
    if keys & set(DEEPSPEED) and not keys & {"base_model", "per_device_train_batch_size", "datasets"}:
        return "deepspeed"
    if len(keys & set(AXOLOTL_CLOUD)) >= 2 and not keys & {"base_model", "datasets", "model_name_or_path"}:
        return "axolotl-cloud"
    return None


def refuse(raw: dict[str, Any], path: Path) -> None:
    tool = which(raw)
    if tool == "pilotrun":
        raise BadInput("a pilotrun campaign already (model:, data:, train: …), not a config to import from",
                       where=str(path), fix=f"run the verbs on it: pilotrun validate {path}")
    if tool == "folder-file":
        _refuse_folder_file(raw, path)
    if tool == "torchtune":
        raise BadInput("a torchtune recipe config (its `_component_` builders name Python classes): pilotrun does not "
                       "read torchtune's format", where=str(path),
                       fix="start from `pilotrun init` and copy the values over: tokenizer.max_seq_len → "
                           "data.max_length, batch_size → train.micro_batch, gradient_accumulation_steps → "
                           "train.accumulation, optimizer.lr → train.lr, epochs → train.epochs, model.lora_rank → "
                           "model.adapter.r, checkpointer.checkpoint_dir → model.path")
    if tool == "llama-factory":
        raise BadInput(f"a LLaMA-Factory config ({', '.join(k for k in LLAMA_FACTORY + ('stage',) if k in raw)}): "
                       "pilotrun does not read LLaMA-Factory's format (its data sets are names in dataset_info.json, "
                       "its prompt a named template)", where=str(path), fix=BY_HAND)
    if tool == "accelerate":
        raise BadInput("an accelerate launch config (distributed_type, num_processes): it says how to launch, not "
                       "what to train", where=str(path),
                       fix="import the training config it launches (Axolotl YAML, TrainingArguments or TRL file), "
                           f"then set train.nproc: {raw.get('num_processes') or 'N'} and train.strategy: fsdp (or "
                           "ddp) as the launch config says")
    if tool == "axolotl-cloud":
        gpus = raw.get("gpu_count")
        raise BadInput(f"an Axolotl cloud config ({', '.join(k for k in AXOLOTL_CLOUD if k in raw)}): it says where "
                       "to run (`axolotl train config.yml --cloud` this file), not what to train", where=str(path),
                       fix="import the training config it runs (config.yml in that command)"
                           + (f", then set hardware.gpus: {gpus}" if isinstance(gpus, int) and gpus > 0 else "")
                           + (f"; for the GPU it names ({raw['gpu']}), give `pilotrun sheet --gpu` the catalogue's "
                              "key (h100-sxm, a100-80gb …)" if raw.get("gpu") else ""))
    if tool == "deepspeed":
        raise BadInput("a DeepSpeed config (zero_optimization): it says how to shard, not what to train",
                       where=str(path),
                       fix="import the training config that names it (its `deepspeed:` key is read: ZeRO-3 → fsdp, "
                           "ZeRO-1/2 → ddp)")


def _refuse_folder_file(raw: dict[str, Any], path: Path) -> None:
    kind = folder_file(raw)
    folder = path.parent
    then = "import the training config that fine-tunes it (Axolotl YAML, TrainingArguments or TRL file), or start "\
           "from `pilotrun init`"
    if kind == "trainer-state":
        raise BadInput(f"the Trainer's record of a run (trainer_state.json: global_step {raw.get('global_step')}, "
                       "log_history): it records what a run did, not how to train", where=str(path),
                       fix="import the run's arguments: `trainer.args.to_json_string()` written to a .json (the "
                           "training_args.bin beside it is a pickle, which pilotrun never loads)")
    if kind == "adapter":
        lora = {k: raw.get(s) for k, s in (("r", "r"), ("alpha", "lora_alpha"), ("dropout", "lora_dropout"),
                                            ("target_modules", "target_modules")) if raw.get(s) is not None}
        shown = ", ".join(f"{k}: {sorted(v) if isinstance(v, (list, set)) else v}" for k, v in lora.items())
        raise BadInput(f"a PEFT adapter's config ({raw.get('peft_type')}, adapter_config.json): it describes a trained "
                       "adapter, not how to train one", where=str(path),
                       fix=then + (f"; its settings as the campaign writes them: model.adapter: {{{shown}}}"
                                   if raw.get("peft_type") == "LORA" and shown else ""))
    what = {"model": f"a model's config.json (model_type {raw.get('model_type')}): it describes a model",
            "tokenizer": "a tokenizer's config (tokenizer_config.json): it describes a tokenizer",
            "generation": "a model's generation config (generation_config.json): it says how the model samples "
                          "text"}[kind]
    raise BadInput(f"{what}, not how to train it", where=str(path),
                   fix=f"{then}; a campaign names this folder as model.path" + (" (or model.tokenizer)"
                                                                                if kind == "tokenizer" else "")
                       + f": {folder}")
