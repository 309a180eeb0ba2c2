"""The cost of dispatching a sweep to Ray: a 4-run sweep (2 arms × 2 seeds of the demo) on a 1-node local Ray
cluster ÷ the same sweep run locally, each a fresh `pilotrun sweep` process, wall time, interleaved, median
of 3. Goal ≤ 1.3.

The cluster is started once (as a user's would be already running) on the loopback address with as many
CPUs as this machine has; its start-up is not counted. Each Ray run asks one CPU, so runs go side by side
where the local sweep runs them one after another; the local sweep reuses one encoding of the data for
every run, each Ray worker process encodes once.

Run: ``python bench/bench_ray.py [--quick]``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "python bench/bench_ray.py"


def _campaign(tmp: Path, updates: int) -> Path:
    import yaml

    from pilotrun.demo.synth import write_demo

    path = write_demo(tmp / "demo", n_conversations=200)
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e-3}], seeds=[0, 1])
    c["train"].update(updates=updates, eval_every=updates // 2, save_every=None)
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _sweep(campaign: Path, home: Path, *extra: str) -> float:
    exe = Path(sys.executable).with_name("pilotrun")
    t0 = time.perf_counter()
    done = subprocess.run([str(exe), "sweep", str(campaign), "--home", str(home), *extra], capture_output=True,
                          text=True, timeout=1800, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 1):
        raise RuntimeError(f"pilotrun sweep {' '.join(extra)} exited {done.returncode}: {done.stderr[-400:]}")
    return wall


def run(quick: bool = False) -> list[dict]:
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    try:
        from ray.cluster_utils import Cluster
    except ImportError:
        return [{"figure": "sweep on a 1-node Ray cluster ÷ local", "median": None, "runs": 0, "target": "≤ 1.3",
                 "met": None, "command": COMMAND, "note": "skipped: Ray is not installed (pilotrun[ray])"}]
    reps = 2 if quick else 3
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": os.cpu_count() or 2})
    ratios, local, remote = [], [], []
    try:
        with tempfile.TemporaryDirectory(prefix="pilotrun-bench-ray-") as tmp:
            campaign = _campaign(Path(tmp), updates=20 if quick else 60)
            _sweep(campaign, Path(tmp) / "warm", "--ray", cluster.address)  # workers and imports warm, as on a cluster in use
            for i in range(reps):
                a = _sweep(campaign, Path(tmp) / f"local-{i}")
                b = _sweep(campaign, Path(tmp) / f"ray-{i}", "--ray", cluster.address)
                local.append(a)
                remote.append(b)
                ratios.append(b / a)
    finally:
        cluster.shutdown()
    med = statistics.median(ratios)
    return [{"figure": "sweep of 4 runs on a 1-node Ray cluster ÷ the same sweep locally (wall)", "median": med,
             "min": min(ratios), "max": max(ratios), "runs": reps, "target": "≤ 1.3", "met": med <= 1.3,
             "command": COMMAND,
             "note": f"local sweeps {statistics.median(local):.1f} s, Ray sweeps {statistics.median(remote):.1f} s "
                     f"(medians); {os.cpu_count()} CPUs, one per run"}]


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    for row in run(quick="--quick" in sys.argv):
        print(row)
