"""The worst-case inputs every phase runs on, chosen from the encoded data."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import per_rank_update
from pilotrun.tasks.packing import filled


def by_length(examples: list) -> list:
    """Longest first (ties: more targets first), so the first micro-batch is the widest padded one."""
    return sorted(examples, key=lambda e: (e.length, e.n_targets), reverse=True)


def padded(chosen: list, pool: list) -> list:
    """``chosen`` (longest first), with its last example swapped for the longest shorter one of ``pool`` when
    every chosen example has the same length and ``pool`` has a shorter one: a batch with padding makes
    the model build an attention mask (batch × length² elements) that a batch without any does not, so a
    campaign with uneven lengths will meet the padded batch at the longest length."""
    if len(chosen) < 2 or chosen[-1].length < chosen[0].length:
        return chosen
    ids = {id(e) for e in chosen}
    shorter = [e for e in pool if e.length < chosen[0].length and id(e) not in ids]
    return chosen[:-1] + by_length(shorter)[:1] if shorter else chosen


def worst_case(prep, world: int, short: str | None = None) -> dict:
    """The inputs each rank gets: the longest training examples as one full update of ``accumulation``
    micro-batches of ``micro_batch``, and the longest validation examples as ``eval_batch`` per rank.
    The widest micro-batch comes last, when the gradients of the earlier ones are already held (the
    heaviest moment of any update), and holds padding when the data can pad it (``padded``).
    ``short`` ("train" or "eval", the test switch only) takes the shortest instead."""
    t = prep.c.train
    per_rank = per_rank_update(t)
    order = by_length(prep.train)
    longest = (order[::-1] if short == "train" else order)[:per_rank]
    if short == "train":
        longest = by_length(longest)
    else:
        longest = padded(longest[: t.micro_batch], prep.train) + longest[t.micro_batch:]
    pool = prep.validation or prep.train
    order = by_length(pool)
    evals = by_length((order[::-1] if short == "eval" else order)[: t.eval_batch * world])
    if short != "eval" and world == 1:
        evals = padded(evals, pool)
    if prep.c.data.packing:  # packed rows: the worst case is a full row of data.max_length tokens (tasks/packing)
        limit = prep.c.data.max_length
        longest = longest if short == "train" else filled(longest, by_length(prep.train), limit)
        evals = evals if short == "eval" else filled(evals, order, limit)
    micro_batches = [longest[i: i + t.micro_batch] for i in range(0, len(longest), t.micro_batch)][::-1]
    train_inputs = {"micro_batch": t.micro_batch, "accumulation": t.accumulation, "ranks": world,
                    "seq_len": max(e.length for e in longest), "precision": t.precision}
    eval_inputs = {"eval_batch": t.eval_batch, "seq_len": evals[0].length if evals else 0, "precision": t.precision}
    if not prep.validation:
        eval_inputs["split"] = "train (no validation split)"
    return {"micro_batches": micro_batches, "train_inputs": train_inputs, "eval": evals, "eval_inputs": eval_inputs}
