"""``data.packing``: several examples in one row of up to ``data.max_length`` tokens, as Axolotl's
``sample_packing`` and TRL's ``packing`` train them.

Rows are filled greedily in the data's order (an example goes in the current row while it fits, else it starts
the next): each example is whole in one row, never split across two (Axolotl's multipack bins by length to fill
rows fuller; the worst case either way is a full row of max_length tokens, which is what memory is sized at).
Within a row every example is trained as if alone:

- ``position_ids`` restart at 0 at each example's first token;
- the model gets no ``attention_mask`` and no cache, so transformers builds a block-diagonal causal mask from
  those restarts (``masking_utils.find_packed_sequence_indices``, for sdpa, eager and flash attention alike):
  no token attends to another example;
- the label of each example's first token is IGNORE: the token before it, the end of the previous example,
  never predicts it.

So a row's loss is the sum of its examples' losses (tests/test_packing.py holds that to fp32 precision).
Not every architecture builds its mask from the restarts (in transformers 5.25 OPT and gpt-oss do not, BLOOM takes
no positions at all): a packed campaign's model is checked to keep the examples apart at its first packed
loss (``check_kept_apart``), and one that does not is refused rather than rehearsed with examples that see each other.
Padding after a row (a micro-batch of rows of different lengths) is an example of its own whose labels are
IGNORE: nothing attends to it.
"""

from __future__ import annotations

import weakref

from pilotrun.errors import BadInput
from pilotrun.tasks.base import IGNORE, Example

JOIN = " + "  # between the record ids of a row's examples


def pack(examples: list[Example], max_length: int) -> list[Example]:
    """The examples in rows of at most ``max_length`` tokens, in order; each row's ``meta["segments"]`` lists its
    examples' lengths and ``meta["rids"]`` their records."""
    rows, part, used = [], [], 0
    for e in examples:
        if part and used + e.length > max_length:
            rows.append(_row(part))
            part, used = [], 0
        part.append(e)
        used += e.length
    if part:
        rows.append(_row(part))
    return rows


def _row(parts: list[Example]) -> Example:
    ids, labels = [], []
    for e in parts:
        ids += e.input_ids
        labels += [IGNORE] + list(e.labels[1:]) if e.labels else []
    groups = list(dict.fromkeys(e.group for e in parts if e.group is not None))
    periods = [e.period for e in parts if e.period is not None]
    return Example(ids, labels, JOIN.join(e.rid for e in parts), group=groups[0] if len(groups) == 1 else
                   (JOIN.join(groups) if groups else None), period=max(periods) if periods else None,
                   prompt_len=parts[0].prompt_len, target_len_full=sum(e.target_len_full for e in parts),
                   meta={"segments": [e.length for e in parts], "rids": [e.rid for e in parts]})


def position_ids(examples: list[Example], width: int) -> list[list[int]]:
    """Per row: positions restarting at 0 at each example, then at 0 again for the padding up to ``width``."""
    out = []
    for e in examples:
        pos = [i for n in e.meta.get("segments", [e.length]) for i in range(n)][:width]
        out.append(pos + list(range(width - len(pos))))
    return out


def packed(examples: list[Example]) -> bool:
    return any("segments" in e.meta for e in examples)


def examples_in(rows: list[Example]) -> int:
    """The examples a split's packed rows hold."""
    return sum(len(e.meta.get("segments", [1])) for e in rows)


def summary(rows: list[Example], max_length: int) -> str:
    """A split's rows in words: how many, how many examples, how full."""
    if not rows:
        return "no rows"
    n = examples_in(rows)
    fill = sum(e.length for e in rows) / (len(rows) * max_length)
    return (f"{n} examples packed in {len(rows)} rows of up to {max_length} tokens ({n / len(rows):.1f} examples a "
            f"row, {fill:.0%} full)")


