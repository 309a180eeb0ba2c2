"""estimate, estimate --options and the sheet without a pilot from a model's config.json alone (no tokenizer, no
weights cached): the vocabulary from the config, every row data.max_length tokens, and each says so; with a
tokenizer cached the shapes are the data's worst case, and each says that instead. The stages that tokenize
(inspect, pilot ...) are exit 2 naming the missing tokenizer."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import SHARED_DATA, TINY_LLAMA, write_jsonl
from hubcache import config_json_only, config_only

from pilotrun.campaign.load import load_campaign
from pilotrun.campaign.prepare import prepare
from pilotrun.errors import BadInput

# a second family, not the Llama the import tests use: Qwen2's config keys, a vocabulary of its own size
TINY_QWEN2 = {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "vocab_size": 1531, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 512, "eos_token_id": 1530, "bos_token_id": 1530,
              "tie_word_embeddings": True}


@pytest.fixture
def campaign(tmp_path, cache):
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    write_jsonl(tmp_path / "train.jsonl", recs[:24])
    write_jsonl(tmp_path / "val.jsonl", recs[24:32])

    def make(repo: str, max_length: int = 96, **train):
        c = {"name": "config-only", "model": {"path": repo},
             "data": {"train": "train.jsonl", "validation": "val.jsonl", "prompt": "instruction",
                      "response": "output", "max_length": max_length},
             "train": {"micro_batch": 2, "accumulation": 3, "updates": 4, "eval_batch": 4, **train}}
        path = tmp_path / f"{repo.replace('/', '-')}.yaml"
        path.write_text(yaml.safe_dump(c))
        return path

    make.cache = cache
    return make


def test_estimate_from_config_json_alone(campaign, cli, tmp_path):
    config_json_only(campaign.cache, "acme/qwen-config", TINY_QWEN2)
    camp = campaign("acme/qwen-config")
    assert cli("validate", camp).code == 0
    r = cli("estimate", camp, "--json", "--home", tmp_path / "home")
    assert r.code == 0, r.err
    res = r.json["stages"][0]
    said = next(m for m in res["messages"] if m.startswith("sequence shapes:"))
    assert "data.max_length (96 tokens) for every row" in said and "no tokenizer cached for acme/qwen-config" in said
    assert "the vocabulary (1,531 tokens) from config.json" in said
    rows = {row["phase"]: row for row in res["data"]["phases"]}
    assert rows["first_step"]["inputs"]["seq_len"] == 96 and rows["eval_longest"]["inputs"]["seq_len"] == 96
    # the embedding has the config's rows (tied: one matrix), the parameter count says so
    assert res["data"]["params"] > 1531 * 64
    # the stages that tokenize say what is missing instead of failing to load a tokenizer
    r = cli("inspect", camp)
    assert r.code == 2 and "no tokenizer cached for acme/qwen-config" in r.err and "`hf download acme/qwen-config`" in r.err


def test_with_a_tokenizer_the_shapes_are_the_datas(campaign):
    config_only(campaign.cache, "acme/llama-tok", dict(TINY_LLAMA, vocab_size=2003))
    prep = prepare(load_campaign(campaign("acme/llama-tok", max_length=1024)), splits=("train", "validation"),
                   shapes=True)
    assert prep.shapes is None and "the data's worst case" in prep.shapes_said()
    assert max(e.length for e in prep.train) < 1024  # the records, tokenized: shorter than the bound
    config_json_only(campaign.cache, "acme/llama-cfg", dict(TINY_LLAMA, vocab_size=2003))
    shaped = prepare(load_campaign(campaign("acme/llama-cfg", max_length=200)), splits=("train", "validation"),
                     shapes=True)
    assert [e.length for e in shaped.train] == [200] * 23 + [199]  # one per record, one padded row
    assert len(shaped.validation) == 8 and max(max(e.input_ids) for e in shaped.train) < 2003
    with pytest.raises(BadInput, match="this stage tokenizes the data"):
        prepare(load_campaign(campaign("acme/llama-cfg")), splits=("train",))


@pytest.mark.slow
def test_options_and_sheet_without_a_pilot_from_config_json_alone(campaign, cli, tmp_path):
    config_json_only(campaign.cache, "acme/qwen-config", TINY_QWEN2)
    camp = campaign("acme/qwen-config")
    r = cli("estimate", camp, "--options", "--home", tmp_path / "home")
    assert r.code == 0, r.err
    assert "sequence shapes: data.max_length (96 tokens)" in " ".join(r.out.split())
    r = cli("sheet", camp, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    out = " ".join(r.out.split())
    assert "NO PILOT: only the config of acme/qwen-config is cached" in out
    assert "sequence shapes: data.max_length (96 tokens)" in out
