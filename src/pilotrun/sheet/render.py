"""The sheet (a dict from ``sheet.build.build_sheet``) as Markdown, HTML or terminal lines.

``SECTIONS`` lists the sheet's sections in order, each a function of the sheet dict returning blocks
(sheet/sections.py); a new section is one more function in that list. One list of blocks feeds all
three forms, so they cannot disagree. Markdown tables are aligned and paragraphs wrapped at ``WIDTH``.
"""

from __future__ import annotations

import html
import textwrap

from pilotrun.console.safe import escape_controls, safe
from pilotrun.sheet import sections as S

WIDTH = 100
SECTIONS = [S.header, S.memory, S.settings, S.stack, S.fit, S.time, S.costs, S.options, S.launch, S.expected,
            S.constants]


def blocks(s: dict) -> list[tuple]:
    """("h", title) | ("p", text) | ("table", columns, rows) | ("list", items) | ("rows", columns, rows, items):
    a table in Markdown and HTML, one line per row (the items) on a terminal; section by section (a dict
    holding ready ``blocks`` is rendered as they are)."""
    if "blocks" in s:
        return safe(s["blocks"])
    out: list[tuple] = []
    for section in SECTIONS:
        out += section(s)
    return safe(out)  # the campaign's name, labels and paths are the user's words: controls shown escaped


def _one_line(text) -> str:
    """A heading's or a table cell's text on one line: a line break or a tab the user's words hold (a campaign name
    of "a\\nb") is shown escaped, as the other controls are, instead of ending the heading or the row."""
    return escape_controls(str(text)).replace("\n", "\\n").replace("\t", "\\t")


def _wrap(text: str, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(str(text), WIDTH, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                         break_on_hyphens=False) or [first.rstrip()]


def table_lines(cols: list, rows: list[list], markdown: bool = True) -> list[str]:
    """Columns padded to their widest cell; numbers right-aligned."""
    cell = (lambda v: _one_line(v).replace("|", "\\|")) if markdown else str  # noqa: E731
    grid = [[cell(c) for c in cols]] + [[cell(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in grid) for i in range(len(cols))]
    numeric = [all(_numberish(r[i]) for r in grid[1:] if r[i]) and any(r[i] for r in grid[1:])
               for i in range(len(cols))]

    def line(r):
        cells = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(r, widths, numeric)]
        return ("| " + " | ".join(cells) + " |") if markdown else "  " + "  ".join(cells).rstrip()

    rule = "|" + "|".join(("-" * (w + 1) + ":" if num else "-" * (w + 2)) for w, num in zip(widths, numeric)) + "|"
    return [line(grid[0])] + ([rule] if markdown else []) + [line(r) for r in grid[1:]]


def _numberish(v: str) -> bool:
    head = v.split(" ")[0].replace(",", "").replace(".", "", 1).lstrip("-")
    return head.isdigit()


def to_markdown(s: dict) -> str:
    lines: list[str] = []
    for b in blocks(s):
        if b[0] == "h":
            lines += [("# " if not lines else "## ") + _one_line(b[1]), ""]
        elif b[0] == "p":
            lines += _wrap(b[1]) + [""]
        elif b[0] == "list":
            for x in b[1]:
                lines += _wrap(x, "- ", "  ")
            lines.append("")
        else:
            lines += table_lines(b[1], b[2]) + [""]
    return "\n".join(lines)


def to_html(s: dict) -> str:
    e = html.escape
    parts: list[str] = []
    for b in blocks(s):
        if b[0] == "h":
            parts.append(f"<h3>{e(b[1])}</h3>" if not parts else f"<h4>{e(b[1])}</h4>")
        elif b[0] == "p":
            parts.append(f"<p>{e(b[1])}</p>")
        elif b[0] == "list":
            parts.append("<ul>" + "".join(f"<li>{e(str(x))}</li>" for x in b[1]) + "</ul>")
        else:
            head = "".join(f"<th>{e(str(c))}</th>" for c in b[1])
            body = "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in r) + "</tr>" for r in b[2])
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
    return "<div class='sheet'>" + "".join(parts) + "</div>"


def to_lines(s: dict) -> list[str]:
    """The terminal form: every block but the fit table (the stage result renders that as its table)."""
    lines: list[str] = []
    skip = False
    for b in blocks(s):
        if b[0] == "h":
            skip = b[1].startswith("Fit table")
            if not skip:
                lines.append(f"== {b[1]}")
        elif skip:
            continue
        elif b[0] == "p":
            lines.append(b[1])
        elif b[0] == "list":
            lines += [f"  - {x}" for x in b[1]]
        elif b[0] == "rows":  # a table too wide for a terminal: one line per row, wrapped at any width
            lines += [f"  - {x}" for x in b[3]]
        else:
            lines += table_lines(b[1], b[2], markdown=False)
    return lines
