"""Predictions of a run's final model on the whole validation set, stored in the journal (split "validation").

A sweep keeps them per run so arms can be compared example by example later, not only by one loss.
"""

from __future__ import annotations

from pilotrun.engine.loop import to_device
from pilotrun.engine.precision import autocast
from pilotrun.tasks.base import IGNORE


def _targets(task, example) -> list[int]:
    if task.kind == "causal-lm":
        return [t for t in example.labels[1:] if t != IGNORE]  # position t predicts token t+1
    return [t for t in example.labels if t != IGNORE]


def store_validation_predictions(recorder, prep, model) -> int:
    """Greedy predictions at the targets of every validation example; returns how many were stored.
    ``recorder=None``: a rank that only takes part in the forward passes (FSDP) stores nothing."""
    import torch

    examples = prep.validation
    if not examples:
        return 0
    batch_size = prep.c.train.eval_batch
    device = next(model.parameters()).device
    model.eval()
    items = []
    with torch.no_grad(), autocast(prep.c.train.precision, device.type):
        for i in range(0, len(examples), batch_size):
            chunk = examples[i: i + batch_size]
            batch = to_device(prep.task.collate(chunk), device)
            if hasattr(prep.task, "pair_margins"):  # preference: which answer each pair's rewards prefer, by how much
                items += _pair_items(chunk, prep.task.pair_margins(model, batch))
                continue
            for e, pred in zip(chunk, prep.task.predict(model, batch)):
                target = _targets(prep.task, e)
                items.append((e.rid, {"pred": pred, "target": target, "exact": pred == target}))
    if recorder is not None:
        recorder.journal.add_predictions(recorder.run_id, "validation", items)
    return len(items)


def _pair_items(chunk: list, margins: dict) -> list[tuple]:
    return [(e.rid, {"margin": m, "preferred": m > 0, "chosen_logp": c, "rejected_logp": r})
            for e, m, c, r in zip(chunk, margins["margin"], margins["chosen"], margins["rejected"])]
