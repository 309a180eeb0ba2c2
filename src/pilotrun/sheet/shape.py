"""What the campaign's batches cost on average, from the pilot: the time of an update as a line in its
padded tokens, and the padded tokens of every update the budget will draw.

The pilot times its train phases on the worst-case (longest) batch; with uneven lengths most updates
are much cheaper. So the pilot also times a few of the updates the campaign's own sampler will draw
(at least ``TYPICAL_UPDATES``; on one rank, more while they take under ``TYPICAL_BUDGET_S``, up to
``TYPICAL_MAX``: one update's time on a shared machine varies by ±10 %, and the plan multiplies it by
every update of the budget), chosen at the budget's quantiles of padded tokens (``typical_order``: the median,
then the 10th and 90th percentiles, …), and counts the padded tokens of every update of the budget (same sampler,
same seed) and of every validation batch. The plan costs each update of the budget at its tokens on the broken line
through those samples and the worst case (``mean_cost``; ``seconds = a + b × padded tokens`` fitted through them
outside the tokens sampled), and scales the longest validation batch's time by each batch's tokens with the fitted
line's fixed share ``a``.

Other work on the machine only ever slows a sample, and on a shared machine by far more than ±10 %:
torch's intra-op threads wait on one another, so a second process on one of two cores made single
updates 10–20× slower (MiniLM's pilot timed 4.1 s where a quiet update takes 0.2 s, and the plan multiplied
it by every update of the budget). A sample more than ``SLOWED`` × the line through the other samples is
left out of the fit (``slowed``; never half of them or more), and while one is, the pilot times more of
the sampler's updates (up to ``TYPICAL_BUSY_S`` in all).
Pure functions; the pilot (rehearsal/memory/pilot_phases.py) measures, the sheet uses.
"""

from __future__ import annotations

from collections import Counter

from pilotrun.engine.sampler import UpdateSampler, update_key

TYPICAL_UPDATES = 3
TYPICAL_MAX = 10
TYPICAL_BUDGET_S = 1.0
# A sample this many times the line through the others was slowed by other work (one-sided: nothing makes an
# update faster than its work); the quiet demo's samples lie within ±10 % of their line
SLOWED = 1.5
TYPICAL_BUSY_S = 5.0  # while a sample is slowed, more of them up to this many seconds of samples in all
# The budget's quantiles of padded tokens the samples are chosen at, in this order: any first n of them spread over
# the budget, so the line's value at the budget's mean is the samples' mean cost (least squares) even where the cost
# grows faster than the tokens (attention). The sampler's first updates were not: the uneven campaign's first
# updates all had the worst case's 8192 tokens, and the line through the origin read 1.075 × its updates.
TYPICAL_QUANTILES = (0.5, 0.1, 0.9, 0.3, 0.7, 0.2, 0.8, 0.4, 0.6, 0.0)
TYPICAL_SCAN = 256  # the samples are chosen among the budget's first updates


def more_typical(timed: list[dict], world: int = 1, worst: tuple[float, float] | None = None) -> bool:
    """Whether the pilot times another of the sampler's updates after ``timed`` (their tokens and seconds;
    ``worst``: the worst case's tokens and seconds, timed too). Ranks must agree (an update holds collectives),
    so several ranks time the minimum, whatever it took."""
    if len(timed) < TYPICAL_UPDATES:
        return True
    if world != 1 or len(timed) >= TYPICAL_MAX:
        return False
    spent = sum(p["seconds"] for p in timed)
    if spent < TYPICAL_BUDGET_S:
        return True
    points = ([worst] if worst else []) + [(p["tokens"], p["seconds"]) for p in timed]
    return spent < TYPICAL_BUSY_S and bool(slowed(points))


def typical_order(budget: list[int], scan: int = TYPICAL_SCAN) -> list[int]:
    """Indices into ``budget`` (the padded tokens of its updates, in the sampler's order) of the updates to time, in
    order: for each of ``TYPICAL_QUANTILES``, the earliest update among the first ``scan`` whose tokens are nearest
    the budget's quantile and not yet chosen. Even lengths give the first updates, as a sampler draws them."""
    pool, ranked = budget[:scan], sorted(budget)
    order: list[int] = []
    for q in TYPICAL_QUANTILES:
        if len(order) == len(pool):
            break
        target = ranked[round(q * (len(ranked) - 1))]
        order.append(min((i for i in range(len(pool)) if i not in order), key=lambda i: (abs(pool[i] - target), i)))
    return order


