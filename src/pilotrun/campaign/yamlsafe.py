"""Reading a campaign file's YAML within bounds: a size cap, an alias-expansion cap, no duplicate keys.

The document is composed once into a node graph in which an alias is the anchored node itself, so
sizes are counted over that graph with a memo (never by expanding it); only a document that passed
the caps is ever constructed or walked by path.
"""

from __future__ import annotations

from typing import Any

import yaml

from pilotrun.errors import EXPONENT_FIX, BadInput, beyond_a_float

MAX_BYTES = 256 << 10
"""A campaign file is a few KB; anything over 256 KiB is refused before it is parsed (parsing that much
already takes about as long as everything else `validate` does)."""
MAX_NODES = 100_000
"""Values a document may hold once its aliases are expanded (a real campaign holds a few hundred)."""

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def _at(where: str, line: int) -> str:
    """``where`` with a line; a ``--set`` value is one line and is named alone (``--set train.lr``, not ``:1``)."""
    return where if where.startswith("--set ") else f"{where}:{line}"


def compose(text: str, where: str) -> yaml.Node | None:
    """Compose ``text`` into nodes; a YAML syntax error is a BadInput naming the line."""
    loader = _Loader(text)
    try:
        return loader.get_single_node()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = _at(where, mark.line + 1) if mark else where
        problem = getattr(e, "problem", None) or str(e)
        raise BadInput(f"invalid YAML: {problem}", where=at, fix="fix the YAML syntax at that line") from None
    finally:
        loader.dispose()


def check_bounds(root: yaml.Node | None, where: str) -> None:
    """Refuse a key given twice in one mapping, an alias that refers to itself, and aliases that expand
    past MAX_NODES. Each distinct node is visited once; sizes are memoised, never expanded."""
    if root is None:
        return
    indegree: dict[int, int] = {id(root): 1}
    stack = [root]
    while stack:  # distinct nodes only: an aliased node is pushed the first time it is reached
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            _no_duplicate_keys(node, where)
        elif isinstance(node, yaml.ScalarNode) and not node.style:  # plain (None; the C loader says "")
            _a_float_holds(node, where)
        for c in _children(node):
            seen = indegree.get(id(c), 0)
            indegree[id(c)] = seen + 1
            if not seen:
                stack.append(c)
    if any(n > 1 for n in indegree.values()):  # aliases: only then can the expanded tree be larger
        _check_expansion(root, indegree, where)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for kv in node.value for n in kv]
    if isinstance(node, yaml.SequenceNode):
        return node.value
    return []


def _check_expansion(root: yaml.Node, indegree: dict[int, int], where: str) -> None:
    size: dict[int, int] = {}
    nodes: dict[int, yaml.Node] = {}
    busy: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        nid = id(node)
        if done:
            busy.discard(nid)
            size[nid] = 1 + sum(size[id(c)] for c in _children(node))
            nodes[nid] = node
            continue
        if nid in size:
            continue
        busy.add(nid)
        stack.append((node, True))
        for c in _children(node):
            if id(c) in busy:
                raise BadInput(f"a YAML alias refers to the value that contains it (anchor at line {_line(c)})",
                               where=_at(where, _line(c)), fix="remove the recursive alias; write the value out")
            if id(c) not in size:
                stack.append((c, False))
    if size[id(root)] - len(indegree) > MAX_NODES:
        # name the anchor whose repetitions add the most values: the one the bomb multiplies
        nid = max((n for n in indegree if indegree[n] > 1), key=lambda n: size[n] * (indegree[n] - 1))
        line = _line(nodes[nid])
        raise BadInput(f"the value anchored at line {line} is repeated by aliases {indegree[nid] - 1} times; expanded, "
                       f"the document would hold {size[id(root)]:,} values (at most {MAX_NODES:,} may come from "
                       "aliases)", where=_at(where, line),
                       fix="write the values out instead of nesting aliases (a campaign, a rates file, a config or "
                           "a --set value is small)")


def _no_duplicate_keys(node: yaml.MappingNode, where: str) -> None:
    seen: dict[Any, int] = {}
    for k, _ in node.value:
        if not isinstance(k, yaml.ScalarNode) or k.tag == "tag:yaml.org,2002:merge":
            continue
        key = k.value
        if key in seen:
            raise BadInput(f"key '{key}' appears twice in one mapping (lines {seen[key]} and {_line(k)}); "
                           "YAML would silently keep the last", where=_at(where, _line(k)),
                           fix=f"keep one '{key}' and delete the other")
        seen[key] = _line(k)


def _a_float_holds(node: yaml.ScalarNode, where: str) -> None:
    """A plain number past what a float holds (``errors.beyond_a_float``), as YAML's float or as the text YAML 1.1
    leaves (``1e-400``: an exponent without a dot), is refused at its line."""
    problem = beyond_a_float(node.value)
    if problem:
        raise BadInput(problem, where=_at(where, _line(node)), fix=EXPONENT_FIX)


def construct(node: yaml.Node | None, where: str) -> Any:
    """Build Python values from a node graph that passed ``check_bounds``."""
    if node is None:
        return None
    loader = _Loader("")
    try:
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        at = _at(where, mark.line + 1) if mark else where
        raise BadInput(f"invalid YAML: {problem}", where=at, fix="fix the YAML at that line") from None
    finally:
        loader.dispose()


def load_bounded(text: str, where: str) -> tuple[Any, yaml.Node | None]:
    node = compose(text, where)
    check_bounds(node, where)
    return construct(node, where), node
