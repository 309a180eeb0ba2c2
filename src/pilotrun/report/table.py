"""Tables that fit the terminal they are printed in, and never wrap when printed to a pipe or file.

A table is laid out at the console's width, trying in turn:

1. one line per row, every column side by side;
2. the same with each multi-word header stacked on two lines (``peak_allocated`` → ``peak`` /
   ``allocated``), so a narrow number column is not as wide as its name;
3. the free-text columns (inputs, note, summary, ...) moved to an indented line under their row;
4. also the columns with one value in every row left out, that value said once under the table;
5. the columns split into two or three tables, each led by the first column;
6. one block per row, a ``column: value`` line each (the vertical layout of narrow terminals).

Cells are never cut and headers never ellipsised: a value too long for the width wraps inside its
own block, with the label column kept clear. A console that is not a terminal is given a width no
line reaches (see ``cli.common.console``), so a log or a pipe gets layout 1.
"""

from __future__ import annotations

import json
import textwrap

GAP = "  "
# columns of free text: the first to leave the row when it does not fit
TEXT_COLUMNS = ("inputs", "note", "summary", "why", "reason", "change", "overrides", "supersedes", "created_at",
                "same_experiment", "probes")
STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red", "completed": "green", "running": "cyan",
         "over-budget": "bold red", "oom": "bold red", "nan": "bold red", "error": "bold red",
         "diverged": "bold red", "failed": "bold red", "check failed": "bold red", "interrupted": "yellow", "stopped": "yellow"}
STYLED_COLUMNS = ("verdict", "status")


def cell(v) -> str:
    """A cell as text: floats to 4 significant digits, containers as JSON, None as empty."""
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return "" if v is None else str(v)


def _header_lines(name: str, stacked: bool) -> list[str]:
    """The header as the column's own name (what --json calls it); stacked: split at its first _ or space."""
    cut = min((i for i in (name.find("_"), name.find(" ")) if i > 0), default=-1)
    if not stacked or cut < 0:
        return [name]
    return [name[:cut], name[cut + 1:]]


def _numeric(values: list) -> bool:
    vals = [v for v in values if v is not None and v != ""]
    return bool(vals) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals)


def _styled(con, text: str, column: str, raw) -> None:
    con.print(text, style=STYLE.get(str(raw)) if column in STYLED_COLUMNS else None, markup=False,
              highlight=False, end="")


def _horizontal(columns, rows, texts, stacked: bool):
    """Headers, header depth, column widths and alignment of layouts 1–3."""
    heads = {c: _header_lines(c, stacked) for c in columns}
    depth = max(len(h) for h in heads.values())
    widths = {c: max([len(x) for x in heads[c]] + [len(t[c]) for t in texts]) for c in columns}
    right = {c: _numeric([r.get(c) for r in rows]) for c in columns}
    return heads, depth, widths, right


def _line_width(columns, widths) -> int:
    return sum(widths[c] for c in columns) + len(GAP) * (len(columns) - 1)


def render_table(con, columns, rows, *, title: str | None = None, stackable=TEXT_COLUMNS) -> str:
    """Print ``rows`` (dicts) under ``columns`` at ``con.width``; returns the layout used
    ("wide", "stacked-headers", "text-below", "same-folded", "split" or "vertical")."""
    columns = list(columns)
    if not rows:
        return "wide"
    width = max(int(con.width), 20)
    texts = [{c: cell(r.get(c)) for c in columns} for r in rows]
    under = [c for c in columns if c in stackable and c != columns[0]]
    same = [c for c in columns[1:] if len(rows) > 1 and c not in under and len({t[c] for t in texts}) == 1
            and texts[0][c]]
    kept = [c for c in columns if c not in under]
    tries = [("wide", columns, False, [], []), ("stacked-headers", columns, True, [], [])]
    if under:
        tries += [("text-below", kept, False, under, []), ("text-below", kept, True, under, [])]
    if same:
        tries.append(("same-folded", [c for c in kept if c not in same], True, under, same))
    for layout, shown, stacked, below, folded in tries:
        heads, depth, widths, right = _horizontal(shown, rows, texts, stacked)
        if _line_width(shown, widths) <= width:
            _print_horizontal(con, title, shown, rows, texts, heads, depth, widths, right, below, width)
            if folded:
                items = [f"{c} {texts[0][c]}" for c in folded]
                for line in _wrap_items(items, width, "    in every row: "):
                    con.print(line, markup=False, highlight=False)
            return layout
    shown = [c for c in kept if c not in same]
    heads, depth, widths, right = _horizontal(shown, rows, texts, True)
    groups = _groups(shown, widths, width)
    if groups is not None:
        for i, group in enumerate(groups):
            _print_horizontal(con, title if i == 0 else None, group, rows, texts, heads, depth, widths, right,
                              under if i == len(groups) - 1 else [], width)
        if same:
            for line in _wrap_items([f"{c} {texts[0][c]}" for c in same], width,
                                    "    in every row: "):
                con.print(line, markup=False, highlight=False)
        return "split"
    _print_vertical(con, title, columns, rows, texts, width)
    return "vertical"


