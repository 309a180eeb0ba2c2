"""What leaving a setting out does to the rehearsal: the reasons named for each setting not carried."""

from __future__ import annotations

from typing import Any

NOTHING = "nothing to rehearse (logging, tracking, output or publishing)"
SPEED = "a speed setting: the figures of time on the rental may differ, memory and the loss do not"
ATTENTION = ("attention kernel: memory on CUDA differs from the eager attention rehearsed here (flash and sdpa "
             "attention hold no seq x seq scores, so the rental needs less for long sequences)")



PACKED_VALIDATION = ("false in the source: its validation rows hold one example each; the rehearsal packs validation "
                     "as it packs training (data.packing applies to every split), so evaluation is sized at full "
                     "rows: at most more memory than the rental's evaluation needs, never less")

AXOLOTL_REASONS = {
    "sample_packing": "the source packs several examples into one row of up to sequence_len tokens; pilotrun packs "
                      "causal-lm rows (data.packing), not preference pairs: this campaign trains one pair per row, so "
                      "its memory figures are for rows as long as the longest pair, not for full packed rows",
    "eval_sample_packing": "packing of the validation rows: see sample_packing",
    "pad_to_sequence_len": "the source pads every row to sequence_len; the rehearsal pads to the longest row of a "
                           "micro-batch, and its worst case (the longest rows) is what the memory figures show",
    "flash_attention": ATTENTION, "sdp_attention": ATTENTION, "xformers_attention": ATTENTION,
    "flex_attention": ATTENTION, "s2_attention": ATTENTION, "attn_implementation": ATTENTION, "attention": ATTENTION,
    "debug": NOTHING, "use_otel_metrics": NOTHING, "otel_metrics_host": NOTHING, "otel_metrics_port": NOTHING,
    "chunked_cross_entropy": "the logits are never held whole on the rental: memory there is smaller than rehearsed",
    "tiled_mlp": "the MLP runs in tiles on the rental: activation memory there is smaller than rehearsed",
    "tf32": "TF32 matmuls on Ampere and later: speed only, the loss moves in the last digits; nothing on CPU",
    "deepspeed": "DeepSpeed is not rehearsed: the nearest strategy (ZeRO-3 → fsdp, ZeRO-1/2 → ddp) is set when the "
                 "file name says the stage; memory per GPU under DeepSpeed differs from FSDP's",
    "special_tokens": "tokens the source adds or sets on the tokenizer: the rehearsal uses the tokenizer as saved; "
                      "save it with these tokens and point model.tokenizer at it",
    "tokens": "tokens the source adds to the vocabulary: the rehearsal's embedding is not resized",
    "lora_modules_to_save": "modules the source trains in full beside the adapter: the rehearsal trains only the "
                            "LoRA matrices, so its gradient and optimizer memory is smaller",
    "lora_fan_in_fan_out": "a layout detail of Conv1D models (GPT-2); peft detects it",
    "peft_use_dora": "DoRA adds a magnitude vector per adapted layer: not rehearsed (plain LoRA is)",
    "peft_use_rslora": "rank-stabilised scaling alpha/sqrt(r): the rehearsal scales alpha/r, so its update size differs",
    "neftune_noise_alpha": "noise on the embeddings during training: not rehearsed; the loss curve differs",
    "group_by_length": "length-grouped batches: the rehearsal samples in random order; the worst case is the same",
    "val_set_size": "the source splits validation off the training data at random; pilotrun validates on a file: "
                    "split one off with `pilotrun split` (by unit, so no conversation leaks) and set data.validation",
    "torch_compile": SPEED, "unsloth_cross_entropy_loss": SPEED, "unsloth_lora_mlp": SPEED,
    "unsloth_lora_qkv": SPEED, "unsloth_lora_o": SPEED, "unsloth_rms_norm": SPEED, "unsloth_rope": SPEED,
    "lora_mlp_kernel": SPEED, "lora_qkv_kernel": SPEED, "lora_o_kernel": SPEED, "liger_rope": SPEED,
    "liger_rms_norm": SPEED, "liger_glu_activation": SPEED, "liger_layer_norm": SPEED,
    "liger_cross_entropy": "a fused cross-entropy: memory of the logits on the rental is smaller than rehearsed",
    "liger_fused_linear_cross_entropy": "the logits are never held whole on the rental: memory there is smaller than "
                                        "rehearsed for large vocabularies",
    "cut_cross_entropy": "the logits are never held whole on the rental: memory there is smaller than rehearsed",
    "flash_attn_cross_entropy": SPEED, "flash_attn_rms_norm": SPEED, "flash_attn_fuse_qkv": SPEED,
    "flash_attn_fuse_mlp": SPEED, "flash_optimum": SPEED,
    "plugins": "plugins change the training loop in ways the rehearsal does not know",
    "lr_scheduler_kwargs": "scheduler arguments: the rehearsal's schedule takes none",
    "cosine_min_lr_ratio": "the rehearsal's cosine decays to 0, not to this share of lr",
    "logging_steps": NOTHING, "save_total_limit": "how many checkpoints the source keeps: disk only",
    "early_stopping_patience": None,  # carried
    "resume_from_checkpoint": "the rehearsal starts from the base model; `pilotrun resume` tests resuming",
    "dataset_prepared_path": NOTHING, "output_dir": NOTHING, "strict": "nothing to rehearse: a loading detail",
    "base_model_config": None, "tokenizer_config": None,
    "model_type": "nothing to rehearse: the model class is read from config.json", "tokenizer_type": "nothing to rehearse: the tokenizer class is read "
                                                                                 "from the tokenizer's files",
    "is_llama_derived_model": "nothing to rehearse: read from config.json", "is_mistral_derived_model": "nothing to rehearse: read from config.json",
    "is_qwen_derived_model": "nothing to rehearse: read from config.json", "is_falcon_derived_model": "nothing to rehearse: read from config.json",
    "ddp_find_unused_parameters": "nothing to rehearse: a DDP detail",
    "gradient_checkpointing_kwargs": "the rehearsal checkpoints without reentrancy (use_reentrant: false)",
    "fsdp_version": "the rehearsal's FSDP is FSDP2 (fully_shard)", "fsdp_final_state_dict_type": NOTHING,
    "save_safetensors": "nothing to rehearse: the rehearsal always saves safetensors", "auto_resume_from_checkpoints": NOTHING,
    "eval_table_size": NOTHING, "eval_max_new_tokens": NOTHING, "special_tokens_": NOTHING,
    "dataset_processes": SPEED, "dataset_num_proc": SPEED, "dataloader_num_workers": SPEED,
    "dataloader_pin_memory": SPEED, "dataloader_prefetch_factor": SPEED,
    "max_grad_norm_": None,
    # mixtures of experts
    "experts_implementation": "the experts' kernel: the rehearsal runs transformers' default (grouped_mm where torch "
                              "has it); the experts' temporaries and speed differ under another",
    "unfrozen_parameters": "the source trains only the parameters these patterns match (the rest frozen); the "
                           "rehearsal trains them all, so its gradient and optimizer memory is larger than the rental's",
    "quantize_moe_experts": "the source quantizes the experts' weights; the rehearsal holds them in model.dtype, so "
                            "its expert memory is larger than the rental's",
    "llama4_linearized_experts": "Llama 4's experts as linear layers in the source; the rehearsal keeps "
                                 "transformers' fused experts (the same parameters)",
}
# arguments of a plugin the file loads whose effect the rehearsal can say more precisely than "not run"
PLUGIN_ARGUMENT_REASONS = {
    "expert_parallel_size": "expert parallelism (the routed experts split over these GPUs) is not trained in the "
                            "rehearsal: `pilotrun estimate --options` prices expert parallel × FSDP rows (the experts "
                            "÷ EP, every GPU sized for the routing worst case)",
}
PREFIX_REASONS = (("wandb_", NOTHING), ("use_wandb", NOTHING), ("mlflow_", NOTHING), ("use_mlflow", NOTHING),
                   ("comet_", NOTHING), ("use_comet", NOTHING), ("gradio_", NOTHING), ("hub_", NOTHING),
                   ("push_", NOTHING), ("use_tensorboard", NOTHING), ("include_tokens", NOTHING),
                   ("profiler_", NOTHING), ("ray_", NOTHING), ("use_ray", NOTHING), ("fsdp_config", None))


