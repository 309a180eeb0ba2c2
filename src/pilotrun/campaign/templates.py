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
  quantization: null           # QLoRA's base (with an adapter): {bits: 4, type: nf4, double_quant: true,
                               # compute_dtype: bfloat16} or {bits: 8}; pip install 'pilotrun[qlora]'
  gradient_checkpointing: false
  trust_remote_code: false
data:
  train: data/train.jsonl      # .jsonl .json .csv .parquet .arrow
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


PREFERENCE = """\
# pilotrun campaign (preference: DPO and its offline kin). Paths are relative to this file.
# Check it with: pilotrun validate campaign.yaml
name: my-dpo
seed: 0
task: preference
model:
  path: models/my-sft-model    # the model after supervised fine-tuning; never downloads
  config: null
  tokenizer: null              # default: model.path
  dtype: float32
  adapter: null                # with LoRA the reference is this model with the adapter disabled (no copy)
  gradient_checkpointing: false
  trust_remote_code: false
data:
  train: data/train.jsonl
  validation: data/validation.jsonl
  test: null
  prompt: prompt               # a field or a template; or messages: a field of the conversation before the answers
  chosen: chosen               # the preferred answer: text, an assistant turn, or a whole conversation
  rejected: rejected           # the dispreferred answer, in the same form
  messages: null
  chat_template: auto          # auto | model | plain | a Jinja template
  group_by: null               # leakage unit, e.g. prompt_id
  period_by: null
  max_length: 1024             # each half (prompt + one answer) is cut to this
preference:
  loss: dpo                    # dpo | ipo | simpo | orpo
  beta: null                   # null: the loss's default (dpo 0.1, ipo 0.1, simpo 2.0, orpo 0.1)
  gamma: 0.5                   # simpo's target margin
  reference: auto              # auto | copy | adapter | none (simpo, orpo)
""" + _COMMON_TRAIN.replace("  lr: 1.0e-4\n", "  lr: 5.0e-7\n").replace(
    "  control: {train.lr: 1.0e-4}\n  variants: [{train.lr: 5.0e-5}, {train.lr: 2.0e-4}]",
    "  control: {preference.beta: 0.1}\n  variants: [{preference.beta: 0.05}, {preference.beta: 0.3}]")


def starter(task: str) -> str:
    return {"causal-lm": CAUSAL_LM, "seq-cls": SEQ_CLS, "preference": PREFERENCE}[task]
