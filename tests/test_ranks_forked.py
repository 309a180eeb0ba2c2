"""engine/distributed.launch's ranks as children of the zygote (engine/fresh.start_processes) or spawned.

A launch forks its ranks from a zygote when one runs (here the module's own), as the resume check's launch does
inside `all`; with ``spawn=True`` (the pilot's and train's ranks, whose start the time plan measures),
with PILOTRUN_FRESH=cold or without a zygote they are spawned. Both paths must behave as torch's spawn does: the
same failures raised, the same output, nothing of the caller's memory in a rank.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from pilotrun.engine import fresh

pytestmark = pytest.mark.distributed

_CALLER_MARK: list[str] = []  # set in the test's process just before a launch: a fork of the caller would see it


def _report(out: str) -> None:
    from pilotrun.engine.distributed import world_rank

    rank = world_rank()[1]
    print(f"rank {rank} says hello", flush=True)
    Path(out, f"rank-{rank}.json").write_text(json.dumps({"ppid": os.getppid(), "mark": list(_CALLER_MARK),
                                                          "cwd": os.getcwd()}))


PRELOAD = ("torch._inductor.config", "torch.distributed")  # what the ranks import; the first sets a variable


@pytest.fixture(scope="module", autouse=True)
def _module_zygote():
    """A zygote of this module's own, started under the environment the tests run in: the session's was started
    under the suite's first one, and a library a test imported since may have set a variable a zygote compares,
    which would send these launches cold whatever the code does.
    The session's zygote comes back after."""
    import torch._inductor.config  # noqa: F401 - sets TORCHINDUCTOR_CACHE_DIR here, as the zygote's preload does

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fresh, "_ZYGOTE", None)
        mp.delenv(fresh.COLD_ENV, raising=False)
        try:
            fresh.start(preload=PRELOAD)
            yield
        finally:
            fresh.stop()


def _ready_zygote():
    deadline = time.monotonic() + 120  # its preload may still be importing: its ready message says the environment
    while fresh.started() and fresh._ZYGOTE.ready_env is None and time.monotonic() < deadline:
        fresh._imported(fresh._ZYGOTE)
        time.sleep(0.05)
    if not fresh.started():
        pytest.fail("this module's zygote is not running")
    return fresh._ZYGOTE


def test_ranks_hold_nothing_of_the_caller_and_print_to_its_output(tmp_path, monkeypatch, capfd):
    """Forked from the zygote, each rank is the zygote's child, not this process's, and so cannot hold what this
    process set (the defect: ranks forked from the caller would carry ``_CALLER_MARK``); it runs in this process's
    folder and prints to its standard output. (Spawned ranks are this process's children: the last test.)"""
    from pilotrun.engine.distributed import launch

    z = _ready_zygote()
    monkeypatch.chdir(tmp_path)
    _CALLER_MARK.append("the caller's")
    try:
        launch(_report, 2, (str(tmp_path),))
    finally:
        _CALLER_MARK.clear()
    said = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [s["ppid"] for s in said] == [z.proc.pid, z.proc.pid]
    assert all(s["mark"] == [] and s["cwd"] == str(tmp_path) for s in said), said
    out = capfd.readouterr().out
    assert "rank 0 says hello" in out and "rank 1 says hello" in out, out
    assert fresh.started() and fresh._ZYGOTE is z  # the zygote takes the next request


def _fail_on_rank1() -> None:
    from pilotrun.engine.distributed import world_rank

    if world_rank()[1] == 1:
        raise RuntimeError("rank 1 failed on purpose")


def _killed_on_rank1(out: str) -> None:
    from pilotrun.engine.distributed import world_rank

    if world_rank()[1] == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    Path(out, "rank-0-done").write_text("done")


