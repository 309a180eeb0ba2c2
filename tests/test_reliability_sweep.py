"""The journal through a killed sweep: `pilotrun sweep` in a real process is SIGKILLed at random moments,
again after each `--continue`; every time the database passes PRAGMA integrity_check, the killed run reads
`interrupted` once the journal is opened, no run is left `running`, every visible checkpoint of a killed run
is complete, and runs that had finished are never touched again. The last `--continue` finishes the sweep."""

from __future__ import annotations

import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml
from conftest import write_campaign

from pilotrun.engine.state import is_complete
from pilotrun.journal.store import Journal

FINISHED = ("completed", "diverged", "stopped", "failed", "interrupted")


def _campaign(demo_dir, seeds):
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e-3}, {"train.lr": 5e-3}], seeds=seeds)
    c["train"].update(updates=8, eval_every=4, save_every=4)
    return write_campaign(demo_dir, c)


def _read(home, sql, args=()):
    """A raw read, without Journal (which would reap): what a kill left on disk."""
    db = sqlite3.connect(f"file:{home / 'journal.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(sql, args).fetchall()
    finally:
        db.close()


def _integrity(home) -> str:
    return _read(home, "PRAGMA integrity_check")[0][0]


def _snapshot(home, run_ids):
    """Every row of these runs in every table."""
    out = {}
    for rid in sorted(run_ids):
        out[rid] = (_read(home, "SELECT * FROM runs WHERE run_id=?", (rid,)),
                    _read(home, "SELECT * FROM metrics WHERE run_id=? ORDER BY split, name, step", (rid,)),
                    _read(home, "SELECT * FROM predictions WHERE run_id=? ORDER BY split, example_id", (rid,)),
                    _read(home, "SELECT phase, rank, verdict, note FROM phases WHERE run_id=? ORDER BY id", (rid,)))
    return out


def _start(campaign, home, log, *extra):
    return subprocess.Popen([sys.executable, "-m", "pilotrun", "sweep", str(campaign), "--home", str(home), *extra],
                            stdout=log, stderr=subprocess.STDOUT, cwd=campaign.parent)


# When to kill, relative to what the process has written (not to a clock, so the moment holds on a slow
# or a fast machine): a run of its own just created; a checkpoint of it being written; its first
# validations recorded; its run finished (so the kill falls between two runs or early in the next).
MOMENTS = ("created", "checkpoint", "validated", "finished")


def _reached(home, known: set, moment: str) -> bool:
    if not (home / "journal.sqlite").exists():
        return False
    try:
        rows = _read(home, "SELECT run_id, status FROM runs ORDER BY created_at, run_id")
    except sqlite3.OperationalError:  # the schema is not written yet
        return False
    new = [r for r in rows if r[0] not in known]
    if not new:
        return False
    run_id, status = new[0]
    if moment == "created":
        return True
    if moment == "checkpoint":
        folder = home / "runs" / run_id / "checkpoints"
        return folder.is_dir() and any(folder.iterdir())
    if moment == "validated":
        return _read(home, "SELECT COUNT(*) FROM metrics WHERE run_id=? AND split='validation'", (run_id,))[0][0] >= 2
    return status != "running"


def _kill_at(proc, home, known: set, moment: str, delay: float, logfile) -> bool:
    """SIGKILL ``delay`` seconds after the process reached ``moment``; False when it finished first."""
    deadline = time.monotonic() + 120
    while not _reached(home, known, moment):
        if proc.poll() is not None:
            assert proc.returncode == 0, logfile.read_text()[-3000:]
            return False
        assert time.monotonic() < deadline, f"the sweep never reached {moment}"
        time.sleep(0.002)
    time.sleep(delay)
    if proc.poll() is not None:
        assert proc.returncode == 0, logfile.read_text()[-3000:]
        return False
    proc.send_signal(signal.SIGKILL)  # no handler, no cleanup
    proc.wait(timeout=60)
    return True


def _sweep_killed_and_continued(demo_dir, moments: list[str], seed: int, seeds=(0,)):
    campaign = _campaign(demo_dir, list(seeds))
    home = demo_dir / "home"
    rng = random.Random(seed)
    known: set[str] = set()
    finished_snapshots: dict = {}
    interrupted_snapshots: dict = {}
    sweep_id = None
    for k, moment in enumerate(moments):
        logfile = demo_dir / f"sweep-{k}.log"
        with open(logfile, "wb") as log:
            proc = _start(campaign, home, log, *(["--continue", sweep_id] if sweep_id else []))
            killed_it = _kill_at(proc, home, known, moment, rng.uniform(0.0, 0.03), logfile)
        assert proc.returncode == (-signal.SIGKILL if killed_it else 0)
        assert _integrity(home) == "ok"
        rows = _read(home, "SELECT run_id, status, sweep_id FROM runs")
        sweep_id = sweep_id or rows[0][2]
        assert {r[2] for r in rows} == {sweep_id}
        # finished at kill time: frozen from now on
        done_now = {r[0] for r in rows if r[1] in FINISHED}
        finished_snapshots.update({rid: snap for rid, snap in _snapshot(home, done_now).items()
                                   if rid not in finished_snapshots})
        killed = {r[0] for r in rows if r[1] == "running"}
        print(f"kill {k} at {moment}: {'killed' if killed_it else 'finished first'}; "
              f"runs {sorted(r[1] for r in rows)}")
        assert len(killed) <= 1  # one run at a time; a kill between two runs leaves none running
        j = Journal(home)  # opening the journal finds the dead pid
        for rid in killed:
            run = j.get_run(rid)
            assert run["status"] == "interrupted" and run["ended_at"]
            assert "process ended" in run["summary"]["reason"]
            for ckpt in (j.run_dir(rid) / "checkpoints").glob("*"):
                if not ckpt.name.startswith("."):
                    assert is_complete(ckpt), f"a killed run left a partial checkpoint at {ckpt}"
        assert not [r for r in j.list_runs() if r["status"] == "running"]
        interrupted_snapshots.update(_snapshot(home, killed))
        known |= {r[0] for r in rows}
        assert _integrity(home) == "ok"
        latest = {(r["arm"], r["seed"]): r["status"] for r in j.list_runs(sweep_id=sweep_id)}  # oldest first
        if not killed_it or (len(latest) == 3 * len(seeds) and all(v == "completed" for v in latest.values())):
            break  # the sweep finished before the kill: nothing left to interrupt
    # the last --continue finishes the sweep
    p = subprocess.run([sys.executable, "-m", "pilotrun", "sweep", str(campaign), "--home", str(home),
                        "--continue", sweep_id, "--json"], capture_output=True, text=True, cwd=demo_dir, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert _integrity(home) == "ok"
    j = Journal(home)
    runs = j.list_runs(sweep_id=sweep_id)
    assert not [r for r in runs if r["status"] == "running"]
    latest = {}
    for r in runs:
        latest[(r["arm"], r["seed"])] = r
    assert sorted(latest) == [(a, s) for a in ("control", "variant-1", "variant-2") for s in seeds]
    assert all(r["status"] == "completed" for r in latest.values())
    # what had finished, and what was interrupted, is exactly as it was
    after = _snapshot(home, set(finished_snapshots) | set(interrupted_snapshots))
    for rid, snap in finished_snapshots.items():
        assert after[rid] == snap, f"finished run {rid} changed"
    for rid, snap in interrupted_snapshots.items():
        assert after[rid] == snap, f"interrupted run {rid} changed after it was reaped"
        assert [r for r in runs if r["supersedes"] == rid], f"interrupted run {rid} was never rerun"
    for r in runs:
        if r["status"] == "completed":  # a finished run's curve is whole
            assert len(j.metrics(r["run_id"], "train", "loss")) == 8
            assert [m["step"] for m in j.metrics(r["run_id"], "validation", "val_loss")] == [0, 4, 8]
    return runs


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_sweep_killed_twice_then_continued(demo_dir):
    runs = _sweep_killed_and_continued(demo_dir, ["checkpoint", "finished"], seed=3)
    assert any(r["status"] == "interrupted" for r in runs)


@pytest.mark.slow
def test_sweep_killed_many_times_then_continued(demo_dir):
    rng = random.Random(17)
    runs = _sweep_killed_and_continued(demo_dir, [rng.choice(MOMENTS) for _ in range(10)], seed=17, seeds=(0, 1, 2))
    assert sum(r["status"] == "interrupted" for r in runs) >= 2
