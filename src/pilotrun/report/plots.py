"""Plots for the HTML report, drawn by matplotlib (Agg) and returned as inline SVG text.

The SVG is made to sit inside an HTML page offline: no XML prolog, no DTD, no namespace URLs, text
kept as text (so a reader can search it), and ids salted per figure so two plots never share one.
"""

from __future__ import annotations

import functools
import io
import itertools
import math
import re

from pilotrun.console.safe import safe
from pilotrun.sheet.plan import fmt_duration

_salt = itertools.count()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _plain_text(draw):
    """Every text of the figure ``draw`` makes is drawn as written: a run name, an arm, a label or a phase holding
    two dollar signs ("$\\frac$", "cost $5 vs $10") is not parsed as mathtext, which raised inside matplotlib (a
    report of exit 3) or set the words between the dollars in italics; and its control characters are shown escaped
    as the terminal shows them (console.safe), not handed to the font (a warning per glyph, then raw bytes in the
    page) or left to reorder the words around them (U+202E)."""
    @functools.wraps(draw)
    def plain(*args, **kwargs):
        import matplotlib

        with matplotlib.rc_context({"text.parse_math": False}):
            return draw(*safe(args), **safe(kwargs))
    return plain


def to_svg(fig) -> str:
    import matplotlib

    plt = _pyplot()
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"pilotrun-{next(_salt)}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight",
                    metadata={"Creator": None, "Date": None, "Format": None, "Type": None})
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    # inline SVG in HTML needs no namespace declarations; the HTML parser knows svg and xlink:href
    return re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", svg, count=4)


def _finite(steps, values):
    pts = [(s, v) for s, v in zip(steps, values) if v is not None and math.isfinite(v)]
    return [p[0] for p in pts], [p[1] for p in pts]


@_plain_text
def loss_curves(series: list[dict], labels: dict[str, str], arms: list[str], title: str = "") -> str:
    """Training loss per update (left) and validation points (right): arms by colour, seeds as thin
    lines, diverged runs dashed and marked with an X at their last point, stopped runs with a bar.

    ``series``: dicts of arm, seed, status, train_steps, train_loss, val_steps, val_values.
    """
    plt = _pyplot()
    colours = plt.get_cmap("tab10")
    fig, (ax_t, ax_v) = plt.subplots(1, 2, figsize=(11, 4.2))
    colour = {a: colours(i % 10) for i, a in enumerate(arms)}
    labelled: set[str] = set()
    spread: dict = {ax_t: [], ax_v: []}
    for s in series:
        c = colour.get(s["arm"], "grey")
        diverged = s["status"] == "diverged"
        style = {"color": c, "linewidth": 0.9, "alpha": 0.85, "linestyle": "--" if diverged else "-"}
        name = None
        if s["arm"] not in labelled:
            labelled.add(s["arm"])
            n_div = sum(x["arm"] == s["arm"] and x["status"] == "diverged" for x in series)
            name = f"{s['arm']}: {labels.get(s['arm'], '')}" + (f" ({n_div} diverged)" if n_div else "")
        tx, ty = _finite(s["train_steps"], s["train_loss"])
        vx, vy = _finite(s["val_steps"], s["val_values"])
        spread[ax_t] += ty
        spread[ax_v] += vy
        ax_t.plot(tx, ty, label=name, **style)
        ax_v.plot(vx, vy, marker="o", markersize=3, **style)
        for ax, xs, ys in ((ax_t, tx, ty), (ax_v, vx, vy)):
            if xs and diverged:
                ax.plot(xs[-1], ys[-1], marker="X", markersize=9, color="red", linestyle="none")
                ax.annotate(f"diverged (seed {s['seed']})", (xs[-1], ys[-1]), fontsize=7, color="red",
                            xytext=(6, 4 - 9 * (s["seed"] % 3)), textcoords="offset points")
            elif xs and s["status"] == "stopped":
                ax.plot(xs[-1], ys[-1], marker="|", markersize=12, color=c, linestyle="none")
    for ax, what in ((ax_t, "training loss per update"), (ax_v, "validation (plan metric)")):
        ax.set_xlabel("update")
        ax.set_title(what, fontsize=10)
        ax.grid(alpha=0.3)
        positive = [v for v in spread[ax] if v > 0]
        if positive and max(positive) / min(positive) > 50:  # a diverged run would flatten the others
            ax.set_yscale("log")
    if labelled:
        ax_t.legend(fontsize=8, loc="best")
    if title:
        fig.suptitle(title, fontsize=11)
    return to_svg(fig)


