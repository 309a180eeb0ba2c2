"""Independent traces at once: a fork of this process computes one while this process computes the others.

A counted trace traces the same campaign at two or three depths (probe/counted.py), each a single-threaded pass of
fake tensors, independent of the others; the sheet bisects the largest sizes while it traces the options table
(sheet/estimates.largest_ahead). ``start(compute)`` forks a child that runs ``compute()`` and writes its
JSON value back through a pipe; the caller goes on with its own work and then reads it with ``Worker.result``,
which answers None whenever the child did not answer whole (it died, exited non-zero, timed out, or wrote a body
whose sha256 is not the one in its header): the caller then computes that part itself, so a failed worker costs
time, never a wrong or missing figure. Every child is reaped (``result`` and ``cancel``); nothing is written to disk.

Why a fork is safe here: the child shares what the parent loaded (the campaign, the prepared data, the imported
modules) as it was at the fork, computes from it alone, and never returns into the parent's code (``os._exit``):
its stdout and stderr go nowhere, its progress reports are dropped (a parent thread could hold their lock at the
fork), the signals that interrupt pilotrun end it at once (no handler of the parent's runs in it), it uses one
torch thread, and it never touches the journal (the parent stores what it computed). It is not used where it
could not be safe or could not pay (``allowed``): off Linux or without ``fork``, with fewer than 2 CPUs this
process may run on, from a thread other than the main one, once CUDA is initialised in this process (a forked
child cannot use it), with ``PILOTRUN_TRACE_WORKERS=1``, or (the variable unset) while the kernel counts no idle
core now (``idle_core``).
"""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from pilotrun import jsonsafe

WORKERS_ENV = "PILOTRUN_TRACE_WORKERS"  # "1" (or 0): one after the other; "2": a worker; unset: one if a core is idle
# test switch: the worker "exit"s with status 3 before it answers, or answers a "truncate"d body and exits 0
TEST_ENV = "PILOTRUN_TEST_TRACE_WORKER"
COUNTS = {"started": 0, "answered": 0, "failed": 0}  # this process's workers: answered whole, or not (computed here)


def allowed() -> bool:
    """Whether a trace may run in a forked worker now (the module's docstring says when not). Unset
    ``PILOTRUN_TRACE_WORKERS``: only while a core is idle now (``idle_core``): on a busy machine the worker would
    only share the caller's cores (the 70B options table took 1.1 × the serial wall at load 2 on 2 cores, 0.73 × at
    load 1); 2 or more: whatever the load."""
    said = os.environ.get(WORKERS_ENV, "").strip()
    if said:
        try:
            if int(said) < 2:
                return False
        except ValueError:
            return False  # not a number: the safe reading, one at a time
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or not hasattr(os, "sched_getaffinity"):
        return False
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2 or threading.current_thread() is not threading.main_thread():
        return False  # one CPU; or a thread's fork, whose child could not reset the signals (the main thread's)
    if not said and not idle_core(cpus):
        return False
    torch = sys.modules.get("torch")
    return not (torch is not None and torch.cuda.is_initialized())


def idle_core(cpus: int, reads: int = 5, gap: float = 0.005, read: Callable[[], str] | None = None) -> bool:
    """Whether one of ``cpus`` cores is idle now: the kernel's count of runnable threads (``/proc/loadavg``'s
    fourth field, this one included) under ``cpus`` at most of ``reads`` readings ``gap`` seconds apart (20 ms).
    Most, not each: any thread that wakes for a moment (a progress line's refresh, a timer, another program's poll)
    counts at the reading that meets it, and with every reading required `all`'s SmolLM2 sheet once traced alone on
    an idle machine; a job that holds the cores holds them at every reading. Not the load average: a minute's
    decaying mean, it takes ~17 s to fall from 2 to 1.5 after a two-thread job ends, so `all`'s sheet stage, right
    after `train`, would trace one depth at a time on an idle machine (reasoned from the decay, not measured).
    Without ``/proc``, the load average under 0.5 below the CPUs. ``read``: what gives ``/proc/loadavg``'s text."""
    idle = 0
    for i in range(reads):
        try:
            text = read() if read is not None else Path("/proc/loadavg").read_text()
        except OSError:
            return os.getloadavg()[0] < cpus - 0.5
        idle += runnable_below(text, cpus)
        if 2 * idle > reads or 2 * (i + 1 - idle) >= reads:  # decided either way
            break
        time.sleep(gap)
    return 2 * idle > reads


