"""The caching allocator's replay calibrated on real measurements: the five campaigns an H200 piloted
(tests/calibration/h200-2026-12-04.json, its provenance there) traced here with ``estimate --device cuda``'s trace,
replayed, and divided by what the GPU measured (bench/calibration.py; its table is bench/RESULTS.md's).

Goal (issue 42): reserved within 0.97-1.05 in every cell, allocated within 0.98-1.02 (within 4 MiB under 80 MiB).
A cell the replay does not reach is listed with the ratio it reads (none now), so a cell that gets worse fails, and one
that reaches the goal fails too, until it is taken off the list. The campaigns are traced with the measured
transformers' KV cache (bench/calibration.as_measured); the trace decides the attention mask from the batch's
padding as the run does (probe/estimate._eager_mask_decisions), without which the steps read 2-3 % over."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# (campaign, phase, counter): the ratio the replay reads today, ± 0.01, for a cell outside the goal (none now)
KNOWN_MISSES: dict[tuple[str, str, str], float] = {}


def _bench():
    spec = importlib.util.spec_from_file_location("calibration", ROOT / "bench" / "calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_fixture_names_its_measurements_and_where_they_come_from():
    fx = _bench().fixture()
    assert fx["provenance"]["gpu"].startswith("NVIDIA H200") and fx["provenance"]["torch"] == "2.11.0+cu130"
    assert fx["provenance"]["transformers"] == "5.17"  # bench/calibration.as_measured is that version's cache
    assert "bench/gpu_check.py" in fx["source"] and "bench/RESULTS.md" in fx["source"]
    assert set(fx["measured_mib"]) == set(fx["campaigns"])
    assert all(len(v) == 4 for c in fx["measured_mib"].values() for v in c.values())


@pytest.mark.slow
def test_the_replay_reads_within_the_goal_in_every_cell_but_the_listed_ones(tmp_path):
    bench = _bench()
    cells = bench.cells(bench.predicted(bench.write_campaigns(tmp_path)))
    assert len(cells) == 70
    known = KNOWN_MISSES
    off, reached = [], []
    for c in cells:
        key = (c["campaign"], c["phase"], c["kind"])
        if key in known:
            if c["ok"]:
                reached.append(key)
            elif abs(c["ratio"] - known[key]) > 0.01:
                off.append((key, round(c["ratio"], 3), known[key]))
        elif not c["ok"]:
            off.append((key, round(c["ratio"], 3), "goal"))
    assert not off, off
    assert not reached, f"these cells reach the goal now: take them off the list: {reached}"


def test_the_calibration_traces_the_kv_cache_the_h200_ran():
    """transformers 5.17 (the fixture's) cached a layer's values in its keys' dtype; inside ``as_measured`` the installed
    DynamicLayer does too, and outside it is as installed."""
    import torch
    from transformers.cache_utils import DynamicLayer

    bench = _bench()
    installed = bench.values_in_key_dtype()
    with bench.as_measured():
        assert bench.values_in_key_dtype()
        layer = DynamicLayer()
        keys, values = layer.update(torch.zeros(1, 2, 3, 8), torch.ones(1, 2, 3, 8, dtype=torch.bfloat16))
        assert values.dtype == torch.float32 and values.shape == (1, 2, 3, 8) and bool((values == 1).all())
    assert bench.values_in_key_dtype() == installed
