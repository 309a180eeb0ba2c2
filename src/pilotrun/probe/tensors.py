"""An exact CPU counter of the bytes held by live tensors, with a true peak: CUDA's "allocated" on CPU.

RSS counts the whole process (the heap glibc keeps after a free, Python objects, code pages), so two
runs of the same phase differ, and a tensor allocated and freed between two samples is missed. This
counter counts tensor storages only, at every operator:

- ``LiveTensors`` (one per process) keeps the bytes of every known storage, keyed by the storage's
  C++ address, with a weak reference whose callback subtracts them when the storage dies (torch keeps
  a storage's Python object alive as long as the storage, so the callback fires exactly at the free,
  in or out of a phase). The first use seeds it with every tensor the garbage collector can reach.
- ``track(model, optimizer)`` adds tensors made outside any phase that the next phase will hold (a
  model built or loaded before the loop, a second run's model in the same process): the loop and
  the pilot call it once after building the model.
- ``_Watch``, a ``TorchDispatchMode`` pushed for the length of a phase, adds each operator's output
  storages as they appear and raises the peak right then: the peak is the most bytes live between
  two operators, with no sampling gap. Autograd's backward runs through the same mode.

What it leaves out, by design: scratch memory an operator allocates and frees inside its own kernel
(oneDNN workspaces), and tensors created outside a phase that no phase operator returns (counted
from the seed on, or once an in-place operator hands them back).

Why this and not the alternatives (measured in docs/ARCHITECTURE.md "Memory counters"): the
profiler's memory events (``profile_memory=True``) are cheaper per operator but count only blocks
allocated while it records, miss the frees of older blocks (warning every thousandth), and must be
parsed after the phase; torch keeps no allocator statistics for CPU at all. The mode costs ~30 µs
per operator (the dispatch itself), so the loop uses it on a chosen subset of updates (probe/watch.py).
"""

from __future__ import annotations

import functools
import gc
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_PLAIN = (torch.Tensor, torch.nn.Parameter)


class LiveTensors:
    """The process's live tensor bytes (CPU storages) and the peak since ``reset_peak()``."""

    def __init__(self):
        self.table: dict[int, tuple[int, weakref.ref]] = {}
        self.bytes = 0
        self.peak = 0
        self.seeded = False
        self.depth = 0  # phases open now: an inner phase's reset must not lower the outer one's peak

    def _gone(self, key: int, _ref) -> None:
        entry = self.table.pop(key, None)
        if entry is not None:
            self.bytes -= entry[0]

    def add(self, t: torch.Tensor) -> None:
        if not t.is_cpu or t.layout != torch.strided:  # is_cpu: ~0.2 µs where device.type takes ~1.4
            return
        st = t.untyped_storage()
        key = st._cdata
        n = st.nbytes()
        entry = self.table.get(key)
        if entry is None:
            if not n:
                return
            self.table[key] = (n, weakref.ref(st, functools.partial(self._gone, key)))
            self.bytes += n
        elif entry[0] != n:  # resized in place
            self.table[key] = (n, entry[1])
            self.bytes += n - entry[0]
        else:
            return
        if self.bytes > self.peak:
            self.peak = self.bytes

    def seed(self) -> None:
        """Count every tensor alive now (once per process: a pass over the garbage collector's objects)."""
        if self.seeded:
            return
        self.seeded = True
        for o in gc.get_objects():
            if type(o) in _PLAIN:
                self.add(o)

    def reset_peak(self) -> int:
        self.peak = self.bytes
        return self.bytes


LIVE = LiveTensors()


def track(*objs) -> None:
    """Count the tensors of modules (parameters, buffers, gradients), optimizers (their state), tensors,
    and lists/tuples/dicts of those, made outside a phase."""
    for o in objs:
        if isinstance(o, torch.Tensor):
            LIVE.add(o)
            if o.grad is not None:
                LIVE.add(o.grad)
        elif isinstance(o, torch.nn.Module):
            track(*o.parameters(), *o.buffers())
        elif isinstance(o, torch.optim.Optimizer):
            for st in o.state.values():
                track(*st.values())
        elif isinstance(o, dict):
            track(*o.values())
        elif isinstance(o, (list, tuple)):
            track(*o)


class _Watch(TorchDispatchMode):
    """Adds every operator's output storages to ``LIVE`` (the peak is raised inside ``add``)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in a dynamo-disable wrapper by default; that wrapper
        # alone cost ~14 of the ~38 µs this mode added per operator (bench: `x + 1` on a 4-element
        # tensor, 4.6 µs bare). pilotrun never compiles under a probe, so the wrapper guards nothing here.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if type(out) is torch.Tensor:
            LIVE.add(out)
        elif type(out) in (tuple, list):
            for o in out:
                if type(o) is torch.Tensor:
                    LIVE.add(o)
        return out


class TensorCounter:
    """``start()`` … ``stop() -> (baseline, peak, end)`` in bytes of live CPU tensors."""

    def __init__(self):
        self._mode: _Watch | None = None
        self._outer_peak = 0
        self.baseline = 0

    def start(self) -> int:
        LIVE.seed()
        self._outer_peak = LIVE.peak if LIVE.depth else 0
        self.baseline = LIVE.reset_peak()
        LIVE.depth += 1
        self._mode = _Watch()
        self._mode.__enter__()
        return self.baseline

    def stop(self) -> tuple[int, int, int]:
        if self._mode is None:
            return self.baseline, LIVE.bytes, LIVE.bytes
        self._mode.__exit__(None, None, None)
        self._mode = None
        LIVE.depth -= 1
        peak = max(LIVE.peak, LIVE.bytes)
        LIVE.peak = max(peak, self._outer_peak)
        return self.baseline, peak, LIVE.bytes
