"""Memory counters behind one interface: ``probe = make_probe(device); probe.start(); ...; probe.stop()``.

``stop()`` returns the counters of the phase, in bytes:
``device, counter, baseline, peak_allocated, peak_reserved, end_allocated, end_reserved``.

- CUDA (counter "cuda"): torch's allocated and reserved bytes of that device; peaks are reset at
  start, and every reading follows a ``synchronize`` so queued kernels have allocated what they will.
- CPU (counter "tensors+rss", the default): ``*_allocated`` are the bytes held by live tensors, exact
  at every operator (engine/tensors.py): deterministic, blind to the heap glibc keeps, with a true
  peak; ``*_reserved`` are the process's resident set (RSS), read as below: what the process holds
  from the system, as CUDA's reserved is what its allocator holds from the card.
- CPU (counter "rss", ``make_probe("cpu", exact=False)``): the process's resident set only. ``peak_allocated`` is the peak RSS inside the
  phase and ``end_allocated`` the RSS at its end. RSS has no reserved counter, so both *_reserved
  are None — never filled with a guess and never added to anything. On Linux the kernel keeps the
  peak (VmHWM) and writing "5" to /proc/self/clear_refs resets it; elsewhere a sampling thread
  keeps the peak (it can miss a spike shorter than its interval).
- MPS (counter "mps"): allocated = tensors held by the MPS allocator, reserved = what the Metal
  driver holds for the process; MPS keeps no peak, so a sampling thread keeps them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from pilotrun.engine.distributed import default_device

SAMPLE_INTERVAL_S = 0.002

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _rss_now() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def _vm_hwm() -> int | None:
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def _can_reset_hwm() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")
        return _vm_hwm() is not None
    except OSError:
        return False


class _Sampler:
    """A daemon thread that keeps the maximum of some readings until stopped."""

    def __init__(self, read):
        self.read = read
        self.peak = read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="pilotrun-probe")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self.peak = tuple(max(a, b) for a, b in zip(self.peak, self.read()))

    def stop(self) -> tuple:
        self._stop.set()
        self._thread.join()
        self.peak = tuple(max(a, b) for a, b in zip(self.peak, self.read()))
        return self.peak


class Probe:
    """The interface; one subclass per device kind."""

    counter = "none"

    def __init__(self, device: str):
        self.device = device
        self.baseline: int | None = None

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> dict:
        raise NotImplementedError

    def _row(self, peak_allocated, peak_reserved, end_allocated, end_reserved) -> dict:
        as_int = lambda v: None if v is None else int(v)  # noqa: E731
        return {"device": self.device, "counter": self.counter, "baseline": as_int(self.baseline),
                "peak_allocated": as_int(peak_allocated), "peak_reserved": as_int(peak_reserved),
                "end_allocated": as_int(end_allocated), "end_reserved": as_int(end_reserved)}


class CudaProbe(Probe):
    counter = "cuda"

    def __init__(self, device):
        import torch

        self.torch = torch
        self.dev = torch.device(device)
        if self.dev.index is None:
            self.dev = torch.device("cuda", torch.cuda.current_device())
        super().__init__(str(self.dev))

    def start(self) -> None:
        cuda = self.torch.cuda
        cuda.synchronize(self.dev)
        cuda.reset_peak_memory_stats(self.dev)
        self.baseline = cuda.memory_allocated(self.dev)

    def stop(self) -> dict:
        cuda = self.torch.cuda
        cuda.synchronize(self.dev)
        return self._row(cuda.max_memory_allocated(self.dev), cuda.max_memory_reserved(self.dev),
                         cuda.memory_allocated(self.dev), cuda.memory_reserved(self.dev))


class RssProbe(Probe):
    counter = "rss"

    def __init__(self, device: str = "cpu", *, sampling: bool | None = None):
        super().__init__(device)
        self.sampling = (not _can_reset_hwm()) if sampling is None else sampling
        self._sampler: _Sampler | None = None

    def start(self) -> None:
        if self.sampling:
            self._sampler = _Sampler(lambda: (_rss_now(),))
        else:
            with open(_CLEAR_REFS, "w") as f:
                f.write("5")  # resets VmHWM to the current RSS
        self.baseline = _rss_now()

    def stop(self) -> dict:
        end = _rss_now()
        if self._sampler is not None:
            (peak,) = self._sampler.stop()
            self._sampler = None
        else:
            peak = _vm_hwm() or end
        return self._row(max(peak, end), None, end, None)


class TensorProbe(Probe):
    """CPU: live tensor bytes (exact, engine/tensors.py) as allocated, RSS as reserved."""

    counter = "tensors+rss"

    def __init__(self, device: str = "cpu"):
        from pilotrun.engine.tensors import TensorCounter  # lazy: pulls in torch

        super().__init__(device)
        self.tensors = TensorCounter()
        self.rss = RssProbe(device)

    def start(self) -> None:
        self.tensors.start()  # the first start counts the tensors alive (a pass over gc's objects)
        self.rss.start()
        self.baseline = self.tensors.baseline

    def stop(self) -> dict:
        rss = self.rss.stop()
        _, peak, end = self.tensors.stop()
        return self._row(peak, rss["peak_allocated"], end, rss["end_allocated"])


class MpsProbe(Probe):
    counter = "mps"

    def __init__(self, device: str = "mps"):
        import torch

        self.mps = torch.mps
        super().__init__(device)
        self._sampler: _Sampler | None = None

    def _read(self) -> tuple[int, int]:
        return int(self.mps.current_allocated_memory()), int(self.mps.driver_allocated_memory())

    def start(self) -> None:
        self.mps.synchronize()
        self.baseline = self._read()[0]
        self._sampler = _Sampler(self._read)

    def stop(self) -> dict:
        self.mps.synchronize()
        peak_a, peak_r = self._sampler.stop() if self._sampler else self._read()
        self._sampler = None
        end_a, end_r = self._read()
        return self._row(peak_a, peak_r, end_a, end_r)


def release_free_memory() -> None:
    """Hand memory nobody holds back before a measured stretch: collect garbage, return glibc's free heap
    to the system (``malloc_trim``), empty CUDA's cache. Between the runs of one sweep process it keeps
    a run's RSS from starting on the previous run's leftovers.

    What survives the collection is then frozen (``gc.freeze``): the imported modules (torch's and
    transformers' are ~10⁶ objects) and the data live for the whole run, and every later full collection
    would walk them all again (0.1–0.4 s each; the model's build imports enough to trigger several). Frozen
    objects are still freed by their reference counts; the next call unfreezes and collects everything
    first, so a cycle among them waits at most until then. ``engine.tensors`` counts frozen tensors too.
    In a process that froze its own (``freeze_process``) the call collects everything made since and leaves
    the frozen alone: nothing it could free was alive when that froze."""
    import gc

    from pilotrun.engine.tensors import FROZEN

    ours = not FROZEN.done  # what is frozen was frozen here, by the call before: unfreeze it, collect, freeze again
    if ours:
        gc.unfreeze()
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc
    if ours:
        gc.freeze()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_probe(device=None, *, exact: bool = True) -> Probe:
    """The probe for a device ("cpu", "cuda", "cuda:1", "mps" or a torch.device); default: the process's device.

    On CPU ``exact=False`` gives RSS alone (no per-operator cost: for blocks the exact counter skips)."""
    if device is None:
        device = default_device()
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cuda":
        return CudaProbe(device)
    if kind == "mps":
        return MpsProbe(str(device))
    dev = str(device) if kind == "cpu" else "cpu"
    return TensorProbe(dev) if exact else RssProbe(dev)
