"""Progress of a long stage on stderr: a live line on a terminal, a plain line at least every 30 s in a log.

    with stage_progress("pilot") as prog:      # the CLI wraps overfit, pilot, resume, fit, train, sweep
        ...
        note("phase steady_step")               # what it is doing now (from anywhere in the process)

On a terminal a rich status line shows the verb, what it is doing and the elapsed time. When stderr is
not a terminal (a log file, CI, a pipe) a plain line ``pilotrun pilot: phase steady_step (1.5 min)``
is written when the stage starts and then every ``PILOTRUN_HEARTBEAT_S`` seconds (default 30), so a
log shows the process is alive and where.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager

_CURRENT: dict = {}  # the running stage: {"label", "doing", "t0", "status"}
DEFAULT_HEARTBEAT_S = 30.0


def note(doing: str) -> None:
    """Say what the running stage is doing now (a no-op when no stage is shown)."""
    cur = _CURRENT.get("stage")
    if cur is None:
        return
    cur["doing"] = doing
    status = cur.get("status")
    if status is not None:
        status.update(_text(cur))


def _elapsed(seconds: float) -> str:
    from pilotrun.sheet.plan import fmt_duration

    return fmt_duration(seconds)


def _text(cur: dict) -> str:
    doing = f": {cur['doing']}" if cur.get("doing") else ""
    return f"pilotrun {cur['label']}{doing} ({_elapsed(time.monotonic() - cur['t0'])})"


def heartbeat_s() -> float:
    try:
        return max(float(os.environ.get("PILOTRUN_HEARTBEAT_S", DEFAULT_HEARTBEAT_S)), 0.05)
    except ValueError:
        return DEFAULT_HEARTBEAT_S


@contextmanager
def stage_progress(label: str, *, stream=None, spinner: bool = True):
    """Show the stage ``label`` as running until the block ends (see the module docstring).
    ``spinner=False``: the stage draws its own bar on a terminal (train, sweep); only the log lines."""
    stream = stream or sys.stderr
    cur = {"label": label, "doing": "", "t0": time.monotonic(), "status": None}
    outer = _CURRENT.get("stage")
    _CURRENT["stage"] = cur
    stop = threading.Event()
    thread = None
    try:
        tty = bool(stream.isatty())
    except (AttributeError, ValueError):
        tty = False
    try:
        if tty and not spinner:
            pass
        elif tty:
            from rich.console import Console

            cur["status"] = Console(file=stream).status(_text(cur))
            cur["status"].start()
        else:
            _line(stream, f"pilotrun {label}: started")

            def beat():
                while not stop.wait(heartbeat_s()):
                    _line(stream, _text(cur))

            thread = threading.Thread(target=beat, name="pilotrun-heartbeat", daemon=True)
            thread.start()
        yield cur
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=1.0)
        if cur["status"] is not None:
            cur["status"].stop()
        _CURRENT["stage"] = outer


def _line(stream, text: str) -> None:
    try:
        stream.write(text + "\n")
        stream.flush()
    except (OSError, ValueError):  # the log went away: progress is not worth failing the stage for
        pass
