"""Golden losses: for each built-in task a tiny fp32 CPU model from a config, a fixed seed, 3 updates; the
losses must equal the stored ones to 1e-5, so a refactor that changes the numbers fails. And the
precision modes really apply: autocast changes the forward's dtype, the grad scaler scales, unscales
(the clipped norm is the true one) and halves its scale on an overflow."""

from __future__ import annotations

import pytest
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign, write_jsonl

# measured on main before the phase-registry refactor (and unchanged by it), torch 2.13.0 CPU; preference when it
# was added
GOLDEN = {
    "causal-lm": [5.941185877873347, 5.586492538452148, 5.439858069786658],
    "seq-cls": [1.099155068397522, 1.3741586804389954, 1.2652761936187744],
    # dpo, β 0.1, the reference a frozen copy: log 2 at the first update, where the policy is the reference
    "preference": [0.6931471824645996, 0.6146698296070099, 0.5609183311462402],
}
UPDATES = 3


def _seq_cls(folder):
    labels = ("neg", "pos", "neutral")
    rows = [{"text": f"review {i}: " + "good " * (i % 5) + "bad " * (i % 3), "label": labels[i % 3]}
            for i in range(16)]
    write_jsonl(folder / "data" / "train.jsonl", rows)
    return write_campaign(folder, {
        "name": "cls", "seed": 0, "task": "seq-cls", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "text": "text", "label": "label", "labels": list(labels),
                 "max_length": 64},
        "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-3, "updates": UPDATES}})


def _preference(folder):
    rows = [{"q": f"reverse word{i}", "good": f"{i}drow", "bad": f"word{i}" + "!" * (i % 3)} for i in range(16)]
    write_jsonl(folder / "data" / "train.jsonl", rows)
    return write_campaign(folder, {
        "name": "pref", "seed": 0, "task": "preference", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "prompt": "q", "chosen": "good", "rejected": "bad", "max_length": 64},
        "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-3, "updates": UPDATES}})


def _campaign(task, folder):
    if task == "causal-lm":
        return tiny_causal_campaign(folder, simple_records(16), train__updates=UPDATES)
    if task == "preference":
        return _preference(folder)
    return _seq_cls(folder)


def _state(path, **overrides):
    import torch

    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.loop import make_state
    from pilotrun.campaign.prepare import prepare

    loaded = load_campaign(path, overrides or None)
    prep = prepare(loaded, splits=("train",))
    torch.manual_seed(prep.c.seed)
    model = prep.task.build_model()
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=prep.c.seed, total_updates=UPDATES,
                       device=torch.device("cpu"))
    return prep, state


@pytest.mark.parametrize("task", sorted(GOLDEN))
def test_three_updates_give_the_stored_losses(tmp_path, task):
    from pilotrun.engine.loop import Hooks, train

    prep, state = _state(_campaign(task, tmp_path))
    assert prep.c.train.precision == "fp32"
    result = train(state, prep.task, prep.train, [], prep.c.train, hooks=Hooks(stop_at=UPDATES))
    losses = [h["loss"] for h in result.history]
    assert losses == pytest.approx(GOLDEN[task], rel=1e-5, abs=1e-5), losses


def _forward_dtypes(state, prep) -> set:
    """The dtypes the model's linear layers produce during one real update."""
    import torch

    from pilotrun.engine.loop import run_update

    seen = set()
    hooks = [m.register_forward_hook(lambda m, i, o: seen.add(o.dtype)) for m in state.model.modules()
             if isinstance(m, torch.nn.Linear)]
    try:
        run_update(state, prep.task, [prep.train[:2]], max_grad_norm=1.0)
    finally:
        for h in hooks:
            h.remove()
    return seen


@pytest.mark.parametrize("precision,dtype", [("fp32", "float32"), ("bf16-mixed", "bfloat16"),
                                             ("fp16-mixed", "float16")])
def test_autocast_is_applied_to_the_forward(tmp_path, precision, dtype):
    import torch

    prep, state = _state(_campaign("causal-lm", tmp_path), **{"train.precision": precision})
    assert _forward_dtypes(state, prep) == {getattr(torch, dtype)}
    assert next(state.model.parameters()).dtype == torch.float32  # mixed: the weights stay fp32


class _Huge:
    """The task with its loss multiplied by 2**20: scaled by 65536, fp16 gradients overflow (a planted defect)."""

    def __init__(self, task):
        self._task = task

    def __getattr__(self, name):
        return getattr(self._task, name)

    def loss(self, model, batch):
        s, n = self._task.loss(model, batch)
        return s * 2.0**20, n


def test_the_grad_scaler_scales_unscales_and_backs_off(tmp_path):
    import torch

    from pilotrun.engine.loop import run_update

    path = _campaign("causal-lm", tmp_path)
    batch = None
    norms = {}
    for precision in ("fp32", "fp16-mixed"):
        prep, state = _state(path, **{"train.precision": precision})
        batch = [prep.train[:2]]
        norms[precision] = run_update(state, prep.task, batch, max_grad_norm=None)["grad_norm"]
    scaler = state.scaler
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.get_scale() == 2.0**16
    # unscaled before clipping: the fp16 norm is the true one, not 65536 times it
    assert norms["fp16-mixed"] == pytest.approx(norms["fp32"], rel=0.05)

    prep, state = _state(path, **{"train.precision": "fp16-mixed"})
    before = [p.detach().clone() for p in state.model.parameters()]
    out = run_update(state, _Huge(prep.task), batch, max_grad_norm=None)
    assert out["finite"]  # the loss itself is finite: only the scaled gradients overflow
    assert state.scaler.get_scale() == 2.0**15  # the overflow halved the scale ...
    assert all(torch.equal(a, b) for a, b in zip(before, state.model.parameters()))  # ... and skipped the step

    prep, state = _state(path)  # fp32 has no scaler: the same loss steps
    before = [p.detach().clone() for p in state.model.parameters()]
    run_update(state, _Huge(prep.task), batch, max_grad_norm=None)
    assert state.scaler is None
    assert not all(torch.equal(a, b) for a, b in zip(before, state.model.parameters()))
