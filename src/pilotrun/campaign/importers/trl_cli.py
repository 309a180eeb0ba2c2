"""A ``trl sft --config`` file's model, adapter and data: TRL's ``ModelConfig`` and ``ScriptArguments`` keys.

The file holds them beside SFTConfig's (TRL's CLI parses all three from it). ``model_name_or_path`` is the model
(a hub id resolved from the local cache, or a folder), ``use_peft`` with ``lora_*`` the adapter, ``dataset_name`` the
data: a local file, or a local folder (``dataset_train_split``'s file, and ``dataset_test_split``'s for validation),
read as TRL reads it — conversations in ``messages``, ``prompt`` + ``completion`` pairs, or plain text in
``dataset_text_field``; a hub data set is asked for as a local file. A TrainingArguments dict names none of them:
they are left to set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotrun.campaign.importers.builder import Builder
from pilotrun.campaign.importers.datafiles import data_file, local_path_of
from pilotrun.errors import BadInput
from pilotrun.records.readers import read_records
from pilotrun.tasks.hub import is_hub_id

DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def model_and_data(raw: dict[str, Any], b: Builder, defaults: dict[str, Any]) -> set[str]:
    """Carry the model, adapter and data keys of a TRL CLI file; returns the keys read."""
    used = {"model_name_or_path", "model_revision", "dtype", "torch_dtype", "use_peft", "lora_r", "lora_alpha",
            "lora_dropout", "lora_target_modules", "dataset_name", "dataset_train_split", "dataset_test_split",
            "dataset_text_field"}
    model = raw.get("model_name_or_path")
    if model:
        rev = raw.get("model_revision")
        hub = is_hub_id(str(model), b.source.parent)
        value = f"{model}@{rev}" if hub and rev and rev != "main" else str(model)
        b.put("model_name_or_path", "model.path", value if hub else b.local_path("model_name_or_path", str(model)))
    else:
        b.to_set.append("model.path")
    dtype = raw.get("dtype") or raw.get("torch_dtype")
    if dtype in DTYPES:
        b.put("dtype" if raw.get("dtype") else "torch_dtype", "model.dtype", DTYPES[dtype])
    if raw.get("use_peft"):
        b.put("use_peft", "model.adapter.kind", "lora")
        for k, key, cast in (("lora_r", "r", int), ("lora_alpha", "alpha", float), ("lora_dropout", "dropout", float)):
            v = raw.get(k, defaults.get(k))
            if v is not None:
                b.put(k if k in raw else f"{k} (TRL's default)", f"model.adapter.{key}", cast(v))
        tm = raw.get("lora_target_modules")
        if tm:
            b.put("lora_target_modules", "model.adapter.target_modules",
                  "all-linear" if tm == "all-linear" else [tm] if isinstance(tm, str) else list(tm))
    _data(raw, b, defaults)
    return used


def _data(raw: dict[str, Any], b: Builder, defaults: dict[str, Any]) -> None:
    name = raw.get("dataset_name")
    if not name:
        b.to_set += ["data.train", "data.validation"]
        return
    local = local_path_of(b, name)
    train = test = None
    if local.is_file():
        train = local
    elif local.is_dir():
        train, _ = data_file(local, str(raw.get("dataset_train_split") or "train"))
        test, _ = data_file(local, str(raw.get("dataset_test_split") or "test"))
        test = test if test != train else None
    if train is None:
        hub = is_hub_id(str(name), b.source.parent)
        b.ask(f"dataset_name = {name!r} is {'a hub data set' if hub else 'no local data file'}; pilotrun reads only "
              f"local files (relative paths are relative to {b.source.name})",
              f"save it as a local .jsonl (e.g. `datasets.load_dataset({str(name)!r}, split='train')"
              ".to_json('train.jsonl')`) and set dataset_name to it")
        return
    b.put("dataset_name", "data.train", b.local_path("dataset_name", str(train)))
    if test is not None:
        b.put("dataset_name (its test split)", "data.validation", b.local_path("dataset_name", str(test)))
    else:
        b.to_set.append("data.validation")
    _fields(raw, b, train, defaults)


def _fields(raw: dict[str, Any], b: Builder, train: Path, defaults: dict[str, Any]) -> None:
    """The data's format as TRL's SFTTrainer reads it, from its first record."""
    try:
        records = read_records(train)
    except BadInput as e:
        b.problems.append(e)
        return
    first = records[0].fields if records else {}
    if b.c.get("task") == "preference":  # a DPOConfig: prompt, chosen and rejected (importers/preference.py)
        if first and "prompt" not in first:
            b.put("dataset_name (no prompt column)", "data.prompt", None,
                  "the two answers are whole conversations: their shared start is the prompt")
        return
    text = raw.get("dataset_text_field") or defaults.get("dataset_text_field") or "text"
    if "messages" in first:
        b.put("dataset_name (conversations)", "data.messages", "messages", "TRL reads a 'messages' field as "
                                                                          "conversations")
        b.put("dataset_name (conversations)", "data.chat_template", "model", "TRL renders them with the tokenizer's "
                                                                            "chat template")
    elif "prompt" in first and "completion" in first:
        b.put("dataset_name (prompt-completion)", "data.prompt", "prompt")
        b.put("dataset_name (prompt-completion)", "data.response", "completion")
    elif text in first:
        b.put("dataset_text_field" if raw.get("dataset_text_field") else "dataset_text_field (TRL's default)",
              "data.prompt", "", "plain text: the whole text is in the loss")
        b.put("dataset_text_field" if raw.get("dataset_text_field") else "dataset_text_field (TRL's default)",
              "data.response", text)
    else:
        b.ask(f"{train.name}: its records have none of the fields TRL's SFT reads (messages, prompt + completion, "
              f"or {text!r}): fields present: {', '.join(sorted(first)) or 'none'}",
              "set dataset_text_field to the text field, or write the campaign's data keys yourself")
