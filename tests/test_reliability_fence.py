"""Fencing: a run the journal reaped while its process was stopped (SIGSTOP, a frozen machine) is no longer that
process's. Continued (SIGCONT), the process stops at once, exits 143 naming the reap and its lease, and writes
nothing more into the run: its row, checkpoints and metrics stay as the reaper left them. A live process whose
lease is renewed is never fenced, even with a lease of a second."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal.store import Journal

WRITER = """
import os, signal, sys, time
from pilotrun import signals
from pilotrun.journal.store import Journal, Lease
signals.install()
j = Journal(sys.argv[1])
run_id = j.create_run(kind="train", name="fenced", config={}, config_sha256="x", campaign_path=None, seed=0,
                      git_rev=None, packages={}, data={}, trust_remote_code=False)
print(run_id, flush=True)
try:
    for step in range(int(sys.argv[2])):  # one metric row per 'update', as a training loop logs them
        if step == 20 and sys.argv[3] == "stop":  # SIGSTOP between writes (a stop inside a transaction would
            with Lease.held[run_id].lock:         # hold the journal's write lock, the lease's thread's included)
                os.kill(os.getpid(), signal.SIGSTOP)
        j.add_metrics(run_id, [("train", "loss", step, 1.0, step, None)], progress=(step + 1, step + 1))
        time.sleep(0.02)
    j.finish_run(run_id, "completed")
    print("completed", flush=True)
except KeyboardInterrupt as e:
    print("interrupted:", getattr(e, "reason", e), flush=True)
    sys.exit(signals.exit_code_of(e))
