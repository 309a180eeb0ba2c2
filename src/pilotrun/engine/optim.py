"""Optimizer and learning-rate schedule from the campaign's train section."""

from __future__ import annotations

import math

from pilotrun.errors import BadInput
from pilotrun.tasks.quantized import import_bitsandbytes


def _fusable(p, optimizer: str) -> bool:
    """A parameter torch's fused CPU kernel steps right: a plain (or, in the estimator, fake) CPU tensor of a
    floating dtype the kernel handles. A DTensor (FSDP's shards) or another tensor subclass keeps torch's
    default. torch 2.13's fused CPU SGD leaves the vectorised part of a bf16/fp16 tensor unstepped (16 of 17
    elements unchanged), so SGD is fused in fp32/fp64 only; fused AdamW, compared with an fp64 AdamW, is as
    close as torch's default in bf16 and fp16, or closer (tests/test_optimizer_kernel.py checks both)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    plain = type(p) in (torch.Tensor, torch.nn.Parameter) or isinstance(p, FakeTensor)
    dtypes = (torch.float32, torch.float64) + ((torch.bfloat16, torch.float16) if optimizer == "adamw" else ())
    return plain and p.device.type == "cpu" and p.dtype in dtypes


def kernel(params, device_type: str | None = None, optimizer: str = "adamw", sharded: bool = False) -> dict:
    """The keyword that picks torch's optimizer kernel pilotrun steps with (``optimizer``: "adamw" or "sgd"),
    for ``device_type`` (the device the run stands for; by default the parameters' own). On CPU torch's fused
    kernel: one pass over each tensor, no per-parameter temporaries; per step on the 22.7M-parameter MiniLM
    classifier ~8× less CPU time for AdamW and ~5× for SGD than torch's CPU default (the single-tensor loop).
    On CUDA torch's default, the foreach kernels, which the estimator's fake CUDA trace names (fake tensors
    sit on the CPU, where the default would be the single-tensor loop). ``sharded``: fake parameters standing
    for FSDP's DTensors, whose torch default is foreach on CUDA and the single-tensor loop on CPU."""
    params = list(params)
    device_type = device_type or (params[0].device.type if params else "cpu")
    if sharded:
        return {"foreach": device_type == "cuda"}
    if device_type == "cpu" and params and all(_fusable(p, optimizer) for p in params):
        return {"fused": True}
    if device_type == "cuda" and any(p.device.type != "cuda" for p in params):
        return {"foreach": True}
    return {}


def make_optimizer(model, t, device_type: str | None = None, sharded: bool = False):
    """The campaign's optimizer over the trainable parameters, on the kernel ``kernel`` picks: pilot, train
    and the estimator build it here (the bench's bare loop asks ``kernel``), so they step with one kernel."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BadInput("the model has no trainable parameters", where="model.adapter",
                       fix="check model.adapter.target_modules, or unfreeze the model")
    if t.optimizer in BNB_OPTIMIZERS:
        import contextlib

        from torch._subclasses.fake_tensor import is_fake, unset_fake_temporarily

        cls = getattr(import_bitsandbytes().optim, BNB_OPTIMIZERS[t.optimizer])
        # its 8-bit code books are computed from values at construction: outside the estimator's fake mode
        with unset_fake_temporarily() if any(is_fake(p) for p in params) else contextlib.nullcontext():
            return cls(params, lr=t.lr, weight_decay=t.weight_decay)  # bitsandbytes' own kernels on every device
    cls = torch.optim.AdamW if t.optimizer == "adamw" else torch.optim.SGD
    return cls(params, lr=t.lr, weight_decay=t.weight_decay, **kernel(params, device_type, t.optimizer, sharded))


# train.optimizer → bitsandbytes' class: AdamW with 8-bit block-quantised moments, and the paged variants whose
# state bitsandbytes puts in CUDA unified memory (tensors of 1e5 elements or more; on the CPU it falls back to plain)
BNB_OPTIMIZERS = {"adamw_8bit": "AdamW8bit", "paged_adamw_8bit": "PagedAdamW8bit",
                  "paged_adamw_32bit": "PagedAdamW32bit"}
PAGED_MIN_NUMEL = 100_000  # bitsandbytes' Optimizer8bit.get_state_buffer: smaller tensors are never paged


def save_optimizer_state(obj, path) -> None:
    """``torch.save`` of an optimizer's state (tensors and numbers only) without the zip records' CRC32.

    A checkpoint's manifest holds every file's sha256, and every reader checks it before anything is read
    (engine/state.py): CRC32 only repeated that check, more weakly, and it was most of the save's time. On
    SmolLM2-135M's 1.08 GB AdamW state, py-spy (200 Hz, two saves) counted 2.55 s in crc32 of 4.1 s in
    ``torch.save``; ``torch.load`` reads the file the same either way. torch's setting is process-wide, so it is
    put back as it was after the save (a user's own ``torch.save`` in the same process keeps its CRC32)."""
    import torch
    from torch.serialization import get_crc32_options, set_crc32_options

    before = get_crc32_options()
    set_crc32_options(False)
    try:
        torch.save(obj, path)
    finally:
        set_crc32_options(before)


def load_keeping_kernel(optimizer, load) -> None:
    """``load()`` (a ``load_state_dict``) with the optimizer's own kernel kept: torch restores each group's
    ``fused``/``foreach`` from the file, so a checkpoint written on another device (or by a pilotrun that
    stepped with another kernel) would change the kernel this run rehearses."""
    kept = [(g.get("fused"), g.get("foreach")) for g in optimizer.param_groups]
    load()
    for group, (fused, foreach) in zip(optimizer.param_groups, kept):
        group["fused"], group["foreach"] = fused, foreach


def lr_factor(update: int, total: int, warmup: int, schedule: str) -> float:
    """Multiplier of the peak lr for the update about to run (0-based count of updates done)."""
    if warmup and update < warmup:
        return (update + 1) / warmup
    if schedule == "constant":
        return 1.0
    span = max(1, total - warmup)
    progress = min(1.0, (update - warmup) / span)
    if schedule == "linear":
        return max(0.0, 1.0 - progress)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(optimizer, t, total_updates: int):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda u: lr_factor(u, total_updates, t.warmup, t.schedule))
