"""Token-by-token view of encoded examples (from rehearsal.data_checks.inspect.view_examples), with a legend."""

from __future__ import annotations

# two shades per kind, alternating, so neighbouring tokens stay apart
STYLES = {"trained": ("black on green3", "black on spring_green2"),
          "masked": ("grey85 on grey27", "grey85 on grey39"),
          "input": ("black on sky_blue2", "black on light_sky_blue1"),
          "padding": ("grey62 on dark_red", "grey62 on red3")}


def _piece(text: str) -> str:
    from pilotrun.report.safe import escape_controls  # a record's ESC or BEL is shown, never sent

    return escape_controls(text.replace("\n", "↵").replace("\t", "⇥").replace(" ", "·")) or "∅"


def legend(kinds: set[str] | None = None):
    from rich.text import Text

    t = Text("legend: ")
    for kind, (style, _) in STYLES.items():
        if kinds is not None and (kind == "input") != ("input" in kinds) and kind != "padding":
            continue  # seq-cls views: input and padding; token-level views: trained, masked and padding
        t.append(f" {kind} ", style=style)
        t.append(" ")
    t.append("  (· space, ↵ newline)")
    return t


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

    from pilotrun.report.safe import safe

    examples = safe(examples)  # records' text, labels and names: control characters printed escaped
    con.print(f"[bold]{len(examples)} {split} examples as the loss sees them[/]")
    con.print(legend({k for e in examples for _, _, k in e["tokens"]}))
    for e in examples:
        con.print(f"\n[bold]{escape(e['rid'])}[/]", highlight=False)
        text = Text()
        plain = con.no_color or con.color_system is None  # a log file: no shades, so a mark between tokens
        for k, (_, piece, kind) in enumerate(e["tokens"]):
            if plain and k:
                text.append("│")
            text.append(_piece(piece), style=STYLES[kind][k % 2])
        con.print(text)
        con.print(f"attention mask: {_mask_runs(e['attention_mask'])}  "
                  f"({''.join(map(str, e['attention_mask']))})", markup=False, highlight=False)
        if "vs_inference" in e:
            con.print(f"vs tokenizer(prompt): {e['vs_inference']}", markup=False, highlight=False)
        if "trained" in e:
            table = Table(show_header=True, header_style="bold", expand=True)
            table.add_column("prompt (decoded, masked)", ratio=1)
            table.add_column("trained span (decoded, in the loss)", ratio=1)
            table.add_row(Text(e["prompt"]), Text(e["trained"]))
            con.print(table)
        else:
            head = e.get("head_label")
            same = "" if head == e.get("label") else f"  [bold red]≠ model id2label name '{escape(str(head))}'[/]"
            con.print(f"text: {e['text']}", markup=False, highlight=False)
            con.print(f"label: [bold]{escape(str(e.get('label')))}[/] (id {e['label_id']}); the model's config.id2label "
                      f"names id {e['label_id']} '{escape(str(head))}'{same}", highlight=False)
