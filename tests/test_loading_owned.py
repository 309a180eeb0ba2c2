"""A model loaded from a folder trains in memory torch allocated, not in the checkpoint file's memory map
(tasks/loading.own_trained_weights): the first optimizer step would otherwise copy every trained weight page by
page (copy-on-write), 1.1 s more on SmolLM2-135M's first update of every run. Weights no update writes stay
mapped; tied weights stay tied; the training is the same, bit for bit."""

from __future__ import annotations

import torch
import yaml

from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign
from pilotrun.campaign import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.engine.loop import make_state, run_update
from pilotrun.tasks import loading


def _folder(tmp_path, tie: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / ("tied" if tie else "model")
    torch.manual_seed(0)
    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    LlamaForCausalLM(LlamaConfig(**dict(cfg, tie_word_embeddings=tie))).save_pretrained(folder, safe_serialization=True)
    return folder


def _prep(tmp_path, model, **model_keys):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, 100), train__updates=2)
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(model), "tokenizer": "byte", **model_keys}
    return prepare(load_campaign(write_campaign(tmp_path / "c", c)), splits=("train",))


def _losses(prep, n=3):
    torch.manual_seed(0)
    model = prep.task.build_model()
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=0, total_updates=n)
    return model, [run_update(state, prep.task, [prep.train[2 * i: 2 * i + 2]], max_grad_norm=1.0)["loss"]
                   for i in range(n)]


def test_trained_weights_are_owned_and_train_as_the_mapped_ones_did(tmp_path, monkeypatch):
    prep = _prep(tmp_path, _folder(tmp_path, tie=True))
    model, owned = _losses(prep)
    params = list(model.parameters())
    assert params and all(p.untyped_storage().resizable() for p in params)  # none left in the file's map
    assert model.lm_head.weight is model.model.embed_tokens.weight  # the tie kept (one parameter, one copy)
    # the same run with the weights left in the map (planted: the copy switched off): mapped, same losses
    monkeypatch.setattr(loading, "own_trained_weights", lambda m: 0)
    model, mapped = _losses(prep)
    assert not any(p.untyped_storage().resizable() for p in model.parameters())
    assert owned == mapped


def test_a_lora_base_stays_mapped_and_only_what_trains_is_copied(tmp_path):
    prep = _prep(tmp_path, _folder(tmp_path, tie=False), adapter={"r": 4, "target_modules": ["q_proj", "v_proj"]})
    model = prep.task.build_model()
    frozen = [p for p in model.parameters() if not p.requires_grad]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert frozen and trained
    assert not any(p.untyped_storage().resizable() for p in frozen)  # the base: read, never written
    assert all(p.untyped_storage().resizable() for p in trained)  # the adapter: made by torch


def test_weights_sharing_one_storage_are_copied_once_and_still_share_it(tmp_path):
    """A storage several weights view (a file read whole, a fused tensor cut in parts) is copied once: each
    weight keeps its offset and strides into the one copy, so a write through one is seen through the other."""
    path = tmp_path / "blob.bin"
    torch.arange(24, dtype=torch.float32).numpy().tofile(path)
    blob = torch.from_file(str(path), shared=False, size=24, dtype=torch.float32)
    assert not blob.untyped_storage().resizable()
    model = torch.nn.Module()
    model.a = torch.nn.Parameter(blob[:12].view(3, 4))
    model.b = torch.nn.Parameter(blob[12:].view(4, 3).t())  # a strided view at an offset
    model.c = torch.nn.Parameter(blob[:4], requires_grad=False)  # frozen, but in the same storage
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert loading.own_trained_weights(model) == 24 * 4
    after = dict(model.named_parameters())
    assert all(torch.equal(after[n], before[n]) for n in before)
    assert len({p.untyped_storage().data_ptr() for p in after.values()}) == 1
    assert after["b"].stride() == (1, 3) and after["b"].storage_offset() == 12
    assert all(p.untyped_storage().resizable() for p in after.values())
    with torch.no_grad():
        model.a[0, 0] = -1.0
    assert model.c[0].item() == -1.0
    assert loading.own_trained_weights(model) == 0  # nothing mapped is left


def test_fake_and_meta_builds_are_left_alone():
    """The estimator builds the model on fake tensors and the meta device: nothing of them is a file's map."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = torch.nn.Linear(4, 4)
    assert loading.own_trained_weights(fake) == 0
    assert loading.own_trained_weights(torch.nn.Linear(4, 4, device="meta")) == 0