def _groups(shown: list[str], widths: dict, width: int, most: int = 3) -> list[list[str]] | None:
    """The columns after the first packed into at most ``most`` tables of ``width``, each led by the
    first column (so every row is named in each); None when they do not pack."""
    key, groups, group = shown[0], [], [shown[0]]
    for c in shown[1:]:
        if _line_width(group + [c], widths) > width:
            if len(group) == 1:
                return None
            groups.append(group)
            group = [key, c]
            if _line_width(group, widths) > width:
                return None
        else:
            group.append(c)
    groups.append(group)
    return groups if len(groups) <= most else None


def _print_horizontal(con, title, shown, rows, texts, heads, depth, widths, right, below, width) -> None:
    if title:
        con.print(title, style="bold", markup=False, highlight=False)
    for i in range(depth):
        parts = []
        for c in shown:
            h = heads[c]
            text = h[i - (depth - len(h))] if i >= depth - len(h) else ""  # short headers sit on the last line
            parts.append(text.rjust(widths[c]) if right[c] else text.ljust(widths[c]))
        con.print(GAP.join(parts).rstrip(), style="bold", markup=False, highlight=False)
    for r, t in zip(rows, texts):
        last = max((j for j, c in enumerate(shown) if t[c]), default=0)  # empty cells at the end: no trailing blanks
        for j, c in enumerate(shown[:last + 1]):
            text = t[c].rjust(widths[c]) if right[c] else t[c].ljust(widths[c])
            if j == last:
                text = text.rstrip()
            _styled(con, text, c, r.get(c))
            if j < last:
                con.print(GAP, end="", markup=False, highlight=False)
        con.print(markup=False, highlight=False)
        for c in below:
            if t[c]:
                label = f"    {c}: "
                for line in wrap(t[c], width, label):
                    con.print(line, markup=False, highlight=False)


def _print_vertical(con, title, columns, rows, texts, width) -> None:
    if title:
        con.print(title, style="bold", markup=False, highlight=False)
    first, rest = columns[0], columns[1:]
    label_w = max(len(c) for c in rest) if rest else 0
    for n, (r, t) in enumerate(zip(rows, texts), 1):
        con.print(f"{first} {t[first]}  ({n}/{len(rows)})", style="bold", markup=False,
                  highlight=False)
        for c in rest:
            label = f"  {c:<{label_w}}  "
            lines = wrap(t[c], width, label)
            con.print(lines[0][:len(label)], end="", markup=False, highlight=False)
            _styled(con, lines[0][len(label):], c, r.get(c))
            con.print(markup=False, highlight=False)
            for line in lines[1:]:
                con.print(line, markup=False, highlight=False)


def wrap(text: str, width: int, label: str, hang: int | None = None) -> list[str]:
    """``label`` + ``text`` wrapped at ``width`` under a hanging indent (the label's width, or
    ``hang`` more than the label's own indent); a word longer than the room (an id, a path) is kept
    whole on its own line rather than cut."""
    indent = len(label) if hang is None else len(label) - len(label.lstrip(" ")) + hang
    first = textwrap.wrap(text, max(width - len(label), 12), break_long_words=False, break_on_hyphens=False)
    if not first:
        return [label]
    rest = textwrap.wrap(text[len(first[0]):].strip(), max(width - indent, 12), break_long_words=False,
                         break_on_hyphens=False)
    return [label + first[0]] + [" " * indent + x for x in rest]


def print_wrapped(con, text: str, indent: str = "") -> None:
    """A message at the console's width under a hanging indent (its own line breaks kept)."""
    width = max(int(con.width), 20)
    for para in str(text).splitlines() or [""]:
        lead = len(para) - len(para.lstrip(" "))
        lines = wrap(para.strip(" "), width, indent + " " * lead, hang=2)
        for line in lines:
            con.print(line.rstrip(), markup=False, highlight=False)


def _wrap_items(items: list[str], width: int, label: str) -> list[str]:
    """``label`` + the items joined by ", ", a line break only between items."""
    lines, line = [], label
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if line.strip() and line != label and len(line) + 1 + len(piece) > width:
            lines.append(line.rstrip())
            line = " " * len(label)
        line += ("" if line.endswith(" ") or line == label else " ") + piece
    return lines + [line.rstrip()]
