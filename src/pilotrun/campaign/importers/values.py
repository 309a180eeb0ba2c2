"""Each value of a source config against the type its tool declares for the key (``schemas``), before any is mapped.

The mappers do arithmetic on what they read (a learning rate, a batch size, a share of the epochs): a value of another
type (``learning_rate: x``, ``micro_batch_size: [2]``, ``save_steps: nan``) was an internal error there, exit 3,
where the tool itself refuses the file. Checked first, it is exit 2 naming the key, the value and the type, as the
tool's own validation would. Numbers written as text are read as the tools read them (pydantic and
``HfArgumentParser`` take ``"2"`` and ``"1e-4"``): the value is replaced by the number before it is mapped.
A type this reader does not know (a class of the tool's: a data set entry, an enum) is left to the mappers.
"""

from __future__ import annotations

import math
from typing import Any

from pilotrun.campaign.importers import schemas
from pilotrun.campaign.importers.builder import Builder
from pilotrun.campaign.importers.render import short
from pilotrun.errors import NUMBER, BadInput

DATA_SET_LISTS = ("datasets", "test_datasets", "pretraining_dataset")
"""Axolotl's keys of data set entries, which the mappers walk: a list (of entries or paths), or left out."""
_NAMES = {"int": "a whole number", "float": "a number", "str": "text", "bool": "true or false", "list": "a list",
          "dict": "a mapping"}


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at ``sep`` outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == sep and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def alternatives(annotation: str) -> list[str] | None:
    """The kinds a type annotation as written allows (``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``,
    ``None``, ``literal:[...]``), or None when one of them is a type this reader does not know (then anything goes)."""
    out: list[str] = []
    for alt in _split(annotation, "|"):
        name, _, inner = alt.partition("[")
        inner = inner[:-1] if inner.endswith("]") else inner
        name = name.strip().removeprefix("typing.")
        if name == "Annotated":
            found = alternatives(_split(inner, ",")[0])
        elif name == "Optional":
            inside = alternatives(inner)
            found = None if inside is None else inside + ["None"]
        elif name == "Union":
            found = alternatives(" | ".join(_split(inner, ",")))
        elif name in ("None", "NoneType"):
            found = ["None"]
        elif name in ("int", "float", "str", "bool"):
            found = [name]
        elif name in ("list", "List", "tuple", "Tuple", "set"):
            found = ["list"]
        elif name in ("dict", "Dict"):
            found = ["dict"]
        elif name == "Literal":
            found = ["literal:" + inner]
        else:
            return None
        if found is None:
            return None
        out += found
    return out


def _literal_values(inner: str) -> list:
    import ast

    try:
        value = ast.literal_eval(f"[{inner}]")
    except (ValueError, SyntaxError):
        return []
    return value


def read_as(value: Any, kinds: list[str]) -> tuple[bool, Any]:
    """(whether ``value`` is what a key of ``kinds`` (numbers, maybe null or named words) takes, the value as the
    tool reads it: a number written as text, as that number). Every finite number is taken, a yes/no too (pydantic's
    lax mode reads true as 1, and a whole-number key takes 0.1 in published configs: warmup_steps 0.1); text that is
    no number, a list, a mapping, NaN and the infinities are not."""
    if value is None:
        return "None" in kinds, None
    if _literal(value, kinds):
        return True, value
    if isinstance(value, bool):
        return True, value
    if isinstance(value, (int, float)):
        return math.isfinite(value), value
    if isinstance(value, str) and NUMBER.fullmatch(value):
        number = float(value)
        if not math.isfinite(number):
            return False, value
        return True, int(number) if "float" not in kinds and number.is_integer() else number
    return False, value


def _literal(value: Any, kinds: list[str]) -> bool:
    return any(value in _literal_values(k.removeprefix("literal:")) for k in kinds if k.startswith("literal:"))


def said(kinds: list[str]) -> str:
    out = []
    for k in kinds:
        if k == "None":
            continue
        if k.startswith("literal:"):
            out += [repr(v) for v in _literal_values(k.removeprefix("literal:"))]
        elif _NAMES[k] not in out:
            out.append(_NAMES[k])
    if "a whole number" in out and "a number" in out:
        out.remove("a whole number")
    return " or ".join(out) or "nothing (leave it out)"


def annotation_of(tool: str, key: str) -> str | None:
    """The winning schema's annotation of ``key``, if any of the tool's schemas knows it."""
    for s in schemas.schemas(tool):
        if key in s.keys and isinstance(s.keys[key].get("type"), str):
            return s.keys[key]["type"]
    return None


def check_values(raw: dict[str, Any], tools: tuple[str, ...], b: Builder, none_is_unset: bool = True) -> None:
    """Each key of ``raw`` whose tool declares a type: a value of another type is a problem of ``b`` naming it;
    a number written as text becomes that number in ``raw``. ``none_is_unset``: a null is the key left out (an
    Axolotl YAML's ``key:``); else (a TrainingArguments dump, which writes null only where the type allows it) a null
    where a number belongs is refused as the class would refuse it."""
    for key, value in list(raw.items()):
        if isinstance(value, str) and "\x00" in value:  # no config's value holds one; a path with it was exit 3
            b.problems.append(BadInput(f"{key} = {value!r} holds a NUL character (\\0)", where=str(b.source),
                                       fix=f"write {key} without it"))
            continue
        tool, annotation = next(((t, a) for t in tools if (a := annotation_of(t, key)) is not None),
                                (tools[0], None))
        kinds = alternatives(annotation) if annotation else None
        label = schemas.primary(tool).label
        if kinds and key in DATA_SET_LISTS and value is not None and not isinstance(value, list):
            b.problems.append(BadInput(f"{key} = {short(value)}: {label} takes a list of data sets there",
                                       where=str(b.source),
                                       fix=f"write {key} as a list: - path: train.jsonl"))
            continue
        if kinds and "str" in kinds and {"int", "float"} & set(kinds) and not any(k.startswith("literal:")
                                                                                for k in kinds):
            kinds = [k for k in kinds if k != "str"]  # Axolotl's learning_rate: str | float, the str a number's text
        numeric = kinds and {"int", "float"} & set(kinds) and set(kinds) <= {"int", "float", "None"} | {
            k for k in kinds if k.startswith("literal:")}
        text = kinds and set(kinds) <= {"str", "None"} and "str" in kinds
        scalar = isinstance(value, (bool, int, float)) and kinds and not any(
            k in ("int", "float", "bool") or k.startswith("literal:") for k in kinds)
        if (text and value is not None and not isinstance(value, str)) or scalar:
            ok, read = False, value  # a path or a name as a list (base_model: [a, b]), modules as a number
        elif not numeric or (value is None and (none_is_unset or "None" in kinds)):
            continue  # only what the mappers compute with: a key of another type is carried as text or named
        else:
            ok, read = read_as(value, kinds)
        if ok:
            raw[key] = read
            continue
        what = said(kinds)
        nan = numeric and (isinstance(value, float) or isinstance(value, str) and value.strip().lower() in (
            "nan", "inf", "-inf", "infinity"))
        b.problems.append(BadInput(
            f"{key} = {short(value)}: {label} takes {what} there"
            + (" (a finite one)" if nan else ""), where=str(b.source),
            fix=f"write {key} as {what}, as the source tool's own validation asks"))
