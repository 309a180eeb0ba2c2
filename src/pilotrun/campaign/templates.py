"""Commented starter campaigns written by ``pilotrun init``."""

from __future__ import annotations

_COMMON_TRAIN = """\
train:
  micro_batch: 2           # examples per forward/backward pass, per rank
  accumulation: 8          # passes per optimizer update (examples per update = micro_batch x accumulation x ranks)
  precision: fp32          # fp32 | bf16-mixed | fp16-mixed | bf16-true
  optimizer: adamw         # adamw | sgd
  lr: 1.0e-4
  weight_decay: 0.0
  schedule: constant       # constant | linear | cosine
  warmup: 0                # updates of linear warmup
  max_grad_norm: 1.0       # null disables clipping
  updates: 200             # the budget in optimizer updates (or set epochs: and updates: null)
  epochs: null
  drop_last: true          # skip the last partial update of each epoch
  eval_every: 20           # updates between validations, fixed before launch
  eval_batch: 8
  save_every: 50
  stop: {on_nan: true, diverge_factor: 3.0, patience: null}
  strategy: single         # single | ddp | fsdp
  nproc: 1                 # processes (ranks) on this machine
plan:
  metric: val_loss
  goal: minimize
  control: {train.lr: 1.0e-4}
  variants: [{train.lr: 5.0e-5}, {train.lr: 2.0e-4}]
  seeds: [0, 1, 2]
hardware:
  memory_per_gpu: 80GiB    # memory of one target GPU
  gpus: 1
  rental_days: [3, 7, 30]
  reserve: 0.2             # share of the rental kept for evaluation and export
"""

CAUSAL_LM = """\
# pilotrun campaign (causal-lm). Paths are relative to this file. Check it with: pilotrun validate campaign.yaml
name: my-sft
seed: 0
task: causal-lm
model:
  path: models/my-base-model   # local Hugging Face model folder (save_pretrained); never downloads
  config: null                 # or a transformers config dict (with model_type) for random init
  tokenizer: null              # default: model.path; or a tokenizer folder, or "byte"
  dtype: float32               # float32 | bfloat16 | float16
  adapter: null                # e.g. {kind: lora, r: 8, alpha: 16, dropout: 0.0, target_modules: [q_proj, v_proj]}
  gradient_checkpointing: false
  trust_remote_code: false
data:
  train: data/train.jsonl      # .jsonl .json .csv .parquet
  validation: data/validation.jsonl
  test: null
  prompt: "Q: {instruction}\\nA: "   # a field name, or a template over fields
  response: output             # the only tokens in the loss
  messages: null               # or a chat field of [{role, content}] (then prompt/response: null)
  group_by: null               # leakage unit, e.g. conversation_id
  period_by: null              # optional time field
  max_length: 256
""" + _COMMON_TRAIN

SEQ_CLS = """\
# pilotrun campaign (seq-cls). Paths are relative to this file. Check it with: pilotrun validate campaign.yaml
name: my-classifier
seed: 0
task: seq-cls
model:
  path: models/my-encoder      # local Hugging Face model folder (save_pretrained); never downloads
  config: null                 # or a transformers config dict (with model_type) for random init
  tokenizer: null              # default: model.path; or a tokenizer folder, or "byte"
  dtype: float32
  adapter: null
  gradient_checkpointing: false
  trust_remote_code: false
data:
  train: data/train.jsonl
  validation: data/validation.jsonl
  test: null
  text: text                   # the text field
  label: label                 # the label field (a class name or an id)
  labels: [negative, positive] # ordered class names: id i means labels[i]
  group_by: null               # leakage unit, e.g. patient_id or document_id
  period_by: null
  max_length: 256
""" + _COMMON_TRAIN


def starter(task: str) -> str:
    return CAUSAL_LM if task == "causal-lm" else SEQ_CLS
