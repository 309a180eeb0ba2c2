"""Preference pairs: the checks a pair of answers needs beyond what each of its sequences needs.

Each pair's two sequences go through ``checks.SplitScan`` as any causal-lm example does (prompt in the loss, EOS,
padding, lengths); ``PairScan`` adds what only a pair can get wrong:

- identical: the chosen answer is the rejected one, token for token. The pair teaches nothing (its DPO loss is
  log 2 whatever the weights) and dilutes its batch; a share of IDENTICAL_FAIL_SHARE or more fails, fewer warn.
- vanished: data.max_length cuts a half's whole answer away (the prompt fills it): the pair leaves the loss.
- difference cut: both answers keep tokens, but what is kept of them is the same and the difference lies past the
  cut: the worst silent one — the pair trains like an identical one, and nothing else says so.
- partly cut: an answer loses its end, the difference stays: a warning, as causal-lm's.
- duplicates: a pair that repeats another train pair (both answers).

``reference_preference``: which answer the starting model (the reference at the start of training) already finds
likelier, per token; when it is the rejected one on most pairs, chosen and rejected are likely swapped (warn).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

from pilotrun.tasks.base import IGNORE
from pilotrun.tasks.preference import halves
from pilotrun.verdicts import FEW, Check

IDENTICAL_FAIL_SHARE = 0.05  # one pair in twenty that trains nothing is a data set built wrong, not noise
SWAPPED_SHARE = 2 / 3  # the starting model prefers the rejected answer of this share of the sampled pairs
SWAP_SAMPLE = 32  # pairs the starting model reads for the swapped-pairs check
SWAP_MIN = 8  # fewer pairs sampled say nothing about a data set's direction


def _ids(rids: list[str]) -> str:
    return ", ".join(rids[:FEW]) + (" …" if len(rids) > FEW else "")


def _answer(ids, labels) -> list[int]:
    return [t for t, y in zip(ids, labels) if y != IGNORE]


class PairScan:
    """Per split, the pairs' own defects; ``add`` sees each (record, encoded pair) once."""

    def __init__(self, max_length: int):
        self.max_length = max_length
        self.n = 0
        self.identical: list[str] = []
        self.vanished: list[tuple[str, str]] = []  # (rid, which halves)
        self.difference_cut: list[tuple[str, int]] = []  # (rid, prompt + answers' common start + 1: the length needed)
        self.partly: list[tuple[str, int]] = []  # (rid, answer tokens lost, the larger half's)
        self.digest: list[int] = []
        self.rids: list[str] = []

    def add(self, record, e) -> None:
        self.n += 1
        self.rids.append(e.rid)
        chosen, rejected = halves(e)
        c_ans, r_ans = _answer(chosen.input_ids, chosen.labels), _answer(rejected.input_ids, rejected.labels)
        self.digest.append(int.from_bytes(hashlib.blake2b(
            np.asarray(chosen.input_ids + [-1] + chosen.labels + [-2] + rejected.input_ids + [-3] + rejected.labels,
                       dtype=np.int64).tobytes(), digest_size=8).digest(), "little"))
        if e.meta.get("identical"):
            self.identical.append(e.rid)
            return
        gone = [name for name, ans, full in (("chosen", c_ans, chosen.target_len_full),
                                             ("rejected", r_ans, rejected.target_len_full)) if full and not ans]
        if gone:
            self.vanished.append((e.rid, " and ".join(gone)))
            return
        cut_c = chosen.target_len_full - len(c_ans)
        cut_r = rejected.target_len_full - len(r_ans)
        if c_ans == r_ans and (cut_c or cut_r):
            common = e.meta.get("common_start", len(c_ans))
            self.difference_cut.append((e.rid, e.meta.get("prompt_tokens", e.prompt_len) + common + 1))
        elif cut_c or cut_r:
            self.partly.append((e.rid, max(cut_c, cut_r)))

    def checks(self, split: str) -> list[Check]:
        out, n = [], max(self.n, 1)
        if self.identical:
            share = len(self.identical) / n
            out.append(Check("identical-pair", "fail" if share >= IDENTICAL_FAIL_SHARE else "warn",
                             f"{len(self.identical)} of {self.n} pairs ({share:.1%}) have a chosen answer identical to "
                             f"the rejected one, e.g. {_ids(self.identical)}: such a pair teaches no preference (its "
                             "loss is the same whatever the weights) — remove them, or fix how the pairs were built",
                             split, {"count": len(self.identical), "share": share, "ids": self.identical[:FEW]}))
        if self.vanished:
            rids = [r for r, _ in self.vanished]
            out.append(Check("pair-truncation", "fail",
                             f"{len(rids)} of {self.n} pairs lose a whole answer to data.max_length={self.max_length} "
                             f"(the prompt fills it), e.g. {rids[0]} ({self.vanished[0][1]}): they leave the loss; "
                             "raise data.max_length or shorten the prompts", split,
                             {"count": len(rids), "ids": rids[:FEW]}))
        if self.difference_cut:
            rids = [r for r, _ in self.difference_cut]
            need = max(k for _, k in self.difference_cut)
            out.append(Check("pair-truncation", "fail",
                             f"{len(rids)} of {self.n} pairs differ only past data.max_length={self.max_length}: what "
                             f"is kept of the chosen and the rejected answer is the same, e.g. {_ids(rids)}: each trains "
                             f"like an identical pair, silently; data.max_length={need} keeps every difference", split,
                             {"count": len(rids), "ids": rids[:FEW], "keep_difference": need}))
        if self.partly:
            worst = max(k for _, k in self.partly)
            out.append(Check("pair-truncation", "warn",
                             f"{len(self.partly)} of {self.n} pairs have an answer cut by data.max_length="
                             f"{self.max_length} (the largest loses {worst} tokens), e.g. "
                             f"{_ids([r for r, _ in self.partly])}; the answers still differ in what is kept", split,
                             {"count": len(self.partly), "largest_loss": worst}))
        if split == "train":
            digest = np.asarray(self.digest, dtype=np.uint64)
            uniq, counts = np.unique(digest, return_counts=True)
            dup = self.n - uniq.size
            if dup:
                where = [self.rids[i] for i in np.flatnonzero(digest == uniq[counts > 1][0])[:FEW]]
                out.append(Check("duplicates", "warn", f"{dup} of {self.n} train pairs ({dup / n:.1%}) repeat another "
                                 f"train pair (prompt and both answers), e.g. {' = '.join(where)}", split,
                                 {"count": int(dup)}))
        return out


