"""A deterministic synthetic instruction data set with conversation ids.

Task families a tiny model can learn in a minute on a CPU: reverse a word, add two numbers, change
case, repeat a word. Each conversation holds several turns of one family; splits are made by
conversation so no conversation crosses splits.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pilotrun.campaign.load import dump_yaml
from pilotrun.errors import BadInput
from pilotrun.journal.files import atomic_write_text

CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"


def _word(rng: random.Random) -> str:
    """A pronounceable pseudo-word of 3 syllables: enough variety that records rarely repeat."""
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(3))


def _turn(rng: random.Random, family: str) -> tuple[str, str]:
    w = _word(rng)
    if family == "reverse":
        return f"reverse {w}", w[::-1]
    if family == "upper":
        return f"upper {w}", w.upper()
    if family == "repeat":
        return f"repeat {w}", f"{w} {w}"
    a, b = rng.randrange(1000), rng.randrange(1000)
    return f"add {a} {b}", str(a + b)


FAMILIES = ("reverse", "upper", "repeat", "add")


def conversations(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        family = FAMILIES[i % len(FAMILIES)]
        cid = f"conv-{i:05d}"
        turns = []
        for t in range(rng.randint(2, 4)):
            instruction, output = _turn(rng, family)
            turns.append({"conversation_id": cid, "turn": t, "family": family,
                          "instruction": instruction, "output": output})
        out.append(turns)
    return out


def split_by_conversation(convs, ratios=(0.8, 0.1, 0.1), seed: int = 0) -> dict[str, list[dict]]:
    order = list(range(len(convs)))
    random.Random(seed + 1).shuffle(order)
    n_train = int(ratios[0] * len(convs))
    n_val = int(ratios[1] * len(convs))
    parts = {"train": order[:n_train], "validation": order[n_train:n_train + n_val],
             "test": order[n_train + n_val:]}
    return {split: [rec for i in sorted(idx) for rec in convs[i]] for split, idx in parts.items()}


DEMO_MODEL = {
    "model_type": "llama", "vocab_size": 384, "hidden_size": 128, "intermediate_size": 344,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
    "max_position_embeddings": 256, "tie_word_embeddings": False,
}


def demo_campaign() -> dict:
    return {
        "name": "demo-tiny-sft",
        "seed": 0,
        "task": "causal-lm",
        "model": {"path": None, "config": DEMO_MODEL, "tokenizer": "byte", "dtype": "float32"},
        "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "test": "data/test.jsonl",
                 "prompt": "Q: {instruction}\nA: ", "response": "output", "group_by": "conversation_id",
                 "max_length": 64},
        "train": {"micro_batch": 8, "accumulation": 2, "precision": "fp32", "optimizer": "adamw", "lr": 3.0e-3,
                  "weight_decay": 0.0, "schedule": "cosine", "warmup": 5, "max_grad_norm": 1.0, "updates": 200,
                  "eval_every": 25, "eval_batch": 32, "save_every": 100,
                  "stop": {"on_nan": True, "diverge_factor": 3.0, "patience": None}},
        "plan": {"metric": "val_loss", "goal": "minimize", "control": {"train.lr": 3.0e-3},
                 "variants": [{"train.lr": 1.0e-3}, {"train.lr": 1.0e-2}], "seeds": [0, 1]},
        "hardware": {"memory_per_gpu": "24GiB", "gpus": 1, "rental_days": [3, 7, 30], "reserve": 0.2},
    }


HEADER = ("# pilotrun demo campaign: a ~0.9M-parameter Llama built from a config, the built-in byte\n"
          "# tokenizer, and a synthetic instruction data set split by conversation.\n")


def write_demo(out: str | Path, n_conversations: int = 320) -> Path:
    """Write campaign.yaml and data/{train,validation,test}.jsonl into out; returns the campaign path. A folder
    holding a campaign the demo did not write, or data files of its names with other records beside no demo
    campaign, is refused before anything is written: ``demo --out my-project`` replaced the user's own."""
    out = Path(out)
    splits = split_by_conversation(conversations(n_conversations))
    files = {out / "data" / f"{split}.jsonl": "".join(json.dumps(r) + "\n" for r in records)
             for split, records in splits.items()}
    path = out / "campaign.yaml"
    _nothing_of_the_users(path, files)
    for target, text in files.items():
        atomic_write_text(target, text)
    atomic_write_text(path, HEADER + dump_yaml(demo_campaign()))
    return path


def _nothing_of_the_users(path: Path, files: dict[Path, str]) -> None:
    fix = "give --out a new or empty folder (the demo writes campaign.yaml and data/*.jsonl there)"
    if path.exists():
        try:
            ours = path.read_text(encoding="utf-8", errors="replace").startswith(HEADER.splitlines()[0])
        except OSError:
            ours = False
        if not ours:
            raise BadInput("holds a campaign.yaml the demo did not write; the demo would replace it", where=str(path),
                           fix=fix)
        return  # the demo's own folder: its data are the demo's too
    for target, text in files.items():
        try:
            theirs = target.exists() and target.read_text(encoding="utf-8", errors="replace") != text
        except OSError:
            theirs = True
        if theirs:
            raise BadInput("holds a data file the demo did not write; the demo would replace it", where=str(target),
                           fix=fix)
