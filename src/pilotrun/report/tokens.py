"""Token-by-token view of encoded examples (from rehearsal.data_checks.inspect.view_examples), with a legend.

The strip of tokens is broken into lines between tokens, never inside one, at the console's width
(``cli.common.console``: PILOTRUN_WIDTH, the terminal's, COLUMNS, else unwrapped). With colour each kind
has its shades; without (a log, a pipe, NO_COLOR) the tokens are separated by ``│`` and a marker row
under each line says each token's kind (``MARKS``, named in the legend). The decoded prompt/answer table
is no wider than the strip above it.
"""

from __future__ import annotations

from pilotrun.console.safe import escape_controls, safe
from pilotrun.verdicts import plural

# two shades per kind, alternating, so neighbouring tokens stay apart
STYLES = {"trained": ("black on green3", "black on spring_green2"),
          "masked": ("grey85 on grey27", "grey85 on grey39"),
          "input": ("black on sky_blue2", "black on light_sky_blue1"),
          "padding": ("grey62 on dark_red", "grey62 on red3")}


MARKS = {"trained": "^", "masked": "-", "padding": "~", "input": " "}  # the marker row without colour
SEP = "│"


def _piece(text: str) -> str:
    return escape_controls(text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·")) or "∅"


def legend(kinds: set[str] | None = None, plain: bool = False):
    from rich.text import Text

    t = Text("legend: ")
    shown = []
    for kind, (style, _) in STYLES.items():
        if kinds is not None and (kind == "input") != ("input" in kinds) and kind != "padding":
            continue  # seq-cls views: input and padding; token-level views: trained, masked and padding
        shown.append(kind)
        t.append(f" {kind} ", style=style)
        t.append(" ")
    t.append("  (· space, ↵ newline)")
    marked = [k for k in shown if MARKS[k].strip() and (kinds is None or k in kinds)]
    if plain and marked:
        t.append(f"; no colour here: tokens are split by {SEP}, and the row under each line marks them: "
                 + ", ".join(f"{MARKS[k]} {k}" for k in marked))
    return t


def strip_lines(tokens: list, width: int, plain: bool) -> list[list[tuple[str, str, int]]]:
    """The token strip as lines of (piece, kind, index) no wider than ``width`` cells, broken between tokens
    (a token wider than the width alone on its line)."""
    from rich.cells import cell_len

    lines, line, used = [], [], 0
    for k, (_, piece, kind) in enumerate(tokens):
        shown = _piece(piece)
        w = cell_len(shown) + (1 if plain and line else 0)
        if line and used + w > width:
            lines.append(line)
            line, used, w = [], 0, cell_len(shown)
        line.append((shown, kind, k))
        used += w
    return lines + ([line] if line else [])


def _strip(con, tokens: list, plain: bool) -> int:
    """Print the token strip; returns the width of its widest line."""
    from rich.cells import cell_len
    from rich.text import Text

    widest = 0
    marks = plain and any(MARKS[kind].strip() for _, _, kind in tokens)
    for line in strip_lines(tokens, max(int(con.width), 20), plain):
        text, row = Text(), []
        for j, (shown, kind, k) in enumerate(line):
            if plain and j:
                text.append(SEP)
                row.append(" ")
            text.append(shown, style=STYLES[kind][k % 2])
            row.append(MARKS[kind] * cell_len(shown))
        widest = max(widest, text.cell_len)
        con.print(text, highlight=False)
        if marks:
            con.print("".join(row).rstrip(), markup=False, highlight=False)
    return widest


def _mask_runs(mask: list[int]) -> str:
    runs, prev, count = [], None, 0
    for m in mask:
        if m == prev:
            count += 1
            continue
        if prev is not None:
            runs.append(f"{prev}×{count}")
        prev, count = m, 1
    if prev is not None:
        runs.append(f"{prev}×{count}")
    return " ".join(runs)


def render_examples(examples: list[dict], con, split: str) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    examples = safe(examples)  # records' text, labels and names: control characters printed escaped

    con.print(f"[bold]{escape(plural(len(examples), split + ' example'))} as the loss sees them[/]")
    plain = con.no_color or con.color_system is None  # a log file: no shades, so a mark between tokens
    con.print(legend({k for e in examples for _, _, k in e["tokens"]}, plain))
    for e in examples:
        con.print(f"\n[bold]{escape(e['rid'])}[/]", highlight=False)
        widest = _strip(con, e["tokens"], plain)
        con.print(f"attention mask: {_mask_runs(e['attention_mask'])}  "
                  f"({''.join(map(str, e['attention_mask']))})", markup=False, highlight=False)
        if "contributes" in e:
            con.print(e["contributes"], markup=False, highlight=False)
        if "packed" in e:
            con.print(e["packed"], markup=False, highlight=False)
        if "vs_inference" in e:
            con.print(f"vs tokenizer(prompt): {e['vs_inference']}", markup=False, highlight=False)
        if "trained" in e:
            # no wider than the strip above it (nor the console): a pipe's console is unwrapped
            table = Table(show_header=True, header_style="bold", width=min(int(con.width), max(widest, 40)))
            table.add_column("prompt (decoded, masked)", ratio=1)
            table.add_column("trained span (decoded, in the loss)", ratio=1)
            table.add_row(Text(e["prompt"]), Text(e["trained"]))
            con.print(table)
        elif "label_id" in e:  # seq-cls: the text and its class
            head = e.get("head_label")
            same = "" if head == e.get("label") else f"  [bold red]≠ model id2label name '{escape(str(head))}'[/]"
            con.print(f"text: {e['text']}", markup=False, highlight=False)
            con.print(f"label: [bold]{escape(str(e.get('label')))}[/] (id {e['label_id']}); the model's config.id2label "
                      f"names id {e['label_id']} '{escape(str(head))}'{same}", highlight=False)
