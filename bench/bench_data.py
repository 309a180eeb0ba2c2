"""Benchmarks of the data checks (issue: data inspect / leakage).

(a) records/s of the data-set-wide checks (every record through task.encode, then the checks) over
    records/s of a bare batched tokenizer pass over the same texts; target >= 0.5.
(b) leakage time at 1M records over leakage time at 100k; target <= 12 (10x the records).

A/B interleaved after a warm-up; medians. Run: ``python bench/bench_data.py`` (prints a Markdown table).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from conftest import SHARED_DATA  # noqa: E402 - the tests' rule: ../shared/data, $PILOTRUN_SHARED_DATA, /work/shared

BPE = SHARED_DATA / "tiny_bpe_tokenizer.json"
ALPACA = SHARED_DATA / "alpaca_tiny.json"
TINY = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4}


def _write_campaign(folder: Path, data: dict, tokenizer: str) -> Path:
    import yaml

    c = {"name": "bench", "task": "causal-lm", "model": {"config": TINY, "tokenizer": tokenizer},
         "data": {"prompt": "{instruction}\n{input}\n", "response": "output", "max_length": 512, **data}}
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(c), encoding="utf-8")
    return path


def synthetic(folder: Path, n: int, seed: int = 0) -> Path:
    """n instruction records in conversations of 1-4, split 80/10/10 by conversation into three .jsonl files."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i:x}" for i in range(20000)])
    sizes = rng.integers(1, 5, n)
    conv = np.repeat(np.arange(n), sizes)[:n]
    dest = rng.random(conv.max() + 1)
    words = vocab[rng.integers(0, vocab.size, (n, 30))]
    files = {s: open(folder / f"{s}.jsonl", "w", encoding="utf-8") for s in ("train", "validation", "test")}
    for i in range(n):
        split = "train" if dest[conv[i]] < 0.8 else "validation" if dest[conv[i]] < 0.9 else "test"
        row = words[i]
        files[split].write(json.dumps({"conversation_id": f"c{conv[i]}", "instruction": " ".join(row[:8]),
                                       "input": "", "output": " ".join(row[8:])}) + "\n")
    for f in files.values():
        f.close()
    return _write_campaign(folder, {s: f"{s}.jsonl" for s in files} | {"group_by": "conversation_id"}, "byte")


def _median_row(figure, values, target, met, command, note=""):
    return {"figure": figure, "median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": len(values), "target": target, "met": met(statistics.median(values)), "command": command,
            **({"note": note} if note else {})}


def bench_checks(tmp: Path, copies: int = 40, reps: int = 5) -> dict:
    from transformers import PreTrainedTokenizerFast

    from pilotrun.campaign import load_campaign
    from pilotrun.data.checks import run_checks
    from pilotrun.campaign.prepare import prepare

    tok = PreTrainedTokenizerFast(tokenizer_file=str(BPE), eos_token="<|endoftext|>")
    tok.save_pretrained(tmp / "bpe")
    recs = json.loads(ALPACA.read_text())
    rows = [dict(r, output=f"{r['output']} ({i})") for i, r in enumerate(recs * copies)]
    (tmp / "alpaca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    loaded = load_campaign(_write_campaign(tmp, {"train": "alpaca.jsonl"}, str(tmp / "bpe")))
    task = prepare(loaded, splits=()).task
    texts = [f"{r['instruction']}\n{r['input']}\n{r['output']}" for r in rows]

    def bare():
        for i in range(0, len(texts), 1024):
            tok(texts[i:i + 1024], add_special_tokens=False)["input_ids"]

    def checks():
        run_checks(task, loaded)

    ratios = []
    bare(), checks()  # warm-up
    for _ in range(reps):
        t0 = time.perf_counter()
        bare()
        tb = time.perf_counter() - t0
        t0 = time.perf_counter()
        checks()
        ratios.append(tb / (time.perf_counter() - t0))
    return _median_row(f"data checks records/s ÷ bare batched tokenizer records/s ({len(rows)} alpaca records, "
                       "BPE tokenizer)", ratios, ">= 0.5", lambda m: m >= 0.5, "python bench/bench_data.py")


def bench_leakage(tmp: Path, small: int = 100_000, large: int = 1_000_000, reps_large: int = 5) -> dict:
    from pilotrun.campaign import load_campaign
    from pilotrun.data.leakage import leakage_checks

    paths = {}
    for n in (small, large):
        folder = tmp / f"leak{n}"
        folder.mkdir()
        paths[n] = load_campaign(synthetic(folder, n))
    leakage_checks(paths[small])  # warm-up
    cpu, wall = {small: [], large: []}, {small: [], large: []}
    for _ in range(reps_large):  # interleaved: small, large, small, large ...
        for n in (small, large):
            t0, c0 = time.perf_counter(), time.process_time()
            leakage_checks(paths[n])
            cpu[n].append(time.process_time() - c0)
            wall[n].append(time.perf_counter() - t0)
    ratios = [b / a for a, b in zip(cpu[small], cpu[large])]
    wall_ratio = statistics.median(b / a for a, b in zip(wall[small], wall[large]))
    return _median_row(f"leakage CPU time at {large:,} ÷ at {small:,} records", ratios, "<= 12", lambda m: m <= 12,
                       "python bench/bench_data.py",
                       note=f"{reps_large} interleaved pairs; one 1M pass takes "
                            f"~{statistics.median(wall[large]):.0f} s; process CPU time because the cores are "
                            f"shared; median CPU s {statistics.median(cpu[small]):.2f} / "
                            f"{statistics.median(cpu[large]):.2f}; wall-clock ratio {wall_ratio:.1f}")


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-data-") as d:
        tmp = Path(d)
        return [bench_checks(tmp), bench_leakage(tmp)]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO))
    from bench.run import markdown  # the one results table, shared with `make bench`

    print(markdown(run()))
