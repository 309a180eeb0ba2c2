"""Settings both tools spell alike: precision, optimizer, schedule, DeepSpeed's stage."""

from __future__ import annotations

import json
from typing import Any

from pilotrun.campaign.importers.builder import Builder
from pilotrun.campaign.importers.reasons import AXOLOTL_REASONS

SCHEDULES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "constant_with_warmup": "constant"}
# the trainers' names of bitsandbytes' AdamW variants (Axolotl and the HF Trainer spell them alike)
BNB_ADAMW = {"adamw_bnb_8bit": "adamw_8bit", "adamw_8bit": "adamw_8bit", "paged_adamw_8bit": "paged_adamw_8bit",
             "paged_adamw_32bit": "paged_adamw_32bit"}
ADAMW = {"adamw", "adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw_torch_xla"}


def precision(b: Builder, src_bf16: str, bf16: Any, src_fp16: str, fp16: Any, auto_default: bool) -> None:
    if bf16 == "auto":
        b.put(src_bf16 + (" (the source's default)" if auto_default else ""), "train.precision", "bf16-mixed",
              "auto: the source falls back to fp16 on GPUs without bf16 (before Ampere); rehearsed as bf16-mixed")
    elif bf16:
        b.put(src_bf16, "train.precision", "bf16-mixed")
    elif fp16:
        b.put(src_fp16, "train.precision", "fp16-mixed")
    else:
        b.put(f"{src_bf16}/{src_fp16}", "train.precision", "fp32")


def optimizer(b: Builder, src: str, name: Any) -> None:
    name = str(name)
    if name in ADAMW:
        b.put(src, "train.optimizer", "adamw")
    elif name in BNB_ADAMW:
        b.put(src, "train.optimizer", BNB_ADAMW[name], "bitsandbytes'")
    elif name.startswith("sgd"):
        b.put(src, "train.optimizer", "sgd")
    else:
        b.put(src, "train.optimizer", "adamw", f"nearest to {name}")
        b.skip(src, name, f"{name} is rehearsed as AdamW: 8-bit, paged or factored optimizer states are smaller on "
                          "the rental than the two fp32 moments rehearsed here (the optimizer rows are an upper "
                          "bound), and the loss curve differs")


def schedule(b: Builder, src: str, name: Any) -> None:
    name = str(name)
    if name in SCHEDULES:
        b.put(src, "train.schedule", SCHEDULES[name])
    else:
        b.put(src, "train.schedule", "cosine", f"nearest to {name}")
        b.skip(src, name, f"the {name} schedule is rehearsed as cosine: the learning rate over the run differs")


def strategy_from_deepspeed(b: Builder, src: str, value: Any) -> None:
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
