"""LoRA checkpoints hold the trainable parameters and the base model's identity, not the base model;
the exported artifact is the adapter (a merged copy only when model.adapter.merged_copy asks)."""

import json

import pytest
import torch
import yaml
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.engine.loop import make_state
from pilotrun.engine.state import load_state, save_state
from pilotrun.errors import BadInput
from pilotrun.tasks import make_task

LORA = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _base(folder, seed=0):
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

    cfg = dict(TINY_LLAMA)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(folder)
    ByT5Tokenizer().save_pretrained(folder)
    return folder


def _lora_campaign(tmp_path, **adapter):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(24))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(_base(tmp_path / "base")), "adapter": dict(LORA, **adapter)}
    path.write_text(yaml.safe_dump(c))
    return path


def _state(path):
    loaded = load_campaign(path)
    model = make_task(loaded).build_model()
    return make_state(model, loaded.campaign.train, n_train=8, seed=0, total_updates=4)


def test_lora_checkpoint_is_the_adapters_size_and_names_its_base(tmp_path):
    path = _lora_campaign(tmp_path)
    state = _state(path)
    with torch.no_grad():  # stands for training: the adapter moves away from a fresh build's
        for p in state.model.parameters():
            if p.requires_grad:
                p.add_(1.0)
    ckpt = save_state(state, tmp_path / "ckpt")
    trainable = sum(p.numel() * p.element_size() for p in state.model.parameters() if p.requires_grad)
    full = sum(p.numel() * p.element_size() for p in state.model.parameters())
    weights = (ckpt / "model.safetensors").stat().st_size
    assert weights < trainable + 16_384 and weights < full / 10, (weights, trainable, full)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    assert manifest["model"].startswith("trainable parameters (adapter-only")
    base = json.loads((ckpt / "base.json").read_text())
    assert base["path"] == str((tmp_path / "base").resolve()) and len(base["weights"]["model.safetensors"]) == 64
    # the round trip: a fresh build takes the trained adapter back, bitwise
    again = _state(path)
    assert "model" in load_state(again, ckpt)
    got = dict(again.model.named_parameters())
    assert all(torch.equal(p, got[n]) for n, p in state.model.named_parameters())


def test_changed_base_weights_refuse_the_checkpoint(tmp_path):
    path = _lora_campaign(tmp_path)
    ckpt = save_state(_state(path), tmp_path / "ckpt")
    _base(tmp_path / "base", seed=1)  # someone overwrote the base model folder
    state = _state(path)
    before = [p.clone() for p in state.model.parameters()]
    with pytest.raises(BadInput) as e:
        load_state(state, ckpt)
    assert "the checkpoint's adapter was trained on base model" in str(e.value)
    assert "whose weight files have changed since (model.safetensors); nothing was loaded" in str(e.value)
    assert "resume with the base model the checkpoint names" in e.value.fix
    assert all(torch.equal(a, b) for a, b in zip(before, state.model.parameters()))


def test_full_model_checkpoint_still_holds_every_weight(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    state = _state(path)
    ckpt = save_state(state, tmp_path / "ckpt")
    assert not (ckpt / "base.json").exists()
    assert json.loads((ckpt / "manifest.json").read_text())["model"] == "all weights"
    full = sum(p.numel() * p.element_size() for p in state.model.parameters())
    assert (ckpt / "model.safetensors").stat().st_size >= full


def test_export_is_the_adapter_and_the_merged_copy_is_asked_for(tmp_path):
    path = _lora_campaign(tmp_path)
    loaded = load_campaign(path)
    task = make_task(loaded)
    model = task.build_model()
    assert task.save_artifact(model, tmp_path / "art") == ["adapter"]
    assert not (tmp_path / "art" / "merged").exists()
    reloaded = task.load_artifact(tmp_path / "art" / "adapter")
    assert type(reloaded).__name__ == "PeftModelForCausalLM"
    merged = make_task(loaded.with_overrides({"model.adapter.merged_copy": True}))
    assert merged.save_artifact(model, tmp_path / "art2") == ["adapter", "merged"]


def test_lora_resume_passes_with_an_adapter_only_checkpoint(cli, tmp_path):
    path = _lora_campaign(tmp_path)
    r = cli("resume", path, "--home", tmp_path / "home", "--at", "2", "--json")
    assert r.code == 0, r.out + r.err
    assert "model" in r.json["data"]["restored"]
