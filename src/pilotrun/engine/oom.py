"""Which exceptions are the device (or the host) running out of memory: the loop ends a run on them,
the phase recorder turns them into verdict "oom"."""

from __future__ import annotations

_OOM_TEXT = ("out of memory", "can't allocate memory")  # CUDA/MPS, and the CPU allocator


def is_oom(exc: BaseException) -> bool:
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", ())
    return isinstance(exc, (MemoryError, oom_type)) or (isinstance(exc, RuntimeError)
                                                        and any(s in str(exc).lower() for s in _OOM_TEXT))
