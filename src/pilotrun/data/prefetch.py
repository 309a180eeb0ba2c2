"""Batched tokenizer calls ahead of ``task.encode``, so the one encoding path runs at batch speed.

``task.encode`` tokenizes one record at a time; a fast tokenizer is several times quicker on a
batch. ``BatchedTokenizer`` stands in for the task's tokenizer: ``prefetch`` tokenizes the texts a
chunk of records will ask for in one call, and each later call with the same text and arguments is
answered from that batch. Anything not prefetched goes to the tokenizer itself, so ``encode`` gives
exactly what it gives without it (tests compare both). Which texts and arguments: the task's own
``tokenized_texts(record)`` and ``tokenize_kwargs()``, the ones its ``encode`` uses (a task without
them is not prefetched).
"""

from __future__ import annotations

from contextlib import contextmanager

from pilotrun.errors import BadInput

CHUNK = 1024  # records whose texts one tokenizer call takes


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


def _texts(task, records) -> list[str]:
    """The texts the task's encode will tokenize for these records (the task says: ``tokenized_texts``)."""
    out = []
    for r in records:
        try:
            out += task.tokenized_texts(r)
        except BadInput:
            continue  # encode raises it with the record's location
    return out


@contextmanager
def batched(task):
    """The task with its tokenizer served in batches; yields ``warm(records)`` to call before each chunk."""
    tok = getattr(task, "tokenizer", None)
    if tok is None or not hasattr(task, "tokenized_texts") or not hasattr(task, "tokenize_kwargs"):
        yield lambda records: None
        return
    proxy = BatchedTokenizer(tok)

    def warm(records) -> None:
        proxy.clear()
        proxy.prefetch(_texts(task, records), **task.tokenize_kwargs())

    task.tokenizer = proxy
    try:
        yield warm
    finally:
        task.tokenizer = tok


def warmed(records: list, warm):
    """``records`` in order, ``warm`` (``batched``'s) called with each ``CHUNK`` of them before its first is handed
    out: a loop over it encodes at batch speed."""
    for start in range(0, len(records), CHUNK):
        chunk = records[start:start + CHUNK]
        warm(chunk)
        yield from chunk


def encode_all(task, records: list) -> list:
    """``[task.encode(r) for r in records]``, with the tokenizer served ``CHUNK`` records' texts at a time: the same
    examples. The stages' encoding (campaign/prepare.py): one call per text took 4.7–6.0 s for 20,000 Alpaca records
    through a fast BPE tokenizer (causal-lm, two texts each), in batches 1.4–1.5 s."""
    with batched(task) as warm:
        return [task.encode(r) for r in warmed(records, warm)]
