"""How a pilotrun process ends on a signal: SIGINT, SIGTERM and SIGHUP are an interruption, never a failure.

``install`` (the console script, in its main thread) turns each of them into :class:`Preempted`, a
``KeyboardInterrupt``: every run in progress then ends 'interrupted' through ``journal.runs`` naming the
signal, and the process exits 128 + the signal's number (130, 143, 129). The exception is raised where the
main thread is, so the run stops within the current update; whatever was being written at that moment
is a temporary beside its target (``journal/files.py``), so the last checkpoint stays complete.

A scheduler that gives a grace period before it kills (SLURM ``--signal=TERM@S``, Kubernetes'
``terminationGracePeriodSeconds``) can let the run write one more checkpoint: with
``$PILOTRUN_TERM_GRACE_S`` > 0 a SIGTERM is only noted; the loop ends after the update in progress, saves a
checkpoint there (``pending``) and raises; if the grace runs out first, it raises wherever it is. SIGINT and
SIGHUP never wait. A second signal while the first is being handled ends the process at once.

A run the journal reaped while this process could not renew its lease (stopped by SIGSTOP or Ctrl-Z, a frozen
VM: ``journal.leases.Lease``) is fenced: :class:`Reaped`, raised at the next journal write or checkpoint of the
run, or in the main thread as soon as the lease's thread finds the row gone (``fence``). The process then
writes nothing more into the run and exits 143, as a preempted run does.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from pilotrun.errors import BadInput

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_ENV = "PILOTRUN_TERM_GRACE_S"

_pending: int | None = None  # a SIGTERM noted under a grace, waiting for the loop's next update boundary
_ending = False  # a Preempted was raised: this process is unwinding
_installed = False  # install() ran: the main thread has our handlers
_fenced: str | None = None  # a Reaped waiting for the main thread (fence)
_received: int | None = None  # the first stop signal this process got (received)


class Preempted(KeyboardInterrupt):
    """The process was asked to stop by ``signum``: the run is interrupted, the exit code 128 + signum."""

    def __init__(self, signum: int, why: str | None = None):
        self.signum = int(signum)
        self.exit_code = 128 + self.signum
        self.name = signal.Signals(self.signum).name
        self.why = why
        super().__init__(self.reason)

    @property
    def reason(self) -> str:
        if self.why:
            return self.why
        what = {signal.SIGINT: "interrupted by the user (Ctrl-C, SIGINT)",
                signal.SIGHUP: "its terminal closed (SIGHUP)"}.get(self.signum)
        return what or f"stopped by {self.name} (preempted, or stopped by a scheduler or the user)"


class Reaped(KeyboardInterrupt):
    """The journal interrupted this process's run (its lease lapsed while the process was stopped, SIGSTOP or a
    frozen VM): the run is another's to judge now, this process stops without writing more into it. Exit 143,
    as a preempted run: to a scheduler both mean "requeue"."""

    exit_code = 128 + signal.SIGTERM
    name = "reaped"

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(reason)


def fence(reason: str) -> None:
    """From the lease's thread: raise :class:`Reaped` in the main thread now (where ``install`` ran; elsewhere
    the run's next journal write raises it)."""
    global _fenced
    if not _installed or _ending or threading.current_thread() is threading.main_thread():
        return
    import _thread

    _fenced = reason
    _thread.interrupt_main(signal.SIGINT)  # runs _handler in the main thread, which raises _fenced


def grace_s() -> float:
    """``$PILOTRUN_TERM_GRACE_S``: seconds a SIGTERM may wait for the update in progress and one checkpoint."""
    raw = os.environ.get(GRACE_ENV, "").strip()
    if not raw:
        return 0.0
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise BadInput(f"{GRACE_ENV}={raw!r} is not a number of seconds", where=f"${GRACE_ENV}",
                       fix=f"set {GRACE_ENV} to seconds (e.g. 60), or unset it to stop at once") from None


def install() -> None:
    """Route SIGINT, SIGTERM and SIGHUP to :class:`Preempted` (the main thread of the console script only)."""
    global _pending, _ending, _installed, _fenced, _received
    if threading.current_thread() is not threading.main_thread():
        return
    _pending, _ending, _fenced, _received = None, False, None, None
    grace_s()  # a malformed grace is bad input before anything starts
    for s in SIGNALS:
        signal.signal(s, _handler)
    signal.signal(signal.SIGALRM, _grace_over)
    _installed = True


