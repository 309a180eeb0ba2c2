"""A built-in task's shapes without its tokenizer: what the estimate needs from ``config.json`` alone.

A hub model whose ``config.json`` alone is cached (or a local folder holding no tokenizer file) cannot
tokenize its data, but an estimate needs only the vocabulary's size (the embedding's and the logits' rows)
and the sequences' shapes, not the text. ``ConfigVocabulary`` stands in for the tokenizer with the size and
the special ids config.json declares; ``shape_examples`` makes the rows the worst case reads: every row
``data.max_length`` tokens (the longest any record can be after truncation), one row a token shorter so the
widest micro-batch holds padding as a data set of uneven lengths makes it (``phases.worst.padded``).
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun import jsonsafe
from pilotrun.tasks.preference import PairExample
from pilotrun.tasks.base import IGNORE, Example

# the files AutoTokenizer reads a tokenizer from; a folder with none of them holds no tokenizer
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt",
                   "spiece.model", "sentencepiece.bpe.model", "merges.txt", "tekken.json")


def tokenizer_absent(c) -> Path | None:
    """The folder a built-in task's campaign reads its tokenizer from, when it holds none of the tokenizer's files
    (config.json alone), else None (a tokenizer is there, or "byte", or no folder: its load says what is wrong)."""
    spec = c.model.tokenizer or c.model.path
    if not spec or spec == "byte":
        return None
    folder = Path(spec)
    if not folder.is_dir() or any((folder / name).exists() for name in TOKENIZER_FILES):
        return None
    return folder


def config_vocabulary(c) -> "ConfigVocabulary | None":
    """The tokenizer's stand-in when the campaign's tokenizer folder holds no tokenizer (``tokenizer_absent``):
    the vocabulary of the model's config.json (or model.config), else None (the real tokenizer is loaded)."""
    folder = tokenizer_absent(c)
    if folder is None:
        return None
    config = c.model.config if isinstance(c.model.config, dict) else None
    model = Path(c.model.path) / "config.json" if c.model.path else None
    if model is not None and model.is_file():
        try:
            config = jsonsafe.loads(model.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # the model's own load names the broken file
    return ConfigVocabulary(config if isinstance(config, dict) else {}, folder)


def _first_id(value) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class ConfigVocabulary:
    """Stands in for the tokenizer of a model whose config.json alone is here: its size (``len``) and special ids
    from the config; it tokenizes nothing (a call is exit 2, naming the folder)."""

    shapes_only = True
    chat_template = None

    def __init__(self, config: dict, folder: Path):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
        size = config.get("vocab_size") or text.get("vocab_size")
        if not isinstance(size, int) or size < 1:
            raise BadInput(f"no tokenizer in {folder}, and its config.json names no vocab_size to estimate from",
                           where="model.tokenizer", fix="point model.tokenizer at the model's tokenizer folder")
        self.folder, self.vocab_size = folder, size

        def special(name: str) -> int | None:
            i = _first_id(config.get(name)) if config.get(name) is not None else _first_id(text.get(name))
            return i if i is not None and 0 <= i < size else None

        self.bos_token_id = special("bos_token_id")
        self.eos_token_id = special("eos_token_id")
        if self.eos_token_id is None:
            self.eos_token_id = size - 1  # an id the embedding has: the shapes do not depend on which
        self.pad_token_id = special("pad_token_id")

    def __len__(self) -> int:
        return self.vocab_size

    def __call__(self, *args, **kwargs):
        raise BadInput(f"no tokenizer in {self.folder} (config.json alone): nothing can be tokenized",
                       where="model.tokenizer", fix="fetch the tokenizer's files too, or point model.tokenizer at them")


def shape_examples(kind: str, count: int, length: int, vocab: int, split: str) -> list[Example]:
    """``count`` rows of ``length`` tokens, the last a token shorter when there are two or more (so the worst case
    holds a padded batch); causal-lm: every token a target but the first, seq-cls: class 0; preference: a pair of two
    such rows."""
    rows = []
    for k in range(count):
        n = max(1, length - 1) if k == count - 1 and count > 1 else length
        ids = [(i % (vocab - 1)) + 1 if vocab > 1 else 0 for i in range(n)]
        labels = list(ids) if kind in ("causal-lm", "preference") else [0]
        if kind in ("causal-lm", "preference") and n > 1:
            labels[0] = IGNORE  # the first token is predicted by nothing
        where = f"{split}:shape {k + 1}"
        if kind == "preference":
            rows.append(PairExample(ids, labels, where, prompt_len=1, target_len_full=n - 1, meta={
                "rejected_ids": list(ids), "rejected_labels": list(labels), "rejected_full": n - 1, "prompt_tokens": 1}))
        else:
            rows.append(Example(ids, labels, where, prompt_len=1, target_len_full=n - 1))
    return rows
