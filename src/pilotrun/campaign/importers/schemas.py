"""The keys each tool's config knows, with their types and defaults, from the tools' own classes.

Two sources, one shape (``Schema``): the data files beside this module (``schemas/TOOL-VERSION.json``, written by
``tools/import_schemas.py`` from Axolotl's pydantic config models and plugins' argument models, transformers'
``TrainingArguments``, TRL's ``SFTConfig``, ``DPOConfig``, ``ModelConfig`` and ``ScriptArguments``, each naming the
version and source it came from), and the tool itself when it is installed here, read the same way, which wins:
its version is the one named, its types and defaults the ones used. Every stored version's keys stay known (a
TrainingArguments dump of transformers 4.x carries keys 5.x dropped), so ``known`` is their union.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from pilotrun import jsonsafe

DATA = Path(__file__).parent / "schemas"
TOOLS = ("axolotl", "transformers", "trl")
# TRL's classes whose fields a `trl sft|dpo --config` file or a dump holds (SFTConfig/DPOConfig extend
# TrainingArguments: only the fields beyond it are TRL's own)
TRL_CLASSES = ("SFTConfig", "DPOConfig", "ModelConfig", "ScriptArguments")


@dataclass(frozen=True)
class Schema:
    tool: str
    version: str
    source: str
    """Where the keys were read: "installed" (this environment's package) or the data's origin (repository@commit,
    or the package version it was generated from)."""
    keys: dict[str, dict] = field(default_factory=dict)
    """name -> {"type": annotation as written, "default": JSON value (or {"expr": source}), "from": class}."""
    groups: dict[str, dict[str, dict]] = field(default_factory=dict)
    """Named sub-schemas: Axolotl's ``datasets`` entry keys and each plugin's (``plugin:axolotl.integrations.X``),
    TRL's keys per class (``SFTConfig`` ...)."""

    @property
    def label(self) -> str:
        return f"{self.tool} {self.version}" + (" (installed)" if self.source == "installed" else "")

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def jsonable(value: Any) -> Any:
    """A default as JSON: enums by value, containers element-wise, anything else JSON cannot hold as its repr."""
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    return {"expr": repr(value)}


def _annotation(t: Any) -> str:
    return t if isinstance(t, str) else getattr(t, "__name__", None) if isinstance(t, type) else \
        str(t).replace("typing.", "")


def dataclass_keys(cls, skip: set[str] | None = None) -> dict[str, dict]:
    """A dataclass's fields (TrainingArguments, TRL's configs): type, default (a factory called), owner."""
    out = {}
    owners = {f.name: c.__name__ for c in reversed(cls.__mro__) if dataclasses.is_dataclass(c)
              for f in dataclasses.fields(c) if f.name in getattr(c, "__annotations__", {})}
    for f in dataclasses.fields(cls):
        if skip and f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            try:
                default = f.default_factory()
            except Exception:  # noqa: BLE001 - a factory that needs the environment: named, not run
                default = {"expr": repr(f.default_factory)}
        else:
            default = None
        out[f.name] = {"type": _annotation(f.type), "default": jsonable(default), "from": owners.get(f.name, cls.__name__)}
    return out


def pydantic_keys(model) -> dict[str, dict]:
    """A pydantic model's fields (Axolotl's), each under its name and its aliases."""
    out = {}
    for name, f in model.model_fields.items():
        default = None if f.is_required() else f.get_default(call_default_factory=True)
        entry = {"type": _annotation(f.annotation), "default": jsonable(default), "from": model.__name__}
        out[name] = entry
        aliases = [f.alias] if f.alias else []
        choices = getattr(f.validation_alias, "choices", None)
        aliases += [a for a in (choices or [f.validation_alias]) if isinstance(a, str)]
        for a in aliases:
            if a and a != name:
                out.setdefault(a, dict(entry, alias_of=name))
    return out


# ---------------------------------------------------------------- the installed tools, read as the data is
def installed_transformers() -> Schema:
    import transformers
    from transformers import TrainingArguments

    return Schema("transformers", transformers.__version__, "installed", dataclass_keys(TrainingArguments))


def installed_trl() -> Schema | None:
    if importlib.util.find_spec("trl") is None:
        return None
    import trl
    from transformers import TrainingArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    groups = {name: dataclass_keys(getattr(trl, name), skip=base) for name in TRL_CLASSES}
    keys = {k: v for g in groups.values() for k, v in g.items()}
    return Schema("trl", trl.__version__, "installed", keys, groups)


def installed_axolotl() -> Schema | None:
    if importlib.util.find_spec("axolotl") is None:
        return None
    import importlib
    import pkgutil
    from importlib.metadata import version

    import axolotl.integrations
    from axolotl.utils.schemas import datasets as ds
    from axolotl.utils.schemas.config import AxolotlInputConfig

    groups = {"datasets": {}}
    for name in ("SFTDataset", "DPODataset", "KTODataset", "StepwiseSupervisedDataset", "SyntheticDataset",
                 "PretrainingDataset"):
        if hasattr(ds, name):
            groups["datasets"].update(pydantic_keys(getattr(ds, name)))
    for mod in pkgutil.iter_modules(axolotl.integrations.__path__):
        try:
            args = importlib.import_module(f"axolotl.integrations.{mod.name}.args")
        except Exception:  # noqa: BLE001 - a plugin without args, or one whose extras are not installed
            continue
        keys = {}
        for obj in vars(args).values():
            if isinstance(obj, type) and hasattr(obj, "model_fields") and obj.__module__ == args.__name__:
                keys.update(pydantic_keys(obj))
        if keys:
            groups[f"plugin:axolotl.integrations.{mod.name}"] = keys
    return Schema("axolotl", version("axolotl"), "installed", pydantic_keys(AxolotlInputConfig), groups)


INSTALLED = {"axolotl": installed_axolotl, "transformers": installed_transformers, "trl": installed_trl}


# ---------------------------------------------------------------- the stored data
def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else -1 for p in v.replace("-", ".").split("."))


