"""The fake-tensor estimate against CUDA's own counters, for machines that have a GPU.

For each config (tiny to ~1B Llama, fp32 and bf16-mixed, with and without checkpointing): the
estimate for device cuda, then the same phases run for real on the GPU through the loop's
functions (``make_state``, ``run_update``, ``evaluate``) inside the CUDA probe, one fresh model per
config. Prints, per phase, estimated and measured peak allocated and reserved and the relative error
of the peak allocated. The CUDA context is in neither number (the probe reads torch's allocator).

Run: ``python bench/gpu_estimate.py [--quick] [--json OUT]``; exits 0 with a note when there is no GPU.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_estimate import LLAMA_1B, TINY, campaign  # noqa: E402

PHASES = ("load", "first_step", "steady_step", "eval_longest")
CONFIGS = [
    ("tiny-512 fp32", dict(TINY, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                           num_key_value_heads=8, vocab_size=8192), {}),
    ("tiny-512 bf16-mixed", dict(TINY, hidden_size=512, intermediate_size=1024, num_attention_heads=8,
                                 num_key_value_heads=8, vocab_size=8192), {"train.precision": "bf16-mixed"}),
    ("1.1B fp32", LLAMA_1B, {}),
    ("1.1B bf16 + checkpointing", LLAMA_1B, {"model.dtype": "bfloat16", "model.gradient_checkpointing": True}),
]


def measured(loaded) -> dict:
    import gc

    import torch

    from pilotrun.engine.loop import evaluate, make_state, run_update
    from pilotrun.probe.memory import make_probe
    from pilotrun.phases.worst import worst_case
    from pilotrun.campaign.prepare import prepare

    device = torch.device("cuda", 0)
    gc.collect()
    torch.cuda.empty_cache()
    prep = prepare(loaded, splits=("train", "validation"))
    t, wc = prep.c.train, worst_case(prep, 1)
    probe, out = make_probe(device), {}
    probe.start()
    model = prep.task.build_model().to(device)
    state = make_state(model, t, n_train=len(prep.train), seed=0, total_updates=4, device=device)
    out["load"] = probe.stop()
    for name in PHASES[1:]:
        probe.start()
        if name == "eval_longest":
            evaluate(state, prep.task, wc["eval"], t.eval_batch)
        else:
            run_update(state, prep.task, wc["micro_batches"], max_grad_norm=t.max_grad_norm)
        out[name] = probe.stop()
    del state, model
    gc.collect()
    torch.cuda.empty_cache()
    return out


def compare(quick: bool) -> list[dict]:
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    rows = []
    with tempfile.TemporaryDirectory(prefix="pilotrun-gpu-estimate-") as d:
        for i, (label, cfg, overrides) in enumerate(CONFIGS[:2] if quick else CONFIGS):
            loaded = load_campaign(campaign(Path(d) / f"c{i}", cfg, max_length=256))
            if overrides:
                loaded = loaded.with_overrides(overrides)
            est = {r["phase"]: r for r in estimate(loaded, device="cuda").data["phases"]}
            got = measured(loaded)
            for name in PHASES:
                e, m = est[name], got[name]
                rows.append({"config": label, "phase": name, "est_peak_allocated": e["peak_allocated"],
                             "cuda_peak_allocated": m["peak_allocated"], "est_peak_reserved": e["peak_reserved"],
                             "cuda_peak_reserved": m["peak_reserved"],
                             "rel_error_allocated": (e["peak_allocated"] - m["peak_allocated"]) / m["peak_allocated"]})
    return rows


def markdown(rows: list[dict]) -> str:
    mib = lambda n: f"{n / 2**20:.1f}"  # noqa: E731
    out = ["| config | phase | est. alloc MiB | CUDA alloc MiB | est. reserved MiB | CUDA reserved MiB | error |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['config']} | {r['phase']} | {mib(r['est_peak_allocated'])} | {mib(r['cuda_peak_allocated'])}"
                   f" | {mib(r['est_peak_reserved'])} | {mib(r['cuda_peak_reserved'])} | "
                   f"{r['rel_error_allocated']:+.1%} |")
    errs = [abs(r["rel_error_allocated"]) for r in rows]
    out.append(f"\nmedian |error| of peak allocated: {statistics.median(errs):.1%}, max {max(errs):.1%}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import torch

    if not torch.cuda.is_available():
        print("no CUDA device here: this script compares the estimate with CUDA's counters on a GPU machine")
        sys.exit(0)
    result = compare("--quick" in sys.argv)
    print(markdown(result))
    if "--json" in sys.argv:
        Path(sys.argv[sys.argv.index("--json") + 1]).write_text(json.dumps(result, indent=2))
