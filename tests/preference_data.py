"""Preference pairs from ../shared/data's Stack Exchange records (``response_j`` the better answer, ``response_k`` the
worse), a tiny Llama with the real byte-level BPE tokenizer (ChatML template), and campaigns over them."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import SHARED_DATA, TINY_LLAMA, write_campaign, write_jsonl

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
BPE_LLAMA = dict(TINY_LLAMA, vocab_size=2048, max_position_embeddings=4096)


def stack_exchange() -> list[dict]:
    """The 25 records: question, response_j (better), response_k (worse); 8 distinct questions."""
    return json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text(encoding="utf-8"))


def short_pairs(chars: int = 240) -> list[dict]:
    """Each record's question cut to its first line and both answers to ``chars`` characters: pairs a tiny model
    trains on in milliseconds (the answers still differ from their first characters)."""
    out = []
    for i, r in enumerate(stack_exchange()):
        out.append({"id": i, "question": r["question"].strip().splitlines()[0][:160],
                    "response_j": r["response_j"][:chars], "response_k": r["response_k"][:chars]})
    return out


def by_question(records: list[dict]) -> tuple[list[dict], list[dict]]:
    """Train and validation with no question in both: the last two distinct questions' records are validation."""
    questions = list(dict.fromkeys(r["question"] for r in records))
    held = set(questions[-2:])
    return [r for r in records if r["question"] not in held], [r for r in records if r["question"] in held]


def bpe_tokenizer(folder: Path, template: str | None = CHATML) -> Path:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>")
    if template:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return folder


def llama_folder(folder: Path, seed: int = 0) -> Path:
    """A tiny Llama saved with save_pretrained beside the BPE tokenizer: a model.path as a user has one."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(BPE_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder, safe_serialization=True)
    bpe_tokenizer(folder)
    return folder


def preference_campaign(folder: Path, train: list[dict], validation: list[dict] | None = None, *,
                        model: dict | None = None, **overrides) -> Path:
    """A preference campaign over question / response_j (chosen) / response_k (rejected)."""
    write_jsonl(folder / "data" / "train.jsonl", train)
    if validation:
        write_jsonl(folder / "data" / "validation.jsonl", validation)
    c = {"name": "pref", "seed": 0, "task": "preference",
         "model": model or {"config": dict(BPE_LLAMA), "tokenizer": str(bpe_tokenizer(folder / "tok"))},
         "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl" if validation else None,
                  "prompt": "Question: {question}\n\nAnswer: ", "chosen": "response_j", "rejected": "response_k",
                  "max_length": 512},
         "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-3, "updates": 4, "eval_every": 2,
                   "save_every": None, "eval_batch": 4},
         "plan": {"seeds": [0]}, "hardware": {"memory_per_gpu": "24GiB"}}
    for key, value in overrides.items():
        section, _, leaf = key.partition("__")
        if leaf:
            c.setdefault(section, {})[leaf] = value
        else:
            c[key] = value
    return write_campaign(folder, c)