@lru_cache(maxsize=None)
def stored(tool: str) -> tuple[Schema, ...]:
    """The data files of ``tool``, newest version first."""
    out = []
    for path in sorted(DATA.glob(f"{tool}-*.json")):
        raw = jsonsafe.loads(path.read_text(encoding="utf-8"))
        out.append(Schema(raw["tool"], raw["version"], raw["source"], raw["keys"], raw.get("groups", {})))
    return tuple(sorted(out, key=lambda s: _version_key(s.version), reverse=True))


@lru_cache(maxsize=None)
def _installed(tool: str) -> Schema | None:
    try:
        return INSTALLED[tool]()
    except Exception:  # noqa: BLE001 - an installed tool that does not import here: the stored data is used
        return None


def schemas(tool: str) -> tuple[Schema, ...]:
    """The tool's schemas, the one that wins first: the installed tool's when it imports, else the newest stored."""
    own = _installed(tool)
    return ((own,) if own is not None else ()) + stored(tool)


def primary(tool: str) -> Schema:
    return schemas(tool)[0]


def known(tool: str, group: str | None = None) -> set[str]:
    """Every key any of the tool's schemas knows (of ``group``: a sub-schema's, a prefix of its names)."""
    out: set[str] = set()
    for s in schemas(tool):
        if group is None:
            out |= set(s.keys)
        else:
            for name, keys in s.groups.items():
                if name == group or name.startswith(group):
                    out |= set(keys)
    return out


def default(tool: str, key: str, fallback: Any = None) -> Any:
    """The winning schema's default of ``key`` (the first schema that knows it)."""
    for s in schemas(tool):
        if key in s.keys:
            d = s.keys[key]["default"]
            return fallback if isinstance(d, dict) and "expr" in d else d
    return fallback


def label(tool: str) -> str:
    """The versions a key was looked up in, for a message: "axolotl 0.18.0 (installed), 0.17.0"."""
    seen = []
    for s in schemas(tool):
        tag = s.version + (" (installed)" if s.source == "installed" else "")
        if s.version not in [x.split(" ")[0] for x in seen]:
            seen.append(tag)
    return f"{tool} " + ", ".join(seen)


def sources(tools: tuple[str, ...]) -> list[str]:
    """Per tool, the schemas the keys were checked against: the winning one with where it came from (installed, or
    the repository and commit it was generated from), then the other stored versions."""
    import re

    out = []
    for tool in tools:
        found = schemas(tool)
        if not found:
            continue
        first = found[0]
        origin = "installed" if first.source == "installed" else re.sub(r"@([0-9a-f]{12})[0-9a-f]+", r"@\1",
                                                                        first.source) if "@" in first.source else "stored"
        rest = []
        for s in found[1:]:
            if s.version != first.version and s.version not in rest:
                rest.append(s.version)
        out.append(f"{tool} {first.version} ({origin})" + "".join(f", {v}" for v in rest))
    return out


def plugin_of(key: str, tool: str = "axolotl") -> str | None:
    """The plugin (``axolotl.integrations.X``) whose arguments hold ``key``, if any."""
    for s in schemas(tool):
        for name, keys in s.groups.items():
            if name.startswith("plugin:") and key in keys:
                return name.removeprefix("plugin:")
    return None
