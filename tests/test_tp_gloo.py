"""The options' tensor-parallel rows are estimated; what can be checked here is checked: transformers' own TP
plan (the one ``sheet/options.tp_degree`` reads) runs on 2 CPU ranks over gloo, gives the unsharded model's
loss, and holds on each rank the parameters ÷ the TP degree but the replicated norms — the split the
estimator's TP rows assume for parameters, gradients and optimizer state."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import TINY_LLAMA

pytestmark = pytest.mark.distributed


@pytest.mark.slow  # ~20 s: a check of the estimate's assumption, not of a pilotrun behaviour
def test_transformers_tp_plan_splits_the_parameters_as_the_estimate_assumes(tmp_path):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pilotrun.engine.launcher import start_scripts
    from pilotrun.sheet.options import tp_degree

    cfg = dict(TINY_LLAMA, num_attention_heads=4, num_key_value_heads=2)
    t = tp_degree(SimpleNamespace(config=cfg, path=None))["degree"]
    assert t == 2  # 4 heads and 2 key/value heads: 2 is the largest degree dividing both
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "model_type"})).save_pretrained(
        tmp_path / "model")
    worker = Path(__file__).parent / "tp_worker.py"
    codes = start_scripts([str(worker), str(tmp_path / "model"), str(tmp_path)], t, tmp_path, timeout=300)
    assert codes == [0] * t, [(tmp_path / f"rank-{r}.log").read_text()[-2000:] for r in range(t)]
    ranks = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in range(t)]
    for r in ranks:
        assert r["loss"] == pytest.approx(r["plain_loss"], abs=1e-6) and r["grads"]
        whole = sum(r["full"].values())
        replicated = sum(n for name, n in r["full"].items() if r["local"][name] == n)
        assert all("norm" in name for name, n in r["full"].items() if r["local"][name] == n)  # only the norms
        assert sum(r["local"].values()) == (whole - replicated) // t + replicated
        assert replicated / whole < 0.01  # so "parameters ÷ t" is the estimate's figure within 1 %
