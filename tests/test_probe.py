"""Memory probes, the phase recorder (pilotrun.phase) and size parsing."""

import threading
import time

import pytest
import torch

import pilotrun
from pilotrun.errors import BadInput
from pilotrun.journal import Journal
from pilotrun.probe.memory import RssProbe, make_probe
from pilotrun.probe.recorder import ROW_KEYS, NonFinite, own_run, phase
from pilotrun.sizes import fmt_bytes, parse_size

MiB = 2**20


def _touch(mib: int):
    """A tensor whose pages are really resident (ones, not empty)."""
    return torch.ones(mib * MiB // 4, dtype=torch.float32)


def test_rss_probe_sees_a_freed_peak_and_no_reserved_counter():
    probe = make_probe("cpu", exact=False)
    assert isinstance(probe, RssProbe) and probe.counter == "rss"
    probe.start()
    x = _touch(96)
    del x
    row = probe.stop()
    assert row["device"] == "cpu" and row["counter"] == "rss"
    assert row["peak_reserved"] is None and row["end_reserved"] is None
    assert row["peak_allocated"] - row["baseline"] >= 80 * MiB, row
    assert row["peak_allocated"] >= row["end_allocated"] > 0


def test_rss_peak_is_reset_at_start():
    # the planted defect: a large peak *before* the phase must not be charged to it
    x = _touch(256)
    del x
    probe = make_probe("cpu", exact=False)
    probe.start()
    y = _touch(8)
    del y
    row = probe.stop()
    assert row["peak_allocated"] - row["baseline"] < 128 * MiB, row


def test_sampling_probe_catches_a_transient_peak():
    probe = RssProbe("cpu", sampling=True)
    probe.start()
    x = _touch(96)
    time.sleep(0.3)  # the sampler runs every few ms; this is the window it must see, not a timing assertion
    del x
    row = probe.stop()
    assert row["peak_allocated"] - row["baseline"] >= 80 * MiB, row
    assert not any(t.name == "pilotrun-probe" for t in threading.enumerate())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_probe_counters():
    probe = make_probe("cuda")
    probe.start()
    x = torch.ones(64 * MiB // 4, device="cuda")
    del x
    row = probe.stop()
    assert row["counter"] == "cuda" and row["device"].startswith("cuda:")
    assert row["peak_allocated"] - row["baseline"] >= 64 * MiB
    assert row["peak_reserved"] >= row["peak_allocated"] and row["end_reserved"] is not None


def test_phase_writes_a_ledger_row_to_the_journal(tmp_path):
    from pilotrun.probe.memory import release_free_memory

    assert pilotrun.phase is phase
    release_free_memory()  # free heap left resident by earlier tests would absorb the tensor without raising RSS
    with own_run(tmp_path / "home", name="my-loop") as run:
        with pilotrun.phase("eval_longest", inputs={"seq_len": 512, "eval_batch": 4}, journal=run.journal,
                            run_id=run.run_id) as p:
            x = _touch(32)
            p.check_finite(x.sum())
            del x
    j = Journal(tmp_path / "home")
    (row,) = j.phase_rows(run.run_id)
    assert row["phase"] == "eval_longest" and row["rank"] == 0 and row["verdict"] == "ok"
    assert row["inputs"] == {"seq_len": 512, "eval_batch": 4} and row["counter"] == "tensors+rss"
    assert row["peak_allocated"] - row["baseline"] >= 32 * MiB and row["duration_s"] > 0
    assert row["peak_reserved"] > 0  # RSS
    assert p.row is not None and list(p.row) == list(ROW_KEYS)
    run_row = j.get_run(run.run_id)
    assert run_row["kind"] == "phases" and run_row["status"] == "completed"


def test_phase_with_a_journal_needs_a_run_id(tmp_path):
    with pytest.raises(BadInput, match="run_id"):
        phase("load", journal=tmp_path / "home")


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 RuntimeError("MPS backend out of memory"),
                                 RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 TB")])
def test_out_of_memory_is_caught_into_an_oom_row(exc):
    rows = []
    with phase("first_step", {"micro_batch": 8}, rows=rows):
        raise exc
    reached = True  # the program goes on after the phase
    assert reached and rows[0]["verdict"] == "oom" and "out of memory" in rows[0]["note"]
    assert rows[0]["inputs"] == {"micro_batch": 8}


def test_other_errors_are_recorded_then_raised_unless_caught():
    rows = []
    with pytest.raises(ValueError, match="bad batch"):
        with phase("first_step", rows=rows):
            raise ValueError("bad batch")
    assert rows[0]["verdict"] == "error" and rows[0]["note"] == "ValueError: bad batch"
    with phase("steady_step", rows=rows, catch_errors=True):
        raise ValueError("again")
    assert rows[1]["verdict"] == "error"


def test_nan_signalled_or_raised():
    rows = []
    with phase("first_step", rows=rows) as p:
        assert not p.check_finite(torch.tensor(float("nan")))
    with phase("steady_step", rows=rows):
        raise NonFinite("loss is inf at update 3")
    with phase("eval_longest", rows=rows) as p:
        assert p.check_finite(torch.tensor(1.5))
    assert [r["verdict"] for r in rows] == ["nan", "nan", "ok"]
    assert rows[0]["note"] == "loss is nan" and rows[1]["note"] == "loss is inf at update 3"


def test_memory_limit_gives_over_budget_naming_phase_and_inputs():
    import os

    from pilotrun.probe.memory import _rss_now

    rows = []
    with phase("eval_longest", {"seq_len": 1024, "eval_batch": 8}, rows=rows, memory_limit=2**40):
        x = _touch(96)
        del x
    # the limit is a GPU's memory: judged on the live tensors (the block holds 96 MiB more than the limit allows),
    # never on the process RSS, which holds the interpreter and libraries too (issue 43)
    assert rows[0]["peak_reserved"] > _rss_now() // 2 > 96 * MiB
    limit = rows[0]["baseline"] + 16 * MiB
    with phase("eval_longest", {"seq_len": 1024, "eval_batch": 8}, rows=rows, memory_limit=limit):
        x = _touch(96)
        del x
    assert rows[0]["verdict"] == "ok" and rows[1]["verdict"] == "over-budget", (rows, os.getpid())
    assert "eval_longest" in rows[1]["note"] and "seq_len 1024" in rows[1]["note"]
    assert "eval_batch 8" in rows[1]["note"] and "(live tensors) is above the limit" in rows[1]["note"]


@pytest.mark.parametrize("text,expected", [("24GiB", 24 * 2**30), ("512MiB", 512 * MiB), ("1.5GB", 1_500_000_000),
                                           ("80G", 80 * 2**30), ("85899345920", 80 * 2**30), (" 2 gib ", 2 * 2**30),
                                           (2**20, 2**20), ("1KiB", 1024), ("4096B", 4096)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["lots", "12 parsecs", "-1GiB", "0", "GiB", ""])
def test_bad_size_names_the_flag(text):
    with pytest.raises(BadInput) as e:
        parse_size(text, where="--memory-limit")
    assert e.value.where == "--memory-limit" and "24GiB" in str(e.value)


@pytest.mark.parametrize("text, fix", [("80", "80GiB"), (80, "80GiB"), ("24", "24GiB"), ("1.5", "1.5GiB"),
                                       (141.0, "141GiB"), ("1048575", "1048575GiB")])
def test_a_size_without_a_unit_below_a_mebibyte_is_refused(text, fix):
    # `memory_per_gpu: 80` and `--memory-limit 80` planned for 80 bytes: every phase failed over a limit of 80 B
    with pytest.raises(BadInput) as e:
        parse_size(text, where="hardware.memory_per_gpu")
    assert f"{text!r} has no unit, so it reads as {int(float(text))} bytes (a number alone is bytes), less than any " \
           "GPU holds" in str(e.value)
    assert e.value.fix == f"write the unit: {fix} (or {fix[:-3]}GB)"


def test_fmt_bytes():
    assert fmt_bytes(None) == ""
    assert fmt_bytes(3 * 2**30 // 2) == "1.50 GiB"
    assert fmt_bytes(512 * MiB) == "512.0 MiB"
    assert fmt_bytes(2048) == "2 KiB"
