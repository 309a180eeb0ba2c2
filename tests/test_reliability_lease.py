"""A run's liveness is a lease, its order the journal's sequence: a real process stopped with SIGSTOP loses its
run once the lease lapses; a row claiming another host or PID 1 (always alive in a container) is reaped by its
lease, never by a PID; a fresh lease keeps a run alive and `sweep --continue` names its host, PID and last
heartbeat. A clock moved back by the journal's test switch reorders nothing."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pilotrun.errors import BadInput
from pilotrun.journal.store import SCHEMA_VERSION, Journal, Lease, wall_time

HOLDER = """
import sys, time
from pilotrun.journal.store import Journal
j = Journal(sys.argv[1])
run_id = j.create_run(kind="train", name="held", config={}, config_sha256="x", campaign_path=None, seed=0,
                      git_rev=None, packages={}, data={}, trust_remote_code=False, sweep_id=sys.argv[2] or None,
                      arm="control")
print(run_id, flush=True)
time.sleep(600)
"""


def _holder(home: Path, lease_s: float, sweep_id: str = ""):
    """A real process that creates a running run and holds it (its lease renewed by its own thread)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(home), sweep_id], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PILOTRUN_LEASE_S=str(lease_s)))
    run_id = proc.stdout.readline().strip()
    assert run_id, "the holder did not create its run"
    return proc, run_id


def _beat(home: Path, run_id: str) -> float:
    db = sqlite3.connect(home / "journal.sqlite")
    try:
        return db.execute("SELECT heartbeat_at FROM runs WHERE run_id=?", (run_id,)).fetchone()[0]
    finally:
        db.close()