def reclaim() -> None:
    """Put back the handlers ``install`` set, where a library replaced them (``ray.init`` makes a driver's SIGTERM
    a ``sys.exit``): a stop signal stays an interruption, 128 + N."""
    if _installed and threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, _handler)
        signal.signal(signal.SIGALRM, _grace_over)


def _handler(signum, frame) -> None:
    global _pending, _ending, _fenced, _received
    if _fenced is not None:  # not a signal: the lease's thread found the run reaped (fence)
        reason, _fenced = _fenced, None
        if not _ending:
            _ending = True
            raise Reaped(reason)
        return
    _received = _received or signum
    if _ending:  # a second signal while unwinding: stop now, as the signal's default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    grace = grace_s() if signum == signal.SIGTERM and _pending is None else 0.0
    if grace > 0:
        _pending = signum
        signal.setitimer(signal.ITIMER_REAL, grace)
        print(f"pilotrun: {signal.Signals(signum).name}: ending after the update in progress and one checkpoint "
              f"(grace {grace:g}s, {GRACE_ENV})", file=sys.stderr, flush=True)
        return
    raise_now(signum)


def _grace_over(signum, frame) -> None:
    if _pending is not None and not _ending:
        raise_now(_pending)


def pending() -> int | None:
    """The signal noted under a grace, if any: the loop checkpoints at its next update boundary, then calls
    :func:`raise_now`."""
    return _pending


def received() -> int | None:
    """The first SIGINT/SIGTERM/SIGHUP this process got, if any: an error that follows it (a rank's collective
    broken by a peer that the same stop ended first) is part of the interruption, not a failure."""
    return _received


PEER_LOST = ("connection closed by peer", "connection reset by peer", "broken pipe")


def lost_peer(exc: BaseException) -> bool:
    """``exc`` is a collective broken because a peer rank ended (preempted, killed): only in a process that is one
    rank of several (torch.distributed initialised), for the errors gloo gives when a peer's socket closes."""
    dist = sys.modules.get("torch.distributed")
    if not isinstance(exc, RuntimeError) or dist is None or not (dist.is_available() and dist.is_initialized()):
        return False
    text = str(exc).lower()
    return dist.get_world_size() > 1 and any(s in text for s in PEER_LOST)


def interruption(exc: BaseException) -> KeyboardInterrupt | None:
    """``exc`` as the interruption it is part of, or None (a failure): itself when it is one (a bare
    KeyboardInterrupt raised by a library, Ray's ``wait``, in place of ours: the signal received); a :class:`Preempted`
    naming the signal when it came after one (``received``: a stop breaks a peer's collective too); a
    ``Preempted`` as by SIGTERM, the scheduler's stop, when a peer rank was lost in a collective (``lost_peer``)."""
    if isinstance(exc, KeyboardInterrupt):  # a bare one after our signal: a library re-raised it without ours
        return exc if isinstance(exc, (Preempted, Reaped)) or _received is None else Preempted(_received)
    said = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    if _received is not None:
        return Preempted(_received, f"{Preempted(_received).reason}; then, while it stopped, {said}")
    if lost_peer(exc):
        return Preempted(signal.SIGTERM, "a peer rank of the run ended while this rank waited for it in a collective "
                                         f"(preempted or killed): {said}")
    return None


def unless_stopping(exc: BaseException) -> None:
    """For an ``except Exception`` that turns an error into a verdict, a fallback or a named gap: raise the
    interruption instead when ``exc`` is part of one (``interruption``: after a signal, a peer rank lost), so a
    stop never becomes a finding ("does not fit", "could not be estimated")."""
    stopped = interruption(exc)
    if stopped is not None:
        raise stopped from exc


def raise_now(signum: int):
    global _ending
    _ending = True
    signal.setitimer(signal.ITIMER_REAL, 0)
    raise Preempted(signum)


def exit_code_of(exc: BaseException) -> int:
    """The exit status of a process ended by ``exc`` (a KeyboardInterrupt without a signal: Ctrl-C, 130)."""
    return getattr(exc, "exit_code", 128 + signal.SIGINT)


def signal_of_exit(code: int | None) -> int | None:
    """The signal that ended a child whose exit status is ``code``: killed by it (-N) or ended by our handler
    (128 + N); None for any other status."""
    if code is None:
        return None
    n = -code if code < 0 else code - 128 if code > 128 else None
    return n if n in [int(s) for s in SIGNALS] else None
