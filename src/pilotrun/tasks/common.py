"""Pieces both built-in tasks use: how they start (``CampaignTask``), field access with record locations,
padding, split records."""

from __future__ import annotations

import string
from typing import Any

from pilotrun.errors import BadInput
from pilotrun.records.readers import not_text, read_records
from pilotrun.records.values import unit_key
from pilotrun.tasks import chat
from pilotrun.tasks.base import IGNORE, Example
from pilotrun.tasks.loading import leading_specials, load_tokenizer, pad_id, save_hf_artifact

SPLITS = ("train", "validation", "test")


def missing_field_fix(name: str, key: str, fields) -> str:
    """The fix for a field ``key`` names that a record lacks: a field's name written as a template ("{output}" for
    data.response, which names a field) is answered with the name meant."""
    inner = name[1:-1].strip() if name.startswith("{") and name.endswith("}") else None
    if inner and inner in fields and key != "data.prompt":
        return f"write {key}: {inner} (it names a field; data.prompt alone is a template)"
    return f"set {key} to one of the fields, or add '{name}' to every record"


def field(record, name: str, key: str) -> Any:
    if name not in record.fields:
        present = ", ".join(sorted(record.fields)) or "none"
        raise BadInput(f"record has no field '{name}' (named by {key}); fields present: {present}",
                       where=record.where, fix=missing_field_fix(name, key, record.fields))
    return record.fields[name]


def text_field(record, name: str, key: str, *, allow_empty: bool = False) -> str:
    value = field(record, name, key)
    if value is None:
        value = ""
    kind = not_text(value)
    if kind is not None:  # str() would train on its Python repr
        raise BadInput(f"field '{name}' (named by {key}) is {kind}, not text", where=record.where,
                       fix=f"give '{name}' a string in every record (numbers are read as text)")
    if not isinstance(value, str):
        value = str(value)
    if not allow_empty and not value.strip():
        raise BadInput(f"field '{name}' (named by {key}) is empty", where=record.where,
                       fix="remove the record or give it a value; an empty target trains nothing")
    return value


def template_fields(template: str) -> list[str] | None:
    """The placeholders of a "{field}" template, or None when the value is a plain field name."""
    names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    return names or None


def render_prompt(record, prompt: str) -> str:
    if prompt == "":  # no prompt: a completion, the whole response is in the loss
        return ""
    names = template_fields(prompt)
    if names is None:
        return text_field(record, prompt, "data.prompt", allow_empty=True)
    values = {n: text_field(record, n, "data.prompt", allow_empty=True) for n in names}
    return prompt.format(**values)


def group_of(record, c) -> str | None:
    if c.data.group_by is None:
        return None
    return unit_key(field(record, c.data.group_by, "data.group_by"))


def period_of(record, c) -> str | None:
    if c.data.period_by is None:
        return None
    return str(field(record, c.data.period_by, "data.period_by"))


def pad_batch(examples: list[Example], pad: int) -> dict[str, Any]:
    """Right-pad to the longest example; padded positions get attention 0 and label IGNORE."""
    import torch

    width = max(e.length for e in examples)
    ids = torch.full((len(examples), width), pad, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), IGNORE, dtype=torch.long)
    for i, e in enumerate(examples):
        n = e.length
        ids[i, :n] = torch.tensor(e.input_ids, dtype=torch.long)
        mask[i, :n] = 1
        labels[i, :n] = torch.tensor(e.labels, dtype=torch.long)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels, "rids": [e.rid for e in examples]}


def read_split(c, split: str):
    path = getattr(c.data, split)
    return read_records(path, f"data.{split}") if path else []


class CampaignTask:
    """How a built-in task starts: the loaded campaign (``campaign``), its typed model (``c``), the tokenizer (the
    one given, else the campaign's) and its pad id; its records are the campaign's splits, grouped by its
    ``data.group_by``."""

    def __init__(self, campaign, tokenizer=None):
        self.campaign = campaign
        self.c = campaign.campaign if hasattr(campaign, "campaign") else campaign
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(self.c)
        self.pad = pad_id(self.tokenizer)

    def records(self, split: str):
        return read_split(self.c, split)

    def group_key(self, record) -> str | None:
        return group_of(record, self.c)

    def save_artifact(self, model, out_dir) -> list[str]:
        """The Hugging Face folders a user loads (the adapter, and a merged copy when model.adapter.merged_copy)."""
        merged = self.c.model.adapter is not None and self.c.model.adapter.merged_copy
        return save_hf_artifact(model, self.tokenizer, out_dir, merged=merged)


def rendering(tokenizer, c, campaign) -> tuple[list[int], int | None, str, str | None]:
    """How a text task renders records (causal-lm, preference): (the specials tokenizer(text) puts before a text, the
    BOS among them or None, the chat format, the chat template's text); none of it without a tokenizer (config.json
    alone: ``tasks/shapes.py``)."""
    if getattr(tokenizer, "shapes_only", False):
        return [], None, "plain", None
    lead = leading_specials(tokenizer)  # what tokenizer(text) puts before the text (a BOS, or none)
    return (lead, lead[0] if lead else None,
            *chat.resolve(c, tokenizer, getattr(campaign, "base_dir", None)))
