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


def which(raw: dict[str, Any]) -> str | None:
    """The foreign tool a config is from, by keys only it has, else None."""
    keys = set(raw)
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
