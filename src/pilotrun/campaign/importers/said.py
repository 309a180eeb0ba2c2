"""What ``all`` and the sheet say once of an imported campaign: the source's settings not reproduced."""

from __future__ import annotations

from pathlib import Path

def not_reproduced_lines(c) -> list[str]:
    """Once per `all` and per sheet: the imported source's settings the rehearsal does not reproduce, each
    with how it can move the figures; the ones that change nothing rehearsed are named on one line."""
    imp = getattr(c, "imported", None)
    if imp is None or not imp.not_carried:
        return []
    moving = [n for n in imp.not_carried if not n.effect.startswith("nothing to rehearse")]
    quiet = [n.key for n in imp.not_carried if n not in moving]
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}.get(imp.tool, imp.tool)
    out = [f"imported from {tool} {Path(imp.file).name}: {len(moving)} of its settings the rehearsal does not "
           "reproduce; the figures can move as each says"]
    out += [f"  {n.key} = {n.value}: {n.effect}" for n in moving]
    if quiet:
        out.append("  nothing to rehearse: " + ", ".join(quiet))
    return out
