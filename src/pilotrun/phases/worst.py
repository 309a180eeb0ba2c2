"""The worst-case inputs every phase runs on, chosen from the encoded data."""

from __future__ import annotations


def by_length(examples: list) -> list:
    """Longest first (ties: more targets first), so the first micro-batch is the widest padded one."""
    return sorted(examples, key=lambda e: (e.length, e.n_targets), reverse=True)


def worst_case(prep, world: int, short: str | None = None) -> dict:
    """The inputs each rank gets: the longest training examples as one full update of ``accumulation``
    micro-batches of ``micro_batch``, and the longest validation examples as ``eval_batch`` per rank.
    ``short`` ("train" or "eval", the test switch only) takes the shortest instead."""
    from pilotrun.campaign.arithmetic import per_rank_update

    t = prep.c.train
    per_rank = per_rank_update(t)
    order = by_length(prep.train)
    longest = (order[::-1] if short == "train" else order)[:per_rank]
    if short == "train":
        longest = by_length(longest)
    micro_batches = [longest[i: i + t.micro_batch] for i in range(0, len(longest), t.micro_batch)]
    pool = prep.validation or prep.train
    order = by_length(pool)
    evals = by_length((order[::-1] if short == "eval" else order)[: t.eval_batch * world])
    train_inputs = {"micro_batch": t.micro_batch, "accumulation": t.accumulation, "ranks": world,
                    "seq_len": micro_batches[0][0].length, "precision": t.precision}
    eval_inputs = {"eval_batch": t.eval_batch, "seq_len": evals[0].length if evals else 0, "precision": t.precision}
    if not prep.validation:
        eval_inputs["split"] = "train (no validation split)"
    return {"micro_batches": micro_batches, "train_inputs": train_inputs, "eval": evals, "eval_inputs": eval_inputs}
