"""A counted trace's depths traced two at a time (probe/workers.py): the same rows as one after the other, a worker
that fails traced again in this process, and no worker left behind."""

from __future__ import annotations

import gzip
import os
import time
from pathlib import Path

import pytest

from conftest import TINY_LLAMA, tiny_causal_campaign

# 18 identical layers: counted on CUDA from traces of 2, 4 and 6 layers (probe/counted.py)
DEEP = dict(TINY_LLAMA, num_hidden_layers=18)


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"instruction": "reverse " + "w" * (5 + (i * 7) % 40), "output": "x" * (10 + (i * 5) % 50)}
            for i in range(start, start + n)]


@pytest.fixture(scope="module")
def deep(tmp_path_factory):
    from pilotrun.campaign.load import load_campaign

    path = tiny_causal_campaign(tmp_path_factory.mktemp("deep"), _records(24), _records(8, 100), model__config=DEEP,
                                data__max_length=96, train__micro_batch=2, train__accumulation=2, train__eval_batch=4)
    return load_campaign(path)


def _table(loaded) -> dict:
    from pilotrun.sheet.options import options_table

    return {k: v for k, v in options_table(loaded).items() if k != "wall_s"}


def _counts() -> dict:
    from pilotrun.probe import workers

    return dict(workers.COUNTS)


def _since(before: dict) -> dict:
    return {k: v - before[k] for k, v in _counts().items()}


def _children() -> set[str]:
    """This process's child processes (zombies included), as ``pid state`` (the session's zygote is one)."""
    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                pid, rest = (entry / "stat").read_text().split(" (", 1)
            except OSError:
                continue
            fields = rest.rsplit(") ", 1)[1].split()
            if int(fields[1]) == me:
                out.add(f"{pid} {fields[0]}")
    return out