def mean_logps(task, model, examples: list, batch_size: int, device) -> list[tuple[float, float]]:
    """(chosen, rejected) per pair: the model's mean log-probability per answer token (no grad, eval mode)."""
    import torch

    out = []
    model.eval()
    with torch.no_grad():
        for i in range(0, len(examples), batch_size):
            batch = {k: v.to(device) if hasattr(v, "to") else v for k, v in task.collate(examples[i: i + batch_size]).items()}
            logp, mask = task.token_logps(model, batch)
            mean = (logp.sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
            n = len(mean) // 2
            out += list(zip(mean[:n], mean[n:]))
    return out


def reference_preference(examples: list, means: list[tuple[float, float]]) -> Check:
    """Warn when the starting model already prefers the rejected answer of most sampled pairs."""
    n = len(means)
    worse = [e.rid for e, (c, r) in zip(examples, means) if math.isfinite(c) and r > c]
    share = len(worse) / max(n, 1)
    data = {"pairs": n, "prefers_rejected": len(worse), "share": share, "ids": worse[:FEW]}
    if n < SWAP_MIN:
        return Check("swapped-pairs", "ok", f"only {n} pairs with both answers in the loss: too few to tell whether "
                     f"chosen and rejected are swapped (the check reads {SWAP_MIN} or more)", "train", data)
    if share >= SWAPPED_SHARE:
        return Check("swapped-pairs", "warn",
                     f"the starting model already prefers the rejected answer of {len(worse)} of {n} train pairs "
                     f"({share:.0%}; mean log-probability per answer token), e.g. {_ids(worse)}: are data.chosen and "
                     "data.rejected swapped? (a model tuned before usually prefers the better answer)", "train", data)
    return Check("swapped-pairs", "ok", f"the starting model prefers the chosen answer of {n - len(worse)} of {n} train "
                 "pairs (mean log-probability per answer token)", "train", data)