@pytest.mark.parametrize("how", ["zygote", "cold"])
def test_a_rank_that_raises_or_is_killed_fails_the_launch_as_torchs_spawn_says_it(how, tmp_path, monkeypatch):
    """A rank's exception comes back with its traceback (``ProcessRaisedException``), the same through the zygote
    as spawned (PILOTRUN_FRESH=cold: torch's own spawn, what the zygote's ``Ranks`` copies); a rank killed by a
    signal as ``ProcessExitedException`` with that signal (forked only: spawned, that is torch's own code)."""
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    from pilotrun.engine.distributed import launch

    _ready_zygote()
    if how == "cold":
        monkeypatch.setenv(fresh.COLD_ENV, "cold")
    with pytest.raises(ProcessRaisedException) as raised:
        launch(_fail_on_rank1, 2)
    assert raised.value.error_index == 1
    text = str(raised.value)
    assert "-- Process 1 terminated with the following error" in text and "Traceback" in text
    assert "_fail_on_rank1" in text and "RuntimeError: rank 1 failed on purpose" in text, text
    if how == "cold":
        return
    with pytest.raises(ProcessExitedException, match="process 1 terminated with signal SIGKILL") as exited:
        launch(_killed_on_rank1, 2, (str(tmp_path),))
    assert exited.value.exit_code == -signal.SIGKILL and exited.value.error_index == 1
    assert fresh.started()


def _kill_the_parent(out: str) -> None:
    from pilotrun.engine.distributed import world_rank

    rank = world_rank()[1]
    Path(out, f"pid-{rank}").write_text(str(os.getpid()))
    if rank == 0:
        while not Path(out, "pid-1").exists():
            time.sleep(0.01)
        os.kill(os.getppid(), signal.SIGKILL)
    time.sleep(120)


def _ended(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_a_zygote_dying_under_its_ranks_takes_them_along_and_the_next_launch_spawns(tmp_path, monkeypatch):
    """The zygote killed (the OOM killer) while its ranks run: they get their parent-death signal as spawned ranks
    do when their parent dies, the launch fails as for a rank killed, no rank is left running, and the next launch,
    without a zygote, spawns its ranks."""
    from torch.multiprocessing.spawn import ProcessExitedException

    from pilotrun.engine.distributed import launch

    monkeypatch.setattr(fresh, "_ZYGOTE", None)  # a zygote of this test's own; the module's comes back after
    try:
        fresh.start(preload=PRELOAD)
        z = _ready_zygote()
        t0 = time.monotonic()
        with pytest.raises(ProcessExitedException, match="terminated with signal SIGKILL"):
            launch(_kill_the_parent, 2, (str(tmp_path),))
        assert time.monotonic() - t0 < 60  # not the ranks' 120 s sleep: they went with the zygote
        assert z.proc.poll() is not None and not fresh.started()
        pids = [int((tmp_path / f"pid-{r}").read_text()) for r in (0, 1)]
        deadline = time.monotonic() + 20
        while not all(_ended(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_ended(p) for p in pids), pids
        assert fresh.start_processes(_report, (str(tmp_path),), 2) is None  # the next launch spawns its ranks
    finally:
        fresh.stop()


def _report_job(job: dict) -> None:
    _report(job["out"])


def test_the_ranks_the_time_plan_measures_are_spawned_even_with_a_zygote(tmp_path, monkeypatch):
    """The pilot's ranks (``Ranks.run``) start as the rental's do, spawned, though a zygote runs: a spawned rank's
    imports are part of the load term the plan is made of (the defect: forked ranks, a load term 18 times short).
    Spawned, they are this process's children and hold nothing of it either."""
    from pilotrun.engine.launcher import Ranks

    _ready_zygote()
    monkeypatch.chdir(tmp_path)
    ranks = Ranks(2)
    assert ranks.spawn
    _CALLER_MARK.append("the caller's")
    try:
        ranks.run(_report_job, {"out": str(tmp_path)}, lambda job: pytest.fail("one process ran it"))
    finally:
        _CALLER_MARK.clear()
    said = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [s["ppid"] for s in said] == [os.getpid(), os.getpid()]
    assert all(s["mark"] == [] and s["cwd"] == str(tmp_path) for s in said), said