def filled(rows: list[Example], pool: list[Example], max_length: int) -> list[Example]:
    """Each row topped up to ``max_length`` tokens with the first examples of other rows of ``pool`` (the last one
    cut to fit): the worst case of a packed campaign is a full row, which a trainer that bins by length (Axolotl's
    multipack) makes nearly every time, whatever room the greedy packing here left in its longest row."""
    out = []
    for r in rows:
        room = max_length - r.length
        ids, labels = list(r.input_ids), list(r.labels)
        segments, rids = list(r.meta.get("segments", [r.length])), list(r.meta.get("rids", [r.rid]))
        for donor in pool:
            if room <= 0:
                break
            if donor is r:
                continue
            start = 0
            for n, rid in zip(donor.meta.get("segments", [donor.length]), donor.meta.get("rids", [donor.rid])):
                take = min(room, n)
                if take <= 0:
                    break
                ids += donor.input_ids[start:start + take]
                labels += [IGNORE] + list(donor.labels[start + 1:start + take])
                segments.append(take)
                rids.append(rid if take == n else f"{rid} (cut to {take} tokens)")
                room -= take
                start += n
        if len(segments) == len(r.meta.get("segments", [r.length])):
            out.append(r)
            continue
        out.append(Example(ids, labels, JOIN.join(rids), group=r.group, period=r.period, prompt_len=r.prompt_len,
                           target_len_full=sum(1 for t in labels if t != IGNORE),
                           meta={"segments": segments, "rids": rids, "filled": True}))
    return out


# the probe: one example after two different first examples of its length; kept apart, its logits do not move
# (the families kept apart move by at most ~3e-7 of their scale in fp32 and bf16; the ones that cross, >= ~8e-3)
_FIRSTS, _SECOND, MOVED = ([11, 12, 13, 14], [25, 26, 27, 28]), [39, 40, 41], 1e-4
_CHECKED: weakref.WeakSet = weakref.WeakSet()


def check_kept_apart(model) -> None:
    """Exit 2 (``data.packing``) when the model's attention lets a packed row's examples see each other: one
    forward of two rows that end with the same example after different ones, positions restarting at it, no mask
    and no cache, as ``CausalLMTask.inputs`` runs packed rows. Once per model, at its first packed loss: inside
    the first update, whose own forward holds far more than these 14 tokens, so no measured peak moves (at the
    build the load's would). Nothing to check on fake or meta tensors (the estimator's trace)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    first = next(iter(model.parameters()), None)
    if model in _CHECKED or first is None or first.device.type == "meta" or is_fake(first):
        return
    inner = getattr(model, "module", model)  # DDP's wrapper holds the model
    vocab = inner.get_input_embeddings().num_embeddings
    ids = torch.tensor([[t % vocab for t in a + _SECOND] for a in _FIRSTS], device=first.device)
    pos = torch.tensor([list(range(len(a))) + list(range(len(_SECOND))) for a in _FIRSTS], device=first.device)
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            logits = model(input_ids=ids, position_ids=pos, use_cache=False).logits[:, -len(_SECOND):].float()
    finally:
        model.train(was)
    moved = float((logits[0] - logits[1]).abs().max() / logits[0].abs().max().clamp_min(1e-12))
    if moved <= MOVED:
        _CHECKED.add(model)
        return
    import transformers

    cfg = getattr(inner, "config", None)
    arch = f"{getattr(cfg, 'model_type', type(model).__name__)}, {getattr(cfg, '_attn_implementation', None)} " \
           f"attention, transformers {transformers.__version__}"
    raise BadInput(f"this model's attention ({arch}) does not keep a packed row's examples apart: an "
                   f"example's logits moved by {moved:.0%} of their scale when the example before it in the row "
                   "changed (transformers keeps them apart only where the architecture builds its mask from the "
                   "restarting position_ids). Its packed rows would train each example on the ones before it, as the "
                   "source tool's packing does on this model unless that tool patches the attention, so they cannot "
                   "be rehearsed as separate examples", where="data.packing",
                   fix="remove data.packing (one example per row: memory is then sized at the longest example, not "
                       "at a full row of data.max_length tokens), or fine-tune an architecture whose attention keeps "
                       "packed examples apart (in transformers 5.25 Llama, Mistral, Qwen, Gemma, Phi-3, GPT-2, "
                       "GPT-NeoX and the mixtures of experts Mixtral, Qwen-MoE, OLMoE and DeepSeek do)")
