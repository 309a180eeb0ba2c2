"""Sizes checked when the campaign is read, not where they are used: a model config's structural sizes (model.config,
model.config_overrides, model.path's config.json) are positive whole numbers and its attention heads whole groups of
its key/value heads; hardware.memory_per_gpu is a size; an empty path is refused. Before, `validate` passed each of
these: transformers built a Llama of -1 or 0 layers or a 0-wide MLP without a word (the estimate then ended in an
internal error, exit 3, or "ok" on a model with nothing to train), 4 heads over 3 key/value groups failed in the
first forward (exit 3), `memory_per_gpu: x` stopped the pilot after its data was read, and `model.tokenizer: ""`
named the campaign's own folder."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import write_campaign
from preference_data import llama_folder


@pytest.mark.parametrize("key, value, words", [
    ("num_hidden_layers", -1, "num_hidden_layers is -1: a model's num_hidden_layers is a positive whole number"),
    ("num_hidden_layers", 0, "num_hidden_layers is 0"),
    ("intermediate_size", 0, "intermediate_size is 0"),
    ("hidden_size", "x", "hidden_size is 'x'"),
    ("max_position_embeddings", 0, "max_position_embeddings is 0"),
    ("vocab_size", True, "vocab_size is True"),
    ("num_key_value_heads", 3, "num_attention_heads 4 is not a multiple of num_key_value_heads 3"),
])
def test_a_model_config_size_that_builds_nothing_sound_is_exit_2_naming_the_key(demo_dir, cli, key, value, words):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["model"]["config"][key] = value
    path = write_campaign(demo_dir, c)
    for verb in ("validate", "estimate"):  # estimate built and traced these before: exit 3 or 0
        r = cli(verb, path)
        assert r.code == 2, (verb, r.err[-2000:])
        assert f"model.config.{key}: " in r.err and words in r.err and "internal error" not in r.err


def test_sound_sizes_and_groups_pass(demo_dir, cli):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    for groups in (1, 2, 4, None):  # 4 heads: any divisor, or null for one key/value head per query head
        c["model"]["config"]["num_key_value_heads"] = groups
        r = cli("validate", write_campaign(demo_dir, c))
        assert r.code == 0, (groups, r.err)


def test_an_override_and_a_folders_config_json_are_named_where_they_are(tmp_path, demo_dir, cli):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["model"]["config_overrides"] = {"num_key_value_heads": 3}
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2 and "model.config_overrides.num_key_value_heads: num_attention_heads 4" in r.err
    assert "fix: set num_key_value_heads to a divisor of 4 (1, 2, 4)" in r.err
    folder = llama_folder(tmp_path / "llama")
    c["model"] = {"path": str(folder)}
    clean = cli("validate", write_campaign(demo_dir, c))
    assert clean.code == 0, clean.err
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(dict(cfg, num_hidden_layers=0)))
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2 and f"{folder / 'config.json'}: num_hidden_layers: num_hidden_layers is 0" in r.err


@pytest.mark.parametrize("value", ["x", "", "-1", "1e999", "0GiB"])
def test_memory_per_gpu_is_a_size_when_the_campaign_is_read(demo_dir, cli, value):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["hardware"]["memory_per_gpu"] = value
    r = cli("validate", write_campaign(demo_dir, c))
    if value == "1e999":  # a number past any float, refused where the file is read, at its line
        assert r.code == 2 and "campaign.yaml:" in r.err and "1e999 is larger than any number a float holds" in r.err
    else:
        assert r.code == 2 and "hardware.memory_per_gpu: " in r.err and "fix: " in r.err
        assert "memory size must be positive" in r.err if value == "0GiB" else f"not a size: {value!r}" in r.err
    c["hardware"]["memory_per_gpu"] = "80GB"
    assert cli("validate", write_campaign(demo_dir, c)).code == 0


@pytest.mark.parametrize("value", [80, 141.0, "24"])
def test_memory_per_gpu_without_a_unit(demo_dir, cli, value):
    # `memory_per_gpu: 80` was "Input should be a valid string", and --set hardware.memory_per_gpu=80 planned for 80
    # bytes: every phase of the pilot then failed over that limit
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["hardware"]["memory_per_gpu"] = value
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2, r.err
    shown = f"{float(value):g}"
    assert (f"hardware.memory_per_gpu: '{value}' has no unit, so it reads as {shown} bytes (a number alone is "
            f"bytes), less than any GPU holds") in r.err, r.err
    assert f"fix: write the unit: {shown}GiB (or {shown}GB)" in r.err
    r = cli("validate", demo_dir / "campaign.yaml", "--set", f"hardware.memory_per_gpu={value}")
    assert r.code == 2 and f"'{value}' has no unit" in r.err, r.err
    c["hardware"]["memory_per_gpu"] = 80 * 2**30  # bytes, as a number: a size without a unit, of a GPU's order
    assert cli("validate", write_campaign(demo_dir, c)).code == 0


@pytest.mark.parametrize("key", ["model.tokenizer", "data.train", "data.test"])
def test_an_empty_path_is_refused_not_read_as_the_campaigns_folder(demo_dir, cli, key):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    section, name = key.split(".")
    c[section][name] = " "
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2 and f"{key}: empty: a path relative to the campaign's folder" in r.err, r.err


@pytest.mark.parametrize("section, key, meant", [
    ("config", "num_hiden_layers", "num_hidden_layers"),
    ("config", "num_layers", "num_hidden_layers"),  # the nearest sharing the most words, not num_labels
    ("config", "layer_norm_eps", "rms_norm_eps"),
    ("config_overrides", "max_position_embedding", "max_position_embeddings"),
])
def test_a_misspelt_config_key_is_exit_2_not_the_default_built_in_its_place(demo_dir, cli, section, key, meant):
    """transformers keeps an unknown key as a plain attribute: `num_hiden_layers: 2` built Llama's default 32 layers."""
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["model"][section] = {**(c["model"].get(section) or {}), key: 2}
    r = cli("estimate", write_campaign(demo_dir, c))
    assert r.code == 2, r.err[-2000:]
    assert f"model.{section}.{key}: not a setting of llama's config" in r.err and f"did you mean {meant}?" in r.err


