"""Loading a campaign file: YAML with line numbers, ``--set`` overrides, errors that name the key.

Every error is a :class:`BadInput` naming the file, the line when known, the dotted key, the value
and a fix.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from pilotrun.campaign import yamlsafe
from pilotrun.tasks.hub import is_hub_id, resolve
from pilotrun.campaign.schema import Campaign
from pilotrun.errors import BadInput, BadInputs, comma_number_fix, utf8_of, utf8_path
from pilotrun.journal.files import dump_yaml  # noqa: F401  (part of campaign's API)
from pilotrun.provenance import config_sha256
from pilotrun.console.progress import spending

PATH_KEYS = ("model.path", "model.tokenizer", "data.train", "data.validation", "data.test")


@dataclass
class LoadedCampaign:
    """A validated campaign with its paths resolved against the campaign file's folder."""

    campaign: Campaign
    source: Path | None
    base_dir: Path
    hub: dict[str, Any] = field(default_factory=dict)
    """model.path / model.tokenizer given as hub ids: key -> tasks.hub.HubModel (what each resolved to)."""

    @property
    def c(self) -> Campaign:
        return self.campaign

    def resolved_dict(self) -> dict[str, Any]:
        return self.campaign.model_dump(mode="json")

    def config_sha256(self) -> str:
        return config_sha256(self.resolved_dict())

    def with_overrides(self, overrides: dict[str, Any]) -> "LoadedCampaign":
        raw = apply_overrides(self.resolved_dict(), overrides, where=str(self.source or "campaign"))
        c = _validate(raw, self.source, {})
        c.track = self.campaign.track  # not in the resolved config (where runs are logged is no part of the experiment)
        hub = _resolve_paths(c, self.base_dir)  # an overridden relative path is relative to the campaign file too
        return LoadedCampaign(c, self.source, self.base_dir, {**self.hub, **hub})


def line_index(text: str) -> dict[tuple, int]:
    """Map each key path in a YAML document to its 1-based line."""
    try:
        node = yamlsafe.compose(text, "campaign")
        yamlsafe.check_bounds(node, "campaign")
    except BadInput:
        return {}
    return _node_lines(node)


def _node_lines(node) -> dict[tuple, int]:
    """Key path -> line over a composed document that passed ``yamlsafe.check_bounds``."""
    out: dict[tuple, int] = {}

    def walk(n, path):
        if isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                p = path + (k.value,)
                out[p] = k.start_mark.line + 1
                walk(v, p)
        elif isinstance(n, yaml.SequenceNode):
            for i, v in enumerate(n.value):
                p = path + (i,)
                out[p] = v.start_mark.line + 1
                walk(v, p)

    if node is not None:
        walk(node, ())
    return out


def _known_keys(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _submodel_at(loc: tuple) -> type[BaseModel] | None:
    model: Any = Campaign
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        ann = field.annotation
        # unwrap Optional[X]
        args = getattr(ann, "__args__", None)
        if args:
            ann = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), ann)
        model = ann
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


_TAG = re.compile(r"[a-z][a-z-]*\[")  # pydantic's tag of a union member's or validator's errors in their location