"""


def _writer(home: Path, lease_s: float, steps: int, stop: bool = False):
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(home), str(steps), "stop" if stop else "run"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PILOTRUN_LEASE_S=str(lease_s)))
    run_id = proc.stdout.readline().strip()
    assert run_id.count("-") == 2, run_id
    return proc, run_id


def _snapshot(home: Path, run_id: str, run_dir: Path | None = None):
    db = sqlite3.connect(f"file:{home / 'journal.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT status, ended_at, summary_json, updates_done, heartbeat_at FROM runs WHERE run_id=?",
                         (run_id,)).fetchone()
        metrics = db.execute("SELECT COUNT(*), MAX(step) FROM metrics WHERE run_id=?", (run_id,)).fetchone()
    finally:
        db.close()
    files = None
    if run_dir is not None:
        files = ({p.name for p in (run_dir / "checkpoints").iterdir() if not p.name.startswith(".")},
                 (run_dir / "metrics.jsonl").read_bytes())
    return row, metrics, files


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"


def _stop_until_reaped(proc, home: Path, run_id: str, lease_s: float, reap, send: bool = True) -> None:
    if send:
        proc.send_signal(signal.SIGSTOP)  # alive (its PID exists) but renewing nothing
    deadline = time.monotonic() + 30
    while not _stopped(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(lease_s)
        reap()
        if _snapshot(home, run_id)[0][0] == "interrupted":
            return
    pytest.fail("the stopped run was never reaped")


def test_a_reaped_process_stops_at_its_next_write_and_writes_nothing_more(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("PILOTRUN_LEASE_S", "1")
    proc, run_id = _writer(home, 1.0, 100000, stop=True)  # it stops itself after 20 writes
    try:
        _stop_until_reaped(proc, home, run_id, 1.0, lambda: Journal(home), send=False)
        reaped = _snapshot(home, run_id)
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 143, out
    assert f"interrupted: the journal reaped run {run_id} while this process was stopped" in out
    assert "its lease lapsed: no heartbeat since" in out and "the bound is 1s, PILOTRUN_LEASE_S" in out
    assert "completed" not in out.splitlines()
    assert _snapshot(home, run_id) == reaped  # not one row, counter or heartbeat more after the reap
    assert reaped[0][0] == "interrupted"


def test_a_live_run_with_a_short_lease_is_never_fenced(tmp_path, monkeypatch):
    """The clean case: the lease of a running process keeps being renewed; a journal opened meanwhile reaps
    nothing and the run completes with every row written."""
    home = tmp_path / "home"
    monkeypatch.setenv("PILOTRUN_LEASE_S", "1")
    proc, run_id = _writer(home, 1.0, 100)  # ~2 s of writes: two bounds
    while proc.poll() is None:
        Journal(home)  # a reaper that finds the lease fresh
        time.sleep(0.2)
    out = proc.stdout.read()
    assert proc.returncode == 0 and "completed" in out, out
    row, metrics, _ = _snapshot(home, run_id)
    assert row[0] == "completed" and metrics == (100, 99)


@pytest.mark.slow
def test_a_train_reaped_while_stopped_ends_at_sigcont_with_its_checkpoints_unchanged(tmp_path):
    """A real `pilotrun train`, stopped with SIGSTOP past its lease and reaped by `pilotrun runs`: at SIGCONT it
    stops, exit 143, and its row, checkpoints and metrics are those of the reap."""
    from test_reliability_signals import _start, _wait_for

    lease = 3.0
    path = tiny_causal_campaign(tmp_path / "c", simple_records(32), simple_records(8, 100), train__updates=400,
                                train__eval_every=100, train__save_every=2)
    home = tmp_path / "home"
    env = {"PILOTRUN_LEASE_S": str(lease)}
    proc = _start("train", path, home, env=env)
    try:
        (run_id,), = _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 4",
                               "4 updates")
        run_dir = home / "runs" / run_id

        def runs() -> None:
            done = subprocess.run([sys.executable, "-m", "pilotrun", "runs", "--home", str(home)], text=True,
                                  capture_output=True, env=dict(os.environ, **env), timeout=120)
            assert done.returncode == 0, done.stderr

        _stop_until_reaped(proc, home, run_id, lease, runs)
        reaped = _snapshot(home, run_id, run_dir)
        assert reaped[2][0], "no checkpoint before the stop"
        proc.send_signal(signal.SIGCONT)
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143, out
    assert f"interrupted: the journal reaped run {run_id}" in out and "its lease lapsed" in out
    assert "internal error" not in out
    assert _snapshot(home, run_id, run_dir) == reaped
    assert not [p for p in (run_dir / "checkpoints").iterdir() if ".tmp-" in p.name]


def test_a_write_that_passed_the_check_before_the_reap_is_refused_inside_its_transaction(tmp_path, monkeypatch):
    """The stop lands between ``check_fence`` (the lease still fresh) and the write: the reap happens there.
    The write's own transaction sees the row no longer 'running', raises Reaped and writes nothing."""
    from pilotrun.journal.leases import Lease
    from pilotrun.signals import Reaped

    monkeypatch.setenv("PILOTRUN_LEASE_S", "60")  # the lease stays fresh: check_fence alone lets the write through
    home = tmp_path / "home"
    j = Journal(home)
    run_id = j.create_run(kind="train", name="fenced", config={}, config_sha256="x", campaign_path=None, seed=0,
                          git_rev=None, packages={}, data={}, trust_remote_code=False)
    try:
        j.add_metrics(run_id, [("train", "loss", 0, 1.0, 0, None)], progress=(1, 1))
        with sqlite3.connect(home / "journal.sqlite") as db:  # what the reaper of another process writes
            db.execute("UPDATE runs SET status='interrupted', summary_json='{\"reason\": \"its lease lapsed\"}' "
                       "WHERE run_id=?", (run_id,))
        before = _snapshot(home, run_id)
        for write in (lambda: j.add_metrics(run_id, [("train", "loss", 1, 0.5, 1, None)], progress=(2, 2)),
                      lambda: j.update_progress(run_id, updates_done=3, examples_seen=3),
                      lambda: j.add_predictions(run_id, "validation", [("e0", [1, 2])]),
                      lambda: j.add_phase_rows(run_id, [{"phase": "save", "rank": 0}])):
            with pytest.raises(Reaped, match="its lease lapsed"):
                write()
        assert _snapshot(home, run_id) == before
        assert run_id not in Lease.held
    finally:
        Lease.release(run_id)
        Lease.reaped.pop(run_id, None)


def test_a_signal_after_commit_inside_a_transaction_is_the_signal_not_an_internal_error(tmp_path):
    """SIGTERM or the fence raise between two bytecodes; landing after COMMIT returned, still inside the
    transaction's block, it must surface as itself (an interruption), not as a failed ROLLBACK (exit 3)."""
    j = Journal(tmp_path / "home")
    with pytest.raises(KeyboardInterrupt):
        with j.transaction() as db:
            db.execute("INSERT INTO notes (run_id, text, decision, created_at) VALUES (NULL, 'x', 0, 'now')")
            db.execute("COMMIT")  # where the signal's exception can land: the work is committed
            raise KeyboardInterrupt
