"""``pilotrun import``: a campaign from the user's Axolotl YAML or Hugging Face ``TrainingArguments`` / TRL
``SFTConfig`` dict (JSON or YAML).

Every setting the source gives is either carried into a campaign key (``Carried``) or named with what its
absence does to the rehearsal (``NotCarried``); a key the source tool itself does not know is a typo (exit
2, naming the nearest known key), since Axolotl ignores unknown keys silently. Whatever the import cannot
decide (which fields are prompt and response, one training file of several) it asks for, exit 2. The
campaign is written atomically with a comment block listing what was not carried, and carries that list
as ``imported.not_carried`` so ``all`` and the sheet can say it. Neither Axolotl nor TRL is imported: the
key lists are written here from their documentation (the HF keys are TrainingArguments' own fields).
"""

from __future__ import annotations

import difflib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilotrun.campaign import yamlsafe
from pilotrun.campaign.schema import Campaign
from pilotrun.errors import BadInput, BadInputs
from pilotrun.journal.files import atomic_write_text
from pilotrun.records.readers import read_records
from pilotrun.tasks.hub import is_hub_id

FORMATS = ("axolotl", "hf")
MAX_BYTES = 1 << 20

NOTHING = "nothing to rehearse (logging, tracking, output or publishing)"
SPEED = "a speed setting: the figures of time on the rental may differ, memory and the loss do not"
ATTENTION = ("attention kernel: memory on CUDA differs from the eager attention rehearsed here (flash and sdpa "
             "attention hold no seq x seq scores, so the rental needs less for long sequences)")


@dataclass
class Carried:
    source: str
    key: str
    value: Any
    note: str = ""


@dataclass
class NotCarried:
    key: str
    value: Any
    reason: str


@dataclass
class Imported:
    fmt: str
    detected: bool
    source: Path
    out: Path
    campaign: dict[str, Any]
    carried: list[Carried] = field(default_factory=list)
    not_carried: list[NotCarried] = field(default_factory=list)
    to_set: list[str] = field(default_factory=list)
    text: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"from": self.fmt, "detected": self.detected, "source": str(self.source), "out": str(self.out),
                "carried": [c.__dict__ for c in self.carried],
                "not_carried": [n.__dict__ for n in self.not_carried], "to_set": self.to_set}


