"""Unknown tokens: the share of prompt and target tokens that are the tokenizer's unk id, per split.

A byte-level BPE (GPT-2, Llama 3) or a SentencePiece model with byte fallback (Llama 2, Mistral) has no
unknown token in practice: every string has a spelling. A WordPiece or word-level vocabulary maps what it
lacks to one id; on text of its own language and domain that stays near 0.01% (BERT's vocabulary on English
Wikipedia). A share of ``WARN_SHARE`` (0.5%, fifty times that) says the vocabulary misses a script, a
language or the data's symbols; at ``FAIL_SHARE`` (5%, one token in twenty: a word in every sentence or
two) the model cannot read or write a real part of the data — every unknown input looks the same to it,
and a target that is unk is no answer — so no rental should train on it.
"""

from __future__ import annotations

import numpy as np

from pilotrun.verdicts import Check
from pilotrun.tasks.base import IGNORE

WARN_SHARE = 0.005
FAIL_SHARE = 0.05


def unk_id(task) -> int | None:
    """The task's unknown-token id: its own ``unk_id``, else its tokenizer's; None when it has none."""
    v = getattr(task, "unk_id", None)
    tok = getattr(task, "tokenizer", None)
    if v is None and tok is not None:
        v = getattr(tok, "unk_token_id", None)
    return int(v) if v is not None else None


def tokenizer_name(task) -> str:
    tok = getattr(task, "tokenizer", None)
    if tok is None:
        return type(task).__name__
    c = getattr(task, "c", None)
    spec = getattr(getattr(c, "model", None), "tokenizer", None) or getattr(getattr(c, "model", None), "path", None)
    where = spec or getattr(tok, "name_or_path", "") or "?"
    return f"{type(tok).__name__} ({where})"


def own_positions(task, unk: int | None) -> tuple[int, int] | None:
    """When the unk id is also a special token the task adds itself (GPT-2, Pythia and OPT use one
    ``<|endoftext|>`` for eos, bos and unk; a tokenizer without a pad pads with it): the special tokens the
    task puts before and after a text, (leading, trailing), whose positions are not counted as unknown
    (with the EOS that ends each target). None when the unk id is no such token: every occurrence counts."""
    tok = getattr(task, "tokenizer", None)
    if unk is None or tok is None:
        return None
    own = {getattr(tok, f"{n}_token_id", None) for n in ("eos", "bos", "pad", "cls", "sep")}
    own |= {getattr(task, n, None) for n in ("eos", "pad", "bos")}
    if unk not in own:
        return None
    lead = getattr(task, "lead", None)
    if lead is not None:  # causal-lm: the leading specials, then texts tokenized without specials
        return len(lead), 0
    try:
        kwargs = dict(task.tokenize_kwargs()) if hasattr(task, "tokenize_kwargs") else {}
        plain = list(tok("Hello", add_special_tokens=False)["input_ids"])
        full = list(tok("Hello", **{**kwargs, "add_special_tokens": kwargs.get("add_special_tokens", True)})
                    ["input_ids"])
    except Exception:
        return 0, 0
    for i in range(len(full) - len(plain) + 1):
        if full[i: i + len(plain)] == plain:
            return i, len(full) - len(plain) - i
    return 0, 0


def counts(e, unk: int, own: tuple[int, int] | None = None) -> tuple[int, int, int, int]:
    """(prompt unk, prompt tokens, target unk, target tokens) of one example; a one-label example is all prompt.

    ``own`` (``own_positions``): the unk id is a special token the task adds, so its occurrences at the
    task's own positions (the leading and trailing specials, the EOS that ends each target run) are not counted."""
    ids = np.asarray(e.input_ids, dtype=np.int64)
    lab = np.asarray(e.labels, dtype=np.int64)
    hit = ids == unk
    if own is not None:
        lead, trail = own
        hit[:lead] = False
        if trail and lab.size != ids.size:
            hit[ids.size - trail:] = False
    if lab.size != ids.size:
        return int(hit.sum()), int(ids.size), 0, 0
    tgt = lab != IGNORE
    # the model reads input_ids; the targets are the labels (next-token ids at the trained positions)
    tgt_hit = lab == unk
    if own is not None:
        ends = tgt & ~np.append(tgt[1:], False)  # the last position of each run of targets: the task's EOS
        tgt_hit &= ~ends
        hit &= ~ends  # the same EOS read as an input
    return int((hit & ~tgt).sum()), int((~tgt).sum()), int((tgt_hit & tgt).sum()), int(tgt.sum())


class UnknownScan:
    """Per split, unknown prompt and target tokens; ``checks()`` gives a verdict per split above WARN_SHARE."""

    def __init__(self, task):
        self.unk = unk_id(task)
        self.own = own_positions(task, self.unk)
        self.name = tokenizer_name(task)
        self.totals: dict[str, np.ndarray] = {}
        self.first: dict[str, str] = {}

    def add(self, split: str, e) -> None:
        if self.unk is None:
            return
        c = np.asarray(counts(e, self.unk, self.own))
        t = self.totals.setdefault(split, np.zeros(4, dtype=np.int64))
        t += c
        if (c[0] or c[2]) and split not in self.first:
            self.first[split] = e.rid

    def shares(self, split: str) -> tuple[float, float]:
        pu, pn, tu, tn = self.totals.get(split, np.zeros(4))
        return (pu / pn if pn else 0.0, tu / tn if tn else 0.0)

    def checks(self) -> list[Check]:
        out = []
        for split in self.totals:
            prompt, target = self.shares(split)
            top = max(prompt, target)
            if top < WARN_SHARE:
                continue
            pu, pn, tu, tn = (int(x) for x in self.totals[split])
            verdict = "fail" if top >= FAIL_SHARE else "warn"
            parts = [f"{pu} of {pn} prompt tokens ({prompt:.1%})"] + ([f"{tu} of {tn} target tokens ({target:.1%})"]
                                                                         if tn else [])
            out.append(Check("unknown-tokens", verdict,
                             f"{' and '.join(parts)} are the unknown token (id {self.unk}) of the tokenizer "
                             f"{self.name}, e.g. {self.first.get(split, '?')}; above {FAIL_SHARE:.0%} the model "
                             f"cannot read or write that part of the data (healthy: under {WARN_SHARE:.1%}) — use a "
                             "tokenizer whose vocabulary covers the data (byte-level BPE has no unknown tokens), "
                             "or check model.tokenizer", split,
                             {"prompt_share": prompt, "target_share": target, "unk_id": self.unk,
                              "tokenizer": self.name}))
        return out