def reason(key: str, table: dict[str, Any]) -> str:
    if table.get(key):
        return table[key]
    for prefix, why in PREFIX_REASONS:
        if key.startswith(prefix) and why:
            return why
    return "pilotrun has no such setting: the rehearsal runs as if it were unset"



HF_REASONS = {
    "packing": AXOLOTL_REASONS["sample_packing"].replace("sequence_len", "max_length"),
    "padding_free": "rows concatenated without padding in the source: memory per micro-batch there is set by the "
                    "tokens, not the longest row",
    "tf32": AXOLOTL_REASONS["tf32"],
    "completion_only_loss": "false in the source: the loss covers the prompt too; the rehearsal's loss is on the "
                            "completion only: loss values differ, memory does not",
    "dataset_text_field": "a plain-text data set: pilotrun needs the prompt and response fields (data.prompt: \"\" and "
                          "data.response: the text field trains on the whole text)",
    "use_liger_kernel": AXOLOTL_REASONS["liger_fused_linear_cross_entropy"],
    "use_liger": AXOLOTL_REASONS["liger_fused_linear_cross_entropy"],
    "torch_compile": SPEED, "dataloader_num_workers": SPEED, "dataloader_pin_memory": SPEED,
    "group_by_length": AXOLOTL_REASONS["group_by_length"],
    "neftune_noise_alpha": AXOLOTL_REASONS["neftune_noise_alpha"],
    "resume_from_checkpoint": AXOLOTL_REASONS["resume_from_checkpoint"],
    "save_total_limit": AXOLOTL_REASONS["save_total_limit"],
    "activation_offloading": "activations offloaded to CPU in the source: memory there is smaller than rehearsed",
    "use_cpu": "nothing to rehearse: pilotrun picks the device it rehearses on",
    "no_cuda": "nothing to rehearse: pilotrun picks the device it rehearses on",
    "eval_strategy": "nothing to rehearse: pilotrun validates every train.eval_every updates",
    "attn_implementation": ATTENTION,
    "load_in_4bit": "the base weights are 4-bit (bitsandbytes) in the source; the import does not carry TRL's "
                    "quantisation keys yet: set model.quantization ({bits: 4, type: nf4, double_quant: true, "
                    "compute_dtype: bfloat16}) to rehearse them",
    "load_in_8bit": "the base weights are 8-bit in the source; the import does not carry TRL's quantisation keys "
                    "yet: set model.quantization: {bits: 8} to rehearse them",
    "use_dora": AXOLOTL_REASONS["peft_use_dora"], "use_rslora": AXOLOTL_REASONS["peft_use_rslora"],
    "lora_modules_to_save": AXOLOTL_REASONS["lora_modules_to_save"],
    "dataset_config": "nothing to rehearse: the local file is read whole",
    "dataset_streaming": "nothing to rehearse: the local file is read whole",
    "model_revision": "nothing to rehearse: a local model folder has one revision",
    "evaluation_strategy": "nothing to rehearse: pilotrun validates every train.eval_every updates",
}
HF_NOTHING_PREFIXES = ("logging_", "log_", "report_to", "run_name", "output_dir", "push_to_hub", "hub_", "disable_tqdm",
                       "save_strategy", "save_only_model", "save_safetensors", "overwrite_output_dir", "eval_strategy",
                       "evaluation_strategy", "do_train", "do_eval", "do_predict", "load_best_model_at_end",
                       "metric_for_best_model", "prediction_loss_only", "label_names", "remove_unused_columns",
                       "ddp_", "dataloader_", "local_rank", "skip_memory_metrics", "include_", "project",
                       "trackio_")