# ---------------------------------------------------------------- reading
def _refuse_pickle(path: Path, head: bytes) -> None:
    """A pickle (training_args.bin is torch.save'd TrainingArguments) is refused by its name or first bytes;
    it is never unpickled: loading a pickle runs whatever code it names."""
    pickled = path.suffix.lower() in (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
    if pickled or head[:1] == b"\x80" or head[:2] == b"PK":
        raise BadInput(f"{path.name} is a pickle (torch.save of TrainingArguments), which pilotrun never loads: "
                       "unpickling runs any code the file names", where=str(path),
                       fix="in the session that trained, write the arguments as JSON: "
                           "`open('args.json', 'w').write(trainer.args.to_json_string())`, then "
                           "`pilotrun import args.json`")


def read_source(path: Path) -> dict[str, Any]:
    try:
        if not path.is_file():
            raise BadInput("config file not found", where=str(path), fix="pass the Axolotl YAML or the arguments' JSON")
        with open(path, "rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as e:
        raise BadInput(f"cannot read the config: {e.strerror or e}", where=str(path),
                       fix="check the path and its permissions") from None
    _refuse_pickle(path, data[:4])
    if len(data) > MAX_BYTES:
        raise BadInput(f"the config holds more than {MAX_BYTES >> 10} KiB", where=str(path),
                       fix="pass the training config itself, not a data file")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadInput(f"not UTF-8 text (byte {e.start})", where=str(path), fix="save the file as UTF-8") from None
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except ValueError as e:
            raise BadInput(f"not valid JSON: {e}", where=str(path), fix="write the arguments with to_json_string()") from None
    else:
        raw, _ = yamlsafe.load_bounded(text, str(path))
    if not isinstance(raw, dict):
        raise BadInput("the config must be a mapping of keys", where=str(path),
                       fix="pass an Axolotl YAML or the dict TrainingArguments.to_dict() writes")
    return raw


def detect(raw: dict[str, Any], path: Path) -> str:
    ax = {"base_model", "datasets", "micro_batch_size", "sequence_len", "num_epochs", "lora_r", "adapter"}
    hf = {"per_device_train_batch_size", "num_train_epochs", "lr_scheduler_type", "optim", "output_dir",
          "max_seq_length", "eval_strategy", "evaluation_strategy"}
    a, h = len(ax & set(raw)), len(hf & set(raw) - {"output_dir"})
    if a and a >= h:
        return "axolotl"
    if h:
        return "hf"
    raise BadInput("cannot tell the config's format (no Axolotl key such as base_model or micro_batch_size, no "
                   "TrainingArguments key such as per_device_train_batch_size)", where=str(path),
                   fix="say it: --from axolotl or --from hf")


def _empty(v: Any) -> bool:
    return v is None or v == "" or v == [] or v == {}


def _typos(raw: dict[str, Any], known: set[str], path: Path, tool: str, where_prefix: str = "") -> list[BadInput]:
    out = []
    for k in raw:
        if k not in known:
            close = difflib.get_close_matches(str(k), sorted(known), n=1)
            out.append(BadInput(f"unknown key '{where_prefix}{k}': {tool} does not know it (it would ignore it "
                                "silently)", where=str(path),
                                fix=(f"did you mean '{where_prefix}{close[0]}'?" if close
                                     else f"remove it, or check {tool}'s config reference")))
    return out


# ---------------------------------------------------------------- helpers shared by both formats
class _Builder:
    def __init__(self, fmt: str, source: Path, out: Path):
        self.fmt, self.source, self.out = fmt, source, out
        self.c: dict[str, Any] = {"name": source.stem, "task": "causal-lm", "model": {}, "data": {}, "train": {}}
        self.carried: list[Carried] = []
        self.not_carried: list[NotCarried] = []
        self.to_set: list[str] = []
        self.problems: list[BadInput] = []
        self.examples: int | None = None  # training records, when the data file could be read

    def put(self, src: str, key: str, value: Any, note: str = "") -> None:
        node = self.c
        *parents, last = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
        self.carried.append(Carried(src, key, value, note))

    def skip(self, key: str, value: Any, reason: str) -> None:
        self.not_carried.append(NotCarried(key, value, reason))

    def ask(self, message: str, fix: str) -> None:
        self.problems.append(BadInput(message, where=str(self.source), fix=fix))

    def local_path(self, src_key: str, value: str) -> str:
        """A path of the source (relative to the source file) written relative to the campaign's folder."""
        p = Path(os.path.expanduser(value))
        p = p if p.is_absolute() else (self.source.parent / p)
        try:
            return os.path.relpath(p.resolve(), self.out.parent.resolve())
        except ValueError:  # another drive
            return str(p.resolve())

    def updates_per_epoch(self) -> float | None:
        t = self.c["train"]
        if self.examples is None:
            return None
        per_update = t.get("micro_batch", 2) * t.get("accumulation", 8) * t.get("nproc", 1)
        return self.examples / per_update

    def total_updates(self) -> float | None:
        t = self.c["train"]
        if t.get("updates"):
            return t["updates"]
        upe = self.updates_per_epoch()
        return None if upe is None or not t.get("epochs") else upe * t["epochs"]

    def in_updates(self, src: str, key: str, value: Any, *, ratio_of: str, minimum: int = 1) -> None:
        """Carry a count of updates given as a share (ratio_of: 'total' or 'epoch'; value < 1 a fraction, or
        N per epoch) as updates from the data's size and the batch arithmetic."""
        if ratio_of == "total":
            base, what = self.total_updates(), "of the budget"
        else:
            base, what = self.updates_per_epoch(), "per epoch"
        if base is None:
            self.skip(src, value, f"a share {what}: the number of updates needs the training data's size, "
                                  f"which the import could not read; set {key} (in updates)")
            self.to_set.append(key)
            return
        n = max(minimum, round(base * value)) if ratio_of == "total" else max(minimum, math.floor(base / value))
        self.put(src, key, int(n), f"{value} {what} = {n} updates, from {self.examples} training examples and "
                                   "the batch arithmetic")

    def read_examples(self) -> None:
        train = self.c["data"].get("train")
        if not train:
            return

        try:
            self.examples = len(read_records(self.out.parent / train))
        except BadInput:
            self.examples = None


# ---------------------------------------------------------------- axolotl
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

# the defaults Axolotl applies when a key is absent, which differ from pilotrun's and move the rehearsal
AXOLOTL_DEFAULTS = {"micro_batch_size": 1, "gradient_accumulation_steps": 1, "num_epochs": 1.0,
                    "sequence_len": 512, "lr_scheduler": "cosine", "optimizer": "adamw_torch_fused",
                    "weight_decay": 0.0, "bf16": "auto"}

ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")

SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "constant_with_warmup": "constant"}
ADAMW = {"adamw", "adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla"}

AXOLOTL_REASONS = {
    "sample_packing": "the source packs several examples into one sequence; the rehearsal trains one example per "
                      "row, so the pilot's worst case is then a packed sequence of sequence_len tokens "
                      "(--set data.max_length to sequence_len and keep examples that long): memory per micro-batch "
                      "on the rental is that of full sequence_len rows, and there are fewer updates per epoch",
    "eval_sample_packing": "packing of the validation rows: see sample_packing",
    "pad_to_sequence_len": "the source pads every row to sequence_len; the rehearsal pads to the longest row of a "
                           "micro-batch, and its worst case (the longest rows) is what the memory figures show",
    "flash_attention": ATTENTION, "sdp_attention": ATTENTION, "xformers_attention": ATTENTION,
    "flex_attention": ATTENTION, "s2_attention": ATTENTION, "attn_implementation": ATTENTION, "attention": ATTENTION,
    "debug": NOTHING, "use_otel_metrics": NOTHING, "otel_metrics_host": NOTHING, "otel_metrics_port": NOTHING,
    "chunked_cross_entropy": "the logits are never held whole on the rental: memory there is smaller than rehearsed",
    "tiled_mlp": "the MLP runs in tiles on the rental: activation memory there is smaller than rehearsed",
    "load_in_4bit": "the base weights are 4-bit (bitsandbytes) in the source; the rehearsal holds them in "
                    "model.dtype, so its weight memory is about 4x (bf16) the rental's: `pilotrun estimate "
                    "--options` prices the QLoRA option",
    "load_in_8bit": "the base weights are 8-bit in the source; the rehearsal holds them in model.dtype, so its "
                    "weight memory is about 2x (bf16) the rental's",
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
}
_PREFIX_REASONS = (("wandb_", NOTHING), ("use_wandb", NOTHING), ("mlflow_", NOTHING), ("use_mlflow", NOTHING),
                   ("comet_", NOTHING), ("use_comet", NOTHING), ("gradio_", NOTHING), ("hub_", NOTHING),
                   ("push_", NOTHING), ("use_tensorboard", NOTHING), ("include_tokens", NOTHING),
                   ("profiler_", NOTHING), ("ray_", NOTHING), ("use_ray", NOTHING), ("fsdp_config", None))


def _reason(key: str, table: dict[str, Any]) -> str:
    if table.get(key):
        return table[key]
    for prefix, why in _PREFIX_REASONS:
        if key.startswith(prefix) and why:
            return why
    return "pilotrun has no such setting: the rehearsal runs as if it were unset"


def _precision(b: _Builder, src_bf16: str, bf16: Any, src_fp16: str, fp16: Any, auto_default: bool) -> None:
    if bf16 == "auto":
        b.put(src_bf16 + (" (the source's default)" if auto_default else ""), "train.precision", "bf16-mixed",
              "auto: the source falls back to fp16 on GPUs without bf16 (before Ampere); rehearsed as bf16-mixed")
    elif bf16:
        b.put(src_bf16, "train.precision", "bf16-mixed")
    elif fp16:
        b.put(src_fp16, "train.precision", "fp16-mixed")
    else:
        b.put(f"{src_bf16}/{src_fp16}", "train.precision", "fp32")


def _optimizer(b: _Builder, src: str, name: Any) -> None:
    name = str(name)
    if name in ADAMW:
        b.put(src, "train.optimizer", "adamw")
    elif name.startswith("sgd"):
        b.put(src, "train.optimizer", "sgd")
    else:
        b.put(src, "train.optimizer", "adamw", f"nearest to {name}")
        b.skip(src, name, f"{name} is rehearsed as AdamW: 8-bit, paged or factored optimizer states are smaller on "
                          "the rental than the two fp32 moments rehearsed here (the optimizer rows are an upper "
                          "bound), and the loss curve differs")


def _schedule(b: _Builder, src: str, name: Any) -> None:
    name = str(name)
    if name in SCHEDULES:
        b.put(src, "train.schedule", SCHEDULES[name])
    else:
        b.put(src, "train.schedule", "cosine", f"nearest to {name}")
        b.skip(src, name, f"the {name} schedule is rehearsed as cosine: the learning rate over the run differs")


def _strategy_from_deepspeed(b: _Builder, src: str, value: Any) -> None:
    text = json.dumps(value) if isinstance(value, dict) else str(value)
    stage = next((s for s in ("3", "2", "1") if f"zero{s}" in text.replace("_", "").lower()
                  or f'"stage": {s}' in text), None)
    b.skip(src, value, AXOLOTL_REASONS["deepspeed"])
    if stage == "3":
        b.put(src, "train.strategy", "fsdp", "nearest to DeepSpeed ZeRO-3")
    elif stage in ("1", "2"):
        b.put(src, "train.strategy", "ddp", f"nearest to DeepSpeed ZeRO-{stage} (optimizer states are sharded there)")
    if stage:
        b.to_set.append("train.nproc")


def import_axolotl(raw: dict[str, Any], b: _Builder) -> None:
    plugin_args: set[str] = set()
    if raw.get("plugins"):  # plugins add their own keys: one far from every core key is a plugin's, not a typo
        plugin_args = {k for k in raw if k not in AXOLOTL_KEYS
                       and not difflib.get_close_matches(str(k), sorted(AXOLOTL_KEYS), n=1, cutoff=0.8)}
    b.problems += _typos({k: v for k, v in raw.items() if k not in plugin_args}, AXOLOTL_KEYS, b.source, "Axolotl")
    for k in plugin_args:
        if not _empty(raw[k]):
            b.skip(k, raw[k], f"not a key of Axolotl's core: an argument of a plugin ({', '.join(map(str, raw['plugins']))}), "
                              "which the rehearsal does not run")
    for i, d in enumerate((raw.get("datasets") or []) + (raw.get("test_datasets") or [])):
        if isinstance(d, dict):
            b.problems += _typos(d, AXOLOTL_DATASET_KEYS, b.source, "Axolotl", where_prefix="datasets[].")
    used: set[str] = set()

    def get(k: str) -> Any:
        used.add(k)
        return raw.get(k)

    def value_or_default(k: str) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not _empty(raw[k]):
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
    _axolotl_data(raw, b, used)
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
    _optimizer(b, src, name)
    wd, src = value_or_default("weight_decay")
    b.put(src, "train.weight_decay", float(wd))
    if get("max_grad_norm") is not None:
        b.put("max_grad_norm", "train.max_grad_norm", float(raw["max_grad_norm"]) or None)
    else:
        b.put("max_grad_norm (the Trainer's default)", "train.max_grad_norm", 1.0)
    name, src = value_or_default("lr_scheduler")
    _schedule(b, src, name)
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
    _precision(b, "bf16", raw.get("bf16", "auto"), "fp16", raw.get("fp16"), bf16_default)
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
        _strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])

    for k, v in raw.items():
        if k in used or k not in AXOLOTL_KEYS or _empty(v) or v is False:
            continue
        b.skip(k, v, _reason(k, AXOLOTL_REASONS))


