"""Fake kernels for the ops whose meta kernel refuses what the run's own kernel takes.

torch's meta kernel of ``aten._grouped_mm`` (the grouped expert matmul transformers' MoE layers run through
``torch.nn.functional.grouped_mm``) copies the checks of the Hopper bf16 kernel: under fake tensors an fp32 or
fp16 model fails with "Expected inputs of BF16 type", while the CPU kernel (and transformers' fallback) run every
floating dtype. The estimator's accountant answers such a call here: an empty output of the shape and dtype the
kernel returns (the bytes are all the ledger needs), laid out as the CUDA kernel lays it out when the trace stands
for a CUDA device (each row padded to 16 bytes).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

# bitsandbytes' CUDA gemm_4bit (bitsandbytes/backends/cuda/ops.py): past this many rows of A (or for a K not aligned to
# the block size) it dequantises the weight into a temporary of the compute dtype and runs F.linear; below it a fused
# kernel may be chosen per architecture and shape. The estimate counts the temporary at every size: an upper bound.
GEMM_4BIT_CUSTOM_MAX_M = 1536


def stand_in(func, args, kwargs: dict, cuda: bool):
    """The output of ``func`` on these fake arguments when its meta kernel would refuse them, else None."""
    import torch

    if func is not torch.ops.aten._grouped_mm.default:
        return _int8_outliers(func, args, kwargs)
    a, b = args[0], args[1]
    offs = args[2] if len(args) > 2 else kwargs.get("offs")
    out_dtype = (args[4] if len(args) > 4 else kwargs.get("out_dtype")) or a.dtype
    if a.dtype == b.dtype == torch.bfloat16 and out_dtype == torch.bfloat16:
        return None  # the meta kernel's own case
    return _grouped_mm_output(a, b, offs, out_dtype, cuda)


def _grouped_mm_output(a, b, offs, dtype, cuda: bool):
    """The grouped matmul's result: (tokens, out) for 2-D × 3-D, a stack of per-group products for 2-D × 2-D
    (the weight gradient), (groups, rows, out) for 3-D × 3-D, (rows, out) for 3-D × 2-D."""
    import torch

    if a.dim() == 2:
        size = [offs.size(0), a.size(0), b.size(1)] if b.dim() == 2 else [a.size(0), b.size(-1)]
    else:
        size = [a.size(1), b.size(1)] if b.dim() == 2 else [a.size(0), a.size(1), b.size(-1)]
    if not cuda:
        return torch.empty(size, dtype=dtype, device=a.device)
    align = max(1, 16 // dtype.itemsize)
    padded = -(-size[-1] // align) * align
    stride = [size[1] * padded, padded, 1] if len(size) == 3 else [padded, 1]
    return torch.empty_strided(size, stride, dtype=dtype, device=a.device)


def inner_temporaries(func, args, kwargs: dict, cuda: bool) -> list[int]:
    """Bytes a kernel allocates inside itself and frees before it returns, which no dispatch mode sees (the op is
    dispatched whole): bitsandbytes' gemm_4bit on CUDA dequantises the 4-bit weight into a compute-dtype temporary
    (and a double-quantised weight's block constants into float32 first). [] for every other op and on the CPU, where
    the exact counter, like the estimate, counts op outputs only."""
    if not cuda or getattr(getattr(func, "_schema", None), "name", None) != "bitsandbytes::gemm_4bit":
        return []
    import math

    a, shape = args[0], args[2]
    absmax_8bit = args[7] if len(args) > 7 else kwargs.get("absmax_8bit")
    out = [math.prod(shape) * a.element_size()]
    if absmax_8bit is not None:
        out.insert(0, absmax_8bit.numel() * 4)
    return out


def _int8_outliers(func, args, kwargs: dict):
    """bitsandbytes' LLM.int8() quantisation of activations with an outlier threshold (8-bit layers' forward without
    gradients: validation, reload): how many columns pass the threshold depends on the values, which fake tensors do
    not have (its fake kernel asks for a dynamic size). Answered with none: the int8 rows and their scales are
    counted; the fp16 copy of the outlier columns (a few per layer in practice) is not."""
    name = getattr(getattr(func, "_schema", None), "name", None)
    if name not in ("bitsandbytes::int8_vectorwise_quant", "bitsandbytes::int8_mixed_scaled_mm"):
        return None
    import torch

    a = args[0]
    if name == "bitsandbytes::int8_mixed_scaled_mm":  # the matmul beside the outliers: its output, no outlier rows
        ca, cb = args[1], args[2]
        return (torch.empty((*ca.shape[:-1], cb.shape[0]), device=a.device, dtype=a.dtype),
                torch.empty(0, device=a.device, dtype=torch.int64))
    threshold = args[1] if len(args) > 1 else kwargs.get("threshold", 0.0)
    if not threshold:
        return None
    return (torch.empty(a.shape, device=a.device, dtype=torch.int8),
            torch.empty(a.numel() // a.shape[-1], device=a.device, dtype=torch.float32),
            torch.empty(0, device=a.device, dtype=torch.int64))


@contextmanager
def device_paths(cuda: bool):
    """Inside, for a trace that stands for CUDA, bitsandbytes' 8-bit layers take the path they take on a GPU.

    ``bitsandbytes.matmul`` (public) picks its autograd function by the input's device while its state is training:
    on the CPU, where the fake tensors sit, MatMul8bitFp (the weight dequantised, a float matmul); on CUDA, and for
    a state not training on any device, MatMul8bitLt (LLM.int8(): int8 activations, an int8 matmul, the outliers
    beside it). In MatMul8bitLt the flag decides one thing more: a weight kept in fp16 (``has_fp16_weights``) and
    without a gradient is quantised again at every call. So the call goes through the public ``bitsandbytes.matmul``
    with the flag off, after that re-quantisation's reset where a training state would do it (the public
    ``MatmulLtState.reset_grads``), and the flag is put back. A frozen int8 base (QLoRA's, ``load_in_8bit``) keeps
    its int8 weight either way. bitsandbytes not imported: nothing to do."""
    bnb = sys.modules.get("bitsandbytes")
    if not cuda or bnb is None:
        yield
        return
    original = bnb.matmul

    def matmul(A, B, out=None, state=None, threshold=0.0, bias=None):
        state = state or bnb.MatmulLtState()
        if not state.is_training:
            return original(A, B, out=out, state=state, threshold=threshold, bias=bias)
        if state.has_fp16_weights and getattr(B, "grad", None) is None:
            state.reset_grads()
        state.is_training = False
        try:
            return original(A, B, out=out, state=state, threshold=threshold, bias=bias)
        finally:
            state.is_training = True

    bnb.matmul = matmul
    try:
        yield
    finally:
        bnb.matmul = original
