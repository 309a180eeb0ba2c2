"""Batched tokenizer calls ahead of ``task.encode``, so the one encoding path runs at batch speed.

``task.encode`` tokenizes one record at a time; a fast tokenizer is several times quicker on a
batch. ``BatchedTokenizer`` stands in for the task's tokenizer: ``prefetch`` tokenizes the texts a
chunk of records will ask for in one call, and each later call with the same text and arguments is
answered from that batch. Anything not prefetched goes to the tokenizer itself, so ``encode`` gives
exactly what it gives without it (tests compare both).
"""

from __future__ import annotations

from contextlib import contextmanager

from pilotrun.errors import BadInput
from pilotrun.tasks import common


class BatchedTokenizer:
    def __init__(self, tokenizer):
        self._tok = tokenizer
        self._memo: dict[tuple, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self._tok, name)

    def __len__(self) -> int:
        return len(self._tok)

    def __call__(self, text, **kwargs):
        if not isinstance(text, str) or kwargs.get("return_offsets_mapping"):  # offsets: a rendered chat template
            return self._tok(text, **kwargs)
        key = (text, tuple(sorted(kwargs.items())))
        ids = self._memo.get(key)
        if ids is None:
            ids = self._memo[key] = list(self._tok(text, **kwargs)["input_ids"])
        return {"input_ids": list(ids)}

    def prefetch(self, texts, **kwargs) -> None:
        todo = [t for t in dict.fromkeys(texts) if (t, tuple(sorted(kwargs.items()))) not in self._memo]
        if not todo:
            return
        suffix = tuple(sorted(kwargs.items()))
        for text, ids in zip(todo, self._tok(todo, **kwargs)["input_ids"]):
            self._memo[(text, suffix)] = ids

    def clear(self) -> None:
        self._memo.clear()


def _texts(task, records) -> tuple[list[str], dict]:
    """The texts the built-in tasks' encode will tokenize for these records, and the call's arguments."""
    c = task.c
    d, out = c.data, []
    kind = getattr(task, "kind", None)
    for r in records:
        try:
            if kind == "causal-lm" and d.messages:
                msgs = r.fields.get(d.messages)
                if isinstance(msgs, list):
                    out += [str(m.get("content", m.get("value"))) for m in msgs if isinstance(m, dict)]
            elif kind == "causal-lm":
                out += [common.render_prompt(r, d.prompt), common.text_field(r, d.response, "data.response")]
            elif kind == "seq-cls":
                out.append(common.text_field(r, d.text, "data.text"))
        except BadInput:
            continue  # encode raises it with the record's location
    if kind == "seq-cls":
        return out, {"add_special_tokens": True, "truncation": True, "max_length": d.max_length}
    return out, {"add_special_tokens": False}


@contextmanager
def batched(task):
    """The task with its tokenizer served in batches; yields ``warm(records)`` to call before each chunk."""
    tok = getattr(task, "tokenizer", None)
    if tok is None or getattr(task, "kind", None) not in ("causal-lm", "seq-cls") or not hasattr(task, "c"):
        yield lambda records: None
        return
    proxy = BatchedTokenizer(tok)

    def warm(records) -> None:
        proxy.clear()
        texts, kwargs = _texts(task, records)
        proxy.prefetch(texts, **kwargs)

    task.tokenizer = proxy
    try:
        yield warm
    finally:
        task.tokenizer = tok
