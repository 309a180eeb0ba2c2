"""Live logging: ``train``, ``sweep`` and ``all`` send their runs to the tracker as they record them.

A :class:`LiveTracker` observes the run lifecycle (``journal/observers.py``): ``RunRecorder`` tells it a run
started, logged rows or finished, and it only takes note. A thread of its own does the sending, by the same
:class:`~pilotrun.integrations.trackers.export.Exporter` as ``export`` (so what it sent is in the journal and a
later export completes the same tracker runs, never duplicates them): each run at most every ``every_s`` while
it trains, and once more when it ends. A tracker that fails is tried again after each of ``retries`` seconds;
after that it is left alone for the rest of the command, and the command says so, with the ``export`` that sends
the rest. Training never waits for it; at the verb's end :meth:`close` gives it ``drain_s`` to finish.
"""

from __future__ import annotations

import queue
import threading
import time
from pathlib import Path
from typing import Callable

from pilotrun.errors import BadInput, raised_by_pilotrun

RETRIES = (1.0, 2.0, 4.0)  # seconds before each further try of a failed send
EVERY_S = 5.0  # the most often a training run's new points are sent
DRAIN_S = 60.0  # what the verb's end gives the tracker to take the rest
DRAIN_STOPPED_S = 10.0  # ... when the verb ends on an error or an interruption


class LiveTracker:
    """``final``: what to send when the verb ends (the sweep's parent, the campaign's run), given the
    Exporter; ``make``: builds the tracker (its package is imported on the worker thread)."""

    def __init__(self, make: Callable[[], object], journal_home: Path, *, export_hint: str,
                 final: Callable[[object], None] | None = None, retries=RETRIES, every_s: float = EVERY_S):
        self.make, self.home, self.hint, self.final = make, Path(journal_home), export_hint, final
        self.retries, self.every_s = tuple(retries), every_s
        self.events: queue.Queue = queue.Queue()
        self.failure: str | None = None
        self.trouble = False
        self.tracker = None
        self.sent: set[str] = set()  # runs the tracker holds whole
        self._thread = threading.Thread(target=self._work, name="pilotrun-live-tracker", daemon=True)
        self._thread.start()

    # --- the observer: called on the training thread, returns at once ---------------------------------
    def tell(self, event: str, journal, run_id: str) -> None:
        if self.failure is None:
            self.events.put((event, journal, run_id))

    # --- the worker --------------------------------------------------------------------------------------
    def _work(self) -> None:
        from pilotrun.integrations.trackers.export import Exporter

        ex, journal = None, None
        pending: dict[str, float] = {}  # run id -> when it may be sent next
        open_runs: set[str] = set()
        stopping = False
        while True:
            timeout = max(0.0, min(pending.values()) - time.monotonic()) if pending else None
            try:
                item = self.events.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is not None and item[0] == "stop":
                stopping = True
            elif item is not None:
                event, journal, run_id = item
                if event == "finished":
                    pending[run_id] = 0.0  # at once
                    open_runs.discard(run_id)
                else:
                    open_runs.add(run_id)
                    pending.setdefault(run_id, 0.0 if event == "started" else time.monotonic() + self.every_s)
            due = [r for r, t in pending.items() if stopping or t <= time.monotonic()]
            for run_id in due:
                del pending[run_id]
                if self.failure is None and journal is not None:
                    ex = ex or self._exporter(Exporter, journal)
                    if ex is not None and self._try(lambda: ex.run(run_id, live=True)):
                        if run_id not in open_runs:
                            self.sent.add(run_id)
            if stopping:
                break
        if self.failure is None and self.final is not None and journal is not None:
            ex = ex or self._exporter(Exporter, journal)
            if ex is not None:
                self._try(lambda: self.final(ex))
        if self.tracker is not None:
            try:
                self.tracker.close()
            except Exception:  # noqa: BLE001 - closing is best effort; the journal is the record
                pass

    def _exporter(self, exporter_class, journal):
        try:
            self.tracker = self.make()
        except Exception as e:  # noqa: BLE001 - a tracker that cannot even be set up is reported, never raised
            self._give_up(e, bug=not isinstance(e, BadInput) and raised_by_pilotrun(e))
            return None
        return exporter_class(journal, self.tracker)

    def _try(self, send: Callable[[], object]) -> bool:
        for wait in (0.0, *self.retries):
            time.sleep(wait)
            try:
                send()
                return True
            except BadInput as e:  # refused for a reason a retry cannot change (a deleted experiment ...)
                self._give_up(e)
                return False
            except Exception as e:  # noqa: BLE001 - down or refusing: tried again, then reported
                if raised_by_pilotrun(e):  # pilotrun's own bug: no retry can change it, and it is said as one
                    self._give_up(e, bug=True)
                    return False
                last = e
        self._give_up(last, tries=1 + len(self.retries))
        return False

    def _give_up(self, e: BaseException, tries: int = 1, bug: bool = False) -> None:
        what = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        said = what if isinstance(e, BadInput) else f"{type(e).__name__}: {what}"  # a refusal says itself
        self.failure = said + (f" (tried {tries} times)" if tries > 1 else "")
        if bug:  # training goes on all the same: the journal has the runs
            self.failure = f"an error in pilotrun itself, not the tracker's ({self.failure}); please report it"

    # --- the verb's end ------------------------------------------------------------------------------------
    def close(self, drain_s: float = DRAIN_S, say: Callable[[str], None] | None = None) -> list[str]:
        """Stop, giving the tracker ``drain_s`` to take what is left (``say`` hears, after 2 s, that it is
        waiting); the lines the verb says about it. ``trouble`` is then whether they are warnings."""
        self.events.put(("stop", None, None))
        self._thread.join(min(2.0, drain_s))
        if self._thread.is_alive() and say is not None:
            say(f"sending what is left to {self.tracker.describe() if self.tracker else 'the tracker'} "
                f"(at most {drain_s:.0f}s)")
        self._thread.join(max(0.0, drain_s - 2.0))
        where = getattr(self.tracker, "target", None) or "the tracker"
        self.trouble = self.failure is not None or self._thread.is_alive()
        if self.failure is not None:
            return [f"live logging to {where} stopped: {self.failure}; training went on and the journal has every "
                    f"run: send them with `{self.hint}`"]
        if self._thread.is_alive():
            return [f"live logging to {where} had not finished after {drain_s:.0f}s; the journal has every run: "
                    f"send the rest with `{self.hint}`"]
        if self.tracker is None:
            return []
        view = self.tracker.how_to_view()
        return [f"logged live to {self.tracker.describe()}: {len(self.sent)} run(s)" + (f"; {view}" if view else "")]
