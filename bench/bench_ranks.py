"""The start of two gloo ranks: forked from the zygote (engine/fresh.start_processes) against spawned.

One fresh process starts a zygote, waits for its imports, then launches two ranks of a function that does nothing
(``engine.distributed.launch``: process group up, the function, process group down), alternating forked and
spawned (``spawn=True``, how the pilot's and train's ranks start) so that both meet the same minutes. Forked is
how the resume check's FSDP ranks start inside `all` and `resume`, and the launches the test suite makes.

Run: ``python bench/bench_ranks.py [--pairs=5]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python bench/bench_ranks.py"
CHILD = """
import json, sys, time
import transformers.modeling_utils  # what a verb has imported by then (the zygote compares the environments)
from pilotrun.engine import distributed, fresh
fresh.start()
deadline = time.monotonic() + 300
while fresh._ZYGOTE.ready_env is None and time.monotonic() < deadline:
    fresh._imported(fresh._ZYGOTE)
    time.sleep(0.05)
out = {"forked": [], "spawned": []}
for _ in range(int(sys.argv[1])):
    for how in ("forked", "spawned"):
        t0 = time.perf_counter()
        distributed.launch(distributed.world_rank, 2, spawn=how == "spawned")
        out[how].append(time.perf_counter() - t0)
fresh.stop()
print(json.dumps(out))
"""


def run(pairs: int = 5) -> list[dict]:
    from bench.run import child_env

    env = child_env()
    env.pop("PILOTRUN_FRESH", None)
    p = subprocess.run([sys.executable, "-c", CHILD, str(pairs)], capture_output=True, text=True, env=env,
                       timeout=600, check=True, cwd=REPO)
    s = json.loads(p.stdout.strip().splitlines()[-1])
    ratios = [f / sp for f, sp in zip(s["forked"], s["spawned"])]
    return [{"figure": "two-rank launch forked from the zygote ÷ spawned (a function that does nothing)",
             "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "runs": pairs,
             "target": "informative", "met": None, "command": COMMAND,
             "note": "forked " + ", ".join(f"{x:.2f}" for x in s["forked"]) + " s; spawned "
                     + ", ".join(f"{x:.2f}" for x in s["spawned"]) + " s (alternated in one process)"}]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from bench.run import markdown

    n = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--pairs=")), 5)
    print(markdown(run(n)))