def _axolotl_data(raw: dict[str, Any], b: _Builder, used: set[str]) -> None:
    used.update(("datasets", "test_datasets", "chat_template", "chat_template_jinja", "val_set_size"))
    datasets = raw.get("datasets") or []
    if not datasets:
        b.to_set.append("data.train")
        return
    if len(datasets) > 1:
        b.ask(f"datasets lists {len(datasets)} data sets; a campaign trains on one file",
              "concatenate them into one local file (e.g. `cat a.jsonl b.jsonl > train.jsonl`, when they share a "
              "type) and list that one")
        return
    d = datasets[0] if isinstance(datasets[0], dict) else {"path": datasets[0]}
    _one_dataset(raw, b, d, "data.train", "datasets[0]")
    tests = raw.get("test_datasets") or []
    if tests:
        t = tests[0] if isinstance(tests[0], dict) else {"path": tests[0]}
        _one_dataset(raw, b, t, "data.validation", "test_datasets[0]", fields=False)
        if len(tests) > 1:
            b.skip("test_datasets[1:]", [x.get("path") if isinstance(x, dict) else x for x in tests[1:]],
                   "only the first test data set is validated on")
    elif raw.get("val_set_size"):
        b.skip("val_set_size", raw["val_set_size"], AXOLOTL_REASONS["val_set_size"])
        b.to_set.append("data.validation")
    else:
        b.to_set.append("data.validation")


