"""Batch arithmetic: examples per update, updates per epoch, what the last partial batch does, and
what the budget means in examples. Printed, never silently changed."""

from __future__ import annotations

import math

from pilotrun.errors import BadInput


def final_is_reference(updates: int, save_every: int | None) -> bool:
    """Whether a run of ``updates`` ends on a numbered checkpoint, so that ``final`` is a reference to it (written
    once that checkpoint's files are checked) and no second copy."""
    return bool(save_every and updates and updates % save_every == 0)


def saves_per_run(updates: int, save_every: int | None) -> int:
    """The checkpoints a run of ``updates`` writes: one every ``save_every`` updates, and ``final`` unless the
    last update saved one (``final_is_reference``)."""
    saved = updates // save_every if save_every else 0
    return saved + (0 if final_is_reference(updates, save_every) else 1)


def data_parallel_ranks(t) -> int:
    return t.nproc if t.strategy in ("ddp", "fsdp") else 1


def per_rank_update(t) -> int:
    """Examples one rank takes into one update: micro_batch × accumulation."""
    return t.micro_batch * t.accumulation


def examples_per_update(t) -> int:
    """Examples one update takes over every data-parallel rank: micro_batch × accumulation × ranks."""
    return per_rank_update(t) * data_parallel_ranks(t)


def updates_per_epoch(n: int, per_update: int, drop_last: bool) -> int:
    """Updates one pass over ``n`` examples makes: the full ones, plus a smaller last one of the rest unless
    ``drop_last`` skips it."""
    full, rest = divmod(n, per_update)
    return full if (drop_last or rest == 0) else full + 1


def batch_arithmetic(t, n_train: int, packed: dict | None = None) -> dict:
    """``n_train``: the training rows (examples, or with data.packing the packed rows); ``packed``: with
    data.packing, {"examples": N} once the data was packed, {} before (validate counts records, not rows)."""
    a = _arithmetic(t, n_train)
    if packed is not None:
        a["packed"] = dict(packed)
    return a


def _arithmetic(t, n_train: int) -> dict:
    ranks = data_parallel_ranks(t)
    per_update = examples_per_update(t)
    full, rest = divmod(n_train, per_update)
    if full == 0 and (t.drop_last or rest == 0):
        raise BadInput(f"{n_train} training examples are fewer than one update of {per_update} "
                       f"(train.micro_batch={t.micro_batch} × train.accumulation={t.accumulation} × {ranks} ranks)",
                       where="train.micro_batch",
                       fix="lower train.micro_batch or train.accumulation, or add training examples")
    per_epoch = updates_per_epoch(n_train, per_update, t.drop_last)
    if t.epochs is not None:
        updates = max(1, math.ceil(t.epochs * per_epoch))
    else:
        updates = t.updates
    full_epochs, extra = divmod(updates, per_epoch)
    examples_per_epoch = n_train - rest if t.drop_last else n_train
    seen = full_epochs * examples_per_epoch + min(extra * per_update, examples_per_epoch)
    if rest == 0:
        last = "every update is full"
    elif t.drop_last:
        last = (f"train.drop_last=true: the last {rest} examples of each (shuffled) epoch are skipped; "
                "a different set each epoch")
    else:
        last = f"train.drop_last=false: the last update of each epoch has {rest} examples instead of {per_update}"
    return {
        "micro_batch": t.micro_batch, "accumulation": t.accumulation, "ranks": ranks,
        "examples_per_update": per_update, "train_examples": n_train, "updates_per_epoch": per_epoch,
        "last_partial": last, "updates": updates, "epochs": round(updates / per_epoch, 3),
        "examples_seen": seen, "budget_from": "train.epochs" if t.epochs is not None else "train.updates",
        "checkpoints": checkpoint_counts(t, updates),
    }


def checkpoint_counts(t, updates: int) -> dict:
    """How many numbered checkpoints a run of ``updates`` writes (train.save_every) and how many stay on disk at
    most (train.keep_checkpoints: the last N, the best by plan.metric; null keeps all), ``final`` apart."""
    saved = updates // t.save_every if t.save_every else 0
    keep = getattr(t, "keep_checkpoints", None)
    kept = saved if keep is None else min(saved, keep + 1)
    final_copy = not final_is_reference(updates, t.save_every)  # else final stands for the last one saved
    return {"saved": saved, "kept": kept, "keep_checkpoints": keep, "final_copy": final_copy, "bytes_each": None}


def checkpoint_line(ck: dict, fmt_bytes=None) -> str:
    """The batch arithmetic's line about checkpoints and the disk they take (``ck["bytes_each"]``, from a pilot's
    save row, formatted by ``fmt_bytes``, when there is one)."""
    keep = ("all kept (train.keep_checkpoints: null)" if ck["keep_checkpoints"] is None else
            f"at most {ck['kept']} kept (the last {ck['keep_checkpoints']}, train.keep_checkpoints, and the best by "
            "plan.metric)")
    copy = ck.get("final_copy", True)
    line = (f"checkpoints: {ck['saved']} saved (train.save_every), {keep}, plus final"
            + ("" if copy else " (a reference to the last one saved, no second copy)"))
    if ck.get("bytes_each") and fmt_bytes is not None:
        n = ck["kept"] + copy
        line += (f"; {n} × {fmt_bytes(ck['bytes_each'])} (the pilot's save row) = {fmt_bytes(n * ck['bytes_each'])}"
                 " on disk per run")
    else:
        line += "; their size: `pilotrun pilot` measures one (its save row)"
    return line


def describe(a: dict, fmt_bytes=None) -> list[str]:
    return [
        f"examples per update = micro_batch {a['micro_batch']} × accumulation {a['accumulation']} × "
        f"ranks {a['ranks']} = {a['examples_per_update']}",
        f"updates per epoch = {a['updates_per_epoch']} ({a['train_examples']} training examples); {a['last_partial']}",
        f"budget ({a['budget_from']}): {a['updates']} updates ≈ {a['epochs']} epochs, {a['examples_seen']} examples seen",
    ] + ([packing_line(a)] if "packed" in a else []) \
      + ([checkpoint_line(a["checkpoints"], fmt_bytes)] if a.get("checkpoints") else [])


def packing_line(a: dict) -> str:
    """What the counts above are under data.packing (``a["packed"]``: the examples in the rows, {} before packing)."""
    p = dict(a["packed"], rows=a["train_examples"])
    if not p.get("examples"):
        return ("data.packing: the counts above are records; packed, they make fewer rows (micro_batch counts rows), "
                "so an epoch has fewer updates: `pilotrun inspect` and the pilot count the rows")
    return (f"data.packing: the 'examples' above are packed rows: {p['examples']} examples in {p['rows']} rows "
            f"({p['examples'] / p['rows']:.1f} examples a row); micro_batch counts rows")
