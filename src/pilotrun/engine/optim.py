"""Optimizer and learning-rate schedule from the campaign's train section."""

from __future__ import annotations

import math

from pilotrun.errors import BadInput


def make_optimizer(model, t):
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise BadInput("the model has no trainable parameters", where="model.adapter",
                       fix="check model.adapter.target_modules, or unfreeze the model")
    if t.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=t.lr, weight_decay=t.weight_decay)
    return torch.optim.SGD(params, lr=t.lr, weight_decay=t.weight_decay)


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