def _one_dataset(raw: dict[str, Any], b: _Builder, d: dict[str, Any], key: str, src: str, fields: bool = True) -> None:
    path = d.get("path")
    local = Path(os.path.expanduser(str(path))) if path else None
    if local is not None and not local.is_absolute():
        local = b.source.parent / local
    if path and d.get("data_files"):
        files = d["data_files"]
        files = [files] if isinstance(files, str) else list(files)
        if len(files) == 1:
            local = Path(os.path.expanduser(str(files[0])))
            local = local if local.is_absolute() else b.source.parent / local
    if not path or local is None or not local.is_file():
        where = f"{src}.path = {path!r}"
        remote = path and (is_hub_id(str(path), b.source.parent) or "://" in str(path))
        b.ask(f"{where} is {'a hub data set or remote path' if remote else 'no local file'}; pilotrun reads only "
              f"local files (relative paths are relative to {b.source.name})",
              "save the data set as a local .jsonl (e.g. `datasets.load_dataset(NAME, split='train')"
              ".to_json('train.jsonl')`) and set its path")
        return
    b.put(f"{src}.path", key, b.local_path(f"{src}.path", str(local)))
    for k, v in d.items():
        if k in ("path", "type", "field", "field_messages", "message_property_mappings", "message_field_role",
                 "message_field_content", "roles_to_train", "chat_template", "chat_template_jinja", "data_files",
                 "ds_type") or _empty(v):
            continue
        b.skip(f"{src}.{k}", v, "nothing to rehearse: the local file is read whole" if k in (
            "split", "name", "revision", "shards_idx", "shards") else
            "a data set option pilotrun has no equivalent for: the records are read as they are")
    if not fields:  # a validation set is read with the training set's fields
        return
    kind = d.get("type")
    if kind == "alpaca":
        b.put(f"{src}.type", "data.prompt", ALPACA_PROMPT, "Axolotl's alpaca prompt (the with-input form)")
        b.put(f"{src}.type", "data.response", "output")
        b.skip(f"{src}.type", "alpaca", "Axolotl drops the '### Input:' section for records with an empty input; the "
                                        "rehearsal keeps it (a few prompt tokens more per such record)")
    elif kind == "completion":
        b.put(f"{src}.type", "data.prompt", "", "completion: no prompt, the whole text is in the loss")
        b.put(f"{src}.field" if d.get("field") else f"{src}.type", "data.response", d.get("field") or "text")
    elif kind == "chat_template":
        b.put(f"{src}.field_messages" if d.get("field_messages") else f"{src}.type", "data.messages",
              d.get("field_messages") or "messages")
        mapping = d.get("message_property_mappings") or {}
        odd = {k: v for k, v in mapping.items() if k != v}
        role, content = d.get("message_field_role"), d.get("message_field_content")
        if odd or (role and role != "role") or (content and content != "content"):
            b.ask(f"{src} maps message fields ({odd or {'role': role, 'content': content}}); pilotrun reads each turn's "
                  "'role' and 'content'", "rename the fields in the data file to role and content")
        roles = d.get("roles_to_train")
        if roles and list(roles) != ["assistant"]:
            b.skip(f"{src}.roles_to_train", roles, "the rehearsal's loss is on the assistant turns only")
        _chat_template(raw, b, d, src)
    elif isinstance(kind, dict) and kind.get("field_instruction") and kind.get("field_output"):
        fmt = kind.get("format") or "{instruction}"
        prompt = fmt.replace("{instruction}", "{" + kind["field_instruction"] + "}")
        if kind.get("field_input"):
            prompt = prompt.replace("{input}", "{" + kind["field_input"] + "}")
        b.put(f"{src}.type.format", "data.prompt", prompt)
        b.put(f"{src}.type.field_output", "data.response", kind["field_output"])
    else:
        b.ask(f"{src}.type = {kind!r} does not say which fields are the prompt and the response",
              "use type alpaca, completion or chat_template (or a type dict with field_instruction and "
              "field_output), or write the campaign's data.prompt and data.response yourself")


