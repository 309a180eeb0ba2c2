"""Precision modes: autocast contexts, the grad scaler, and which dtype a campaign's arithmetic rounds in.

A comparison of two computations of the same campaign (verify's reload, resume's fresh process, overfit's
accumulation check, fit's variants) expects the rounding of the dtype the arithmetic ran in: ``train.precision``
alone does not say it (fp32 precision over ``model.dtype: bfloat16`` weights computes in bf16).
"""

from __future__ import annotations

import contextlib

from pilotrun.tasks.loading import weights_dtype

# torch.finfo(dtype).eps: the spacing of the dtype's numbers just above 1 (no torch import for a constant)
EPS = {"float32": 2.0 ** -23, "bfloat16": 2.0 ** -7, "float16": 2.0 ** -10}
AUTOCAST = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16"}


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


def compute_dtype(model_dtype: str, precision: str) -> str:
    """The coarsest dtype the forward and backward round in: autocast's under -mixed, else the weights'."""
    held = weights_dtype(model_dtype, precision)
    cast = AUTOCAST.get(precision, held)
    return max((held, cast), key=lambda d: EPS.get(d, EPS["float32"]))


def campaign_compute_dtype(c) -> str:
    """The campaign's coarsest rounding; a quantised base's layers round in their compute dtype (4-bit) or in
    float16 (LLM.int8()'s matmul), whichever is coarser."""
    dtype = compute_dtype(c.model.dtype, c.train.precision)
    q = getattr(c.model, "quantization", None)
    if q is None:
        return dtype
    layers = q.compute_dtype if q.bits == 4 else "float16"
    return max((dtype, layers), key=lambda d: EPS.get(d, EPS["float32"]))