def campaign_errors(err: ValidationError, where: str, lines: dict[tuple, int],
                    overridden: dict[tuple, str] | None = None) -> BadInputs:
    """The schema's refusals as bad input, one per key: ``where`` the file (``lines`` its keys' line numbers), and
    ``overridden`` what to name instead where a key's value came from elsewhere (``--set KEY``, an imported setting)."""
    problems = []
    merged: dict[tuple, list] = {}  # one key's type errors under each member of its union: one problem
    for e in err.errors():
        # a union's members tag their errors (list[str], literal['all-linear'], function-after[...]): not keys
        loc = tuple(p for p in e["loc"] if not (isinstance(p, str) and _TAG.match(p)))
        if e["type"] in ("value_error", "assertion_error", "extra_forbidden", "finite_number"):
            problems.append((loc, e))
        elif loc in merged:
            merged[loc].append(e["msg"])
        else:
            merged[loc] = [e["msg"]]
            problems.append((loc, e))
    out = []
    for loc, e in problems:
        key = ".".join(str(p) for p in loc) or "(top level)"
        line = None
        for n in range(len(loc), 0, -1):
            if loc[:n] in lines:
                line = lines[loc[:n]]
                break
        at = f"{where}:{line}" if line else where
        blamed = next((s for k, s in (overridden or {}).items() if loc[:len(k)] == k), None)
        if blamed:  # the value came from the command line, not the file
            at = blamed
        if e["type"] == "extra_forbidden":
            parent = _submodel_at(loc[:-1]) or Campaign
            choices = _known_keys(parent)
            close = difflib.get_close_matches(str(loc[-1]), choices, n=1)
            fix = f"did you mean '{'.'.join(map(str, loc[:-1] + (close[0],)))}'?" if close else (
                f"known keys here: {', '.join(choices)}")
            out.append(BadInput(f"unknown key '{key}'", where=at, fix=fix))
            continue
        shown = _short(e.get("input"))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] in ("value_error", "assertion_error"):
            msg, _, fix = msg.partition("; ")
            out.append(BadInput(f"{key}: {msg}" if loc else msg, where=at, fix=fix or f"change {key} as the message says"))
        elif e["type"] == "finite_number":
            out.append(BadInput(f"key '{key}' = {shown}: {msg}", where=at,
                                fix=f"set {key} to a finite number (.inf and .nan are not accepted)"))
        else:
            msgs = merged[loc]  # this key's messages under each member of its union
            said = msgs[0] + "".join(f", or {m[0].lower()}{m[1:]}" for m in msgs[1:])
            comma = comma_number_fix(e.get("input"), whole=e["type"].startswith("int"))
            fix = comma or f"set {key} to a valid value (see `pilotrun init` for a commented example)"
            out.append(BadInput(f"key '{key}' = {shown}: {said}", where=at, fix=fix))
    return BadInputs(out) if len(out) > 1 else out[0]


def _short(value: Any, limit: int = 80) -> str:
    """A JSON-like excerpt of ``value`` of at most ``limit`` characters, built without serialising all of it
    (a value may be large, or repeat one list thousands of times through YAML aliases)."""
    out: list[str] = []
    budget = [limit + 1]

    def put(s: str) -> bool:
        out.append(s[: budget[0]])
        budget[0] -= len(s)
        return budget[0] > 0

    def walk(v: Any) -> bool:
        if isinstance(v, dict):
            if not put("{"):
                return False
            for i, (k, x) in enumerate(v.items()):
                if (i and not put(", ")) or not put(json.dumps(str(k)) + ": ") or not walk(x):
                    return False
            return put("}")
        if isinstance(v, (list, tuple)):
            if not put("["):
                return False
            for i, x in enumerate(v):
                if (i and not put(", ")) or not walk(x):
                    return False
            return put("]")
        if isinstance(v, str):
            return put(json.dumps(v[: limit + 1]))
        return put(json.dumps(v, default=lambda o: str(o)[: limit + 1]))

    walk(value)
    text = "".join(out)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _validate(raw: dict[str, Any], source: Path | None, lines: dict[tuple, int],
              overrides: dict[str, Any] | None = None) -> Campaign:
    where = str(source) if source else "campaign"
    try:
        return Campaign.model_validate(raw)
    except ValidationError as err:
        overridden = {tuple(k.split(".")): f"--set {k}={_short(v)}" for k, v in (overrides or {}).items()}
        raise campaign_errors(err, where, lines, overridden) from None


