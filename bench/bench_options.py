"""Benchmark of the options table at scale (issue 23): wall time of `estimate --options` for a 70B and a
405B Llama config (decoder layers counted from traces of 2, 4 and 6 layers); target <= 10 s each on 2 cores (issue 34; the estimate issue asked <= 30).

A warm-up first, untimed: the table of a small Llama (``WARM_UP``), which imports what the timed tables use (torch,
transformers' Llama, torch's fake tensors, peft). Before stop 61 the 70B table, run first, paid those imports
alone when the module ran by itself (13.2 s against 7.6 s warm) and not under ``bench/run.py``, whose earlier
modules had imported them; the warm-up's wall is in the notes (a fresh ``estimate --options`` pays it once).

Run: ``python bench/bench_options.py`` (prints a Markdown table). Run it alone: it holds the cores.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA = {"model_type": "llama", "vocab_size": 128256, "num_attention_heads": 64, "num_key_value_heads": 8,
         "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}
CONFIGS = {"70B": dict(LLAMA, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80),
           "405B": dict(LLAMA, hidden_size=16384, intermediate_size=53248, num_hidden_layers=126,
                        num_attention_heads=128)}
# the warm-up's model: the timed ones' architecture at a size whose table is quick, and no config the timed tables
# trace (nothing of theirs is kept for them)
WARM_UP = dict(LLAMA, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=2)


def campaign(folder: Path, config: dict) -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    recs = [{"instruction": "q " * (20 + (i * 7) % 60), "output": "a " * (20 + (i * 5) % 60)} for i in range(80)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:64]))
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[64:]))
    c = {"name": "bench-options", "task": "causal-lm", "model": {"config": config, "tokenizer": "byte",
                                                                "dtype": "bfloat16"},
         "data": {"train": "train.jsonl", "validation": "validation.jsonl", "prompt": "instruction",
                  "response": "output", "max_length": 2048},
         "train": {"micro_batch": 1, "accumulation": 8, "eval_batch": 4, "updates": 100, "eval_every": 50,
                   "precision": "bf16-true"},
         "hardware": {"memory_per_gpu": "80GiB"}}
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def run() -> list[dict]:
    from pilotrun.campaign.load import load_campaign
    from pilotrun.sheet.options import options_table

    rows = []
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-options-") as d:
        t0 = time.perf_counter()
        options_table(load_campaign(campaign(Path(d) / "warm-up", WARM_UP)))
        warm_up = time.perf_counter() - t0
        for name, cfg in CONFIGS.items():
            loaded = load_campaign(campaign(Path(d) / name, cfg))
            t0 = time.perf_counter()
            table = options_table(loaded)
            wall = time.perf_counter() - t0
            rec = table["recommended"]
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            rows.append({"figure": f"options table wall time, {table['params'] / 1e9:.1f}B Llama config (s)",
                         "median": wall, "min": wall, "max": wall, "runs": 1, "target": "<= 10",
                         "met": wall <= 10, "command": "python bench/bench_options.py",
                         "note": (f"{len(table['rows'])} rows; recommended {rec['label']} on {rec['count']} × "
                                  f"{rec['name']}" if rec else "no option keeps the question")
                         + (f"; load average {load:.1f} on {os.cpu_count()} cores" if load is not None else "")
                         + f"; after an untimed warm-up, a small Llama's table: {warm_up:.1f} s, the libraries' "
                           "imports in it"})
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO))
    from bench.run import markdown

    print(markdown(run()))
