"""Axolotl's datasets → the campaign's data keys: the files, the prompt and response fields, the chat template.

A data set's ``path`` is read as Axolotl reads it: a local file, or a local folder (its data files; the split's when
it holds several), before a hub id; a hub data set is asked for as a local file. Its ``type`` names the fields: the
part before a ``:`` (``alpaca:phi``, ``sharegpt:chatml``) or a ``.`` (``alpaca_chat.load_qa``) is the strategy and
says which fields are prompt and response; what follows is the prompt's style, named as not carried. Conversations
(``chat_template``, the older ``sharegpt``) are read from their field as pilotrun's chat reader reads turns:
``{role, content}`` or ShareGPT ``{from, value}`` with the roles human/gpt; a mapping onto those is carried, one onto
other fields is asked for.
"""

from __future__ import annotations

import itertools
from typing import Any

from pilotrun.campaign.importers.builder import Builder, empty
from pilotrun.campaign.importers.render import short
from pilotrun.campaign.importers.datafiles import data_file, local_path_of
from pilotrun.campaign.importers.reasons import AXOLOTL_REASONS
from pilotrun.tasks.chat import ROLE_ALIASES
from pilotrun.tasks.hub import is_hub_id

ALPACA_PROMPT = ("Below is an instruction that describes a task, paired with an input that provides further "
                 "context. Write a response that appropriately completes the request.\n\n"
                 "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n")

# Axolotl's instruction strategies (prompt_tokenizers, prompt_strategies): (instruction, input, output) fields
INSTRUCTION = {
    "alpaca": ("instruction", "input", "output"), "alpaca_chat": ("instruction", "input", "output"),
    "alpaca_chat.load_qa": ("question", None, "answer"), "alpaca_chat.load_camel_ai": ("message_1", None, "message_2"),
    "alpaca_chat.load_concise": ("instruction", "input", "output"),
    "alpaca_w_system": ("instruction", "input", "output"), "alpaca_w_system.load_open_orca": ("question", None,
                                                                                              "response"),
    "alpaca_instruct": ("instruction", "input", "output"), "gpteacher": ("instruction", "input", "response"),
    "oasst": ("INSTRUCTION", None, "RESPONSE"), "summarizetldr": ("article", None, "summary"),
}
CHAT = ("chat_template", "sharegpt", "messages")  # conversation strategies: a field of turns
KNOWN_TYPES = "alpaca[:style], alpaca_chat, gpteacher, oasst, summarizetldr, completion, chat_template, sharegpt"


def axolotl_data(raw: dict[str, Any], b: Builder, used: set[str], read_fields=None) -> None:
    """The data sets' files, and their fields as ``read_fields`` reads a type (default: the supervised types;
    importers/preference.py passes its own)."""
    read_fields = read_fields or _fields
    used.update(("datasets", "test_datasets", "chat_template", "chat_template_jinja", "val_set_size",
                 "pretraining_dataset", "streaming"))
    datasets, group = raw.get("datasets") or [], "datasets"
    if not datasets and raw.get("pretraining_dataset"):
        pre = raw["pretraining_dataset"]
        datasets, group = (pre if isinstance(pre, list) else [pre]), "pretraining_dataset"
    if not datasets:
        b.to_set.append("data.train")
        return
    if len(datasets) > 1:
        b.ask(f"{group} lists {len(datasets)} data sets; a campaign trains on one file",
              "concatenate them into one local file (e.g. `cat a.jsonl b.jsonl > train.jsonl`, when they share a "
              "type) and list that one")
        return
    d = datasets[0] if isinstance(datasets[0], dict) else {"path": datasets[0]}
    if group == "pretraining_dataset":  # streamed text: a completion data set of its text column
        d = dict(d, type="completion", field=d.get("text_column") or "text")
    _one_dataset(raw, b, d, "data.train", f"{group}[0]", read_fields=read_fields)
    tests = raw.get("test_datasets") or []
    if tests:
        t = tests[0] if isinstance(tests[0], dict) else {"path": tests[0]}
        _one_dataset(raw, b, t, "data.validation", "test_datasets[0]", fields=False)
        if len(tests) > 1:
            b.skip("test_datasets[1:]", [x.get("path") if isinstance(x, dict) else x for x in tests[1:]],
                   "only the first test data set is validated on")
    elif raw.get("val_set_size"):
        b.skip("val_set_size", raw["val_set_size"], AXOLOTL_REASONS["val_set_size"], until="data.validation")
        b.to_set.append("data.validation")
    else:
        b.to_set.append("data.validation")