def runnable_below(loadavg: str, cpus: int) -> bool:
    """``/proc/loadavg``'s runnable threads (``R/T``, the reader among them) fewer than ``cpus``."""
    try:
        return int(loadavg.split()[3].split("/")[0]) < cpus
    except (IndexError, ValueError):
        return False


class Worker:
    """A forked child computing one value; ``result`` reads it once and reaps the child."""

    def __init__(self, pid: int, fd: int):
        self.pid, self.fd = pid, fd
        self.started = time.monotonic()
        self.status: int | None = None  # the child's exit status once reaped

    def result(self, timeout: float) -> Any | None:
        """The child's value, or None where it did not answer whole within ``timeout`` seconds (it is killed)."""
        if self.status is not None:
            return None
        deadline = time.monotonic() + timeout
        chunks: list[bytes] = []
        done = False
        try:
            while not done and time.monotonic() < deadline:
                if select.select([self.fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    chunk = os.read(self.fd, 1 << 20)
                    done = not chunk
                    chunks.append(chunk)
        finally:
            self._reap(kill=not done)  # killed where it did not finish in time (or this process is interrupted)
        value = _answer(b"".join(chunks)) if done and self.status == 0 else None
        COUNTS["answered" if value is not None else "failed"] += 1
        return value

    def cancel(self) -> None:
        """Kill the child if it still runs and reap it (a no-op once reaped)."""
        if self.status is None:
            self._reap(kill=True)

    def _reap(self, kill: bool) -> None:
        if self.status is not None:
            return
        try:
            os.close(self.fd)
        except OSError:
            pass
        if kill:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.status = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def _answer(data: bytes) -> Any | None:
    """The value a worker wrote (a JSON header with its body's sha256, a line feed, the JSON body), or None."""
    head, _, body = data.partition(b"\n")
    try:
        if jsonsafe.loads(head) != {"sha256": hashlib.sha256(body).hexdigest()}:
            return None
        return jsonsafe.loads(body)
    except ValueError:
        return None


def start(compute: Callable[[], Any]) -> Worker | None:
    """``compute()`` (a JSON value) in a forked child when ``allowed()``, else None (the caller computes it)."""
    if not allowed():
        return None
    parent = os.getpid()
    try:
        r, w = os.pipe()
    except OSError:  # out of file descriptors: computed here
        return None
    try:
        pid = os.fork()
    except OSError:  # out of processes or memory: computed here
        os.close(r)
        os.close(w)
        return None
    if pid == 0:  # the child: it never returns into the caller's code
        status = 1
        try:
            os.close(r)
            _detach(parent)
            body = json.dumps(compute()).encode()
            head = json.dumps({"sha256": hashlib.sha256(body).hexdigest()}).encode()
            plant = os.environ.get(TEST_ENV)
            if plant == "exit":
                os._exit(3)
            if plant == "truncate":  # half the body under the whole one's sha256
                body = body[: len(body) // 2]
            with os.fdopen(w, "wb") as f:
                f.write(head + b"\n" + body)
            status = 0
        except BaseException:  # noqa: BLE001 - whatever happened, the parent computes it itself
            status = 1
        finally:
            os._exit(status)
    os.close(w)
    COUNTS["started"] += 1
    return Worker(pid, r)


def _detach(parent: int) -> None:
    """The child's own conditions (the module's docstring): nothing of the parent's console, signals or threads."""
    import torch

    from pilotrun.console import progress
    from pilotrun.signals import SIGNALS

    for s in SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    _die_with(parent)
    devnull = open(os.devnull, "w")  # noqa: SIM115 - the child's for its whole life
    sys.stdout = sys.stderr = devnull
    progress.detach()
    torch.set_num_threads(1)


def _die_with(parent: int) -> None:
    """SIGKILL this child when the parent dies (Linux's PR_SET_PDEATHSIG), so no worker outlives it."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the call: nobody reads this child
        os._exit(1)
