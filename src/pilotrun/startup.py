"""How long this process took to get to where it is: Python's start, imports, the command's own checks.

A campaign's rented hours include every process's start, so the time plan has a term for it: the pilot
records its own start-up, and the sweep its own, and the two are compared like any other term.
``mark()`` is called once by the console script (``cli/main.py``), and ``seconds()`` is then the time from
the process's start (the kernel's record of it) to now. In a process pilotrun did not start (a notebook,
a test calling the library, a Ray worker) nothing is marked and ``seconds()`` is None: that start-up is
not pilotrun's to plan. A process that runs several stages before the first run (``all``) ``discount``s
each stage's seconds, so the pilot inside ``all`` records the start-up a pilot of its own would have, not
the seconds since ``all`` began.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass
class _Start:
    """This process's start-up: where ``mark()`` was called, and whether a run has taken it."""

    at: float | None = None  # perf_counter at mark
    boot: float = 0.0  # seconds from the process's start to the mark
    taken: bool = False
    discounted: float = 0.0  # seconds of earlier stages in this process (see discount)


_STATE = _Start()

# What pilotrun sets, unless the user did, before the libraries load a model (tasks/loading.py): never a hub, no
# advisory warnings. engine/fresh.py imports the libraries of its zygote under these too.
LIBRARY_ENV_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1"}


def mark() -> None:
    if _STATE.at is None:
        _STATE.at, _STATE.boot = time.perf_counter(), _since_process_start()


def seconds(at: float | None = None) -> float | None:
    """Seconds from the process's start to ``at`` (a ``time.perf_counter()`` reading; now by default)."""
    if _STATE.at is None:
        return None
    return max(0.0, _STATE.boot + ((time.perf_counter() if at is None else at) - _STATE.at) - _STATE.discounted)


def discount(stage_s: float) -> None:
    """A stage of this process that was not a run's start-up took ``stage_s``: a later run does not count it."""
    if not _STATE.taken:
        _STATE.discounted += max(0.0, stage_s)


def take(at: float | None = None) -> float | None:
    """``seconds(at)`` for the first run this process starts (its start-up is that run's to plan), None after."""
    if _STATE.taken:
        return None
    _STATE.taken = True
    return seconds(at)


def _since_process_start() -> float:
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # no psutil or no process table: the command's own time only
        return 0.0
