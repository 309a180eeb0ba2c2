"""verify: hashes before loading, no pickles, reload in a fresh process and reproduce the control predictions."""

import shutil

import pytest
import torch
import yaml
from conftest import TINY_LLAMA, write_campaign

from pilotrun.journal.files import write_manifest
from pilotrun.engine.control import CONTROL_FILE, load_control


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real train run of the demo (tiny budget), shared; tests that tamper work on a copy of its home."""
    from pilotrun.campaign import load_campaign
    from pilotrun.demo.synth import write_demo
    from pilotrun.rehearsal.training.train import train_run

    root = tmp_path_factory.mktemp("verify")
    path = write_demo(root / "demo", n_conversations=60)
    c = yaml.safe_load(path.read_text())
    c["model"]["config"] = dict(TINY_LLAMA)
    c["train"].update(updates=6, eval_every=6, save_every=None, micro_batch=4, accumulation=2)
    write_campaign(path.parent, c)
    home = root / "home"
    res = train_run(load_campaign(path), home, progress=False)
    assert res.verdict == "ok"
    return home, res.data["run_id"]


def _copy(trained, tmp_path):
    home, run_id = trained
    shutil.copytree(home, tmp_path / "home")
    return tmp_path / "home", run_id, tmp_path / "home" / "runs" / run_id


def test_clean_run_reloads_and_reproduces(cli, trained):
    home, run_id = trained
    control = load_control(home / "runs" / run_id / CONTROL_FILE)
    assert len(control["rids"]) == 4 and control["values"][0].shape[-1] == 8
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert "every file matches manifest.json (sha256)" in text
    assert "artifact/model: loaded as a user would (LlamaForCausalLM" in text
    assert "4 control predictions reproduced, logits within" in text
    row = r.json["stages"][0]["rows"][0]
    assert row["ids_equal"] and row["max_logit_diff"] <= row["tolerance"] == 1e-4


def test_flipped_byte_refused_naming_the_file(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    weights = run_dir / "artifact" / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    assert "artifact/model/model.safetensors: sha256 differs from manifest.json" in r.json["summary"]
    assert "fresh process" not in "\n".join(r.json["messages"])  # refused before anything was loaded


def test_pickle_weights_refused_with_explanation(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    model_dir = run_dir / "artifact" / "model"
    from safetensors.torch import load_file

    torch.save(load_file(str(model_dir / "model.safetensors")), model_dir / "pytorch_model.bin")
    (model_dir / "model.safetensors").unlink()
    write_manifest(run_dir, {"kind": "pilotrun-run", "run_id": run_id})  # hashes match: only the format is wrong
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    msg = r.json["messages"][0]
    assert msg.startswith("artifact/model/pytorch_model.bin: pickle-based weights refused")
    assert "unpickling runs arbitrary code" in msg and "safetensors" in msg


def test_artifact_that_is_not_the_trained_model_fails(cli, trained, tmp_path):
    """The reproduce step can fail: consistent hashes, but the weights are another model's."""
    home, run_id, run_dir = _copy(trained, tmp_path)
    from safetensors.torch import load_file, save_file

    weights = run_dir / "artifact" / "model" / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v * 0.5 for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
    write_manifest(run_dir, {"kind": "pilotrun-run", "run_id": run_id})
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    text = "\n".join(r.json["messages"])
    assert "artifact/model: logits differ from training by up to" in text


def test_run_without_artifact_is_bad_input(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    shutil.rmtree(run_dir / "artifact")
    r = cli("verify", run_id, "--home", home)
    assert r.code == 2 and "has no artifact folder" in r.err


@pytest.mark.slow
def test_lora_adapter_reloads_through_peft(cli, tmp_path):
    """A LoRA run on a base model saved to disk: the adapter through peft, and the merged copy (asked for)."""
    from conftest import simple_records, tiny_causal_campaign
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

    cfg = dict(TINY_LLAMA)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(
        tmp_path / "base")
    ByT5Tokenizer().save_pretrained(tmp_path / "base")
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), simple_records(4, 100))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(tmp_path / "base"),
                  "adapter": {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"],
                              "merged_copy": True}}
    path.write_text(yaml.safe_dump(c))
    r = cli("train", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    r = cli("verify", r.json["data"]["run_id"], "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert "artifact/adapter: loaded as a user would (PeftModelForCausalLM" in text
    assert "artifact/merged: loaded as a user would (LlamaForCausalLM" in text
