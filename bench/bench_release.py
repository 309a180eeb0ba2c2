"""``release_free_memory`` in a process that froze its own (``engine.tensors.freeze_process``) ÷ in one that did not.

Two fresh processes import what a run has imported by its start (torch, transformers, pilotrun's CLI and a Llama),
one of them then freezes it (as the zygote does after its imports, and the test session after its collection),
and each times the call before each of a few runs' model builds (a tiny Llama built and dropped between calls,
so every call has a run's garbage to collect). Without the freeze each call unfreezes and walks every object the
libraries made; with it, only what was made since.

Run: ``python bench/bench_release.py [--calls=5]``.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMMAND = "python bench/bench_release.py"
CHILD = """
import gc, json, sys, time
import torch, transformers
from transformers import LlamaConfig, LlamaForCausalLM
import pilotrun.cli.main
from pilotrun.engine.tensors import freeze_process
from pilotrun.probe.memory import release_free_memory
if sys.argv[2] == "frozen":
    freeze_process()
cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=300)
out = []
for _ in range(int(sys.argv[1])):
    model = LlamaForCausalLM(cfg)  # a run's model, dropped before the next run's release
    del model
    t0 = time.perf_counter()
    release_free_memory()
    out.append(time.perf_counter() - t0)
print(json.dumps({"seconds": out, "frozen": gc.get_freeze_count()}))
"""


def _child(calls: int, how: str) -> dict:
    from bench.run import child_env

    p = subprocess.run([sys.executable, "-c", CHILD, str(calls), how], capture_output=True, text=True,
                       env=child_env(), timeout=600, check=True, cwd=REPO)
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(calls: int = 5) -> list[dict]:
    plain, frozen = _child(calls, "plain"), _child(calls, "frozen")
    p, f = statistics.median(plain["seconds"]), statistics.median(frozen["seconds"])
    return [{"figure": "release_free_memory before a run, in a process that froze its imports ÷ in one that did not",
             "median": f / p, "min": min(frozen["seconds"]) / max(plain["seconds"]),
             "max": max(frozen["seconds"]) / min(plain["seconds"]), "runs": calls, "target": "informative",
             "met": None, "command": COMMAND,
             "note": f"median {f * 1000:.2f} ms against {p * 1000:.0f} ms; torch, transformers, pilotrun's CLI and "
                     f"a Llama imported ({frozen['frozen']:,} objects frozen); a tiny Llama built and dropped "
                     "before each call"}]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    from bench.run import markdown

    n = next((int(a.split("=", 1)[1]) for a in sys.argv if a.startswith("--calls=")), 5)
    print(markdown(run(n)))
