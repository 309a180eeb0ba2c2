"""What the campaign's batches cost on average, from the pilot: the time of an update as a line in its
padded tokens, and the padded tokens of every update the budget will draw.

The pilot times its train phases on the worst-case (longest) batch; with uneven lengths most updates
are much cheaper. So the pilot also times a few updates the campaign's own sampler draws first
(at least ``TYPICAL_UPDATES``; on one rank, more while they take under ``TYPICAL_BUDGET_S``, up to
``TYPICAL_MAX``: one update's time on a shared machine varies by ±10 %, and the plan multiplies it by
every update of the budget), fits ``seconds = a + b × padded tokens`` through those and the worst case,
and counts the padded tokens of every update of the budget (same sampler, same seed) and of every
validation batch. The plan then uses the fitted line at the budget's mean tokens per update, and
scales the longest validation batch's time by each batch's tokens with the same fixed share ``a``.
Pure functions; the pilot (rehearsal/memory/pilot_phases.py) measures, the sheet uses.
"""

from __future__ import annotations

from pilotrun.engine.sampler import UpdateSampler

TYPICAL_UPDATES = 3
TYPICAL_MAX = 10
TYPICAL_BUDGET_S = 1.0


def more_typical(timed: list[float], world: int = 1) -> bool:
    """Whether the pilot times another of the sampler's updates after ``timed`` (their seconds). Ranks
    must agree (an update holds collectives), so several ranks time the minimum, whatever it took."""
    if len(timed) < TYPICAL_UPDATES:
        return True
    return world == 1 and len(timed) < TYPICAL_MAX and sum(timed) < TYPICAL_BUDGET_S


def padded_tokens(micro_batches: list[list]) -> int:
    """Tokens an update computes on: each micro-batch padded to its longest example, times the rows an example is
    (a preference pair: its chosen and its rejected sequence, ``rows`` 2)."""
    return sum(len(mb) * getattr(mb[0], "rows", 1) * max(e.length for e in mb) for mb in micro_batches if mb)


def budget_tokens(examples: list, t, seed: int, updates: int, rank: int = 0, world: int = 1) -> list[int]:
    """Padded tokens of every update of the budget, from the campaign's sampler (this rank's share)."""
    s = UpdateSampler.for_train(t, len(examples), seed, rank, world)
    return [padded_tokens([[examples[i] for i in mb] for mb in s.next_update()]) for _ in range(updates)]


def eval_tokens(examples: list, batch: int, rank: int = 0, world: int = 1) -> list[int]:
    """Padded tokens of each validation batch in the order ``engine.loop.evaluate`` takes them."""
    mine = examples[rank::world]
    return [padded_tokens([mine[i: i + batch]]) for i in range(0, len(mine), batch)]


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``seconds = a + b × tokens``; through the origin when that gives a < 0 or b < 0."""
    n = len(points)
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if n >= 2 and sxx > 0:
        b = sum((x - mx) * (y - my) for x, y in points) / sxx
        a = my - b * mx
        if a >= 0 and b >= 0:
            return a, b
    sq = sum(x * x for x in xs)
    return 0.0, (sum(x * y for x, y in points) / sq if sq else 0.0)


def scaled_units(model: dict, steady_s: float, eval_s: float) -> dict | None:
    """Seconds per update and per validation batch at the campaign's mean shapes, or None without a model.

    ``model``: the pilot's ``time_model`` (worst/typical tokens and seconds, budget and validation tokens).
    """
    worst = model.get("worst_update_tokens")
    typical = model.get("typical") or []
    budget = model.get("budget_update_tokens") or []
    if not worst or not budget:
        return None
    a, b = fit_line([(worst, steady_s)] + [(p["tokens"], p["seconds"]) for p in typical])
    mean = sum(budget) / len(budget)
    update = a + b * mean
    at_worst = a + b * worst
    share = a / at_worst if at_worst else 1.0  # the part of a pass that does not grow with tokens
    ev_worst, ev_batches = model.get("worst_eval_tokens"), model.get("eval_batch_tokens") or []
    eval_batch = eval_s
    if ev_worst and ev_batches:
        eval_batch = eval_s * sum(share + (1 - share) * tok / ev_worst for tok in ev_batches) / len(ev_batches)
    return {"update": update, "eval_batch": eval_batch, "a": a, "b": b, "mean_update_tokens": mean,
            "worst_update_tokens": worst, "fixed_share": share,
            "text": (f"updates timed at the budget's mean of {mean:.0f} padded tokens (worst case {worst}): "
                     f"seconds = {a:.3g} + {b:.3g} × tokens, fitted through the worst case and "
                     f"{len(typical)} of the sampler's first updates; validation batches scaled by their tokens")}
