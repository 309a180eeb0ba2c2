"""Precision modes: autocast contexts and the grad scaler."""

from __future__ import annotations

import contextlib


def autocast(precision: str, device_type: str):
    import torch

    if precision == "bf16-mixed":
        return torch.autocast(device_type=device_type, dtype=torch.bfloat16)
    if precision == "fp16-mixed":
        return torch.autocast(device_type=device_type, dtype=torch.float16)
    return contextlib.nullcontext()


def make_scaler(precision: str, device_type: str):
    """A grad scaler for fp16-mixed; None otherwise. It acts once per optimizer update."""
    if precision != "fp16-mixed":
        return None
    import torch

    return torch.amp.GradScaler(device_type)