def _coerce_value(text: str, where: str) -> Any:
    """--set values are YAML scalars/flow collections: 1e-4, true, null, [1, 2], {a: 1}, read within the campaign
    file's bounds (``yamlsafe``: an alias bomb such as ``[&a [x,x,x], &b [*a,*a,*a], ...]`` held validate for
    minutes and gigabytes, and a value nested thousands deep was a RecursionError); text that is no YAML is itself."""
    try:
        node = yamlsafe.compose(text, where)
    except BadInput as e:
        if "nesting depth" in e.detail:  # YAML, but nested past libyaml's limit: not a string the user meant
            raise
        return text
    yamlsafe.check_bounds(node, where)
    return yamlsafe.construct(node, where)


def parse_set(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise BadInput(f"--set {item!r} is not KEY=VALUE", where="--set",
                           fix="write it as --set train.lr=3e-4")
        key, value = item.split("=", 1)
        key = key.strip()
        if not key:
            raise BadInput(f"--set {item!r} has an empty key", where="--set", fix="write it as --set train.lr=3e-4")
        text = _text_only(key)
        try:
            read = _coerce_value(value, f"--set {key}")
        except BadInput:
            if not text:
                raise
            read = value  # "Q: {question}: {answer}" is no YAML (a mapping as a key): the text meant
        # YAML may read the text as something else: --set data.prompt={question} a mapping, --set name=2024-01-01 a
        # date, --set data.group_by=123 a number; where the key takes only text, the text is what was meant
        out[key] = value if text and read is not None and not isinstance(read, str) else read
    return out


def _text_only(key: str) -> bool:
    """Whether the campaign key ``key`` (dotted) takes text and nothing else (null aside)."""
    parts = key.split(".")
    model = _submodel_at(tuple(parts[:-1]))
    field = model.model_fields.get(parts[-1]) if model is not None else None
    if field is None:
        return False
    kinds = {a for a in (get_args(field.annotation) or (field.annotation,)) if a is not type(None)}
    return kinds == {str}


def apply_overrides(raw: dict[str, Any], overrides: dict[str, Any], *, where: str = "--set") -> dict[str, Any]:
    """Apply dotted-key overrides to a raw campaign dict; an unknown key is an error naming it."""
    raw = copy.deepcopy(raw)
    for key, value in overrides.items():
        parts = key.split(".")
        node = raw
        for i, part in enumerate(parts):
            sub = _submodel_at(tuple(parts[:i]))
            known = _known_keys(sub) if sub is not None else None
            indexed = re.fullmatch(r"(\w+)\[\d+\]", part)
            if known is not None and part not in known and indexed and indexed.group(1) in known:
                raise _an_item(parts[:i] + [indexed.group(1)], node.get(indexed.group(1)), key, where)
            if known is not None and part not in known:
                close = difflib.get_close_matches(part, known, n=1)
                fix = (f"did you mean '{'.'.join(parts[:i] + [close[0]] + parts[i + 1:])}'?" if close
                       else f"known keys: {', '.join(known)}")
                raise BadInput(f"unknown key '{key}'", where=where, fix=fix)
            if i == len(parts) - 1:
                node[part] = value
            elif parts[:i + 1] == ["plan", "control"]:  # its keys are dotted keys: the rest of the path is one
                if not isinstance(node.get(part), dict):
                    node[part] = {}
                node[part][".".join(parts[i + 1:])] = value  # (plan.control.train.lr set a nested train: {lr},
                break  # read by nothing, and the control kept its train.lr)
            else:
                child = node.get(part)
                if child is None:
                    child = node[part] = {}
                if isinstance(child, list):
                    raise _an_item(parts[:i + 1], child, key, where)
                if not isinstance(child, dict):
                    raise BadInput(f"'{'.'.join(parts[:i+1])}' is not a section; cannot set '{key}'", where=where,
                                   fix="set the whole value instead")
                node = child
    return raw


def _an_item(parts: list[str], value: Any, key: str, where: str) -> BadInput:
    """``--set plan.variants.0.train.lr=…`` (or ``plan.variants[0]…``): a list's item is not a key; the list is set
    whole, and its value now is said in the form --set reads, to copy and edit."""
    name = ".".join(parts)
    now = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip() if value is not None else None
    return BadInput(f"'{name}' is a list, and --set takes no item of it; cannot set '{key}'", where=where,
                    fix=f"set the whole list: --set '{name}=[...]'" + (f" (its value now: {now})" if now else ""))


def _read_text(path: Path) -> str:
    try:
        if not path.is_file():
            raise BadInput("campaign file not found", where=str(path),
                           fix="pass the path of a campaign.yaml (pilotrun init writes one)")
        size = path.stat().st_size
        if size > yamlsafe.MAX_BYTES:
            raise BadInput(f"the campaign file holds {size:,} bytes; a campaign file may hold at most "
                           f"{yamlsafe.MAX_BYTES // 1024} KiB", where=str(path),
                           fix="keep records in data files (data.train ...) and the campaign to its settings")
        with open(path, "rb") as f:
            data = f.read(yamlsafe.MAX_BYTES + 1)
    except OSError as e:  # a symlink loop, no permission, a name too long ...
        raise BadInput(f"cannot read the campaign file: {e.strerror or e}", where=str(path),
                       fix="check the path and its permissions (`ls -l`)") from None
    if len(data) > yamlsafe.MAX_BYTES:  # grown since stat, or a special file
        raise BadInput(f"the campaign file holds more than {yamlsafe.MAX_BYTES // 1024} KiB", where=str(path),
                       fix="keep records in data files (data.train ...) and the campaign to its settings")
    return utf8_of(data, path)


def _read_yaml(path: Path) -> tuple[dict[str, Any], dict[tuple, int]]:
    raw, node = yamlsafe.load_bounded(_read_text(path), str(path))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise BadInput("the campaign file must be a mapping of keys (name:, model:, data:, train: ...)",
                       where=str(path), fix="see `pilotrun init` for the shape")
    _another_tools(raw, path)
    return raw, _node_lines(node)


def _another_tools(raw: dict[str, Any], path: Path) -> None:
    """A campaign verb given the config the campaign is to be imported from (``pilotrun all axolotl.yml``), or a file
    no campaign is made from (an accelerate launch config, a model's config.json): said once as what it is, where
    each of its keys was an "unknown key" of its own (40 of them for an Axolotl file, the first "did you mean
    'model'?" for base_model)."""
    if not raw or raw.keys() & {"model", "data", "train"}:
        return
    from pilotrun.campaign.importers import foreign
    from pilotrun.campaign.importers.source import detect

    if foreign.which(raw) == "pilotrun":  # a campaign lacking a section (plan: and hardware: only): its keys say
        return
    try:
        foreign.refuse(raw, path)
    except BadInput as e:
        raise BadInput(f"not a campaign file: {e.detail}", where=e.where, fix=e.fix) from None
    try:
        fmt = detect(raw, path)
    except BadInput:  # no tool's: its unknown keys say what is wrong
        return
    tool = "an Axolotl config" if fmt == "axolotl" else "a Hugging Face TrainingArguments / TRL config"
    raise BadInput(f"not a campaign file: {tool} ({', '.join(list(raw)[:4])} …)", where=str(path),
                   fix=f"write the campaign from it with `pilotrun import {shlex.quote(str(path))}` (campaign.yaml "
                       "beside it, every key it carries commented with its source), then run this verb on that file")


def _resolve_paths(c: Campaign, base: Path) -> dict[str, Any]:
    """Paths made absolute against ``base``; a hub id (model.path, model.tokenizer) becomes its cached snapshot
    folder. Returns the hub ids resolved, by key."""
    hub: dict[str, Any] = {}

    def from_hub(key: str, v: str | None) -> str | None:
        if not is_hub_id(v, base):
            return v
        hub[key] = resolve(v, key, local=base / v)
        return hub[key].snapshot

    for key in PATH_KEYS:  # "" would name the campaign's own folder
        section, name = key.split(".")
        v = getattr(getattr(c, section), name)
        if isinstance(v, str) and not v.strip():
            raise BadInput(f"empty: a path relative to the campaign's folder, \"\" would name the folder itself ({base})",
                           where=key, fix="name a file or folder, or remove the key")
        if isinstance(v, str) and "\x00" in v:  # os.stat raised ValueError on it: exit 3
            raise BadInput(f"{v!r} holds a NUL character (\\0, YAML's \"\\0\" escape), which no path can hold",
                           where=key, fix="write the path without it")
        _no_shell_variable(key, v, base)
    c.model.path = from_hub("model.path", c.model.path)
    c.model.tokenizer = from_hub("model.tokenizer", c.model.tokenizer)

    def res(v: str | None, allow_byte: bool = False) -> str | None:
        if v is None or (allow_byte and v == "byte"):
            return v
        p = Path(v).expanduser()
        try:
            return str(p if p.is_absolute() else (base / p).resolve())
        except (OSError, RuntimeError):  # a symlink loop (RuntimeError before Python 3.13): reported when read
            return str(base / p)

    c.model.path = res(c.model.path)
    c.model.tokenizer = res(c.model.tokenizer, allow_byte=True)
    c.data.train = res(c.data.train)
    c.data.validation = res(c.data.validation)
    c.data.test = res(c.data.test)
    return hub


_SHELL_VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?|%([A-Za-z_][A-Za-z0-9_]*)%")


def _no_shell_variable(key: str, value, base: Path) -> None:
    """A path holding ``$DATA``, ``${HOME}`` or ``%USERPROFILE%`` that does not exist as written: YAML reads it as text
    and no reader expands it, so it was "data file not found" of ``…/campaign-folder/$DATA/train.jsonl``."""
    if not isinstance(value, str) or value == "byte":
        return
    found = _SHELL_VARIABLE.search(value)
    if found is None:
        return
    p = Path(value).expanduser()
    if (p if p.is_absolute() else base / p).exists():  # a folder really named so
        return
    name = found.group(1) or found.group(2)
    now = os.environ.get(name)
    raise BadInput(f"{value!r} holds {found.group(0)}: a campaign file's paths are read as written, no variable "
                   "expanded", where=key,
                   fix="write the path itself" + (f" ({os.path.expandvars(value)} with ${name} as this shell has it)"
                                                   if now is not None else f" (${name} is not set here either)")
                       + f", or let the shell expand it: --set {key}=\"{value}\"")


def _resolve(path: Path) -> Path:
    try:
        resolved = path.resolve()
    except (OSError, RuntimeError) as e:  # RuntimeError: a symlink loop before Python 3.13
        raise BadInput(f"cannot resolve the campaign path: {e}", where=str(path),
                       fix="the path is a symlink loop or unreachable; point at the file itself") from None
    utf8_path(resolved)  # its folder holds every path the campaign names, which the journal records
    return resolved


def load_campaign(path: str | Path, overrides: dict[str, Any] | None = None) -> LoadedCampaign:
    """Read, override and validate a campaign file. Raises BadInput naming file, line and key."""
    with spending("campaign"):
        return _load_campaign(path, overrides)


def _load_campaign(path: str | Path, overrides: dict[str, Any] | None) -> LoadedCampaign:
    path = _resolve(Path(path))
    raw, lines = _read_yaml(path)
    if overrides:
        raw = apply_overrides(raw, overrides, where="--set")
    c = _validate(raw, path, lines, overrides)
    hub = _resolve_paths(c, path.parent)
    return LoadedCampaign(c, path, path.parent, hub)


def campaign_from_dict(raw: dict[str, Any], base_dir: Path, overrides: dict[str, Any] | None = None) -> LoadedCampaign:
    with spending("campaign"):
        return _campaign_from_dict(raw, base_dir, overrides)


def _campaign_from_dict(raw: dict[str, Any], base_dir: Path, overrides: dict[str, Any] | None) -> LoadedCampaign:
    if overrides:
        raw = apply_overrides(raw, overrides)
    c = _validate(raw, None, {})
    hub = _resolve_paths(c, base_dir)
    return LoadedCampaign(c, None, base_dir, hub)


