"""Who else hears of a run as the journal records it: the live trackers (``integrations/trackers/live.py``),
registered by a verb asked to log live (``train``, ``sweep``, ``all`` with ``--track`` or the campaign's
``track`` key).

``RunRecorder`` tells each observer that a run started, that rows reached the journal, and that it finished;
an observer only takes note (it reads the journal itself, on its own thread) and never fails, blocks or slows
the run: whatever it raises is dropped here. The journal stays the record.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Protocol

EVENTS = ("started", "logged", "finished")


class RunObserver(Protocol):
    def tell(self, event: str, journal, run_id: str) -> None:
        """``event`` (one of EVENTS) happened to ``run_id`` in ``journal``; must return at once."""


_observers: list[RunObserver] = []


@contextmanager
def observing(observer: RunObserver) -> Iterator[RunObserver]:
    """Tell ``observer`` of every run this process records while the block runs."""
    _observers.append(observer)
    try:
        yield observer
    finally:
        _observers.remove(observer)


def tell(event: str, journal, run_id: str) -> None:
    for o in list(_observers):
        try:
            o.tell(event, journal, run_id)
        except Exception:  # noqa: BLE001 - an observer never fails the run it watches
            pass
