"""Durations as a reader takes them (ms, s, min, h, days): the progress line's and the sheet's."""

from __future__ import annotations

DAY_S = 86400.0


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 1:
        return f"{s * 1e3:.3g} ms"
    if s < 120:
        return f"{s:.3g} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 2 * DAY_S:
        return f"{s / 3600:.1f} h"
    return f"{s / DAY_S:.2f} days"
