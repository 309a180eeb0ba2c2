"""Leases: how the journal knows a run (or a sweep's claims) is still alive, whatever host or PID it names.

A running run renews its ``heartbeat_at`` from a thread of its process (``Lease``); the journal reaps a run
whose lease lapsed (``Journal.reap_interrupted``); a process that wakes to find its run reaped is fenced
(``check_fence``) before it writes into it again. A lease holds the ``store.Journal`` it renews in (not
imported here: the store imports this module).
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from datetime import datetime

from pilotrun import signals
from pilotrun import jsonsafe
from pilotrun.signals import Reaped

LEASE_ENV = "PILOTRUN_LEASE_S"
LEASE_S = 120.0
"""A running run renews its lease (``heartbeat_at``) every ``lease_s() / 8`` seconds; a run whose last renewal
is older than ``lease_s()`` is interrupted, whatever host or PID it claims. Eight renewals per bound: one
renewal may wait SQLite's 30 s busy timeout behind a writer and a loaded machine may stall a thread for
seconds, and a run reaped by mistake cannot be revived; two minutes is short beside any requeue, so a
preempted run blocks ``sweep --continue`` briefly. ``$PILOTRUN_LEASE_S`` overrides it (tests use ~1 s).
Hosts that share a home must keep their clocks within the bound of each other (NTP does)."""

CLOCK_ENV = "PILOTRUN_TEST_CLOCK_SHIFT_S"  # test switch only: seconds added to this process's wall clock


def lease_s() -> float:
    try:
        return max(0.05, float(os.environ.get(LEASE_ENV) or LEASE_S))
    except ValueError:
        return LEASE_S


def wall_time() -> float:
    """The one wall clock of the journal (shown, and used for leases; never for order). Test switch:
    ``$PILOTRUN_TEST_CLOCK_SHIFT_S`` moves it, as a clock stepped by NTP would. Never set it outside tests."""
    return time.time() + float(os.environ.get(CLOCK_ENV) or 0.0)


OWNER = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
"""This process, as the owner of sweep cells it claimed (``Journal.claim_cells``)."""


class Lease(threading.Thread):
    """Renews one running run's ``heartbeat_at`` (or, keyed ``claims:SWEEP``, this process's claims on a sweep's
    cells) while this process lives; stops when nothing is left to renew (the run finished here or was reaped
    elsewhere, the claims released). A failed renewal (a busy or full disk) is retried at the next beat.

    Fencing: a run reaped while this process was stopped (SIGSTOP, a frozen VM) is no longer its own. The
    thread that finds the row gone at its next renewal raises ``signals.Reaped`` in the main thread
    (``signals.fence``), and :func:`check_fence`, at every journal write into the run and before every
    checkpoint, raises it too: when the last renewal is older than two beats it renews first, in the calling
    thread, so no write lands between the process's waking and the lease's thread's next beat."""

    held: dict[str, "Lease"] = {}  # run_id (or claims:SWEEP_ID) → the lease this process renews
    reaped: dict[str, str] = {}  # run_id → why the journal interrupted it under this process (fenced)
    RUN = "UPDATE runs SET heartbeat_at=? WHERE run_id=? AND status='running'"
    CLAIMS = "UPDATE claims SET heartbeat_at=? WHERE sweep_id=? AND owner=?"

    def __init__(self, journal, key: str, sql: str, args: tuple):
        super().__init__(name=f"pilotrun-lease-{key}", daemon=True)
        self.journal, self.run_id, self.stopped = journal, key, threading.Event()
        self.sql, self.args = sql, args
        self.renewed = time.monotonic()  # the last renewal that found the row still this process's
        self.lock = threading.Lock()

    @classmethod
    def take(cls, journal, run_id: str, sql: str = RUN, args: tuple | None = None) -> None:
        if run_id in cls.held and cls.held[run_id].is_alive():
            return
        lease = cls.held[run_id] = cls(journal, run_id, sql, args or (run_id,))
        lease.start()

    @classmethod
    def release(cls, run_id: str) -> None:
        lease = cls.held.pop(run_id, None)
        if lease is not None:
            lease.stopped.set()

    def renew(self) -> bool:
        """One renewal; False when the row is no longer this process's (reaped, or finished here)."""
        with self.lock:
            with self.journal.transaction() as db:
                alive = db.execute(self.sql, (wall_time(), *self.args)).rowcount
            if alive:
                self.renewed = time.monotonic()
            return bool(alive)

    def run(self) -> None:
        while not self.stopped.wait(lease_s() / 8):
            try:
                alive = self.renew()
            except Exception:  # noqa: BLE001 - a renewal that fails is retried; the bound allows several
                continue
            if not alive:
                if self.sql == self.RUN and not self.stopped.is_set():  # not finished here: reaped elsewhere
                    signals.fence(self.lose())
                else:
                    self.held.pop(self.run_id, None)
                return

    def lose(self) -> str:
        """The run was reaped elsewhere: record why (in ``reaped`` before it leaves ``held``, so a write in
        between sees one of them), let go of it, and return why."""
        reason = self.fenced()
        self.held.pop(self.run_id, None)
        self.stopped.set()
        return reason

    def fenced(self) -> str:
        """Why the journal took the run from this process (recorded once, from its row)."""
        if self.run_id not in self.reaped:
            with self.journal.connect() as db:
                row = db.execute("SELECT status, summary_json FROM runs WHERE run_id=?", (self.run_id,)).fetchone()
            status, summary = (row[0], jsonsafe.loads(row[1] or "{}")) if row else ("gone", {})
            why = summary.get("reason") or f"its status is {status!r}"
            self.reaped[self.run_id] = (
                f"the journal reaped run {self.run_id} while this process was stopped (SIGSTOP, Ctrl-Z or a "
                f"frozen machine) for longer than its lease: {why}; the run is '{status}' and this process "
                f"stops without writing more into it (resume from its last checkpoint, or rerun)")
        return self.reaped[self.run_id]


