"""Why ``overfit`` could not memorise a handful of examples: the likely causes, most evidence first.

Each data cause is measured on the examples overfit tried, as a share, and listed only with evidence:
- unknown tokens: the share of prompt or target tokens that are the tokenizer's unk id (inputs that all
  read as <unk> cannot be told apart);
- constant targets: the share of target tokens that are one and the same id (an unk, a pad, a fixed
  label: the targets carry no information, a sign of a wrong field or a broken encode);
- identical inputs with different targets: examples whose input, as the model reads it, equals another's
  while their targets differ — no model can memorise both.
Capacity (too small a model, too few updates, too short a max_length) is what is left when no data cause
has evidence, so it always comes last.
"""

from __future__ import annotations

import numpy as np

from pilotrun.data.unknown import counts, own_positions, tokenizer_name, unk_id
from pilotrun.tasks.base import IGNORE

CONSTANT_SHARE = 0.5  # half the target tokens one id: no data set of real answers looks like that


def _inputs_and_targets(e) -> tuple[bytes, bytes]:
    ids, lab = np.asarray(e.input_ids, dtype=np.int64), np.asarray(e.labels, dtype=np.int64)
    if lab.size != ids.size:
        return ids.tobytes(), lab.tobytes()
    tgt = np.flatnonzero(lab != IGNORE)
    first = int(tgt[0]) if tgt.size else ids.size
    return ids[:first].tobytes(), lab[lab != IGNORE].tobytes()


def conflicting_inputs(examples: list) -> list[str]:
    """The examples (rids) whose input, as the model reads it up to the first target, equals another
    example's while their targets differ: no model reproduces both."""
    by_input: dict[bytes, set] = {}
    for e in examples:
        x, y = _inputs_and_targets(e)
        by_input.setdefault(x, set()).add(y)
    return [e.rid for e in examples if len(by_input[_inputs_and_targets(e)[0]]) > 1]


def conflict_text(rids: list[str], n: int) -> str:
    shown = ", ".join(rids[:3]) + (f" and {len(rids) - 3} more" if len(rids) > 3 else "")
    return (f"identical inputs with different targets: {len(rids)} of {n} examples read the same as another example "
            f"whose target differs ({shown})")


def plateau_causes(task, examples: list, model=None) -> list[str]:
    """The causes, each a sentence with its measurement, most evidence first; capacity last."""
    found: list[tuple[float, str]] = []
    unk = unk_id(task)
    if unk is not None:
        own = own_positions(task, unk)  # an unk id that is the task's own EOS or pad is not unknown there
        pu, pn, tu, tn = (sum(x) for x in zip(*(counts(e, unk, own) for e in examples)))
        share = max(pu / pn if pn else 0.0, tu / tn if tn else 0.0)
        if share > 0:
            found.append((share, f"unknown tokens: {pu} of {pn} prompt tokens ({pu / max(pn, 1):.0%}) and {tu} of "
                                 f"{tn} target tokens ({tu / max(tn, 1):.0%}) are the unknown token (id {unk}) of "
                                 f"the tokenizer {tokenizer_name(task)}"))
    targets = np.concatenate([np.asarray([t for t in e.labels if t != IGNORE], dtype=np.int64) for e in examples]
                             or [np.empty(0, np.int64)])
    if targets.size:
        ids, n = np.unique(targets, return_counts=True)
        top = n.max() / targets.size
        if top >= CONSTANT_SHARE and len(examples) > 1:
            found.append((top, f"constant targets: {n.max()} of {targets.size} target tokens ({top:.0%}) are the "
                               f"one id {int(ids[n.argmax()])}"))
    clash = conflicting_inputs(examples)
    if clash:
        found.append((len(clash) / len(examples), conflict_text(clash, len(examples))))
    found.sort(key=lambda f: -f[0])  # stable: ties keep the order above
    params = sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None else None
    size = f" ({params:,} trainable parameters)" if params is not None else ""
    capacity = (f"capacity: the model{size} or the budget is too small for these examples — raise --max-updates, "
                "check the model's size and data.max_length" + (" (no data cause measured)" if not found else ""))
    return [f"{i}) {text}" for i, text in enumerate([t for _, t in found] + [capacity], 1)]