def test_a_stopped_process_loses_its_run_when_the_lease_lapses(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("PILOTRUN_LEASE_S", "1.5")
    proc, run_id = _holder(home, 1.5)
    try:
        first = _beat(home, run_id)
        deadline = time.monotonic() + 20
        while _beat(home, run_id) == first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _beat(home, run_id) > first  # the live process renews its lease
        assert Journal(home).get_run(run_id)["status"] == "running"  # alive: not reaped (same host, pid alive)
        proc.send_signal(signal.SIGSTOP)  # the process exists (its PID is alive) but renews nothing
        time.sleep(2.5)
        run = Journal(home).get_run(run_id)
        assert run["status"] == "interrupted"
        reason = run["summary"]["reason"]
        assert reason.startswith("its lease lapsed: no heartbeat since ")
        assert f"pid {proc.pid} on host " in reason and "the bound is 1.5s, PILOTRUN_LEASE_S" in reason
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def _planted(home: Path, *, host: str, pid: int, age_s: float, sweep_id: str | None = None) -> str:
    """A running row as another process (host, pid) left it, its last heartbeat ``age_s`` ago; this process
    does not renew it."""
    j = Journal(home)
    run_id = j.create_run(kind="sweep", name="c", config={}, config_sha256="x", campaign_path=None, seed=0,
                          git_rev=None, packages={}, data={}, trust_remote_code=False, sweep_id=sweep_id, arm="control")
    Lease.release(run_id)
    with j.transaction() as db:
        db.execute("UPDATE runs SET host=?, pid=?, heartbeat_at=? WHERE run_id=?",
                   (host, pid, wall_time() - age_s, run_id))
    return run_id


@pytest.mark.parametrize("host, pid", [("node-gone-17", 4242), ("this", 1)])
def test_a_run_claiming_another_host_or_pid_1_is_reaped_by_its_lease(tmp_path, monkeypatch, host, pid):
    import socket

    monkeypatch.setenv("PILOTRUN_LEASE_S", "60")
    home = tmp_path / "home"
    host = socket.gethostname() if host == "this" else host  # PID 1 on this host: always alive
    stale = _planted(home, host=host, pid=pid, age_s=61)
    fresh = _planted(home, host=host, pid=pid, age_s=5)
    j = Journal(home)
    assert j.get_run(stale)["status"] == "interrupted"
    assert f"pid {pid} on host {host}" in j.get_run(stale)["summary"]["reason"]
    assert j.get_run(fresh)["status"] == "running"  # a lease renewed 5 s ago: alive wherever it is


def test_continue_names_the_live_runs_host_pid_and_heartbeat(tmp_path, monkeypatch):
    from pilotrun.rehearsal.training.sweep import _todo

    monkeypatch.setenv("PILOTRUN_LEASE_S", "60")
    home = tmp_path / "home"
    j = Journal(home)
    sweep_id = j.create_sweep({"p": 1}, "sha", None)
    _planted(home, host="node-a", pid=31337, age_s=7, sweep_id=sweep_id)

    class Arm:
        name = "control"

    with pytest.raises(BadInput) as e:
        _todo(Journal(home), sweep_id, [Arm()], [0])
    msg = str(e.value)
    assert "is still running: pid 31337 on host node-a, last heartbeat " in msg and "(7s ago)" in msg
    assert "reaped when its lease lapses, 60s after its last heartbeat" in msg


def test_order_is_the_journal_sequence_not_the_clock(tmp_path, monkeypatch):
    """The clock is stepped back an hour between two runs of one sweep cell (the journal's test switch): the
    second still comes after the first, and the cell's latest run is the one that supersedes."""
    from pilotrun.rehearsal.training.sweep import _latest_runs

    home = tmp_path / "home"
    j = Journal(home)
    sweep_id = j.create_sweep({"p": 1}, "sha", None)
    first = _planted(home, host="h", pid=1, age_s=0, sweep_id=sweep_id)
    j.finish_run(first, "interrupted")
    monkeypatch.setenv("PILOTRUN_TEST_CLOCK_SHIFT_S", "-3600")
    later_sweep = j.create_sweep({"p": 1}, "sha", None)
    second = j.create_run(kind="sweep", name="c", config={}, config_sha256="x", campaign_path=None, seed=0, git_rev=None,
                          packages={}, data={}, trust_remote_code=False, sweep_id=sweep_id, arm="control",
                          supersedes=first)
    j.finish_run(second, "completed")
    runs = j.list_runs()
    assert runs[0]["created_at"] > runs[1]["created_at"]  # the clocks disagree with the order...
    assert [r["run_id"] for r in runs] == [first, second]  # ...the sequence does not
    assert _latest_runs(j, sweep_id)[("control", 0)]["run_id"] == second
    assert j.find_sweep("sha")["sweep_id"] == later_sweep


def test_a_version_1_journal_gets_a_sequence_and_leases(tmp_path):
    """A journal written before leases: its rows take their insertion order; a running run without a heartbeat is
    judged by its start."""
    from pilotrun.journal import store

    home = tmp_path / "home"
    home.mkdir()
    old = store.SCHEMA.replace(",\n    seq INTEGER,\n    heartbeat_at REAL\n);", "\n);").replace(
        ",\n    seq INTEGER\n);", "\n);")
    old = "\n".join(line for line in old.splitlines() if "runs_by_seq" not in line and "runs_seq_immutable" not in line
                    and "sequence number is immutable" not in line)
    db = sqlite3.connect(home / "journal.sqlite")
    db.executescript(old + "\nPRAGMA user_version=1;")
    for i, (rid, started) in enumerate([("b-late", "2020-01-01T00:00:00.000+00:00"),
                                        ("a-early", "2019-01-01T00:00:00.000+00:00")]):
        db.execute("INSERT INTO runs (run_id, kind, name, created_at, config_json, config_sha256, status, started_at,"
                   " host, pid) VALUES (?,?,?,?,?,?,?,?,?,?)",
                   (rid, "train", "n", started, "{}", "x", "running", started, "elsewhere", 1))
    db.commit()
    db.close()
    j = Journal(home)
    assert SCHEMA_VERSION >= 3  # later versions migrate through v3's sequence and leases too
    runs = j.list_runs()
    assert [r["run_id"] for r in runs] == ["b-late", "a-early"] and [r["seq"] for r in runs] == [1, 2]
    assert all(r["status"] == "interrupted" and "lease lapsed: no heartbeat since 20" in r["summary"]["reason"]
               for r in runs)
    assert (home / "journal.sqlite.bak-v1").exists()