def _one_dataset(raw: dict[str, Any], b: Builder, d: dict[str, Any], key: str, src: str, fields: bool = True,
                 read_fields=None) -> None:
    path = d.get("path")
    local = local_path_of(b, path) if path else None
    files = d.get("data_files")
    files = [files] if isinstance(files, str) else files or []
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        b.ask(f"{src}.data_files = {short(d.get('data_files'))}: Axolotl reads a file's path or a list of paths there",
              "write data_files as a path, e.g. data_files: train.jsonl")
        return
    if files and len(files) == 1 and (local_path_of(b, files[0]).is_file() or local is None or not local.is_dir()):
        local = local_path_of(b, files[0])
    elif files and local is not None and local.is_dir() and len(files) == 1:
        local = local / files[0]
    if local is not None and local.is_dir():
        found, candidates = data_file(local, str(d.get("split") or ("test" if key == "data.validation" else "train")))
        if found is None:
            b.ask(f"{src}.path = {path!r} is a folder with {len(candidates) or 'no'} data files"
                  + (f" ({', '.join(p.name for p in candidates[:4])})" if candidates else "")
                  + "; a campaign reads one file", "concatenate the split's files into one .jsonl and set its path"
                  if candidates else "put the data set's .jsonl, .json, .parquet or .csv file there")
            return
        local = found
    folder = local_path_of(b, path) if path else None
    if files and folder is not None and folder.is_dir() and (local is None or not local.is_file()):
        held = sorted(p.relative_to(folder).as_posix() for p in itertools.islice(folder.rglob("*"), 1000)
                      if p.is_file())
        b.ask(f"{src}.data_files = {files[0] if len(files) == 1 else files!r} is not in the local folder {path!r}"
              + (f" (it holds {', '.join(held[:4])}{' …' if len(held) > 4 else ''})" if held else " (it is empty)"),
              f"put the data set's file at {path}/{files[0]} (its path in the hub data set), or set data_files to "
              "the file the folder holds")
        return
    if not path or local is None or not local.is_file():
        where = f"{src}.path = {path!r}"
        remote = path and (is_hub_id(str(path), b.source.parent) or "://" in str(path))
        b.ask(f"{where} is {'a hub data set or remote path' if remote else 'no local file'}; pilotrun reads only "
              f"local files (relative paths are relative to {b.source.name})",
              f"save the data set as a local .jsonl (e.g. `datasets.load_dataset({str(path)!r}, split='train')"
              ".to_json('train.jsonl')`) and set its path" + (" (a folder of that name beside the config is read "
                                                              "first, as Axolotl does)" if remote else ""))
        return
    b.put(f"{src}.path", key, b.local_path(f"{src}.path", str(local)))
    mapped = ("path", "type", "field", "field_messages", "message_property_mappings", "message_field_role",
              "message_field_content", "roles_to_train", "chat_template", "chat_template_jinja", "data_files",
              "ds_type", "roles", "text_column", "field_chosen", "field_rejected")
    for k, v in d.items():
        if k in mapped or empty(v):
            continue
        b.skip(f"{src}.{k}", v, "nothing to rehearse: the local file is read whole" if k in (
            "split", "name", "revision", "shards_idx", "shards", "trust_remote_code") else
            "a data set option pilotrun has no equivalent for: the records are read as they are")
    if fields:  # a validation set is read with the training set's fields
        (read_fields or _fields)(raw, b, d, src)


def _fields(raw: dict[str, Any], b: Builder, d: dict[str, Any], src: str) -> None:
    kind = d.get("type")
    if isinstance(kind, dict):
        _user_defined(b, kind, src)
        return
    name = str(kind or "")
    strategy, _, style = name.partition(":")
    if strategy in INSTRUCTION:
        _instruction(b, src, name, strategy, style)
    elif strategy in ("completion", "pretrain"):
        b.put(f"{src}.type", "data.prompt", "", "completion: no prompt, the whole text is in the loss")
        b.put(f"{src}.field" if d.get("field") else f"{src}.type", "data.response", d.get("field") or "text")
    elif strategy.split(".")[0] in CHAT:
        conversations(raw, b, d, src, strategy, style)
    else:
        b.ask(f"{src}.type = {kind!r} does not say which fields are the prompt and the response",
              f"use one of {KNOWN_TYPES} (or a type dict with field_instruction and field_output), or write the "
              "campaign's data.prompt and data.response yourself")


def _instruction(b: Builder, src: str, name: str, strategy: str, style: str) -> None:
    instruction, inp, output = INSTRUCTION[strategy]
    if inp:
        prompt = ALPACA_PROMPT.replace("{instruction}", "{" + instruction + "}").replace("{input}", "{" + inp + "}")
    else:
        prompt = ALPACA_PROMPT.replace(", paired with an input that provides further context", "").replace(
            "\n\n### Input:\n{input}", "").replace("{instruction}", "{" + instruction + "}")
    b.put(f"{src}.type", "data.prompt", prompt, f"{strategy}: Axolotl's instruction prompt (the Alpaca form)")
    b.put(f"{src}.type", "data.response", output)
    if style:
        b.skip(f"{src}.type", name, f"the prompt style '{style}' renders the same fields in another prompt (its own "
                                    "markers or the chat format); the rehearsal renders the Alpaca form: token "
                                    "counts per record differ by a few, memory and the loss's fields do not")
    elif inp:
        b.skip(f"{src}.type", name, f"Axolotl drops the '### Input:' section for records with an empty {inp}; the "
                                    "rehearsal keeps it (a few prompt tokens more per such record)")


