"""Prompt and answer mixed up: the trained target already inside the prompt, or the prompt inside the target.

Two ways a causal-lm data set trains the wrong thing while every token looks fine:
- a prompt field that already holds the answer (a pre-formatted ``text`` with prompt and answer), so the
  model learns to copy the answer from its input and has nothing to learn at inference;
- a response field that already holds the prompt, so the model is trained to reproduce the instruction.

With ``data.prompt``/``data.response`` the fields' texts are compared (whitespace collapsed) and the fields are
named; otherwise (chat, custom tasks) the trained token span is looked for inside the prompt tokens. An exact
copy of the whole prompt is the ``prompt-in-loss`` echo check's, not repeated here. A short target (a word or
two, as extractive QA has) inside its context is normal: only texts of at least ``MIN_WORDS`` words (or
``MIN_TOKENS`` tokens) count, and the verdict follows the share of examples.
"""

from __future__ import annotations

import numpy as np

from pilotrun.verdicts import FEW, Check
from pilotrun.tasks import common
from pilotrun.tasks.base import IGNORE

MIN_WORDS = 4  # a contained text shorter than this is a coincidence (a name, a number, a yes/no)
MIN_TOKENS = 8
FAIL_SHARE = 0.5  # as the echo check: most examples mixed up is the data set's layout, not a few odd records
WARN_SHARE = 0.05
SHOW = 70  # characters of each text shown in the example


def _flat(text: str) -> str:
    return " ".join(text.split())


def _clip(text: str) -> str:
    return repr(text if len(text) <= SHOW else text[: SHOW - 1] + "…")


def _contains(hay: np.ndarray, needle: np.ndarray) -> bool:
    """Whether ``needle`` occurs as a contiguous run of ``hay`` (int64 arrays)."""
    if needle.size == 0 or needle.size > hay.size:
        return False
    h, n = hay.astype("<i8").tobytes(), needle.astype("<i8").tobytes()
    at = h.find(n)
    while at != -1 and at % 8:
        at = h.find(n, at + 1)
    return at != -1


class MixupScan:
    """Per split: the examples whose target is inside the prompt, or prompt inside the target."""

    def __init__(self, c):
        d = c.data
        self.fields = None
        if c.task == "causal-lm" and d.prompt and d.response and not d.messages:
            self.fields = (common.template_fields(d.prompt) or [d.prompt], d.response)
        self.n: dict[str, int] = {}
        self.hits: dict[str, dict[str, list[tuple[str, str]]]] = {}

    def add(self, split: str, record, e) -> None:
        self.n[split] = self.n.get(split, 0) + 1
        if len(e.labels) != len(e.input_ids):  # one label per example: no prompt and answer to mix
            return
        found = self._by_fields(record) if self.fields else self._by_tokens(e)
        if found:
            kind, detail = found
            self.hits.setdefault(split, {}).setdefault(kind, []).append((e.rid, detail))

    def _by_fields(self, record):
        prompt_fields, response = self.fields
        answer = _flat(common.text_field(record, response, "data.response", allow_empty=True))
        if not answer:
            return None
        for name in prompt_fields:
            text = _flat(common.text_field(record, name, "data.prompt", allow_empty=True))
            if not text or text == answer:  # an exact copy is the echo check's
                continue
            if len(answer.split()) >= MIN_WORDS and answer in text:
                return "target-in-prompt", (f"data.response field '{response}' = {_clip(answer)} is inside prompt "
                                            f"field '{name}' = {_clip(text)}")
            if len(text.split()) >= MIN_WORDS and text in answer:
                return "prompt-in-target", (f"prompt field '{name}' = {_clip(text)} is inside data.response field "
                                            f"'{response}' = {_clip(answer)}")
        return None

    @staticmethod
    def _by_tokens(e):
        ids, lab = np.asarray(e.input_ids, dtype=np.int64), np.asarray(e.labels, dtype=np.int64)
        tgt = np.flatnonzero(lab != IGNORE)
        if tgt.size == 0 or tgt[0] == 0:
            return None
        span, prompt = lab[tgt[0]: tgt[-1] + 1], ids[: tgt[0]]
        span = span[span != IGNORE][:-1] if span.size > 1 else span  # the last target is usually EOS
        if np.array_equal(span, prompt):
            return None
        if span.size >= MIN_TOKENS and _contains(prompt, span):
            return "target-in-prompt", f"the {span.size} trained tokens occur inside the {prompt.size} prompt tokens"
        if prompt.size >= MIN_TOKENS and _contains(span, prompt):
            return "prompt-in-target", f"the {prompt.size} prompt tokens occur inside the {span.size} trained tokens"
        return None

    def checks(self) -> list[Check]:
        out = []
        for split, kinds in self.hits.items():
            n = self.n[split]
            for kind, hits in kinds.items():
                share = len(hits) / n
                if share < WARN_SHARE:
                    continue
                rid, detail = hits[0]
                what = ("the trained target already appears in the prompt: the model learns to copy it from its "
                        "input; is a prompt field a pre-formatted text holding the answer?"
                        if kind == "target-in-prompt" else
                        "the prompt appears inside the trained target: the model is trained to reproduce the "
                        "instruction; does data.response hold the prompt too?")
                out.append(Check(kind, "fail" if share >= FAIL_SHARE else "warn",
                                 f"{len(hits)} of {n} examples ({share:.1%}): {what} e.g. {rid}: {detail}", split,
                                 {"count": len(hits), "share": share, "ids": [r for r, _ in hits[:FEW]]}))
        return out
