"""The caching allocator's replay calibrated on real measurements: the five campaigns an H200 piloted
(tests/calibration/h200-2026-12-04.json, its provenance there) traced here with ``estimate --device cuda``'s trace,
replayed, and divided by what the GPU measured (bench/calibration.py; its table is bench/RESULTS.md's).

Goal (issue 42): reserved within 0.97-1.05 in every cell, allocated within 0.98-1.02 (within 4 MiB under 80 MiB).
The cells the replay does not reach yet are listed with the ratio they read, so a cell that gets worse fails, and one
that reaches the goal fails too, until it is taken off the list. Where they come from is the trace's, not the
replay's (bench/RESULTS.md says what is known)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# (campaign, phase, counter): the ratio the replay reads today, ± 0.01
KNOWN_MISSES = {
    ("wide512-fp32", "steady_step", "reserved"): 1.062, ("wide512-fp32", "eval_longest", "reserved"): 1.056,
    ("wide512-fp32", "save", "reserved"): 1.056, ("wide512-fp32", "export", "reserved"): 1.056,
    ("wide512-fp32", "reload", "reserved"): 1.056,
    ("wider1024-bf16", "eval_longest", "reserved"): 0.930, ("wider1024-bf16", "save", "reserved"): 0.930,
    ("wider1024-bf16", "export", "reserved"): 0.930, ("wider1024-bf16", "reload", "reserved"): 0.930,
    ("wide512-fp32", "first_step", "allocated"): 1.031, ("wide512-fp32", "steady_step", "allocated"): 1.027,
    ("wide512-bf16", "eval_longest", "allocated"): 0.943, ("wider1024-bf16", "first_step", "allocated"): 0.979,
    ("wider1024-bf16", "eval_longest", "allocated"): 0.945,
}


def _bench():
    spec = importlib.util.spec_from_file_location("calibration", ROOT / "bench" / "calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fixture_names_its_measurements_and_where_they_come_from():
    fx = _bench().fixture()
    assert fx["provenance"]["gpu"].startswith("NVIDIA H200") and fx["provenance"]["torch"] == "2.11.0+cu130"
    assert "bench/gpu_check.py" in fx["source"] and "bench/RESULTS.md" in fx["source"]
    assert set(fx["measured_mib"]) == set(fx["campaigns"])
    assert all(len(v) == 4 for c in fx["measured_mib"].values() for v in c.values())


@pytest.mark.slow
def test_the_replay_reads_within_the_goal_in_every_cell_but_the_listed_ones(tmp_path):
    bench = _bench()
    cells = bench.cells(bench.predicted(bench.write_campaigns(tmp_path)))
    assert len(cells) == 70
    off, reached = [], []
    for c in cells:
        key = (c["campaign"], c["phase"], c["kind"])
        if key in KNOWN_MISSES:
            if c["ok"]:
                reached.append(key)
            elif abs(c["ratio"] - KNOWN_MISSES[key]) > 0.01:
                off.append((key, round(c["ratio"], 3), KNOWN_MISSES[key]))
        elif not c["ok"]:
            off.append((key, round(c["ratio"], 3), "goal"))
    assert not off, off
    assert not reached, f"these cells reach the goal now: take them off KNOWN_MISSES: {reached}"
