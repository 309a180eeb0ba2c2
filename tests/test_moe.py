"""Mixtures of experts: the loss they train (the router's auxiliary loss), their LoRA defaults, and what the
options table says of them (expert parallelism, total and active parameters). The family matrix
(tests/test_architectures.py) loads, estimates and pilots each family."""

from __future__ import annotations

import pytest
from architectures import MOE, campaign, save_model
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign

QWEN3_MOE = {"model_type": "qwen3_moe", **MOE["qwen3_moe"], "num_hidden_layers": 2, "vocab_size": 384,
             "output_router_logits": True}


def _first_update(loaded) -> tuple[dict, object, dict]:
    """pilotrun's first update on the first micro-batch (accumulation 1), and transformers' own forward with labels
    on the same batch from the same weights (a second build under the campaign seed)."""
    import torch

    from pilotrun.campaign.prepare import prepare
    from pilotrun.engine.loop import make_state, run_update

    prep = prepare(loaded, splits=("train",))
    t = prep.c.train
    mb = prep.train[: t.micro_batch]
    state = make_state(prep.task.build_model(), t, n_train=len(prep.train), seed=prep.c.seed, total_updates=1)
    out = run_update(state, prep.task, [mb], max_grad_norm=t.max_grad_norm)
    batch = prep.task.collate(mb)
    with torch.no_grad():
        ref = prep.task.build_model()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       labels=batch["labels"])
    return out, ref, batch


@pytest.mark.parametrize("coef", [0.02, 0.5])
def test_the_router_aux_coefficient_moves_the_first_update_loss_as_transformers_forward_does(tmp_path, coef):
    """Qwen3-MoE with output_router_logits: the loss was the targets' cross-entropy whatever the coefficient (the
    same with the router logits on or off), while transformers' forward — so the HF Trainer, TRL, Axolotl — adds
    router_aux_loss_coef × aux. Now pilotrun's first update is transformers' loss, its part apart; with the router
    logits off neither adds it."""
    cfg = dict(QWEN3_MOE, router_aux_loss_coef=coef)
    on = load_campaign(tiny_causal_campaign(tmp_path / "on", simple_records(8), model__config=cfg,
                                            train__accumulation=1))
    out, ref, _ = _first_update(on)
    assert ref.aux_loss is not None
    assert out["loss"] == pytest.approx(float(ref.loss), rel=1e-6, abs=1e-6)
    assert out["loss_parts"]["router_aux"] == pytest.approx(coef * float(ref.aux_loss), rel=1e-5)
    off = load_campaign(tiny_causal_campaign(tmp_path / "off", simple_records(8),
                                             model__config=dict(cfg, output_router_logits=False),
                                             train__accumulation=1))
    plain, ref_off, _ = _first_update(off)
    assert "loss_parts" not in plain and plain["loss"] == pytest.approx(float(ref_off.loss), rel=1e-6)
    assert out["loss"] - plain["loss"] == pytest.approx(coef * float(ref.aux_loss), rel=1e-4)


def test_a_saved_mixtral_trains_its_router_loss_when_the_campaign_turns_the_router_logits_on(tmp_path):
    """A second instance, through a saved folder: Mixtral's config.json leaves output_router_logits off (as the
    published one does); model.config_overrides turns it on as Axolotl's model_config does, and the coefficient
    comes from config.json (0.02, set here to 0.1)."""
    folder = save_model(tmp_path / "mixtral", "mixtral", router_aux_loss_coef=0.1)
    loaded = load_campaign(campaign(tmp_path / "c", folder, seq_cls=False, train__accumulation=1,
                                    model__config_overrides={"output_router_logits": True}))
    out, ref, _ = _first_update(loaded)
    assert out["loss"] == pytest.approx(float(ref.loss), rel=1e-6)
    assert out["loss_parts"]["router_aux"] == pytest.approx(0.1 * float(ref.aux_loss), rel=1e-5)