@_plain_text
def phase_ledger(rows: list[dict], title: str = "") -> str:
    """Memory per phase and rank as horizontal bars: grey up to the phase's baseline, coloured (by
    verdict) from the baseline to the peak allocated, light for the peak reserved where the device has
    one; the end value as a dot. The label gives the peak above the baseline and the duration.

    On the CPU (counter rss) the process's resident baseline (the interpreter, torch: ~0.5 GiB) would be
    every bar, so the bars start at each phase's baseline: what the phase itself added, and its duration."""
    if rows and all((r.get("counter") or "") in CPU_COUNTERS for r in rows):
        return _increase_ledger(rows, title)
    plt = _pyplot()
    verdict_colour = {"ok": "#4c9a2a", "over-budget": "#d98c00", "oom": "#c0392b", "nan": "#8e44ad",
                      "error": "#7f8c8d"}
    mib = 2 ** 20
    names = [f"{r['phase']} (rank {r['rank']})" for r in rows]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4))
    ys = list(range(len(rows)))[::-1]
    counters = sorted({r.get("counter") or "?" for r in rows})
    for y, r in zip(ys, rows):
        c = verdict_colour.get(r["verdict"], "grey")
        if r.get("peak_reserved") is not None:
            ax.barh(y, r["peak_reserved"] / mib, height=0.7, color=c, alpha=0.3)
        base = r.get("baseline") or 0
        if base:
            ax.barh(y, base / mib, height=0.45, color="#c8c8c8")
        if r.get("peak_allocated") is not None:
            ax.barh(y, (r["peak_allocated"] - base) / mib, left=base / mib, height=0.45, color=c)
            text = f"{r['verdict']}, {(r['peak_allocated'] - base) / mib:+.1f} MiB"
            if r.get("duration_s") is not None:
                text += f", {r['duration_s']:.2f}s"
            ax.annotate(text, (max(r["peak_allocated"], r.get("peak_reserved") or 0) / mib, y), xytext=(4, -3),
                        textcoords="offset points", fontsize=7)
        if r.get("end_allocated") is not None:
            ax.plot(r["end_allocated"] / mib, y, marker="o", markersize=4, color="black", linestyle="none")
    ax.set_yticks(ys, names, fontsize=8)
    unit = "RSS" if counters == ["rss"] else "/".join(counters)
    ax.set_xlabel(f"MiB ({unit}): grey = baseline, colour = up to the peak allocated, light = peak reserved, "
                  "• = end")
    ax.margins(x=0.15)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return to_svg(fig)


_VERDICT_COLOUR = {"ok": "#4c9a2a", "over-budget": "#d98c00", "oom": "#c0392b", "nan": "#8e44ad", "error": "#7f8c8d",
                   "warn": "#d98c00"}


CPU_COUNTERS = ("rss", "tensors+rss")  # RSS alone, or the exact tensor counter (allocated) beside RSS (reserved)


@_plain_text
def _increase_ledger(rows: list[dict], title: str) -> str:
    plt = _pyplot()
    mib = 2 ** 20
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.4))
    ys = list(range(len(rows)))[::-1]
    for y, r in zip(ys, rows):
        base = r.get("baseline") or 0
        peak = r.get("peak_allocated")
        up = max((peak - base) / mib, 0.0) if peak is not None else 0.0
        ax.barh(y, up, height=0.55, color=_VERDICT_COLOUR.get(r["verdict"], "grey"))
        text = f"{r['verdict']}, +{up:.1f} MiB"
        if r.get("duration_s") is not None:
            text += f", {_duration(r['duration_s'])}"
        ax.annotate(text, (up, y), xytext=(4, -3), textcoords="offset points", fontsize=7)
    ax.set_yticks(ys, [f"{r['phase']} (rank {r['rank']})" for r in rows], fontsize=8)
    base = max((r.get("baseline") or 0 for r in rows), default=0)
    what = ("process RSS" if all(r.get("counter") == "rss" for r in rows)
            else "bytes held by live tensors, the exact counter")
    ax.set_xlabel(f"MiB added over the phase's own baseline ({what}; baselines up to {base / mib:.0f} MiB)")
    ax.margins(x=0.25)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return to_svg(fig)


def _duration(s: float) -> str:
    return fmt_duration(s)


@_plain_text
def paired_bars(labels: list[str], a: list[float], b: list[float], names: tuple[str, str], *, unit: str,
                title: str = "", band: tuple[float, float] | None = None) -> str:
    """Two bars per label (e.g. pilot peak and observed peak; predicted and actual seconds), with the
    ratio b ÷ a written beside each pair; ``band`` colours ratios outside it."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(labels) + 1.5))
    ys = list(range(len(labels)))[::-1]
    for y, x1, x2 in zip(ys, a, b):
        ax.barh(y + 0.18, x1, height=0.34, color="#9db4d0")
        ax.barh(y - 0.18, x2, height=0.34, color="#2e6da4")
        if x1:
            ratio = x2 / x1
            bad = band is not None and not band[0] <= ratio <= band[1]
            ax.annotate(f"{ratio:.2f}", (max(x1, x2), y), xytext=(4, -3), textcoords="offset points", fontsize=8,
                        color="#c0392b" if bad else "black")
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_xlabel(f"{unit}: light = {names[0]}, dark = {names[1]}; the number is {names[1]} ÷ {names[0]}")
    ax.margins(x=0.15)
    ax.grid(axis="x", alpha=0.3)
    if title:
        ax.set_title(title, fontsize=10)
    return to_svg(fig)
