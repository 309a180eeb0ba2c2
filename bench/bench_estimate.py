"""Benchmarks of the memory estimate and of fit's bisection (issue: memory estimate and fit).

(a) wall time of `estimate` (fake tensors, every phase) for a 1.1B-parameter Llama config; target <= 60 s.
(b) relative error of the estimated increase of each training/eval phase against the measured RSS
    increase, on CPU, for tiny models of several widths; target median <= 0.15. Measured in a fresh
    process with a fixed glibc mmap threshold (freed tensors go back to the OS, so RSS follows the
    live tensors) after a warm-up run.
(c) fit's bisection: probes used ÷ the bound ceil(log2(range)) + 1, over every range 1..64 and every
    fitting threshold; target max <= 1. Beside it, halving from the largest micro-batch: its probes,
    and how often it settles on a micro-batch smaller than the largest that fits.

Run: ``python bench/bench_estimate.py`` (prints a Markdown table).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LLAMA_1B = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
            "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
            "max_position_embeddings": 2048}
TINY = {"model_type": "llama", "vocab_size": 2048, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "tie_word_embeddings": False}
MEASURE = """
import json, sys
from pilotrun.campaign.load import load_campaign
from pilotrun.engine.loop import evaluate, make_state, run_update
from pilotrun.probe.memory import make_probe
from pilotrun.phases.worst import worst_case
from pilotrun.campaign.prepare import prepare

def phases(path):
    prep = prepare(load_campaign(path), splits=("train", "validation"))
    t, wc = prep.c.train, worst_case(prep, 1)
    state = make_state(prep.task.build_model(), t, n_train=len(prep.train), seed=0, total_updates=4)
    probe, out = make_probe("cpu", exact=False), {}  # RSS (the exact default would need track(model))
    for name in ("first_step", "steady_step", "eval_longest"):
        probe.start()
        if name == "eval_longest":
            evaluate(state, prep.task, wc["eval"], t.eval_batch)
        else:
            run_update(state, prep.task, wc["micro_batches"], max_grad_norm=t.max_grad_norm)
        r = probe.stop()
        out[name] = r["peak_allocated"] - r["baseline"]
    return out

phases(sys.argv[1])
print(json.dumps(phases(sys.argv[2])))
"""


def campaign(folder: Path, config: dict, *, max_length=128, micro_batch=4, accumulation=2, eval_batch=8) -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    recs = [{"instruction": "q " * (20 + (i * 7) % 60), "output": "a " * (20 + (i * 5) % 60)} for i in range(48)]
    (folder / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[:32]))
    (folder / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs[32:]))
    c = {"name": "bench", "task": "causal-lm", "model": {"config": config, "tokenizer": "byte"},
         "data": {"train": "train.jsonl", "validation": "validation.jsonl", "prompt": "instruction",
                  "response": "output", "max_length": max_length},
         "train": {"micro_batch": micro_batch, "accumulation": accumulation, "eval_batch": eval_batch,
                   "updates": 4, "save_every": None}}
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _row(figure, values, target, met, command, note=""):
    med = statistics.median(values)
    return {"figure": figure, "median": med, "min": min(values), "max": max(values), "runs": len(values),
            "target": target, "met": met(values), "command": command, **({"note": note} if note else {})}


def bench_wall_1b(tmp: Path, reps: int = 3) -> dict:
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    loaded = load_campaign(campaign(tmp / "big", LLAMA_1B, max_length=256))
    times, params = [], 0
    for _ in range(reps):
        t0 = time.perf_counter()
        r = estimate(loaded, device="cuda")
        times.append(time.perf_counter() - t0)
        params = r.data["params"]
    return _row(f"estimate wall time, {params / 1e9:.2f}B Llama config, 4×2 micro-batches of 256 tokens (s)",
                times, "<= 60", lambda v: statistics.median(v) <= 60, "python bench/bench_estimate.py")


def bench_rss_error(tmp: Path) -> dict:
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    script = tmp / "measure.py"
    script.write_text(MEASURE)
    warm = campaign(tmp / "warm", TINY)
    errors, detail = [], []
    for width in (256, 384, 512):
        cfg = dict(TINY, hidden_size=width, intermediate_size=2 * width, num_attention_heads=width // 64,
                   num_key_value_heads=width // 64)
        path = campaign(tmp / f"w{width}", cfg)
        done = subprocess.run([sys.executable, str(script), str(warm), str(path)], capture_output=True, text=True,
                              env={"MALLOC_MMAP_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
                                   "PYTHONPATH": str(REPO / "src")}, timeout=600, check=True)
        measured = json.loads(done.stdout.strip().splitlines()[-1])
        rows = {r["phase"]: r for r in estimate(load_campaign(path), device="cpu").data["phases"]}
        for name, got in measured.items():
            est = rows[name]["peak_allocated"] - rows[name]["baseline"]
            errors.append(abs(got - est) / est)
            detail.append(f"w{width} {name} {est / 2**20:.1f}/{got / 2**20:.1f} MiB")
    return _row("|measured − estimated| ÷ estimated phase increase, CPU RSS, tiny Llamas 256/384/512 wide",
                errors, "median <= 0.15", lambda v: statistics.median(v) <= 0.15, "python bench/bench_estimate.py",
                note="estimated/measured: " + "; ".join(detail))


def _halving(m: int, fits) -> tuple[int | None, int]:
    probes, x = 0, m // 2
    while x >= 1:
        probes += 1
        if fits(x):
            return x, probes
        x //= 2
    return None, probes


def bench_probes() -> list[dict]:
    from pilotrun.rehearsal.memory.fit_rules import probe_bound
    from pilotrun.rehearsal.memory.fit_probe import largest_fitting

    ratios, halving_probes, bisect_probes, smaller = [], [], [], 0
    cases = 0
    for m in range(2, 65):
        cands = list(range(1, m))
        for threshold in range(0, m):
            def fits(x):
                return x <= threshold

            best, tried = largest_fitting(cands, fits)
            ratios.append(len(tried) / probe_bound(len(cands)))
            bisect_probes.append(len(tried))
            found, n = _halving(m, fits)
            halving_probes.append(n)
            smaller += found is not None and best is not None and found < best
            cases += 1
    return [_row("fit bisection probes ÷ bound ceil(log2(range)) + 1, ranges 1..63, every threshold", ratios,
                 "max <= 1", lambda v: max(v) <= 1, "python bench/bench_estimate.py",
                 note=f"{cases} cases; median probes: bisection {statistics.median(bisect_probes)}, halving "
                      f"{statistics.median(halving_probes)}"),
            _row("halving from the largest micro-batch: probes per case (for comparison)", halving_probes,
                 "informative", lambda v: True, "python bench/bench_estimate.py",
                 note=f"halving settles on a smaller micro-batch than the largest that fits in {smaller} of "
                      f"{cases} cases ({smaller / cases:.0%}); its probes are bounded by log2(m) but it answers "
                      "a different question")]


def run() -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-estimate-") as d:
        tmp = Path(d)
        return [bench_wall_1b(tmp), bench_rss_error(tmp), *bench_probes()]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO))
    from bench.run import markdown  # the one results table, shared with `make bench`

    print(markdown(run()))