def _chat_template(raw: dict[str, Any], b: _Builder, d: dict[str, Any], src: str) -> None:
    jinja = d.get("chat_template_jinja") or raw.get("chat_template_jinja")
    name = d.get("chat_template") or raw.get("chat_template")
    where = f"{src}.chat_template" if d.get("chat_template") else "chat_template"
    if jinja:
        j = Path(os.path.expanduser(str(jinja)))
        j = j if j.is_absolute() else b.source.parent / j
        value = b.local_path(where, str(j)) if str(jinja).endswith(".jinja") and j.is_file() else jinja
        b.put(f"{src}.chat_template_jinja" if d.get("chat_template_jinja") else "chat_template_jinja",
              "data.chat_template", value)
    elif name in (None, "tokenizer_default"):
        b.put(where if name else f"{src}.type", "data.chat_template", "model", "the tokenizer's own template")
    elif str(name).startswith("tokenizer_default_fallback_"):
        b.put(where, "data.chat_template", "auto", "the tokenizer's template when it has one")
        b.skip(where, name, f"the fallback ({str(name).removeprefix('tokenizer_default_fallback_')}) is Axolotl's "
                            "built-in template: a tokenizer without a template renders as plain 'role: content' here")
    else:
        b.put(where, "data.chat_template", "model", f"nearest to Axolotl's built-in {name}")
        b.skip(where, name, f"Axolotl's built-in '{name}' template is not shipped with pilotrun: the rehearsal renders "
                            "with the tokenizer's own template; to render with the source's, save it as a .jinja "
                            "file and set data.chat_template to it (token counts differ otherwise)")


