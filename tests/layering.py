"""The package's layers, bottom to top, as folders, and a checker that walks every import with ``ast``.

A folder (a package of src/pilotrun, or one of the few files of the ground floor) sits wholly in one layer.
It may import from itself or from a layer below it, never from one above, and never from another folder of
its own layer (the stages do not import each other; ``rehearsal/all.py``, a layer up, runs them) — except on
the ground floor, whose files lean on one another. No two folders import each other round a circle, and no
two modules do either. Lazy imports inside functions count: they are the same dependency, only paid later.
A helper one module takes from another is public (no leading underscore). A module's folder is the longest
entry of ``LAYERS`` that names it or a package above it; a module no entry names is itself an error (place it
when you add it).
"""

from __future__ import annotations

import ast
from pathlib import Path

GROUND = "ground"
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    # the package root is imported before any of its modules: the ground. Its ``__getattr__`` hands out the
    # public names (pilotrun.Task, pilotrun.phase) lazily: the one import allowed to point up. console/ is how
    # every layer speaks to the user: terminal-safe text, durations, the progress line; sizes.py reads the memory
    # sizes users write (hardware.memory_per_gpu, --memory-limit) and prints them; jsonsafe.py reads JSON nested too
    # deep as bad JSON (a data line, a config.json), never a RecursionError.
    (GROUND, ("pilotrun", "pilotrun.errors", "pilotrun.verdicts", "pilotrun.provenance", "pilotrun.startup",
              "pilotrun.signals", "pilotrun.scratch", "pilotrun.console", "pilotrun.sizes", "pilotrun.jsonsafe")),
    ("journal", ("pilotrun.journal",)),
    ("records", ("pilotrun.records",)),
    ("tasks", ("pilotrun.tasks",)),
    ("data", ("pilotrun.data",)),
    ("campaign", ("pilotrun.campaign",)),
    ("engine", ("pilotrun.engine",)),
    ("phases", ("pilotrun.phases",)),
    ("probe", ("pilotrun.probe",)),
    ("sheet", ("pilotrun.sheet",)),
    # each stage folder is its own; none imports another
    ("stages", ("pilotrun.rehearsal.data_checks", "pilotrun.rehearsal.mechanics", "pilotrun.rehearsal.memory",
                "pilotrun.rehearsal.rental", "pilotrun.rehearsal.training")),
    ("rehearsal", ("pilotrun.rehearsal",)),  # all.py: the stages in order
    ("report", ("pilotrun.report",)),
    ("integrations", ("pilotrun.integrations",)),
    ("demo", ("pilotrun.demo",)),
    ("front", ("pilotrun.cli",)),
    ("entry", ("pilotrun.__main__",)),  # python -m pilotrun
]


def modules(src: Path, top: str = "pilotrun") -> dict[str, Path]:
    out = {}
    for f in sorted((src / top).rglob("*.py")):
        parts = f.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules ``name`` imports (``from a import b`` counts as a.b when that is a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    facade = {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
              and "." not in name for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in facade:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def private_imports(name: str, path: Path) -> list[str]:
    """Names with a leading underscore imported from another module: a helper two modules share is public."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module != name:
            out += [f"{name} imports the private {node.module}.{a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return out


def folder_of(name: str, layers=LAYERS) -> tuple[int, str] | None:
    """The layer and the folder (the longest entry naming ``name`` or a package above it), or None."""
    best, best_len = None, -1
    for i, (_, prefixes) in enumerate(layers):
        for p in prefixes:
            inside = name.startswith(p + ".") and "." in p  # the root names only itself
            if (name == p or inside) and len(p) > best_len:
                best, best_len = (i, p), len(p)
    return best


def layer_of(name: str, layers=LAYERS) -> int | None:
    found = folder_of(name, layers)
    return None if found is None else found[0]


def problems(src: Path, layers=LAYERS, top: str = "pilotrun") -> list[str]:
    """Every upward or sideways folder import, folder circle, unplaced module, private import and module import
    circle, as sentences."""
    mods = modules(src, top)
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    out = []
    entries = [p for _, prefixes in layers for p in prefixes]
    for m in sorted(mods):
        found = folder_of(m, layers)
        if found is None:
            out.append(f"{m} is in no layer: add it to LAYERS")
            continue
        # a new sub-package of a folder whose sub-packages are folders of their own (a stage) needs its own entry
        rest = m[len(found[1]) + 1:].split(".") if m != found[1] else []
        sub = f"{found[1]}.{rest[0]}" if rest else None
        if sub and any(e.startswith(found[1] + ".") for e in entries) and (
                len(rest) > 1 or mods[m].name == "__init__.py"):
            out.append(f"{m} is in no layer: add {sub} to LAYERS")
    folders: dict[str, set[str]] = {}
    for m, targets in sorted(graph.items()):
        fm = folder_of(m, layers)
        for t in sorted(targets):
            ft = folder_of(t, layers)
            if fm is None or ft is None or fm[1] == ft[1]:
                continue
            (lm, a), (lt, b) = fm, ft
            if lt > lm:
                out.append(f"{m} ({layers[lm][0]}) imports {t} ({layers[lt][0]}), a layer above it")
            elif lt == lm and layers[lm][0] != GROUND:
                out.append(f"{m} ({a}) imports {t} ({b}), another folder of its layer ({layers[lm][0]})")
            else:
                folders.setdefault(a, set()).add(b)
    out += [f"folder circle: {' -> '.join(c)}" for c in cycles(folders)]
    for m, p in sorted(mods.items()):
        out += private_imports(m, p)
    out += [f"import circle: {' -> '.join(c)}" for c in cycles(graph)]
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected group of modules (Tarjan), each closed on its first module."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(_circle(sorted(group), graph))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _circle(group: list[str], graph) -> list[str]:
    """A path from the group's first module back to itself through the group."""
    members, start = set(group), group[0]
    paths, seen = {start: [start]}, {start}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    return paths[v] + [start]
                if w in members and w not in seen:
                    seen.add(w)
                    paths[w] = paths[v] + [w]
                    nxt.append(w)
        frontier = nxt
    return group