def slowed(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (tokens, seconds) samples that other work slowed: one at a time, the one furthest above the
    line through the others (``fit_line``), while it is more than ``SLOWED`` × that line and more than half the
    samples stay. Where the others are all of one length, the line is the highest any cost ``a + b × tokens``
    through them can be (flat below their length, through the origin above it), so a short update's fixed cost
    is never taken for a slowed one."""
    kept, out = list(range(len(points))), []
    while len(kept) > 2 and 2 * (len(kept) - 1) > len(points):
        top, top_ratio = None, SLOWED
        for i in kept:
            others = [points[j] for j in kept if j != i]
            x, y = points[i]
            if len({p[0] for p in others}) > 1:
                a, b = fit_line(others)
                line = a + b * x
            else:
                x0, y0 = others[0][0], sorted(p[1] for p in others)[len(others) // 2]
                line = y0 * max(1.0, x / x0) if x0 else y0
            if line > 0 and y / line > top_ratio:
                top, top_ratio = i, y / line
        if top is None:
            break
        kept.remove(top)
        out.append(top)
    return sorted(out)


def padded_tokens(micro_batches: list[list]) -> int:
    """Tokens an update computes on: each micro-batch padded to its longest example, times the rows an example is
    (a preference pair: its chosen and its rejected sequence, ``rows`` 2)."""
    return sum(len(mb) * getattr(mb[0], "rows", 1) * max(e.length for e in mb) for mb in micro_batches if mb)


def budget_tokens(examples: list, t, seed: int, updates: int, rank: int = 0, world: int = 1) -> list[int]:
    """Padded tokens of every update of the budget, from the campaign's sampler (this rank's share)."""
    return budget_shapes(examples, t, seed, updates, rank, world)[0]


def budget_shapes(examples: list, t, seed: int, updates: int, rank: int = 0,
                  world: int = 1) -> tuple[list[int], list[tuple[int, int]]]:
    """``budget_tokens``, and each update's key as the run's memory watch reads it (engine/sampler.py
    ``update_key``), from the same draws."""
    s = UpdateSampler.for_train(t, len(examples), seed, rank, world)
    tokens, keys = [], []
    for _ in range(updates):
        mbs = [[examples[i] for i in mb] for mb in s.next_update()]
        tokens.append(padded_tokens(mbs))
        keys.append(update_key(mbs))
    return tokens, keys


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


def mean_cost(points: list[tuple[float, float]], budget: list[int], a: float, b: float) -> float:
    """The mean seconds of the budget's updates: each at its tokens on the broken line through the samples (those of
    one length averaged), and on the fitted ``a + b × tokens`` outside the lengths sampled. An update's cost grows
    faster than its tokens where attention's square counts, which one straight line through samples at the budget's
    quantiles over-reads at the mean (1.04 on a planted case of three samples, the broken line 1.01)."""
    at: dict[float, list[float]] = {}
    for x, y in points:
        at.setdefault(x, []).append(y)
    xs = sorted(at)
    ys = [sum(at[x]) / len(at[x]) for x in xs]

    def one(x: float) -> float:
        if len(xs) < 2 or x < xs[0] or x > xs[-1]:
            return a + b * x
        i = next(k for k in range(len(xs) - 1) if x <= xs[k + 1])
        return ys[i] + (ys[i + 1] - ys[i]) * (x - xs[i]) / (xs[i + 1] - xs[i])

    return sum(n * one(x) for x, n in Counter(budget).items()) / len(budget)  # a budget has few distinct lengths


def scaled_units(model: dict, steady_s: float, eval_s: float) -> dict | None:
    """Seconds per update and per validation batch at the campaign's mean shapes, or None without a model.

    ``model``: the pilot's ``time_model`` (worst/typical tokens and seconds, budget and validation tokens).
    """
    worst = model.get("worst_update_tokens")
    typical = model.get("typical") or []
    budget = model.get("budget_update_tokens") or []
    if not worst or not budget:
        return None
    points = [(worst, steady_s)] + [(p["tokens"], p["seconds"]) for p in typical]
    left_out = slowed(points)
    kept = [p for i, p in enumerate(points) if i not in left_out]
    a, b = fit_line(kept)
    mean = sum(budget) / len(budget)
    update = mean_cost(kept, budget, a, b)
    at_worst = a + b * worst
    share = a / at_worst if at_worst else 1.0  # the part of a pass that does not grow with tokens
    ev_worst, ev_batches = model.get("worst_eval_tokens"), model.get("eval_batch_tokens") or []
    ev_points = [(ev_worst, eval_s)] + [(p["tokens"], p["seconds"]) for p in model.get("typical_eval") or []]
    eval_batch = eval_s
    if ev_worst and ev_batches and len(ev_points) > 1:  # the validation's own line: its batches timed by the pilot
        eval_batch = mean_cost(ev_points, ev_batches, *fit_line(ev_points))
    elif ev_worst and ev_batches:  # a pilot that timed only the worst batch: the update's fixed share
        eval_batch = eval_s * sum(share + (1 - share) * tok / ev_worst for tok in ev_batches) / len(ev_batches)
    return {"update": update, "eval_batch": eval_batch, "a": a, "b": b, "mean_update_tokens": mean,
            "worst_update_tokens": worst, "fixed_share": share, "slowed": len(left_out),
            "text": (f"updates costed at their padded tokens (the budget's mean {mean:.0f}, worst case {worst}) on the "
                     f"line through the worst case and {len(typical)} of the budget's updates at its quantiles of "
                     f"tokens (fitted: seconds = {a:.3g} + {b:.3g} × tokens)"
                     + (f" ({len(left_out)} of these {len(points)} samples left out: over {SLOWED:g} × the line "
                        f"through the others, slowed by other work on the machine)" if left_out else "")
                     + ("; validation batches costed on the line through the worst and "
                        f"{len(ev_points) - 1} timed {'batch' if len(ev_points) == 2 else 'batches'}"
                        if len(ev_points) > 1 else "; validation batches scaled by their tokens"))}