# ---------------------------------------------------------------- Hugging Face TrainingArguments / TRL SFTConfig
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
    "evaluation_strategy": "nothing to rehearse: pilotrun validates every train.eval_every updates",
}
HF_NOTHING_PREFIXES = ("logging_", "log_", "report_to", "run_name", "output_dir", "push_to_hub", "hub_", "disable_tqdm",
                       "save_strategy", "save_only_model", "save_safetensors", "overwrite_output_dir", "eval_strategy",
                       "evaluation_strategy", "do_train", "do_eval", "do_predict", "load_best_model_at_end",
                       "metric_for_best_model", "prediction_loss_only", "label_names", "remove_unused_columns",
                       "ddp_", "dataloader_", "local_rank", "skip_memory_metrics", "include_", "project",
                       "trackio_")


def _hf_defaults() -> dict[str, Any]:
    import dataclasses

    from transformers import TrainingArguments

    out = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def _accelerator_defaults() -> dict[str, Any]:
    """What ``to_dict`` writes for an accelerator_config nobody set (the AcceleratorConfig defaults)."""
    import dataclasses

    from transformers.trainer_pt_utils import AcceleratorConfig

    return json.loads(json.dumps(dataclasses.asdict(AcceleratorConfig()), default=str))


def _same(v: Any, d: Any) -> bool:
    if _empty(v) and _empty(d):
        return True
    try:
        return v == d or str(v) == str(d) or (isinstance(v, (int, float)) and float(v) == float(d))
    except (TypeError, ValueError):
        return False