def check_fence(run_id: str | None = None) -> None:
    """Raise ``signals.Reaped`` when ``run_id`` (None: any run this process holds) was reaped by the journal
    while this process held it. Free while the lease is fresh; a lease not renewed for two beats (the process
    was stopped) is renewed here first."""
    ids = [run_id] if run_id is not None else [k for k in Lease.held if not k.startswith("claims:")]
    for key in ids:
        if key in Lease.reaped:
            raise Reaped(Lease.reaped[key])
        lease = Lease.held.get(key)
        if lease is None or lease.sql != Lease.RUN or time.monotonic() - lease.renewed <= lease_s() / 4:
            continue
        if not lease.renew():  # still held, so not finished here: reaped
            raise Reaped(lease.lose())


def last_heartbeat(run: dict) -> float:
    """When the run last renewed its lease (its start for a journal written before leases)."""
    if run.get("heartbeat_at") is not None:
        return float(run["heartbeat_at"])
    try:
        return datetime.fromisoformat(run["started_at"]).timestamp()
    except (TypeError, ValueError):
        return 0.0


def fence_inside(db, run_id: str) -> None:
    """The fence at the write itself, as its transaction's first statement: ``BEGIN IMMEDIATE`` holds the
    journal's write lock, so no reaper interleaves. A run this process holds whose row is no longer 'running'
    was reaped after :func:`check_fence` passed (the process was stopped between the check and the write):
    raise ``signals.Reaped``, and the transaction rolls back with nothing written."""
    if run_id in Lease.reaped:
        raise Reaped(Lease.reaped[run_id])
    lease = Lease.held.get(run_id)
    if lease is None or lease.sql != Lease.RUN:
        return
    row = db.execute("SELECT status FROM runs WHERE run_id=?", (run_id,)).fetchone()
    if row is not None and row[0] == "running":
        return
    raise Reaped(lease.lose())
