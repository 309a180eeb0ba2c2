"""What ``all`` and the sheet say once of an imported campaign: the source's settings not reproduced."""

from __future__ import annotations

from pathlib import Path


def _set(c, dotted: str) -> bool:
    """Whether the campaign sets ``dotted`` (data.validation ...): a setting it settles is no longer said."""
    node = c
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node not in (None, "", [], {})


def not_reproduced_lines(c) -> list[str]:
    """Once per `all` and per sheet: the imported source's settings the rehearsal does not reproduce, each
    with how it can move the figures; the ones that change nothing rehearsed are named on one line."""
    imp = getattr(c, "imported", None)
    standing = [n for n in (imp.not_carried if imp is not None else []) if not (n.until and _set(c, n.until))]
    if not standing:
        return []
    moving = [n for n in standing if not n.effect.startswith("nothing to rehearse")]
    quiet = [n.key for n in standing if n not in moving]
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}.get(imp.tool, imp.tool)
    out = [f"imported from {tool} {Path(imp.file).name}: {len(moving)} of its settings the rehearsal does not "
           "reproduce; the figures can move as each says"]
    out += [f"  {n.key} = {n.value}: {n.effect}" for n in moving]
    if quiet:
        out.append("  nothing to rehearse: " + ", ".join(quiet))
    return out
