"""Preemption is an interruption: a real `pilotrun train` / `sweep` / 2-rank DDP `train` process sent SIGTERM
(SIGHUP) mid-run ends the run 'interrupted' with exit 143 (129), its last checkpoint complete and loadable;
`sweep --continue` then finishes the plan without rerunning a completed cell. The moment to signal is read
from the journal (a run with updates done), never from a clock."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign

from pilotrun.engine.state import is_complete, latest_checkpoint, problems
from pilotrun.journal.store import Journal


def _read(home: Path, sql: str, args=()):
    """A raw read, without Journal (which would reap)."""
    if not (home / "journal.sqlite").exists():
        return []
    db = sqlite3.connect(f"file:{home / 'journal.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # the schema is not written yet
        return []
    finally:
        db.close()


def _start(verb: str, campaign: Path, home: Path, *extra, env=None):
    return subprocess.Popen([sys.executable, "-m", "pilotrun", verb, str(campaign), "--home", str(home), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=campaign.parent,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def _wait_for(proc, home: Path, sql: str, what: str, timeout: float = 240.0):
    """Poll the journal until ``sql`` returns a row (the moment to signal), failing if the process ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = _read(home, sql)
        if rows:
            return rows
        if proc.poll() is not None:
            pytest.fail(f"the process ended ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        time.sleep(0.05)
    proc.kill()
    pytest.fail(f"no {what} within {timeout}s")


def _ended(proc, timeout: float = 120.0) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, out


def _long_campaign(folder: Path, **overrides) -> Path:
    return tiny_causal_campaign(folder, simple_records(32), simple_records(8, 100),
                                **{"train__updates": 400, "train__eval_every": 100, **overrides})


def _run_row(home: Path) -> dict:
    journal = Journal(home, create=False)
    (run,) = journal.list_runs()
    return run


def _assert_loads(run_dir: Path) -> Path:
    """The newest checkpoint is complete and its weights and training state load."""
    from safetensors.torch import load_file

    latest = latest_checkpoint(run_dir / "checkpoints")
    assert latest is not None and is_complete(latest), problems(latest) if latest else "no checkpoint"
    assert load_file(str(latest / "model.safetensors"))  # every tensor reads back
    assert not [p for p in (run_dir / "checkpoints").iterdir() if is_complete(p) is False
                and not p.name.startswith(".")]
    return latest


@pytest.mark.slow  # the fast selection keeps an external SIGTERM (the grace test) and one during a save
def test_sigterm_mid_train_interrupts_the_run_exit_143(tmp_path):
    path = _long_campaign(tmp_path / "c", train__save_every=2)
    home = tmp_path / "home"
    proc = _start("train", path, home)
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 4", "4 updates")
    proc.send_signal(signal.SIGTERM)
    code, out = _ended(proc)
    assert code == 143, out
    assert "interrupted: stopped by SIGTERM" in out
    run = _run_row(home)
    assert run["status"] == "interrupted"
    assert "SIGTERM" in run["summary"]["reason"]
    assert 4 <= run["updates_done"] < 400
    _assert_loads(home / "runs" / run["run_id"])


@pytest.mark.slow
def test_sighup_mid_train_exit_129_names_the_closed_terminal(tmp_path):
    path = _long_campaign(tmp_path / "c", train__save_every=3)
    home = tmp_path / "home"
    proc = _start("train", path, home)
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE updates_done >= 3", "3 updates")
    proc.send_signal(signal.SIGHUP)
    code, out = _ended(proc)
    assert code == 129, out
    run = _run_row(home)
    assert run["status"] == "interrupted" and "terminal closed (SIGHUP)" in run["summary"]["reason"]
    _assert_loads(home / "runs" / run["run_id"])


def test_sigterm_during_a_save_keeps_the_last_complete_checkpoint(tmp_path):
    """The SIGTERM arrives while the update-4 checkpoint's model file is written: no grace, so the save is cut
    short: its temporary is removed, update-2 stays the newest checkpoint, complete."""
    path = _long_campaign(tmp_path / "c", train__save_every=2, train__updates=6)
    home = tmp_path / "home"
    # the second save (update 4) is cut while its model file is written
    proc = _start("train", path, home, env={"PILOTRUN_TEST_SIGTERM_SAVE_AT": "model#2"})
    code, out = _ended(proc)
    assert code == 143, out
    run = _run_row(home)
    assert run["status"] == "interrupted"
    ckpts = home / "runs" / run["run_id"] / "checkpoints"
    assert not [p.name for p in ckpts.iterdir() if ".tmp-" in p.name]  # the cut save left nothing behind
    assert not [p for p in ckpts.iterdir() if not p.name.startswith(".") and not is_complete(p)]
    assert run["updates_done"] == 4  # stopped inside the save after update 4
    assert _assert_loads(home / "runs" / run["run_id"]).name == "update-000002"


def test_sigterm_with_a_grace_writes_one_more_checkpoint(tmp_path):
    """PILOTRUN_TERM_GRACE_S: the run ends after the update in progress with a checkpoint of it, although
    save_every would not have saved there."""
    path = _long_campaign(tmp_path / "c", train__save_every=1000)
    home = tmp_path / "home"
    proc = _start("train", path, home, env={"PILOTRUN_TERM_GRACE_S": "60"})
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE updates_done >= 1", "an update")
    time.sleep(0.3)
    proc.send_signal(signal.SIGTERM)
    code, out = _ended(proc)
    assert code == 143, out
    assert "ending after the update in progress and one checkpoint (grace 60s" in out
    run = _run_row(home)
    assert run["status"] == "interrupted"
    latest = _assert_loads(home / "runs" / run["run_id"])
    assert latest.name == f"update-{run['updates_done']:06d}"  # the update the run stopped after, saved


def test_a_malformed_grace_is_bad_input(tmp_path):
    proc = _start("validate", _long_campaign(tmp_path / "c"), tmp_path / "home",
                  env={"PILOTRUN_TERM_GRACE_S": "soon"})
    code, out = _ended(proc)
    assert code == 2 and "PILOTRUN_TERM_GRACE_S='soon' is not a number of seconds" in out


def _sweep_campaign(folder: Path) -> Path:
    path = tiny_causal_campaign(folder, simple_records(32), simple_records(8, 100), train__updates=30,
                                train__eval_every=10, train__save_every=5, plan__seeds=[0])
    c = yaml.safe_load(path.read_text())
    c["plan"].update(metric="val_loss", goal="minimize", control={"train.lr": 1e-3}, variants=[{"train.lr": 3e-3}])
    return write_campaign(folder, c)


@pytest.mark.slow
def test_sigterm_mid_sweep_then_continue_finishes_without_rerunning(tmp_path):
    path = _sweep_campaign(tmp_path / "c")
    home = tmp_path / "home"
    proc = _start("sweep", path, home)
    # the control finished, the variant is training
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 5 AND EXISTS "
                          "(SELECT 1 FROM runs WHERE status='completed')", "a completed run and one in progress")
    proc.send_signal(signal.SIGTERM)
    code, out = _ended(proc)
    assert code == 143, out
    journal = Journal(home, create=False)
    runs = journal.list_runs()
    assert [r["status"] for r in runs] == ["completed", "interrupted"]
    done, cut = runs
    _assert_loads(home / "runs" / cut["run_id"])
    sweep_id = done["sweep_id"]
    again = _start("sweep", path, home, "--continue", sweep_id)
    code, out = _ended(again, timeout=300)
    assert code == 0, out
    runs = journal.list_runs()
    assert len(runs) == 3  # the completed control was not rerun
    assert runs[0]["run_id"] == done["run_id"] and runs[0]["status"] == "completed"
    assert runs[2]["supersedes"] == cut["run_id"] and runs[2]["status"] == "completed"


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _ddp(folder: Path) -> Path:
    return _long_campaign(folder, train__strategy="ddp", train__nproc=2, train__save_every=2)


@pytest.mark.slow
@pytest.mark.parametrize("target", ["parent", "rank 1"])
def test_sigterm_under_ddp_ends_every_rank_and_interrupts_the_run(tmp_path, target):
    home = tmp_path / "home"
    proc = _start("train", _ddp(tmp_path / "c"), home)
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE updates_done >= 4", "4 updates on 2 ranks")
    ranks = [c for c in _children(proc.pid) if "spawn" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")]
    assert len(ranks) >= 2, ranks
    os.kill(proc.pid if target == "parent" else max(ranks), signal.SIGTERM)
    code, out = _ended(proc, timeout=60)
    assert code == 143, out
    assert "internal error" not in out
    for r in ranks:
        assert not Path(f"/proc/{r}").exists() or "Z" in Path(f"/proc/{r}/stat").read_text().split()[2]
    run = _run_row(home)
    assert run["status"] == "interrupted" and "SIGTERM" in run["summary"]["reason"]
    _assert_loads(home / "runs" / run["run_id"])
