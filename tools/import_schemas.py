"""Write the tools' config schemas that `pilotrun import` reads: src/pilotrun/campaign/importers/schemas/TOOL-VERSION.json.

Each file holds every key the tool's config takes, with its type and default, and the version and source it was
read from. Run it again when a tool releases; the import reads every stored version, and the installed tool's own
classes win when it is installed where pilotrun runs.

    # Axolotl: its pydantic config models and its plugins' argument models, parsed from a source tree (a checkout,
    # `git archive COMMIT src/axolotl VERSION | tar -x`, or an unpacked wheel); nothing of it is imported
    python tools/import_schemas.py axolotl --source DIR --origin axolotl-ai-cloud/axolotl@COMMIT
    # transformers' TrainingArguments and TRL's SFTConfig, DPOConfig, ModelConfig, ScriptArguments, imported from
    # this interpreter (point PYTHONPATH at another version, e.g. `pip install --no-deps --target T "transformers<5"`)
    python tools/import_schemas.py transformers
    python tools/import_schemas.py trl
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from pilotrun.campaign.importers import schemas as S  # noqa: E402 - after the path

OUT = S.DATA
DATASET_CLASSES = ("SFTDataset", "DPODataset", "KTODataset", "StepwiseSupervisedDataset", "SyntheticDataset",
                   "PretrainingDataset")


# ---------------------------------------------------------------- Axolotl, from its source
def _literal(node: ast.AST | None):
    if node is None:
        return None
    try:
        return S.jsonable(ast.literal_eval(node))
    except (ValueError, SyntaxError, TypeError):
        return {"expr": ast.unparse(node)}


def _field(stmt: ast.AnnAssign, owner: str) -> tuple[dict, list[str]]:
    """(entry, aliases) of one annotated field: ``x: T = default`` or ``x: T = Field(default=..., alias=...)``."""
    entry = {"type": ast.unparse(stmt.annotation), "default": None, "from": owner}
    aliases: list[str] = []
    value = stmt.value
    is_field = isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "Field"
    if not is_field:
        entry["default"] = _literal(value)
        return entry, aliases
    kw = {k.arg: k.value for k in value.keywords if k.arg}
    if value.args:
        entry["default"] = None if getattr(value.args[0], "value", None) is Ellipsis else _literal(value.args[0])
    elif "default" in kw:
        entry["default"] = _literal(kw["default"])
    elif "default_factory" in kw:
        entry["default"] = {"expr": ast.unparse(kw["default_factory"]) + "()"}
    if isinstance(kw.get("alias"), ast.Constant):
        aliases.append(kw["alias"].value)
    va = kw.get("validation_alias")
    if isinstance(va, ast.Constant) and isinstance(va.value, str):
        aliases.append(va.value)
    elif isinstance(va, ast.Call):
        aliases += [a.value for a in va.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    return entry, aliases


def _classes(files: list[Path]) -> dict[str, ast.ClassDef]:
    out = {}
    for f in files:
        for node in ast.parse(f.read_text(encoding="utf-8"), str(f)).body:
            if isinstance(node, ast.ClassDef):
                out[node.name] = node
    return out


def _fields(name: str, classes: dict[str, ast.ClassDef]) -> dict[str, dict]:
    """The fields of class ``name`` and its bases known here (pydantic's order: the first base wins)."""
    node = classes.get(name)
    if node is None:
        return {}
    out: dict[str, dict] = {}
    for base in reversed(node.bases):
        out.update(_fields(getattr(base, "id", getattr(base, "attr", "")), classes))
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            if ast.unparse(stmt.annotation).startswith("ClassVar"):
                continue
            entry, aliases = _field(stmt, name)
            out[stmt.target.id] = entry
            for a in aliases:
                if a != stmt.target.id:
                    out[a] = dict(entry, alias_of=stmt.target.id)
    return out


def axolotl(source: Path, origin: str) -> dict:
    pkg = source / "src" / "axolotl" if (source / "src" / "axolotl").is_dir() else source / "axolotl"
    if not (pkg / "utils" / "schemas" / "config.py").is_file():
        raise SystemExit(f"{source}: no axolotl/utils/schemas/config.py (pass a checkout or an unpacked wheel)")
    version_file = next((p for p in (source / "VERSION", pkg / "VERSION") if p.is_file()), None)
    version = version_file.read_text().strip() if version_file else "unknown"
    classes = _classes(sorted((pkg / "utils" / "schemas").rglob("*.py")))
    keys = _fields("AxolotlInputConfig", classes)
    groups = {"datasets": {}}
    for name in DATASET_CLASSES:
        groups["datasets"].update(_fields(name, classes))
    for args in sorted((pkg / "integrations").glob("*/args.py")):
        own = _classes([args])
        plugin = {}
        for name in own:
            plugin.update(_fields(name, {**classes, **own}))
        if plugin:
            groups[f"plugin:axolotl.integrations.{args.parent.name}"] = plugin
    return {"tool": "axolotl", "version": version, "source": origin, "keys": keys, "groups": groups}


# ---------------------------------------------------------------- transformers and TRL, from the installed packages
def transformers() -> dict:
    s = S.installed_transformers()
    return {"tool": s.tool, "version": s.version, "source": f"transformers {s.version} (pip)", "keys": s.keys}


def trl() -> dict:
    s = S.installed_trl()
    if s is None:
        raise SystemExit("trl is not installed here (pip install --no-deps --target T trl, then PYTHONPATH=T)")
    return {"tool": s.tool, "version": s.version, "source": f"trl {s.version} (pip)", "keys": s.keys,
            "groups": s.groups}


def write(data: dict) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{data['tool']}-{data['version']}.json"
    data = dict(data, generated_by="tools/import_schemas.py")
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("tool", choices=S.TOOLS)
    p.add_argument("--source", type=Path, help="axolotl: a source tree (checkout or unpacked wheel)")
    p.add_argument("--origin", help="axolotl: where the tree came from, e.g. axolotl-ai-cloud/axolotl@COMMIT")
    a = p.parse_args(argv)
    if a.tool == "axolotl":
        if a.source is None or not a.origin:
            p.error("axolotl needs --source and --origin")
        data = axolotl(a.source, a.origin)
    else:
        data = transformers() if a.tool == "transformers" else trl()
    path = write(data)
    print(f"{path.relative_to(ROOT)}: {data['tool']} {data['version']}, {len(data['keys'])} keys"
          + "".join(f", {k} {len(v)}" for k, v in data.get("groups", {}).items() if not k.startswith("plugin:"))
          + (f", {sum(k.startswith('plugin:') for k in data.get('groups', {}))} plugins" if data["tool"] == "axolotl"
             else ""))


if __name__ == "__main__":
    main()