def import_hf(raw: dict[str, Any], b: _Builder) -> None:
    defaults = _hf_defaults()
    defaults["accelerator_config"] = _accelerator_defaults()
    defaults.update({k: v for k, v in TRL_DEFAULTS.items() if k not in defaults})
    known = set(defaults) | TRL_KEYS | HF_OLD_KEYS
    b.problems += _typos(raw, known, b.source, "TrainingArguments/SFTConfig")
    used: set[str] = set()

    def val(k: str, default: Any = None) -> tuple[Any, str]:
        used.add(k)
        if k in raw and not _empty(raw[k]):
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
    _schedule(b, src, name.get("value", name) if isinstance(name, dict) else name)
    name, src = val("optim", "adamw_torch")
    _optimizer(b, src, name)
    wd, src = val("weight_decay", 0.0)
    b.put(src, "train.weight_decay", float(wd))
    g, src = val("max_grad_norm", 1.0)
    b.put(src, "train.max_grad_norm", float(g) or None)
    used.update(("max_steps", "num_train_epochs"))
    if raw.get("max_steps") and int(raw["max_steps"]) > 0:
        b.put("max_steps", "train.updates", int(raw["max_steps"]))
        if "num_train_epochs" in raw and not _same(raw["num_train_epochs"], defaults.get("num_train_epochs")):
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
    _precision(b, "bf16", raw.get("bf16"), "fp16", raw.get("fp16"), False)
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
        _strategy_from_deepspeed(b, "deepspeed", raw["deepspeed"])
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
        if k in used or k not in known or _empty(v) or v is False or _same(v, defaults.get(k, None)):
            continue
        if isinstance(v, str) and v.startswith("<") and v.endswith(">") and v[1:-1].replace("_", "").isupper():
            continue  # to_json_string's placeholder for a secret (<HUB_TOKEN>): nothing the user set here
        if k == "accelerator_config" and isinstance(v, dict) and all(
                _same(x, defaults[k].get(n)) for n, x in v.items()):
            continue  # to_dict writes the defaults of an accelerator_config nobody set
        if k in ("packing", "padding_free") and not v:
            continue
        reason = HF_REASONS.get(k) or (NOTHING if k.startswith(HF_NOTHING_PREFIXES) else
                                       "pilotrun has no such setting: the rehearsal runs as if it were unset")
        b.skip(k, v, reason)


