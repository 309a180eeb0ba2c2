"""Per-process speed of the same updates: fresh processes each time the demo's first 60 updates
(``engine.loop.run_update``, the sampler's order) and report their median seconds per update, under torch's
default intra-op threads and under ``OMP_NUM_THREADS=1``.

Why (issue 50): the pilot times its update samples in one process and the sweep runs in another, so a speed that
one process keeps throughout and the next does not share moves the time plan's ratio by as much, whatever the
plan models. Read the spread of the process medians, not their level.

Run: ``python bench/bench_threads.py [--processes=5]``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python bench/bench_threads.py"
CHILD = """
import statistics, sys, time
import torch
from pilotrun.campaign.load import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.engine.loop import make_state, run_update
from pilotrun.engine.sampler import UpdateSampler
prep = prepare(load_campaign(sys.argv[1]), splits=("train",))
t = prep.c.train
torch.manual_seed(0)
state = make_state(prep.task.build_model(), t, n_train=len(prep.train), seed=0, total_updates=200)
sampler = UpdateSampler.for_train(t, len(prep.train), 0, 0, 1)
seconds = []
for _ in range(60):
    mbs = [[prep.train[j] for j in mb] for mb in sampler.next_update()]
    t0 = time.perf_counter()
    run_update(state, prep.task, mbs, max_grad_norm=t.max_grad_norm)
    seconds.append(time.perf_counter() - t0)
print(statistics.median(seconds[5:]))
"""


def per_process(campaign: Path, n: int, env: dict) -> list[float]:
    out = []
    for _ in range(n):
        p = subprocess.run([sys.executable, "-c", CHILD, str(campaign)], capture_output=True, text=True, env=env,
                           timeout=600, check=True)
        out.append(float(p.stdout.strip().splitlines()[-1]))
    return out


def run(processes: int = 5) -> list[dict]:
    sys.path.insert(0, str(REPO / "src"))
    from pilotrun.demo.synth import write_demo

    rows = []
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-threads-") as d:
        campaign = write_demo(Path(d) / "demo")
        base = dict(os.environ, HF_HUB_OFFLINE="1")
        for label, env in (("torch's default threads", base), ("OMP_NUM_THREADS=1", dict(base, OMP_NUM_THREADS="1"))):
            ms = [s * 1e3 for s in per_process(campaign, processes, env)]
            rows.append({"figure": f"demo update, ms per process ({label}): slowest ÷ fastest process",
                         "median": max(ms) / min(ms), "min": None, "max": None, "runs": processes,
                         "target": "informative", "met": None, "command": COMMAND,
                         "note": "each fresh process's median over updates 6-60: "
                                 + ", ".join(f"{x:.1f}" for x in ms) + f" ms (median {statistics.median(ms):.1f})"})
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from bench.run import markdown

    n = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--processes=")), 5)
    print(markdown(run(n)))