def test_settings_older_versions_name_and_keys_like_none_pass(demo_dir, cli, tmp_path):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    # rope_theta and rope_scaling: Llama's settings before transformers 5, which its config still reads
    c["model"]["config"].update(rope_theta=10000.0, rope_scaling=None, pretraining_tp=1, my_note="kept")
    assert cli("estimate", write_campaign(demo_dir, c)).code == 0
    folder = llama_folder(tmp_path / "llama")
    c["model"] = {"path": str(folder), "config_overrides": {"num_hiden_layers": 1}}
    r = cli("estimate", write_campaign(demo_dir, c))
    assert r.code == 2 and "model.config_overrides.num_hiden_layers: " in r.err


@pytest.mark.parametrize("adapter, words", [
    ({"r": 8, "alpha": 0}, "model.adapter.alpha: alpha 0 scales the adapter's output by alpha / r = 0"),
    ({"target_modules": []}, "model.adapter.target_modules: an empty list adapts no module"),
    # one problem for the key, each form it may take, and no member tag of the union (was "target_modules.list[str]")
    ({"target_modules": "q"}, "key 'model.adapter.target_modules' = \"q\": Input should be a valid list, or input "
                              "should be 'all-linear'\n"),
])
def test_an_adapter_that_cannot_train_is_refused_when_read(demo_dir, cli, adapter, words):
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["model"]["adapter"] = adapter
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2 and words in r.err and "list[str]" not in r.err, r.err
    for clean in ({"r": 8, "alpha": -16}, {"target_modules": ["q_proj"]}, {"target_modules": "all-linear"}):
        c["model"]["adapter"] = clean
        assert cli("validate", write_campaign(demo_dir, c)).code == 0, clean


def test_float16_weights_trained_themselves_are_refused_under_fp16_mixed_and_warned_under_fp32(demo_dir, cli):
    """fp16-mixed over model.dtype float16 failed every step of the pilot with torch's "Attempting to unscale FP16
    gradients"; fp32 over it trains in float16 with no scaler (the demo's validation loss NaN after two updates)."""
    c = yaml.safe_load((demo_dir / "campaign.yaml").read_text())
    c["model"]["dtype"], c["train"]["precision"] = "float16", "fp16-mixed"
    r = cli("validate", write_campaign(demo_dir, c))
    assert r.code == 2 and "model.dtype: model.dtype=float16 with train.precision=fp16-mixed trains the float16 " \
                           "weights themselves" in r.err and "fix: set model.dtype: float32" in r.err
    c["train"]["precision"] = "fp32"
    r = cli("validate", write_campaign(demo_dir, c), "--json")
    assert r.code == 0 and r.json["verdict"] == "warn" and "with no grad scaler" in r.json["summary"]
    for dtype, precision, adapter in (("float16", "fp16-mixed", {"r": 4}), ("float16", "fp32", {"r": 4}),
                                      ("float32", "fp16-mixed", None), ("float16", "bf16-mixed", None)):
        c["model"].update(dtype=dtype, adapter=adapter)
        c["train"]["precision"] = precision
        r = cli("validate", write_campaign(demo_dir, c), "--json")
        assert r.code == 0 and r.json["verdict"] == "ok", (dtype, precision, adapter, r.err)
