"""Axolotl's datasets → the campaign's data keys: the files, the prompt and response fields, the chat template."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.reasons import AXOLOTL_REASONS
from pilotrun.tasks.hub import is_hub_id

ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")



def axolotl_data(raw: dict[str, Any], b: Builder, used: set[str]) -> None:
    used.update(("datasets", "test_datasets", "chat_template", "chat_template_jinja", "val_set_size"))
    datasets = raw.get("datasets") or []
    if not datasets:
        b.to_set.append("data.train")
        return
    if len(datasets) > 1:
        b.ask(f"datasets lists {len(datasets)} data sets; a campaign trains on one file",
              "concatenate them into one local file (e.g. `cat a.jsonl b.jsonl > train.jsonl`, when they share a "
              "type) and list that one")
        return
    d = datasets[0] if isinstance(datasets[0], dict) else {"path": datasets[0]}
    _one_dataset(raw, b, d, "data.train", "datasets[0]")
    tests = raw.get("test_datasets") or []
    if tests:
        t = tests[0] if isinstance(tests[0], dict) else {"path": tests[0]}
        _one_dataset(raw, b, t, "data.validation", "test_datasets[0]", fields=False)
        if len(tests) > 1:
            b.skip("test_datasets[1:]", [x.get("path") if isinstance(x, dict) else x for x in tests[1:]],
                   "only the first test data set is validated on")
    elif raw.get("val_set_size"):
        b.skip("val_set_size", raw["val_set_size"], AXOLOTL_REASONS["val_set_size"])
        b.to_set.append("data.validation")
    else:
        b.to_set.append("data.validation")


def _one_dataset(raw: dict[str, Any], b: Builder, d: dict[str, Any], key: str, src: str, fields: bool = True) -> None:
    path = d.get("path")
    local = Path(os.path.expanduser(str(path))) if path else None
    if local is not None and not local.is_absolute():
        local = b.source.parent / local
    if path and d.get("data_files"):
        files = d["data_files"]
        files = [files] if isinstance(files, str) else list(files)
        if len(files) == 1:
            local = Path(os.path.expanduser(str(files[0])))
            local = local if local.is_absolute() else b.source.parent / local
    if not path or local is None or not local.is_file():
        where = f"{src}.path = {path!r}"
        remote = path and (is_hub_id(str(path), b.source.parent) or "://" in str(path))
        b.ask(f"{where} is {'a hub data set or remote path' if remote else 'no local file'}; pilotrun reads only "
              f"local files (relative paths are relative to {b.source.name})",
              "save the data set as a local .jsonl (e.g. `datasets.load_dataset(NAME, split='train')"
              ".to_json('train.jsonl')`) and set its path")
        return
    b.put(f"{src}.path", key, b.local_path(f"{src}.path", str(local)))
    for k, v in d.items():
        if k in ("path", "type", "field", "field_messages", "message_property_mappings", "message_field_role",
                 "message_field_content", "roles_to_train", "chat_template", "chat_template_jinja", "data_files",
                 "ds_type") or empty(v):
            continue
        b.skip(f"{src}.{k}", v, "nothing to rehearse: the local file is read whole" if k in (
            "split", "name", "revision", "shards_idx", "shards") else
            "a data set option pilotrun has no equivalent for: the records are read as they are")
    if not fields:  # a validation set is read with the training set's fields
        return
    kind = d.get("type")
    if kind == "alpaca":
        b.put(f"{src}.type", "data.prompt", ALPACA_PROMPT, "Axolotl's alpaca prompt (the with-input form)")
        b.put(f"{src}.type", "data.response", "output")
        b.skip(f"{src}.type", "alpaca", "Axolotl drops the '### Input:' section for records with an empty input; the "
                                        "rehearsal keeps it (a few prompt tokens more per such record)")
    elif kind == "completion":
        b.put(f"{src}.type", "data.prompt", "", "completion: no prompt, the whole text is in the loss")
        b.put(f"{src}.field" if d.get("field") else f"{src}.type", "data.response", d.get("field") or "text")
    elif kind == "chat_template":
        b.put(f"{src}.field_messages" if d.get("field_messages") else f"{src}.type", "data.messages",
              d.get("field_messages") or "messages")
        mapping = d.get("message_property_mappings") or {}
        odd = {k: v for k, v in mapping.items() if k != v}
        role, content = d.get("message_field_role"), d.get("message_field_content")
        if odd or (role and role != "role") or (content and content != "content"):
            b.ask(f"{src} maps message fields ({odd or {'role': role, 'content': content}}); pilotrun reads each turn's "
                  "'role' and 'content'", "rename the fields in the data file to role and content")
        roles = d.get("roles_to_train")
        if roles and list(roles) != ["assistant"]:
            b.skip(f"{src}.roles_to_train", roles, "the rehearsal's loss is on the assistant turns only")
        _chat_template(raw, b, d, src)
    elif isinstance(kind, dict) and kind.get("field_instruction") and kind.get("field_output"):
        fmt = kind.get("format") or "{instruction}"
        prompt = fmt.replace("{instruction}", "{" + kind["field_instruction"] + "}")
        if kind.get("field_input"):
            prompt = prompt.replace("{input}", "{" + kind["field_input"] + "}")
        b.put(f"{src}.type.format", "data.prompt", prompt)
        b.put(f"{src}.type.field_output", "data.response", kind["field_output"])
    else:
        b.ask(f"{src}.type = {kind!r} does not say which fields are the prompt and the response",
              "use type alpaca, completion or chat_template (or a type dict with field_instruction and "
              "field_output), or write the campaign's data.prompt and data.response yourself")


def _chat_template(raw: dict[str, Any], b: Builder, d: dict[str, Any], src: str) -> None:
    jinja = d.get("chat_template_jinja") or raw.get("chat_template_jinja")
    name = d.get("chat_template") or raw.get("chat_template")
    where = f"{src}.chat_template" if d.get("chat_template") else "chat_template"
    if jinja:
        j = Path(os.path.expanduser(str(jinja)))
        j = j if j.is_absolute() else b.source.parent / j
        value = b.local_path(where, str(j)) if str(jinja).endswith(".jinja") and j.is_file() else jinja
        b.put(f"{src}.chat_template_jinja" if d.get("chat_template_jinja") else "chat_template_jinja",
              "data.chat_template", value)
    elif name in (None, "tokenizer_default"):
        b.put(where if name else f"{src}.type", "data.chat_template", "model", "the tokenizer's own template")
    elif str(name).startswith("tokenizer_default_fallback_"):
        b.put(where, "data.chat_template", "auto", "the tokenizer's template when it has one")
        b.skip(where, name, f"the fallback ({str(name).removeprefix('tokenizer_default_fallback_')}) is Axolotl's "
                            "built-in template: a tokenizer without a template renders as plain 'role: content' here")
    else:
        b.put(where, "data.chat_template", "model", f"nearest to Axolotl's built-in {name}")
        b.skip(where, name, f"Axolotl's built-in '{name}' template is not shipped with pilotrun: the rehearsal renders "
                            "with the tokenizer's own template; to render with the source's, save it as a .jinja "
                            "file and set data.chat_template to it (token counts differ otherwise)")
