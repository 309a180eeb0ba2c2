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
  the pilot call it once after building the model. ``LiveTensors.sweep`` adds every other tensor alive
  that no operator handed back (a library's own tables): the pilot's load ends with one.
- ``_Watch``, a ``TorchDispatchMode`` pushed for the length of a phase, adds each operator's output
  storages as they appear and raises the peak right then: the peak is the most bytes live between
  two operators, with no sampling gap. Autograd's backward runs through the same mode.

FSDP2 (``fully_shard``) frees and re-allocates its unsharded parameters by resizing their storages in
place (``UntypedStorage.resize_``), which no operator reports: ``track`` on a sharded model registers
its FSDP parameters, and their all-gather buffers are re-read before the peak is raised and at each
phase's start and end (``LiveTensors.refresh``), so a freed gather counts nothing and a live one counts.

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
        self.sharded: list[weakref.ref] = []  # FSDP2 modules whose gather buffers resize without an operator
        self._refreshing = False

    def _gone(self, key: int, _ref) -> None:
        entry = self.table.pop(key, None)
        if entry is not None:
            self.bytes -= entry[0]

    def add(self, t: torch.Tensor) -> None:
        if type(t) not in _PLAIN:  # a DTensor's storage is its global size: count the local shard it holds
            t = getattr(t, "_local_tensor", t)
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
            if self.sharded and not self._refreshing:
                self.refresh()  # a gather freed since it was counted must not raise the peak
            self.peak = max(self.peak, self.bytes)

    def refresh(self) -> None:
        """Re-read the sizes of the registered FSDP2 modules' gather buffers (resized in place, unseen)."""
        self._refreshing = True
        try:
            alive = []
            for ref in self.sharded:
                module = ref()
                if module is None:
                    continue
                alive.append(ref)
                for t in _gather_buffers(module):
                    self.add(t)
            self.sharded = alive
        finally:
            self._refreshing = False

    def seed(self) -> None:
        """Count every tensor alive now (once per process: a pass over the garbage collector's objects)."""
        if self.seeded:
            return
        self.seeded = True
        self.sweep()

    def sweep(self) -> None:
        """Count every tensor alive now that no operator handed back: a pass over the garbage collector's objects.
        Libraries make tensors without one, and not only as a model's parameters (``track``): bitsandbytes builds
        its 4-bit lookup tables (252 bytes) on the first quantisation, inside the pilot's load phase. A run, whose
        counter starts after its model is built (``seed``), counted them; the pilot did not, and every phase of the
        run read 252 bytes over it (its save 1.00037 ×). The pilot's load ends with a sweep."""
        for o in _all_objects():
            if type(o) in _PLAIN:
                self.add(o)

    def reset_peak(self) -> int:
        if self.sharded:
            self.refresh()
        self.peak = self.bytes
        return self.bytes


LIVE = LiveTensors()


class _Frozen:
    """What ``freeze_process`` froze for good: whether it did, and weak references to the tensors among them."""

    def __init__(self):
        self.done = False
        self.tensors: list = []


FROZEN = _Frozen()


def freeze_process() -> None:
    """Declare what this process holds now its own for as long as it lives: collect in full, then ``gc.freeze``
    what survives (a later call does it again, what was frozen with what came since).

    For a process that holds much pilotrun did not make before pilotrun runs in it: the fresh processes' zygote
    after its imports (``engine/fresh.py``; its children inherit the frozen imports), a test session after its
    collection (``tests/conftest.py``), a notebook. ``probe.memory.release_free_memory`` then collects everything
    made since, in full, at every call, and neither unfreezes nor freezes: a full collection no longer walks the
    imported libraries (~4 × 10⁵ objects with torch and transformers, ~0.2 s on 2 cores, at every run's start and
    in every probe of ``fit``). What is frozen here is still freed by its reference counts, but a cycle among it that
    becomes garbage is never collected: call it where what is alive is the process's for good, never with a
    run's model or data alive. The tensors among it are remembered (weak references) for the exact counter's
    passes over every live tensor (``_all_objects``), which no longer unfreeze to find them."""
    gc.unfreeze()
    gc.collect()
    FROZEN.tensors = [weakref.ref(o) for o in gc.get_objects() if type(o) in _PLAIN]  # type(): no attribute read
    FROZEN.done = True
    gc.freeze()


def frozen_tensors() -> list:
    """The tensors ``freeze_process`` froze that are still alive."""
    return [t for t in (r() for r in FROZEN.tensors) if t is not None]


def _all_objects() -> list:
    """Every object the garbage collector tracks, those ``gc.freeze`` moved out of its generations included
    (``probe.memory.release_free_memory`` freezes what is alive before a run; ``gc.get_objects`` skips them).
    In a process that froze its own for good (``freeze_process``) nothing is unfrozen: what it froze
    is there by the tensors it remembered (unfreezing and freezing again would freeze everything alive now, the
    run's model and data among it, out of every later collection)."""
    if FROZEN.done:
        return gc.get_objects() + frozen_tensors()
    if not gc.get_freeze_count():
        return gc.get_objects()
    gc.unfreeze()
    try:
        return gc.get_objects()
    finally:
        gc.freeze()


def _gather_buffers(module) -> list[torch.Tensor]:
    """The tensors FSDP2 gathers the unsharded parameters of ``module`` into (empty before the first gather).

    torch keeps them in private attributes (``FSDPParam.all_gather_outputs`` and the extensions' inner
    tensors); read defensively, so another torch only loses this correction."""
    state = getattr(module, "_get_fsdp_state", None)
    group = getattr(state(), "_fsdp_param_group", None) if state is not None else None
    out = []
    for fp in getattr(group, "fsdp_params", None) or ():
        out += [t for t in (getattr(fp, "all_gather_outputs", None) or ()) if isinstance(t, torch.Tensor)]
        out += [t for t in (getattr(fp, "_unsharded_inner_tensors", None) or ()) if isinstance(t, torch.Tensor)]
    return out


def _register_sharded(model: torch.nn.Module) -> None:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        return
    known = {id(r()) for r in LIVE.sharded}
    LIVE.sharded += [weakref.ref(m) for m in model.modules() if isinstance(m, FSDPModule) and id(m) not in known]


def track(*objs) -> None:
    """Count the tensors of modules (parameters, buffers, gradients), optimizers (their state), tensors,
    and lists/tuples/dicts of those, made outside a phase."""
    for o in objs:
        if isinstance(o, torch.Tensor):
            LIVE.add(o)
            if o.grad is not None:
                LIVE.add(o.grad)
        elif isinstance(o, torch.nn.Module):
            _register_sharded(o)
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
        # torch wraps a mode's __torch_dispatch__ in a dynamo-disable wrapper by default; without it this
        # mode adds ~19 instead of ~25 µs of CPU time per operator (`x + 1` on a 4-element tensor, 3.8 µs
        # bare, best of 7 × 20,000). pilotrun never compiles under a probe: the wrapper guards nothing here.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if type(out) is torch.Tensor or hasattr(out, "_local_tensor"):  # a DTensor's ops run unseen inside it
            LIVE.add(out)
        elif type(out) in (tuple, list):
            for o in out:
                if type(o) is torch.Tensor or hasattr(o, "_local_tensor"):
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
        if LIVE.sharded:
            LIVE.refresh()
        LIVE.depth -= 1
        peak = max(LIVE.peak, LIVE.bytes)
        LIVE.peak = max(peak, self._outer_peak)
        return self.baseline, peak, LIVE.bytes
