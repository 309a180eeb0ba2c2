"""overfit on preference pairs: what memorised means for a pair, and what the memorising run must show.

A pair is memorised when the policy's reward prefers its chosen answer (preference accuracy 1.0 on the pairs);
the run must also show the reward margin positive and grown from its start (0 when the policy starts as the
reference), the policy's log-ratios to the reference moved (chosen up relative to rejected), and the reference
itself unchanged: its log-probabilities of the same pairs equal before and after the run (a reference that shares
the policy's weights, or is rebuilt from a trained checkpoint, moves with it and the loss can no longer fall).
"""

from __future__ import annotations

import math

from pilotrun.engine.loop import to_device
from pilotrun.verdicts import plural

MOVED_RTOL = 1e-6  # the reference's log-probabilities, recomputed on the same inputs: equal to rounding


def is_pair_task(task) -> bool:
    return hasattr(task, "pair_margins")


def pair_state(task, model, examples, device) -> dict:
    """The policy's and reference's log-probabilities and the reward margin of each pair, now (no grad)."""
    batch = to_device(task.collate(examples), device)
    out = task.pair_margins(model, batch)
    model.train()
    return out


def pair_check(task, model, examples, device) -> dict:
    """``prediction_check`` for pairs: the pairs whose reward prefers the rejected answer are the ones missed."""
    now = pair_state(task, model, examples, device)
    wrong = [(e.rid, 1, 1) for e, m in zip(examples, now["margin"]) if not m > 0]
    return {"teacher_forced_wrong": wrong, "generation_wrong": [], "generated": 0, "pairs": now}


def _mean(values) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def reference_moved(start: dict, end: dict, examples) -> str | None:
    """Why the reference counts as moved (its log-probabilities of a pair differ after the run), else None."""
    if "ref_chosen" not in start:
        return None
    for key, half in (("ref_chosen", "chosen"), ("ref_rejected", "rejected")):
        for e, a, b in zip(examples, start[key], end[key]):
            if abs(a - b) > MOVED_RTOL * max(abs(a), abs(b), 1.0):
                return (f"the reference moved: its log-probability of the {half} answer of {e.rid} was {a:.6g} before "
                        f"the run and {b:.6g} after it; the reference must stay the starting model — it shares "
                        "weights with the policy (a copy that is not one) or was rebuilt from a trained checkpoint")
    return None


def pair_findings(task, start: dict, end: dict, examples, history: list[dict]) -> tuple[list[str], list[str]]:
    """(lines, failures) of a memorising run on pairs: accuracy, margin, log-ratios, the reference."""
    failures, lines = [], []
    moved = reference_moved(start, end, examples)
    if moved:
        failures.append(moved)
    n = len(examples)
    correct = sum(1 for m in end["margin"] if m > 0)
    m0, m1 = _mean(start["margin"]), _mean(end["margin"])
    lines.append(f"preference accuracy {correct}/{n} ({correct / max(n, 1):.2f}); mean reward margin "
                 f"{m0:+.4g} → {m1:+.4g}")
    if not moved and not (m1 > 0 and m1 > m0):
        failures.append(f"the reward margin did not grow: mean {m0:+.4g} at the start, {m1:+.4g} after "
                        f"{plural(len(history), 'update')}: the loss does not reach the policy's preference")
    if "ref_chosen" in end:
        ratio_c = _mean([p - r for p, r in zip(end["chosen"], end["ref_chosen"])])
        ratio_r = _mean([p - r for p, r in zip(end["rejected"], end["ref_rejected"])])
        lines.append(f"policy log-ratio to the reference: chosen {ratio_c:+.4g}, rejected {ratio_r:+.4g} (both 0 at the "
                     "start)")
        if not moved:
            lines.append(f"the reference did not move: its log-probabilities of the {plural(n, 'pair')} are the "
                         "same before and after the run")
    return lines, failures