# ---------------------------------------------------------------- writing
def _yaml_value(v: Any) -> str:
    import yaml

    if isinstance(v, str) and ("\n" in v or v != v.strip() or v == ""):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a double-quoted YAML scalar: one line

    text = yaml.safe_dump(v, default_flow_style=True, allow_unicode=True, width=10**9).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _short(v: Any, limit: int = 60) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def render(imp: Imported) -> str:
    """The campaign as commented YAML: a header listing what was not carried, each key with its source."""
    where = {c.key: c for c in imp.carried}
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}[imp.fmt]
    lines = [f"# imported by `pilotrun import` from {tool} config {imp.source.name}",
             "# each key says where it came from; keys the source did not give keep pilotrun's defaults", "#"]
    if imp.not_carried:
        lines.append("# NOT CARRIED (the rehearsal does not reproduce these settings):")
        for n in imp.not_carried:
            lines.append(f"#   {n.key}: {_short(n.value)}")
            lines.append(f"#     {n.reason}")
    else:
        lines.append("# every setting of the source is carried")
    if imp.to_set:
        lines += ["#", "# TO SET before `pilotrun validate` passes: " + ", ".join(imp.to_set),
                  "#   (edit this file, or pass --set KEY=VALUE to each verb)"]
    lines.append("")

    to_set = {t.split(" ")[0] for t in imp.to_set}

    def emit(d: dict[str, Any], indent: int, prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and k != "config" and key not in where and v and k not in ("imported",):
                lines.append(" " * indent + f"{k}:")
                emit(v, indent + 2, key + ".")
                continue
            if k == "imported":
                lines.append(" " * indent + f"{k}:")
                lines.append(" " * (indent + 2) + f"tool: {_yaml_value(v['tool'])}")
                lines.append(" " * (indent + 2) + f"file: {_yaml_value(v['file'])}")
                lines.append(" " * (indent + 2) + "not_carried:" + (" []" if not v["not_carried"] else ""))
                for n in v["not_carried"]:
                    lines.append(" " * (indent + 4) + f"- key: {_yaml_value(n['key'])}")
                    lines.append(" " * (indent + 6) + f"value: {_yaml_value(n['value'])}")
                    lines.append(" " * (indent + 6) + f"effect: {_yaml_value(n['effect'])}")
                continue
            c = where.get(key)
            comment = f"  # from {c.source}" + (f": {c.note}" if c.note else "") if c else ""
            if c is None and key in to_set:
                comment = f"  # TO SET: --set {key}=..."
            lines.append(" " * indent + f"{k}: {_yaml_value(v)}{comment}")

    emit(imp.campaign, 0, "")
    return "\n".join(lines) + "\n"


def import_config(source: str | Path, fmt: str | None = None, out: str | Path | None = None,
                  force: bool = False) -> Imported:
    """Read ``source``, map it to a campaign and write it to ``out`` (default: campaign.yaml beside the source).
    Nothing is written when anything is bad input (exit 2)."""
    source = Path(source).expanduser().resolve()
    if fmt is not None and fmt not in FORMATS:
        raise BadInput(f"--from {fmt}: unknown format", where="--from", fix="use --from axolotl or --from hf")
    raw = read_source(source)
    detected = fmt is None
    fmt = fmt or detect(raw, source)
    out_path = Path(out).expanduser() if out else source.parent / "campaign.yaml"
    out_path = out_path.resolve()
    if out_path == source:
        raise BadInput("--out names the source config itself", where="--out", fix="write the campaign to another file")
    if out_path.exists() and not force:
        raise BadInput(f"{out_path} exists; the import does not overwrite it", where="--out",
                       fix="pass another --out, or --force to replace it")
    b = _Builder(fmt, source, out_path)
    (import_axolotl if fmt == "axolotl" else import_hf)(raw, b)
    if b.problems:
        raise BadInputs(b.problems) if len(b.problems) > 1 else b.problems[0]
    campaign = b.c
    campaign["imported"] = {"tool": fmt, "file": str(source),
                            "not_carried": [{"key": n.key, "value": _short(n.value), "effect": n.reason}
                                            for n in b.not_carried]}
    for section in ("model", "data", "train"):
        if not campaign[section]:
            campaign[section] = {}
    for key in ("model.path", "data.train", "data.validation"):
        sec, k = key.split(".")
        campaign[sec].setdefault(k, None)
    try:
        Campaign.model_validate(campaign)
    except Exception as e:  # a value the campaign refuses (a negative lr ...): named, nothing written
        raise BadInput(f"the imported values do not make a valid campaign: {e}", where=str(source),
                       fix="correct the value in the source config") from None
    imp = Imported(fmt, detected, source, out_path, campaign, b.carried, b.not_carried, b.to_set)
    imp.text = render(imp)
    atomic_write_text(out_path, imp.text)
    return imp


# ---------------------------------------------------------------- what `all` and the sheet say
def not_reproduced_lines(c) -> list[str]:
    """Once per `all` and per sheet: the imported source's settings the rehearsal does not reproduce, each
    with how it can move the figures; the ones that change nothing rehearsed are named on one line."""
    imp = getattr(c, "imported", None)
    if imp is None or not imp.not_carried:
        return []
    moving = [n for n in imp.not_carried if not n.effect.startswith("nothing to rehearse")]
    quiet = [n.key for n in imp.not_carried if n not in moving]
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}.get(imp.tool, imp.tool)
    out = [f"imported from {tool} {Path(imp.file).name}: {len(moving)} of its settings the rehearsal does not "
           "reproduce; the figures can move as each says"]
    out += [f"  {n.key} = {n.value}: {n.effect}" for n in moving]
    if quiet:
        out.append("  nothing to rehearse: " + ", ".join(quiet))
    return out
