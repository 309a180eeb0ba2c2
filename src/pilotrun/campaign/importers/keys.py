"""The keys each tool knows, and the typo rule: a key the source tool does not know is named with the nearest one."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from pilotrun.errors import BadInput

# Axolotl's config keys (its config reference, utils/schemas/*.py): the whole top level, so a typo is named.
AXOLOTL_KEYS = set("""
base_model base_model_config cls_model_config revision_of_model model_revision tokenizer_config tokenizer_use_fast
tokenizer_legacy tokenizer_use_mistral_common tokenizer_type processor_type tokenizer_save_jinja_files
trust_remote_code experimental_skip_move_to_device use_kernels model_quantization_config
model_quantization_config_kwargs model_type type_of_model model_config overrides_of_model_config model_kwargs
overrides_of_model_kwargs output_dir hub_model_id hub_strategy hub_revision save_safetensors load_in_8bit
load_in_4bit adapter lora_model_dir lora_r lora_alpha lora_fan_in_fan_out lora_target_modules
lora_target_parameters lora_target_linear lora_modules_to_save lora_dropout peft_layers_to_transform
peft_layers_pattern peft peft_use_dora peft_use_rslora peft_layer_replication peft_init_lora_weights
peft_trainable_token_indices peft_ensure_weight_tying peft_autocast_adapter_dtype qlora_sharded_model_loading
lora_on_cpu gptq bnb_config_kwargs loraplus_lr_ratio loraplus_lr_embedding merge_lora merge_method relora
relora_steps relora_warmup_steps relora_anneal_steps relora_prune_ratio relora_prune_method relora_cpu_offload
jagged_restart_steps jagged_restart_warmup_steps jagged_restart_anneal_steps gradient_accumulation_steps
micro_batch_size batch_size eval_batch_size auto_find_batch_size train_on_inputs group_by_length learning_rate
embedding_lr embedding_lr_scale weight_decay optimizer optim_args optim_target_modules torchdistx_path
lr_scheduler lr_scheduler_kwargs lr_quadratic_warmup cosine_min_lr_ratio cosine_constant_lr_ratio lr_div_factor
lr_groups adam_epsilon adam_epsilon2 adam_beta1 adam_beta2 adam_beta3 max_grad_norm num_epochs use_wandb
wandb_name wandb_run_id wandb_mode wandb_project wandb_entity wandb_watch wandb_log_model use_mlflow
mlflow_tracking_uri mlflow_experiment_name mlflow_run_name hf_mlflow_log_artifacts use_comet comet_api_key
comet_workspace comet_project_name comet_experiment_key comet_mode comet_online comet_experiment_config
lisa_n_layers lisa_step_interval lisa_layers_attribute gradio_title gradio_share gradio_server_name
gradio_server_port gradio_max_new_tokens gradio_temperature use_ray ray_run_name ray_num_workers
resources_per_worker image_size image_resize_algorithm strict resume_from_checkpoint auto_resume_from_checkpoints
resize_token_embeddings_to_32x mean_resizing_embeddings shrink_embeddings embeddings_skip_upcast rl trl vllm qat
quantization reward_model process_reward_model num_labels dpo_use_weighting dpo_use_logits_to_keep datasets
test_datasets shuffle_merged_datasets shuffle_before_merging_datasets dataset_prepared_path dataset_shard_num
dataset_shard_idx skip_prepare_dataset pretraining_dataset dataset_processes dataset_num_proc
dataset_exact_deduplication dataset_keep_in_memory dataloader_pin_memory dataloader_num_workers
dataloader_prefetch_factor dataloader_drop_last accelerator_config remove_unused_columns push_dataset_to_hub
hf_use_auth_token device device_map world_size local_rank ddp seed ddp_timeout ddp_bucket_cap_mb
ddp_broadcast_buffers ddp_find_unused_parameters eval_table_size eval_max_new_tokens do_causal_lm_eval
eval_causal_lm_metrics do_bench_eval bench_dataset bench_split metric_for_best_model greater_is_better
loss_watchdog_threshold loss_watchdog_patience gc_steps bf16 fp16 fp8 bfloat16 float16 tf32 float32
gradient_checkpointing gradient_checkpointing_kwargs activation_offloading unfrozen_parameters sequence_len
min_sample_len max_prompt_len sample_packing sample_packing_group_size sample_packing_bin_size
sample_packing_sequentially eval_sample_packing pad_to_sequence_len curriculum_sampling multipack_real_batches
pretraining_sample_concatenation batch_flattening use_pose pose_split_on_token_ids pose_max_context_len
pose_num_chunks pretrain_multipack_buffer_size pretrain_multipack_attn xformers_attention sdp_attention
s2_attention flex_attention flex_attn_compile_kwargs flash_attention flash_attn_cross_entropy flash_attn_rms_norm
flash_attn_fuse_qkv flash_attn_fuse_mlp flash_optimum eager_attention attn_implementation
unsloth_cross_entropy_loss unsloth_lora_mlp unsloth_lora_qkv unsloth_lora_o unsloth_rms_norm unsloth_rope
lora_mlp_kernel lora_qkv_kernel lora_o_kernel llama4_linearized_experts deepspeed fsdp fsdp_config fsdp_version
fsdp_final_state_dict_type val_set_size sequence_parallel_degree context_parallel_size tensor_parallel_size
dp_shard_size dp_replicate_size heads_k_stride ring_attn_func special_tokens tokens added_tokens_overrides
torch_compile torch_compile_backend torch_compile_mode max_steps warmup_steps warmup_ratio eval_steps
evals_per_epoch eval_strategy save_steps saves_per_epoch save_strategy save_total_limit save_first_step
logging_steps early_stopping_patience load_best_model_at_end save_only_model use_tensorboard profiler_steps
include_tokens_per_second include_tkps neftune_noise_alpha noisy_embedding_alpha orpo_alpha rpo_alpha
simpo_gamma cpo_alpha kto_desirable_weight kto_undesirable_weight rl_beta dpo_beta max_memory gpu_memory_limit
low_cpu_mem_usage chat_template chat_template_jinja chat_template_kwargs eot_tokens default_system_message
fix_untrained_tokens is_preprocess preprocess_iterable total_num_tokens total_supervised_tokens
sample_packing_eff_est axolotl_config_path is_falcon_derived_model is_llama_derived_model
is_mistral_derived_model is_qwen_derived_model plugins max_packed_sequence_len rope_scaling evaluation_strategy
eval_table_max_new_tokens inference liger_rope liger_rms_norm liger_glu_activation liger_layer_norm
liger_cross_entropy liger_fused_linear_cross_entropy cut_cross_entropy debug attention chunked_cross_entropy
chunked_cross_entropy_num_chunks tiled_mlp tiled_mlp_num_shards tiled_mlp_use_original_mlp dpo_padding_free
dpo_norm_loss dpo_label_smoothing dpo_generate_during_eval kd_ce_alpha kd_alpha kd_temperature
kd_zscore_base_temp kd_top_k_before_softmax use_otel_metrics otel_metrics_host otel_metrics_port streaming
telemetry
""".split())

AXOLOTL_DATASET_KEYS = set("""
path split type input_transform shards shards_idx preprocess_shards conversation chat_template
chat_template_jinja data_files input_format name ds_type field field_human field_model field_messages
field_tools field_thinking template_thinking_key message_field_role message_field_content
message_property_mappings message_field_training message_field_training_detail split_thinking logprobs_field
temperature roles_to_train train_on_eos roles drop_system_message trust_remote_code revision
""".split())


# TRL's SFTConfig keys beyond TrainingArguments (its documentation), and TrainingArguments keys of transformers
# 4.x that the installed version no longer has (dumps written by older versions carry them).
TRL_KEYS = set("""
model_init_kwargs chat_template_path dataset_text_field dataset_kwargs dataset_num_proc eos_token pad_token
max_length max_seq_length shuffle_dataset packing packing_strategy padding_free pad_to_multiple_of
eval_packing completion_only_loss assistant_only_loss loss_type activation_offloading use_liger use_liger_kernel
dataset_batch_size num_of_sequences chars_per_token neftune_noise_alpha
""".split())
# TRL's SFTConfig defaults (a to_dict of an SFTConfig writes them all): a value equal to one sets nothing
TRL_DEFAULTS = {"dataset_text_field": "text", "max_length": 1024, "packing": False, "packing_strategy": "bfd",
                "padding_free": False, "eval_packing": None, "completion_only_loss": None, "assistant_only_loss": False,
                "loss_type": "nll", "activation_offloading": False, "shuffle_dataset": False, "dataset_num_proc": None,
                "pad_token": None, "eos_token": None, "chat_template_path": None, "model_init_kwargs": None,
                "dataset_kwargs": None, "pad_to_multiple_of": None, "use_liger_kernel": False}
HF_OLD_KEYS = set("""
evaluation_strategy overwrite_output_dir logging_dir push_to_hub_token push_to_hub_model_id
push_to_hub_organization per_gpu_train_batch_size per_gpu_eval_batch_size no_cuda use_mps_device
fp16_backend half_precision_backend tpu_num_cores tpu_metrics_debug debug xpu_backend mp_parameters
sharded_ddp fsdp_min_num_params fsdp_transformer_layer_cls_to_wrap warmup_ratio use_ipex ray_scope
save_on_each_node use_cpu jit_mode_eval torchdynamo dispatch_batches split_batches include_inputs_for_metrics
eval_use_gather_object use_legacy_prediction_loop past_index logging_nan_inf_filter save_safetensors
include_tokens_per_second include_num_input_tokens_seen neftune_noise_alpha optim_target_modules
batch_eval_metrics eval_on_start use_liger_kernel local_rank fp16_opt_level fp16_full_eval bf16_full_eval
ddp_backend dataloader_persistent_workers skip_memory_metrics greater_is_better
""".split())



def typos(raw: dict[str, Any], known: set[str], path: Path, tool: str, where_prefix: str = "") -> list[BadInput]:
    out = []
    for k in raw:
        if k not in known:
            close = difflib.get_close_matches(str(k), sorted(known), n=1)
            out.append(BadInput(f"unknown key '{where_prefix}{k}': {tool} does not know it (it would ignore it "
                                "silently)", where=str(path),
                                fix=(f"did you mean '{where_prefix}{close[0]}'?" if close
                                     else f"remove it, or check {tool}'s config reference")))
    return out
