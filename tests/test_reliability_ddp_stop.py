"""A signal under DDP ends every rank after the same update: 2-rank `train` runs, spawned or joined by torchrun,
SIGTERMed (at the parent, at torchrun's agent or at one rank) end 'interrupted', every rank 143, never 3 nor a
hang, the last checkpoint complete and loadable. With a grace (PILOTRUN_TERM_GRACE_S) the ranks agree, by one
all-reduce per update, on the update to stop after, and write one checkpoint there together: one more
checkpoint than the same stop without a grace."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability_signals import _assert_loads, _children, _ended, _long_campaign, _run_row, _start, _wait_for

pytestmark = [pytest.mark.distributed, pytest.mark.slow]  # 3 processes that each import torch: 30-60 s apiece


def _torchrun(campaign: Path, home: Path, env: dict | None = None):
    from pilotrun.engine.distributed import free_port

    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                             str(free_port()), "--log-dir", str(home.parent / "torchrun-logs"),  # not in TMPDIR
                             "-m", "pilotrun", "train", str(campaign), "--home", str(home)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=campaign.parent,
                            env=dict(os.environ, OMP_NUM_THREADS="1", **(env or {})))


def _workers(agent: int) -> list[int]:
    return sorted(c for c in _children(agent) if "pilotrun" in Path(f"/proc/{c}/cmdline").read_text(errors="replace"))


def _gone(pids: list[int]) -> bool:
    return all(not Path(f"/proc/{p}").exists() or "Z" in Path(f"/proc/{p}/stat").read_text().split()[2] for p in pids)


def _checkpoints(home: Path, run: dict) -> list[str]:
    folder = home / "runs" / run["run_id"] / "checkpoints"
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("update-")) if folder.exists() else []


def _ddp(folder: Path, **kw) -> Path:
    return _long_campaign(folder, train__strategy="ddp", train__nproc=2, **{"train__save_every": 2, **kw})


@pytest.mark.parametrize("target", ["agent", "rank 1"])
def test_torchrun_ranks_sigtermed_end_interrupted_with_their_checkpoint(tmp_path, target):
    """No grace: the agent forwards SIGTERM to both ranks, or one rank alone is stopped and its peer, blocked in a
    collective, is broken by it: both end 143 (the peer's error is part of the stop), the run 'interrupted'."""
    home = tmp_path / "home"
    proc = _torchrun(_ddp(tmp_path / "c"), home)
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 4", "4 updates")
    ranks = _workers(proc.pid)
    assert len(ranks) == 2, ranks
    os.kill(proc.pid if target == "agent" else ranks[1], signal.SIGTERM)
    code, out = _ended(proc, timeout=120)
    assert _gone(ranks)
    assert "internal error" not in out and "exitcode  : 3" not in out, out[-3000:]
    if target == "rank 1":  # torchrun reports each rank's exit: both were interrupted
        assert re.findall(r"exitcode\s*:\s*(-?\d+)", out) and set(re.findall(r"exitcode\s*:\s*(-?\d+)", out)) <= {"143"}, out[-3000:]
    run = _run_row(home)
    assert run["status"] == "interrupted", run["summary"]
    if target == "agent":
        assert run["summary"]["reason"].startswith("stopped by SIGTERM"), run["summary"]
    else:  # rank 0, which records, was not signalled: its collective broke when rank 1 ended
        assert run["summary"]["reason"].startswith("a peer rank of the run ended while this rank waited for it in "
                                                   "a collective (preempted or killed): RuntimeError"), run["summary"]
    _assert_loads(home / "runs" / run["run_id"])


def test_torchrun_with_a_grace_checkpoints_the_agreed_update_on_both_ranks(tmp_path):
    """A SIGTERM to ONE rank under a grace: the ranks agree (all-reduce MAX of the stop) to stop after the same
    update, save it together although save_every would not, and end 143."""
    home = tmp_path / "home"
    proc = _torchrun(_ddp(tmp_path / "c", train__save_every=1000), home, env={"PILOTRUN_TERM_GRACE_S": "60"})
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 2", "2 updates")
    ranks = _workers(proc.pid)
    os.kill(ranks[1], signal.SIGTERM)
    code, out = _ended(proc, timeout=180)
    assert _gone(ranks)
    assert "ending after the update in progress and one checkpoint" in out
    assert set(re.findall(r"exitcode\s*:\s*(-?\d+)", out)) <= {"143"}, out[-3000:]
    run = _run_row(home)
    assert run["status"] == "interrupted" and "SIGTERM" in run["summary"]["reason"], run["summary"]
    latest = _assert_loads(home / "runs" / run["run_id"])
    assert _checkpoints(home, run) == [latest.name]  # the one grace checkpoint, at the agreed update
    assert latest.name == f"update-{run['updates_done']:06d}"


@pytest.mark.parametrize("grace", ["", "60"])
def test_spawned_ddp_with_a_grace_writes_one_more_checkpoint_than_without(tmp_path, grace):
    home = tmp_path / "home"
    proc = _start("train", _ddp(tmp_path / "c", train__save_every=1000), home, env={"PILOTRUN_TERM_GRACE_S": grace})
    _wait_for(proc, home, "SELECT run_id FROM runs WHERE status='running' AND updates_done >= 2", "2 updates")
    ranks = [c for c in _children(proc.pid) if "spawn" in Path(f"/proc/{c}/cmdline").read_text(errors="replace")]
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    code, out = _ended(proc, timeout=120)
    assert code == 143, out
    assert _gone(ranks) and "internal error" not in out
    run = _run_row(home)
    assert run["status"] == "interrupted" and "SIGTERM" in run["summary"]["reason"]
    if not grace:  # every rank ended at once: no checkpoint at all (save_every is far), within the stop bound
        assert _checkpoints(home, run) == [] and time.monotonic() - t0 < 60
    else:
        latest = _assert_loads(home / "runs" / run["run_id"])
        assert _checkpoints(home, run) == [latest.name]