@pytest.fixture(scope="module")
def serial_trace(deep, tmp_path_factory):
    """The written campaign's trace with every depth in this process, its traces kept in a home: (rows, files)."""
    from pilotrun.campaign import reuse
    from pilotrun.probe.trace import trace

    home = tmp_path_factory.mktemp("serial-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("PILOTRUN_TRACE_WORKERS", "1")
    try:
        with reuse.keeping_traces(home):
            rows = trace(deep, counted=True)["rows"]
    finally:
        mp.undo()
    return rows, _kept(home)


def _kept(home: Path) -> dict:
    return {p.name: gzip.decompress(p.read_bytes()) for p in sorted((home / "traces").iterdir())}


@pytest.fixture(scope="module")
def serial(deep):
    """The options table with every trace in this process (``PILOTRUN_TRACE_WORKERS=1``)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("PILOTRUN_TRACE_WORKERS", "1")
    try:
        before = _counts()
        table = _table(deep)
        assert _since(before)["started"] == 0
    finally:
        mp.undo()
    assert table["counted"]["layers"] == 18
    return table


def test_depths_traced_two_at_a_time_give_the_same_options_table(deep, serial, monkeypatch):
    """The must-show: the deepest trace of each variant (written, LoRA …) comes from a forked worker, and the table
    is the one traced one after the other, row for row (the LoRA variant replays the written one's reload, which the
    worker recorded)."""
    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    monkeypatch.delenv("PILOTRUN_TEST_TRACE_WORKER", raising=False)
    children, before = _children(), _counts()
    table = _table(deep)
    done = _since(before)
    assert done["answered"] == done["started"] == 2 and done["failed"] == 0, done  # written and LoRA
    assert table == serial
    assert _children() == children
    # the table says the depths it counted from (its message read "2 and 3", the CPU's, on CUDA's 2, 4 and 6)
    from pilotrun.sheet.options_view import _depths

    assert table["counted"]["depths"] == [2, 4, 6] and _depths(table["counted"]) == "2, 4 and 6"


@pytest.mark.parametrize("plant", ["exit", pytest.param("truncate", marks=pytest.mark.slow)])
def test_a_worker_that_fails_is_traced_here_with_the_same_rows(deep, serial_trace, monkeypatch, plant):
    """A worker that exits 3 before it answers, or answers half its body under the whole one's sha256: the depth it
    had is traced in this process, the rows are the same, and the worker is reaped (no zombie)."""
    from pilotrun.probe.trace import trace

    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    monkeypatch.setenv("PILOTRUN_TEST_TRACE_WORKER", plant)
    children, before = _children(), _counts()
    rows = trace(deep, counted=True)["rows"]
    assert _since(before) == {"started": 1, "answered": 0, "failed": 1}
    assert rows == serial_trace[0]
    assert _children() == children


@pytest.mark.slow
def test_the_sheet_keeps_what_a_worker_traced_as_it_keeps_its_own(deep, serial_trace, tmp_path, monkeypatch):
    """Inside ``keeping_traces`` this process stores the worker's trace: the same files with the same bodies as a
    serial run keeps, and a later run reads all of them back without a worker."""
    from pilotrun.campaign import reuse
    from pilotrun.probe.trace import trace

    monkeypatch.delenv("PILOTRUN_TEST_TRACE_WORKER", raising=False)
    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    before = _counts()
    with reuse.keeping_traces(tmp_path):
        rows = trace(deep, counted=True)["rows"]
    assert _since(before) == {"started": 1, "answered": 1, "failed": 0}
    assert len(serial_trace[1]) == 3 and _kept(tmp_path) == serial_trace[1] and rows == serial_trace[0]
    hits = reuse.COUNTS["trace_hits"]
    with reuse.keeping_traces(tmp_path):
        assert trace(deep, counted=True)["rows"] == rows
    assert reuse.COUNTS["trace_hits"] - hits == 3 and _since(before)["started"] == 1  # all kept: nothing forked


def test_a_worker_answers_its_value_or_none(monkeypatch):
    from pilotrun.probe import workers

    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    monkeypatch.delenv("PILOTRUN_TEST_TRACE_WORKER", raising=False)
    children = _children()
    assert workers.start(lambda: {"layers": [2, 4, 6], "x": 0.1}).result(30) == {"layers": [2, 4, 6], "x": 0.1}
    broken = workers.start(lambda: 1 / 0)
    assert broken.result(30) is None and broken.status == 1
    # one that does not answer in time is killed and reaped at once
    slow = workers.start(lambda: time.sleep(60))
    started = time.monotonic()
    assert slow.result(0.5) is None and time.monotonic() - started < 10 and slow.status == -9
    slow.cancel()  # a no-op once reaped
    assert _children() == children


def test_no_worker_where_the_switch_or_the_machine_says_one_at_a_time(monkeypatch):
    from pilotrun.probe import workers

    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("this machine has one CPU")
    assert workers.allowed()
    for said in ("1", "0", "many"):
        monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", said)
        assert not workers.allowed() and workers.start(lambda: 1) is None
    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")
    assert workers.allowed()
    os.sched_setaffinity(0, {min(cpus)})
    try:
        assert not workers.allowed()
    finally:
        os.sched_setaffinity(0, cpus)


def test_a_worker_only_while_a_core_is_idle_now_not_by_the_minutes_load_average():
    """The load average still read 1.5–2 on 2 cores a minute after the work before had ended, and the sheet traced
    one depth at a time on an idle machine: the kernel's count of runnable threads now decides. Planted: as many
    spinning processes as cores, and no core is idle."""
    import subprocess
    import sys

    from pilotrun.probe import workers

    assert workers.runnable_below("0.80 1.90 1.70 1/312 4242", 2)  # the reader alone runs: a core idle
    assert not workers.runnable_below("0.20 0.10 0.05 2/312 4242", 2) and not workers.runnable_below("junk", 2)
    # a thread that woke for a moment meets one reading: most readings decide (each one did, and `all`'s SmolLM2
    # sheet once traced alone on an idle machine)
    for said, idle in ((["2/312", "1/312", "1/312", "1/312", "1/312"], True),
                       (["1/312", "2/312", "1/312", "2/312", "1/312"], True),
                       (["2/312", "1/312", "2/312", "3/312", "1/312"], False)):
        readings = iter(f"0.1 0.1 0.1 {r} 4242" for r in said)
        assert workers.idle_core(2, gap=0, read=lambda: next(readings)) is idle, said
    cpus = len(os.sched_getaffinity(0))
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cpus)]
    try:
        time.sleep(0.3)
        assert not workers.idle_core(cpus)
    finally:
        for p in spinning:
            p.kill()
            p.wait()


def _largest_question(tmp_path):
    """The tiny campaign's largest sizes on an H100, as the sheet asks them: (loaded, arguments of ``largest``)."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.sheet import estimates as E
    from pilotrun.sheet.catalogue import BY_KEY

    path = tiny_causal_campaign(tmp_path / "camp", _records(24), _records(8, 100), data__max_length=96)
    loaded = load_campaign(path)
    rows = [{"phase": p, "rank": 0, "inputs": {"seq_len": 60}, "peak_reserved": 1} for p in ("steady_step",
                                                                                            "eval_longest")]
    c = loaded.campaign
    return loaded, lambda: (E._Prepared(loaded), rows, BY_KEY["h100-sxm"], 1, c.train, c)


@pytest.mark.parametrize("plant", [None, "exit"])
def test_the_sheets_largest_sizes_from_a_worker_are_those_computed_here(tmp_path, monkeypatch, plant):
    """The sheet's largest sizes bisected in a forked worker while the process traces the options table
    (sheet/estimates.largest_ahead): the same sizes as computed in the process; a worker that fails (planted: it exits
    3) is computed again here, with the same sizes; the child is reaped."""
    from pilotrun.sheet import estimates as E

    loaded, question = _largest_question(tmp_path)
    prep, rows, card, ranks, t, c = question()
    here = E.largest(loaded, prep, rows, card, "predicted", ranks, t, c)
    assert here["micro_batch"]["value"] and here["seq_len"]["value"]
    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")  # whatever the machine's load
    if plant:
        monkeypatch.setenv("PILOTRUN_TEST_TRACE_WORKER", plant)
    children, before = _children(), _counts()
    prep, rows, card, ranks, t, c = question()
    ahead = E.largest_ahead(loaded, prep, rows, card, ranks, t, c)
    assert ahead is not None and _since(before)["started"] == 1
    assert E.largest(loaded, prep, rows, card, "predicted", ranks, t, c, ahead=ahead) == here
    assert _since(before) == {"started": 1, "answered": 0 if plant else 1, "failed": 1 if plant else 0}
    assert _children() == children


def test_no_worker_for_largest_sizes_kept_in_the_home(tmp_path, monkeypatch):
    """Sizes the home keeps are read back, not bisected again in a worker."""
    from pilotrun.campaign import reuse
    from pilotrun.sheet import estimates as E

    loaded, question = _largest_question(tmp_path)
    monkeypatch.setenv("PILOTRUN_TRACE_WORKERS", "2")
    with reuse.keeping_traces(tmp_path / "home"):
        prep, rows, card, ranks, t, c = question()
        first = E.largest(loaded, prep, rows, card, "predicted", ranks, t, c)
        before = _counts()
        prep, rows, card, ranks, t, c = question()
        assert E.largest_ahead(loaded, prep, rows, card, ranks, t, c) is None
        assert E.largest(loaded, prep, rows, card, "predicted", ranks, t, c) == first
        assert _since(before)["started"] == 0
