"""The imported campaign as commented YAML."""

from __future__ import annotations

import json
from typing import Any

from pilotrun.campaign.importers.builder import Imported

def yaml_value(v: Any) -> str:
    import yaml

    if isinstance(v, str) and ("\n" in v or v != v.strip() or v == ""):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a double-quoted YAML scalar: one line

    text = yaml.safe_dump(v, default_flow_style=True, allow_unicode=True, width=10**9).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def short(v: Any, limit: int = 60) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def render(imp: Imported) -> str:
    """The campaign as commented YAML: a header listing what was not carried, each key with its source."""
    where = {c.key: c for c in imp.carried}
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}[imp.fmt]
    lines = [f"# imported by `pilotrun import` from {tool} config {imp.source.name}",
             "# each key says where it came from; keys the source did not give keep pilotrun's defaults",
             "# keys checked against: " + "; ".join(imp.schemas), "#"]
    if imp.not_carried:
        lines.append("# NOT CARRIED (the rehearsal does not reproduce these settings):")
        for n in imp.not_carried:
            lines.append(f"#   {n.key}: {short(n.value)}")
            lines.append(f"#     {n.reason}")
    else:
        lines.append("# every setting of the source is carried")
    if imp.to_set:
        lines += ["#", "# TO SET before `pilotrun validate` passes: " + ", ".join(imp.to_set),
                  "#   (edit this file, or pass --set KEY=VALUE to each verb)"]
    lines.append("")

    to_set = {t.split(" ")[0] for t in imp.to_set}

    def emit(d: dict[str, Any], indent: int, prefix: str) -> None:
        for k, v in d.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict) and k != "config" and key not in where and v and k not in ("imported",):
                lines.append(" " * indent + f"{k}:")
                emit(v, indent + 2, key + ".")
                continue
            if k == "imported":
                lines.append(" " * indent + f"{k}:")
                lines.append(" " * (indent + 2) + f"tool: {yaml_value(v['tool'])}")
                lines.append(" " * (indent + 2) + f"file: {yaml_value(v['file'])}")
                lines.append(" " * (indent + 2) + "not_carried:" + (" []" if not v["not_carried"] else ""))
                for n in v["not_carried"]:
                    lines.append(" " * (indent + 4) + f"- key: {yaml_value(n['key'])}")
                    lines.append(" " * (indent + 6) + f"value: {yaml_value(n['value'])}")
                    lines.append(" " * (indent + 6) + f"effect: {yaml_value(n['effect'])}")
                    if n.get("until"):
                        lines.append(" " * (indent + 6) + f"until: {yaml_value(n['until'])}")
                continue
            c = where.get(key)
            comment = f"  # from {c.source}" + (f": {c.note}" if c.note else "") if c else ""
            if c is None and key in to_set:
                comment = f"  # TO SET: --set {key}=..."
            lines.append(" " * indent + f"{k}: {yaml_value(v)}{comment}")

    emit(imp.campaign, 0, "")
    return "\n".join(lines) + "\n"