def _user_defined(b: Builder, kind: dict, src: str) -> None:
    if not (kind.get("field_instruction") and kind.get("field_output")):
        b.ask(f"{src}.type names no field_instruction and field_output",
              "name both fields in the type dict, or write the campaign's data.prompt and data.response yourself")
        return
    fmt = kind.get("format") or "{instruction}"
    prompt = fmt.replace("{instruction}", "{" + kind["field_instruction"] + "}")
    if kind.get("field_input"):
        prompt = prompt.replace("{input}", "{" + kind["field_input"] + "}")
    b.put(f"{src}.type.format", "data.prompt", prompt)
    b.put(f"{src}.type.field_output", "data.response", kind["field_output"])


# the turn fields pilotrun's chat reader takes (tasks/chat.messages_of): role or from, content or value
TURN_FIELDS = {"role": ("role", "from"), "content": ("content", "value")}


def _a_mapping(b: Builder, d: dict[str, Any], key: str, src: str, example: str) -> dict | None:
    """``d[key]`` as the mapping Axolotl reads there (names onto names, or onto lists of names), {} when left out;
    None, with the problem asked, for a value of another shape (``roles: x`` was exit 3 here)."""
    value = d.get(key) or {}

    def name(x) -> bool:
        return isinstance(x, (str, int)) and not isinstance(x, bool)

    if isinstance(value, dict) and all(name(k) and (name(v) or v is None or isinstance(v, list) and all(map(name, v)))
                                       for k, v in value.items()):
        return value
    b.ask(f"{src}.{key} = {short(value)}: Axolotl reads a mapping of names there", f"write it as {example}")
    return None


def conversations(raw: dict[str, Any], b: Builder, d: dict[str, Any], src: str, strategy: str, style: str) -> None:
    sharegpt = strategy.startswith("sharegpt")
    field = d.get("field_messages") or d.get("field") or ("conversations" if sharegpt else "messages")
    b.put(f"{src}.field_messages" if d.get("field_messages") else f"{src}.type", "data.messages", field)
    mapping = _a_mapping(b, d, "message_property_mappings", src, "{role: from, content: value}")
    roles = _a_mapping(b, d, "roles", src, "{user: [human], assistant: [gpt]}")
    if mapping is None or roles is None:
        return
    for old, prop in (("message_field_role", "role"), ("message_field_content", "content")):
        if d.get(old):
            mapping.setdefault(prop, d[old])
    odd = {prop: f for prop, f in mapping.items() if prop in TURN_FIELDS and f not in TURN_FIELDS[prop]}
    if odd:
        b.ask(f"{src} maps the turns' {', '.join(f'{p} to {f!r}' for p, f in odd.items())}; pilotrun reads each "
              "turn's role (or ShareGPT's from) and content (or value)",
              "rename those fields in the data file to role and content (or from and value)")
    elif any(f != prop for prop, f in mapping.items()):
        b.skip(f"{src}.message_property_mappings", mapping, "nothing to rehearse: pilotrun's chat reader takes these "
                                                            "turn fields as they are")
    strange = {alias: role for role, aliases in roles.items()
               for alias in ([aliases] if isinstance(aliases, (str, int)) else aliases or [])
               if ROLE_ALIASES.get(str(alias), str(alias)) != role}
    if strange:
        b.ask(f"{src}.roles reads {', '.join(f'{a!r} as {r}' for a, r in strange.items())}; pilotrun reads the roles "
              f"user, assistant and system, and {', '.join(sorted(ROLE_ALIASES))} as their ShareGPT names",
              "rename those roles in the data file")
    elif roles:
        b.skip(f"{src}.roles", roles, "nothing to rehearse: pilotrun reads these role names as they are")
    trained = d.get("roles_to_train")
    if trained and list(trained) != ["assistant"]:
        b.skip(f"{src}.roles_to_train", trained, "the rehearsal's loss is on the assistant turns only")
    if sharegpt and style:
        raw = dict(raw, chat_template=raw.get("chat_template") or style)  # sharegpt:chatml names the template
    chat_template(raw, b, d, src)


def chat_template(raw: dict[str, Any], b: Builder, d: dict[str, Any], src: str) -> None:
    jinja = d.get("chat_template_jinja") or raw.get("chat_template_jinja")
    name = d.get("chat_template") or raw.get("chat_template")
    where = f"{src}.chat_template" if d.get("chat_template") else "chat_template"
    if jinja:
        j = local_path_of(b, jinja)
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
