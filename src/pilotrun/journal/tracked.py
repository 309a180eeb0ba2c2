"""Where the journal's runs went in a tracker: per tracker, target and subject (a run id, a sweep id, or
``campaign:NAME``), the tracker's own id for it, and how far it was sent.

The journal keeps this so that exporting twice creates nothing twice and a run logged live is the run a
later export completes. ``state`` is ``live`` (being logged as it trains), ``partial`` (sent, but the run was
not finished or the tracker stopped answering) or ``complete``; ``digest`` says what was complete (the run's
final status and what can still be added to it, its notes), so a note added later is sent again.
"""

from __future__ import annotations

from pilotrun.journal.store import Journal, now

STATES = ("live", "partial", "complete")


def tracked(journal: Journal, tracker: str, target: str, subject: str) -> dict | None:
    """The row for ``subject`` in ``tracker`` at ``target``, or None when it was never sent there."""
    with journal.connect() as db:
        row = db.execute("SELECT * FROM tracked WHERE tracker=? AND target=? AND subject=?",
                         (tracker, target, subject)).fetchone()
    return dict(row) if row else None


def record_tracked(journal: Journal, tracker: str, target: str, subject: str, tracker_run_id: str, *,
                   experiment: str | None, state: str, digest: str | None = None) -> None:
    """Insert or update the row; the subject's tracker id is the one last recorded (a run made again in the
    tracker, the first one deleted there, replaces it)."""
    assert state in STATES, state
    with journal.transaction() as db:
        db.execute("INSERT INTO tracked (tracker, target, subject, tracker_run_id, experiment, state, digest, "
                   "updated_at) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT (tracker, target, subject) DO UPDATE SET "
                   "state=excluded.state, digest=excluded.digest, experiment=excluded.experiment, "
                   "updated_at=excluded.updated_at, tracker_run_id=excluded.tracker_run_id",
                   (tracker, target, subject, tracker_run_id, experiment, state, digest, now()))


def tracked_rows(journal: Journal, tracker: str | None = None) -> list[dict]:
    return journal.rows("tracked", "tracker", tracker, order="rowid")
