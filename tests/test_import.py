"""`pilotrun import` (Axolotl YAML, TrainingArguments / SFTConfig dicts) and hub ids from the local HF cache.

The source configs are written here from the formats' documentation (Axolotl's config reference and its
examples; TRL's SFTConfig reference) or by the installed transformers itself (TrainingArguments.to_json_string);
the cache is laid out in a temp dir as huggingface_hub writes it and read back by its own offline look-up.
"""

from __future__ import annotations

import json
import pickle
import sqlite3

import pytest
import yaml

from conftest import SHARED_DATA, TINY_LLAMA, write_jsonl
from hubcache import LLAMA_32_1B, add_model, config_only, tokenizer_files

from pilotrun.campaign.importers import import_config, not_reproduced_lines
from pilotrun.campaign.load import load_campaign
from pilotrun.errors import BadInput


@pytest.fixture
def data(tmp_path):
    """Alpaca records (instruction/input/output) and chat records (messages of role/content), local files."""
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    rows = [{k: r[k] for k in ("instruction", "input", "output")} for r in recs]
    write_jsonl(tmp_path / "data" / "alpaca_train.jsonl", rows[:80])
    write_jsonl(tmp_path / "data" / "alpaca_val.jsonl", rows[80:])
    chats = [{"conversation": [{"role": "user", "content": r["instruction"]},
                               {"role": "assistant", "content": r["output"]}]} for r in rows]
    write_jsonl(tmp_path / "data" / "chat.jsonl", chats[:80])
    write_jsonl(tmp_path / "data" / "chat_val.jsonl", chats[80:])
    write_jsonl(tmp_path / "data" / "text.jsonl", [{"text": r["instruction"] + " " + r["output"]} for r in rows])
    return tmp_path / "data"


def write(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(obj, sort_keys=False) if path.suffix != ".json" else json.dumps(obj, indent=2))
    return path


def carried(imp) -> dict[str, tuple[str, object]]:
    return {c.key: (c.source, c.value) for c in imp.carried}


def value_at(campaign, key):
    node = campaign
    for part in key.split("."):
        node = getattr(node, part)
    return node


def check_round_trip(imp, **sets):
    """The written file (comments and all) holds every carried value as the import carried it, and the campaign
    it makes passes validate's consistency checks (with ``sets`` for what the source did not say)."""
    from pilotrun.campaign.consistency import check_consistency

    raw = yaml.safe_load(imp.out.read_text())
    for c in imp.carried:
        node = raw
        for part in c.key.split("."):
            node = node[part]
        assert node == c.value, (c.key, node, c.value)
    loaded = load_campaign(imp.out, sets or None)
    check_consistency(loaded.campaign, loaded.base_dir)
    return loaded


# --------------------------------------------------------------------------------------- Axolotl
AXOLOTL_LORA = {  # the shape of Axolotl's examples/llama-3/lora-1b.yml, pointed at local files
    "base_model": "NousResearch/Llama-3.2-1B",
    "model_type": "LlamaForCausalLM", "tokenizer_type": "AutoTokenizer",
    "load_in_8bit": False, "load_in_4bit": False, "strict": False,
    "datasets": [{"path": "data/alpaca_train.jsonl", "type": "alpaca"}],
    "test_datasets": [{"path": "data/alpaca_val.jsonl", "type": "alpaca", "split": "train"}],
    "dataset_prepared_path": "last_run_prepared", "output_dir": "./outputs/lora-out",
    "adapter": "lora", "lora_model_dir": None, "lora_r": 16, "lora_alpha": 32, "lora_dropout": 0.05,
    "lora_target_linear": True, "lora_fan_in_fan_out": None,
    "sequence_len": 2048, "sample_packing": True, "eval_sample_packing": False, "pad_to_sequence_len": True,
    "wandb_project": "llama-lora", "wandb_entity": None, "wandb_watch": None,
    "gradient_accumulation_steps": 4, "micro_batch_size": 2, "num_epochs": 1, "optimizer": "adamw_bnb_8bit",
    "lr_scheduler": "cosine", "learning_rate": 0.0002, "train_on_inputs": False, "group_by_length": False,
    "bf16": "auto", "fp16": None, "tf32": False, "gradient_checkpointing": True, "early_stopping_patience": None,
    "resume_from_checkpoint": None, "logging_steps": 1, "flash_attention": True, "warmup_ratio": 0.1,
    "evals_per_epoch": 4, "saves_per_epoch": 1, "weight_decay": 0.0,
    "special_tokens": {"pad_token": "<|end_of_text|>"},
}


def test_axolotl_lora_with_packing_and_epochs(tmp_path, data, cache):
    config_only(cache, "NousResearch/Llama-3.2-1B", dict(TINY_LLAMA, vocab_size=2003))
    src = write(tmp_path / "lora.yml", AXOLOTL_LORA)
    imp = import_config(src)
    assert imp.fmt == "axolotl" and imp.detected
    got = carried(imp)
    # every carried value equals its source's
    assert got["model.path"] == ("base_model", "NousResearch/Llama-3.2-1B")
    assert got["model.adapter.r"] == ("lora_r", 16) and got["model.adapter.alpha"] == ("lora_alpha", 32.0)
    assert got["model.adapter.dropout"] == ("lora_dropout", 0.05)
    assert got["model.adapter.target_modules"] == ("lora_target_linear", "all-linear")
    assert got["model.gradient_checkpointing"] == ("gradient_checkpointing", True)
    assert got["data.train"] == ("datasets[0].path", "data/alpaca_train.jsonl")
    assert got["data.validation"] == ("test_datasets[0].path", "data/alpaca_val.jsonl")
    assert got["data.response"] == ("datasets[0].type", "output")
    assert "{instruction}" in got["data.prompt"][1] and "{input}" in got["data.prompt"][1]
    assert got["data.max_length"] == ("sequence_len", 2048)
    assert got["train.micro_batch"] == ("micro_batch_size", 2)
    assert got["train.accumulation"] == ("gradient_accumulation_steps", 4)
    assert got["train.epochs"] == ("num_epochs", 1.0)
    assert got["train.lr"] == ("learning_rate", 0.0002)
    assert got["train.schedule"] == ("lr_scheduler", "cosine")
    assert got["train.weight_decay"] == ("weight_decay", 0.0)
    assert got["train.precision"][1] == "bf16-mixed" and got["model.dtype"][1] == "bfloat16"
    # ratios become updates from the data's size, as Axolotl rounds them: 80 examples / (2 x 4) = 10 updates per
    # epoch; warmup floor(0.1 x 10) = 1, which Axolotl makes 2; 4 evals per epoch: the share 1/4, rounded up
    assert got["train.warmup"] == ("warmup_ratio", 2)
    assert got["train.eval_every"] == ("evals_per_epoch", 3)
    assert got["train.save_every"] == ("saves_per_epoch", 10)
    notes = {c.key: c.note for c in imp.carried}
    assert "falls back to fp16" in notes["train.precision"]
    assert "1 warmup step is 2 in Axolotl" in notes["train.warmup"]
    assert "80 training examples" in notes["train.eval_every"] and "every 3 updates" in notes["train.eval_every"]
    # every non-empty setting not carried is named, with its effect
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert set(skipped) == {"datasets[0].type", "test_datasets[0].split", "model_type", "tokenizer_type",
                            "dataset_prepared_path", "output_dir", "eval_sample_packing", "pad_to_sequence_len",
                            "wandb_project", "logging_steps", "flash_attention", "special_tokens"}
    assert got["data.packing"] == ("sample_packing", True)  # issue 43: packing rehearsed, rows of sequence_len
    assert "the rehearsal packs validation as it packs training" in skipped["eval_sample_packing"]
    assert "eager attention" in skipped["flash_attention"]
    assert "nothing to rehearse" in skipped["wandb_project"] and "nothing to rehearse" in skipped["logging_steps"]
    assert carried(imp)["train.optimizer"] == ("optimizer", "adamw_8bit")  # bitsandbytes' AdamW8bit, rehearsed
    # the file: a comment block at the top naming each, and the campaign carries the list
    text = imp.out.read_text()
    head = text.split("\nname:")[0]
    assert all(f"#   {k}:" in head for k in skipped)
    assert "# from lora_r" in text
    loaded = check_round_trip(imp)  # validates with the hub model's config.json alone in the cache
    assert [n.key for n in loaded.campaign.imported.not_carried] == [n.key for n in imp.not_carried]


def test_axolotl_qlora_chat_template_max_steps(tmp_path, data, cli):
    cfg = {  # Axolotl's examples/llama-3/qlora.yml shape, with a chat_template data set
        "base_model": "./models/base", "load_in_4bit": True, "adapter": "qlora",
        "lora_r": 32, "lora_alpha": 16, "lora_dropout": 0.05,
        "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "chat_template": "chatml",
        "datasets": [{"path": "data/chat.jsonl", "type": "chat_template", "field_messages": "conversation",
                      "message_property_mappings": {"role": "role", "content": "content"},
                      "roles_to_train": ["assistant"]}],
        "val_set_size": 0.05, "sequence_len": 1024, "micro_batch_size": 1, "gradient_accumulation_steps": 8,
        "max_steps": 40, "optimizer": "paged_adamw_32bit", "lr_scheduler": "linear", "learning_rate": "1e-4",
        "warmup_steps": 5, "eval_steps": 10, "save_steps": 20, "bf16": True, "seed": 3, "max_grad_norm": 0.3,
    }
    src = write(tmp_path / "cfg" / "qlora.yaml", cfg)
    (tmp_path / "cfg" / "models" / "base").mkdir(parents=True)
    (tmp_path / "data").rename(tmp_path / "cfg" / "data")  # relative paths are relative to the source file
    out = tmp_path / "elsewhere" / "campaign.yaml"
    r = cli("import", src, "--out", out)
    assert r.code == 0, r.err
    assert "format: Axolotl (detected" in r.out
    imp = import_config(src, "axolotl", out, force=True)
    got = carried(imp)
    assert got["model.path"] == ("base_model", "../cfg/models/base")  # rewritten relative to the campaign
    assert got["data.train"] == ("datasets[0].path", "../cfg/data/chat.jsonl")
    assert got["data.messages"] == ("datasets[0].field_messages", "conversation")
    assert got["data.chat_template"][1] == "model"
    assert got["model.adapter.target_modules"] == ("lora_target_modules", ["q_proj", "k_proj", "v_proj", "o_proj"])
    assert got["model.adapter.r"] == ("lora_r", 32)
    assert got["train.updates"] == ("max_steps", 40) and "train.epochs" not in got
    assert got["train.lr"] == ("learning_rate", 1e-4)
    assert got["train.schedule"] == ("lr_scheduler", "linear")
    assert got["train.warmup"] == ("warmup_steps", 5)
    assert got["train.eval_every"] == ("eval_steps", 10) and got["train.save_every"] == ("save_steps", 20)
    assert got["train.precision"] == ("bf16", "bf16-mixed") and got["seed"] == ("seed", 3)
    assert got["train.max_grad_norm"] == ("max_grad_norm", 0.3)
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert set(skipped) == {"chat_template", "val_set_size"}
    assert got["train.optimizer"] == ("optimizer", "paged_adamw_32bit")
    # the 4-bit base is carried as Axolotl's QLoRA loads it: nf4, double-quantised, computing in bf16
    assert got["model.quantization"] == ("load_in_4bit", {"bits": 4, "type": "nf4", "double_quant": True,
                                                          "compute_dtype": "bfloat16"})
    assert "pilotrun split" in skipped["val_set_size"]
    assert "chatml" in skipped["chat_template"]
    assert "data.validation" in imp.to_set
    # validate asks for what the source does not say (the validation file), then passes
    r = cli("validate", out, "--set", f"data.validation={tmp_path / 'cfg' / 'data' / 'chat_val.jsonl'}")
    assert r.code in (0, 2), r.err  # the model folder is empty: it has no config.json
    assert "no config.json" in r.err


def test_axolotl_full_finetune_completion_fsdp(tmp_path, data, cache):
    config_only(cache, "Qwen/Qwen2.5-0.5B", dict(TINY_LLAMA, vocab_size=2003))
    cfg = {  # a full fine-tune (no adapter) on plain text, FSDP as Axolotl's fsdp examples write it
        "base_model": "Qwen/Qwen2.5-0.5B", "datasets": [{"path": "data/text.jsonl", "type": "completion",
                                                        "field": "text"}],
        "test_datasets": [{"path": "data/alpaca_val.jsonl", "type": "completion", "field": "text"}],
        "sequence_len": 512, "micro_batch_size": 4, "gradient_accumulation_steps": 2, "num_epochs": 2,
        "learning_rate": 2e-5, "optimizer": "adamw_torch_fused", "lr_scheduler": "constant_with_warmup",
        "warmup_steps": 3, "weight_decay": 0.1, "bf16": False, "fp16": True, "train_on_inputs": True,
        "fsdp": ["full_shard", "auto_wrap"],
        "fsdp_config": {"fsdp_offload_params": True, "fsdp_transformer_layer_cls_to_wrap": "Qwen2DecoderLayer"},
        "deepspeed": None, "use_wandb": False,
    }
    imp = import_config(write(tmp_path / "full.yml", cfg))
    got = carried(imp)
    assert "model.adapter.kind" not in got
    assert got["data.prompt"][1] == "" and got["data.response"] == ("datasets[0].field", "text")
    assert got["train.strategy"] == ("fsdp", "fsdp") and "train.nproc" in imp.to_set
    assert got["train.precision"] == ("fp16", "fp16-mixed")
    assert got["train.schedule"] == ("lr_scheduler", "constant")
    assert got["train.epochs"] == ("num_epochs", 2.0)
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert set(skipped) == {"train_on_inputs", "fsdp_config.offload_params"}
    assert "prompt tokens" in skipped["train_on_inputs"]
    check_round_trip(imp)
    # the campaign names the train.nproc to set in its header
    assert "TO SET" in imp.out.read_text() and "train.nproc" in imp.out.read_text()


def test_axolotl_typo_is_named_and_nothing_written(tmp_path, data, cli):
    """A key no schema knows, a letter or two from a key the file does not set, is a typo (exit 2, nothing written);
    the same near a key the file sets is named and carried nowhere."""
    cfg = dict(AXOLOTL_LORA, val_set_sise=0.05)
    cfg["datasets"] = [{"path": "data/alpaca_train.jsonl", "type": "alpaca", "feild": "x"}]
    src = write(tmp_path / "typo.yml", cfg)
    r = cli("import", src)
    assert r.code == 2
    assert "unknown key 'val_set_sise'" in r.err and "did you mean 'val_set_size'?" in r.err
    assert "unknown key 'datasets[].feild'" in r.err and "'datasets[].field'" in r.err
    assert not (tmp_path / "campaign.yaml").exists()
    # the clean config imports
    cfg.pop("val_set_sise")
    cfg["datasets"] = [{"path": "data/alpaca_train.jsonl", "type": "alpaca"}]
    assert cli("import", write(src, cfg)).code == 0 and (tmp_path / "campaign.yaml").is_file()
    # near lora_dropout, which the file sets: not a typo; named with the schema version it is unknown to
    imp = import_config(write(src, dict(cfg, lora_droput=0.1)), out=tmp_path / "c2.yaml")
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert skipped["lora_droput"].startswith("unknown to axolotl 0.18.0") and "carried nowhere" in skipped["lora_droput"]
    assert carried(imp)["model.adapter.dropout"] == ("lora_dropout", 0.05)


def test_an_imported_value_the_campaign_refuses_names_its_source_key(tmp_path, data, cli):
    """Axolotl renders a user-defined format with str.format, as pilotrun renders data.prompt: a format whose braces do
    not pair is refused naming the source's key and the campaign key it maps to (it was pydantic's raw report)."""
    cfg = dict(AXOLOTL_LORA)
    cfg["datasets"] = [{"path": "data/alpaca_train.jsonl", "type": {
        "field_instruction": "instruction", "field_output": "output",
        "format": "[INST] {instruction} {{ [/INST] }", "no_input_format": "[INST] {instruction} [/INST]"}}]
    src = write(tmp_path / "format.yml", cfg)
    r = cli("import", src)
    assert r.code == 2, r.err
    assert f"{src}: datasets[0].type.format (imported as data.prompt): data.prompt: its braces do not pair" in r.err
    assert "validation error" not in r.err and "double it ({{ or }})" in r.err
    assert not (tmp_path / "campaign.yaml").exists()
    cfg["datasets"][0]["type"]["format"] = "[INST] {{ {instruction} }} [/INST]"  # the literal braces doubled
    assert cli("import", write(src, cfg)).code == 0, r.err


def test_axolotl_schema_keys_and_plugin_arguments(tmp_path, data):
    """Keys Axolotl's schema or its plugins define import (the hand-written list refused them as typos); a plugin's
    argument is named with its plugin, loaded by the file or not; a key of no schema far from every known key is
    named as unknown, with the version; one near a key the file does not set is a typo."""
    cfg = dict(AXOLOTL_LORA, plugins=["axolotl.integrations.liger.LigerPlugin"], liger_rms_norm=True,
               kd_alpha=0.5, streaming_multipack_buffer_size=10000, fused_attn_kernel=True, use_eaft=False,
               my_own_knob=3)
    cfg["test_datasets"] = [{"path": "data/alpaca_val.jsonl", "type": "alpaca", "split": "train",
                             "field_system": "sys"}]
    imp = import_config(write(tmp_path / "liger.yml", cfg))
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert skipped["liger_rms_norm"] == "an argument of the plugin axolotl.integrations.liger, which the rehearsal " \
                                        "does not run"
    assert "axolotl.integrations.kd, which the file does not load" in skipped["kd_alpha"]
    assert skipped["my_own_knob"].startswith("unknown to axolotl 0.18.0")
    assert "use_eaft" not in skipped  # false: nothing set
    assert {"streaming_multipack_buffer_size", "fused_attn_kernel"} <= set(skipped)
    with pytest.raises(BadInput, match="did you mean 'lora_fan_in_fan_out'"):
        import_config(write(tmp_path / "liger2.yml", dict(cfg, lora_fan_in_fan_ou=True)), out=tmp_path / "c2.yaml")


def test_axolotl_what_it_cannot_decide_is_asked(tmp_path, data, cli):
    hub = dict(AXOLOTL_LORA, datasets=[{"path": "tatsu-lab/alpaca", "type": "alpaca"}])
    r = cli("import", write(tmp_path / "hub.yml", hub))
    assert r.code == 2 and "datasets[0].path = 'tatsu-lab/alpaca' is a hub data set" in r.err
    assert "to_json('train.jsonl')" in r.err
    odd = dict(AXOLOTL_LORA, datasets=[{"path": "data/alpaca_train.jsonl", "type": "input_output"}])
    r = cli("import", write(tmp_path / "odd.yml", odd))
    assert r.code == 2 and "does not say which fields are the prompt and the response" in r.err
    two = dict(AXOLOTL_LORA, datasets=[{"path": "data/alpaca_train.jsonl", "type": "alpaca"},
                                       {"path": "data/alpaca_val.jsonl", "type": "alpaca"}])
    r = cli("import", write(tmp_path / "two.yml", two))
    assert r.code == 2 and "a campaign trains on one file" in r.err
    assert not (tmp_path / "campaign.yaml").exists()


# --------------------------------------------------------------------------------------- HF / TRL
def test_training_arguments_dump_imports(tmp_path, data, cli):
    """The dict the installed transformers itself writes (to_json_string), every key of it."""
    from transformers import TrainingArguments

    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                             gradient_accumulation_steps=8, learning_rate=3e-5, lr_scheduler_type="cosine",
                             warmup_steps=10, max_steps=300, optim="adamw_torch", weight_decay=0.01,
                             max_grad_norm=0.5, fp16=False, eval_strategy="steps", eval_steps=50, save_steps=100,
                             seed=7, logging_steps=5, report_to="none", per_device_eval_batch_size=16)
    src = tmp_path / "args.json"
    src.write_text(args.to_json_string())
    r = cli("import", src, "--json")
    assert r.code == 0
    env = r.json
    got = {c["key"]: (c["source"], c["value"]) for c in env["data"]["carried"]}
    assert got["train.micro_batch"] == ("per_device_train_batch_size", 4)
    assert got["train.accumulation"] == ("gradient_accumulation_steps", 8)
    assert got["train.lr"] == ("learning_rate", 3e-5) and got["train.schedule"] == ("lr_scheduler_type", "cosine")
    assert got["train.warmup"] == ("warmup_steps", 10) and got["train.updates"] == ("max_steps", 300)
    assert got["train.optimizer"] == ("optim", "adamw") and got["train.weight_decay"] == ("weight_decay", 0.01)
    assert got["train.max_grad_norm"] == ("max_grad_norm", 0.5)
    assert got["train.eval_every"] == ("eval_steps", 50) and got["train.save_every"] == ("save_steps", 100)
    assert got["seed"] == ("seed", 7) and got["train.eval_batch"] == ("per_device_eval_batch_size", 16)
    assert got["train.precision"] == ("bf16/fp16", "fp32")
    skipped = {n["key"] for n in env["data"]["not_carried"]}
    assert skipped == {"output_dir", "logging_steps", "do_eval"}  # eval_strategy: steps is eval_every's
    # no model, no data in the source: left empty, said, and validate asks for them
    assert env["data"]["to_set"] == ["model.path", "data.train", "data.validation"]
    camp = tmp_path / "campaign.yaml"
    assert "model.path=..." in camp.read_text()
    r = cli("validate", camp)
    assert r.code == 2 and "no model" in r.err
    sets = ["--set", "model.config=" + json.dumps(TINY_LLAMA), "--set", "model.tokenizer=byte",
            "--set", f"data.train={data / 'alpaca_train.jsonl'}", "--set", f"data.validation={data / 'alpaca_val.jsonl'}",
            "--set", "data.prompt=instruction", "--set", "data.response=output"]
    r = cli("validate", camp, *sets)
    assert r.code == 0, r.err


SFT_CONFIG = {  # a TRL SFTConfig as YAML (trl's CLI reads this), with epochs and a warmup ratio
    "output_dir": "Qwen2-0.5B-SFT", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4,
    "learning_rate": 2.0e-5, "lr_scheduler_type": "cosine_with_min_lr", "warmup_ratio": 0.25,
    "num_train_epochs": 3, "bf16": True, "gradient_checkpointing": True, "max_length": 1024, "packing": True,
    "assistant_only_loss": True, "completion_only_loss": None, "logging_steps": 25, "report_to": ["wandb"],
    "push_to_hub": True, "save_steps": 0.5, "optim": "adamw_8bit",
}


def test_sft_config_yaml_imports_with_packing_and_epochs(tmp_path, data):
    imp = import_config(write(tmp_path / "sft.yaml", SFT_CONFIG), "hf")
    assert not imp.detected
    got = carried(imp)
    assert got["data.max_length"] == ("max_length", 1024)
    assert got["data.messages"] == ("assistant_only_loss", "messages")
    assert got["train.epochs"] == ("num_train_epochs", 3.0)
    assert got["train.precision"] == ("bf16", "bf16-mixed")
    assert got["model.gradient_checkpointing"] == ("gradient_checkpointing", True)
    assert got["train.schedule"] == ("lr_scheduler_type", "cosine")  # nearest, and named
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert set(skipped) == {"output_dir", "lr_scheduler_type", "logging_steps", "report_to", "push_to_hub",
                            "warmup_ratio", "save_steps"}
    assert got["data.packing"] == ("packing", True)
    assert got["train.optimizer"] == ("optim", "adamw_8bit")
    # no data: the ratios cannot become updates; the note says what to set
    assert "train.warmup" in imp.to_set and "train.save_every" in imp.to_set
    check_round_trip(imp, **{"model.config": dict(TINY_LLAMA), "model.tokenizer": "byte",
                             "data.train": str(data / "chat.jsonl"), "data.validation": str(data / "chat_val.jsonl"),
                             "data.messages": "conversation", "train.warmup": 2, "train.save_every": 10})


def test_sft_config_max_seq_length_json(tmp_path):
    cfg = {"per_device_train_batch_size": 8, "max_seq_length": 512, "max_steps": 100, "packing": False,
           "completion_only_loss": False, "warmup_steps": 0.1, "lr_scheduler_type": "linear", "num_train_epochs": 1}
    imp = import_config(write(tmp_path / "sft.json", cfg))
    got = carried(imp)
    assert imp.fmt == "hf"
    assert got["data.max_length"] == ("max_seq_length", 512) and got["train.updates"] == ("max_steps", 100)
    assert got["train.warmup"] == ("warmup_steps", 10)  # a ratio below 1 (transformers 5) of the 100 updates
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert set(skipped) == {"completion_only_loss", "num_train_epochs"}
    assert "loss covers the prompt" in skipped["completion_only_loss"]


def test_sft_config_typo(tmp_path, cli):
    r = cli("import", write(tmp_path / "sft.json", {"per_device_train_batch_size": 2, "gradient_acumulation_steps": 4}))
    assert r.code == 2 and "'gradient_acumulation_steps'" in r.err and "'gradient_accumulation_steps'" in r.err
    assert not (tmp_path / "campaign.yaml").exists()


@pytest.mark.parametrize("name, text", [
    ("sft.json", '{"per_device_train_batch_size": 2,\n "learning_rate": 1e-400}'),  # JSON's reader: 0.0
    ("axolotl.yml", "base_model: m\nlearning_rate: 2.0e-400\nmicro_batch_size: 2\n"),  # YAML's float: 0.0
    ("args.yaml", "per_device_train_batch_size: 2\nlearning_rate: 1e-400\n"),  # YAML 1.1's text, then float()
])
def test_a_number_past_a_float_is_refused_not_imported_as_zero(tmp_path, cli, name, text):
    """The source's lr of 1e-400 was imported as train.lr: 0.0 without a word."""
    (tmp_path / name).write_text(text)
    r = cli("import", tmp_path / name)
    assert r.code == 2 and f"{name}:2: " in r.err and "is smaller than any number a float holds" in r.err, r.err
    assert not (tmp_path / "campaign.yaml").exists()
    (tmp_path / name).write_text(text.replace("-400", "-4"))
    assert cli("import", tmp_path / name).code == 0


def test_training_args_bin_refused_never_loaded(tmp_path, cli):
    """A pickle whose load would create a marker file: refused (exit 2), the marker never appears."""
    marker = tmp_path / "UNPICKLED"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    for name in ("training_args.bin", "args.json"):  # by its name, and by its bytes under another name
        src = tmp_path / name
        src.write_bytes(pickle.dumps(Payload(), protocol=2))
        r = cli("import", src)
        assert r.code == 2 and "pickle" in r.err and "to_json_string()" in r.err
        assert not marker.exists()
    assert not (tmp_path / "campaign.yaml").exists()
    pickle.loads((tmp_path / "args.json").read_bytes())  # the planted payload is live: loading it leaves the marker
    assert marker.exists()


# --------------------------------------------------------------------------------------- hub ids
def tiny_saved(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    import torch

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(**dict(TINY_LLAMA, vocab_size=2003))
    folder = tmp_path / "saved"
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder, safe_serialization=True)
    return folder


def hub_campaign(tmp_path, data, path, **train):
    c = {"name": "hub", "model": {"path": path},
         "data": {"train": str(data / "alpaca_train.jsonl"), "validation": str(data / "alpaca_val.jsonl"),
                  "prompt": "instruction", "response": "output", "max_length": 64},
         "train": {"micro_batch": 2, "accumulation": 2, "updates": 2, "eval_every": 1, "save_every": None, **train}}
    return write(tmp_path / "camp" / "campaign.yaml", c)


def test_hub_id_resolved_from_the_cache_and_recorded(tmp_path, data, cache):
    from huggingface_hub import scan_cache_dir

    from pilotrun.tasks.hub import is_hub_id, snapshot_of
    from pilotrun.journal.runs import RunRecorder
    from pilotrun.journal.store import Journal
    from pilotrun.tasks.loading import build_model, load_tokenizer

    files = {p.name: p.read_bytes() for p in tiny_saved(tmp_path).iterdir()}
    snap = add_model(cache, "acme/tiny-llama", {**files, **tokenizer_files()})
    repo = scan_cache_dir(cache).repos  # the library's own scan sees the layout we wrote
    assert [r.repo_id for r in repo] == ["acme/tiny-llama"]
    assert is_hub_id("acme/tiny-llama", tmp_path) and not is_hub_id("data/alpaca_train.jsonl", tmp_path)
    loaded = load_campaign(hub_campaign(tmp_path, data, "acme/tiny-llama"))
    assert loaded.campaign.model.path == str(snap)
    assert snapshot_of(loaded.campaign.model.path) == ("acme/tiny-llama", snap.name)
    assert loaded.hub["model.path"].commit == snap.name and loaded.hub["model.path"].revision == "main"
    model = build_model(loaded.campaign, load_tokenizer(loaded.campaign), "causal-lm")
    assert model.config.hidden_size == 64
    # @revision: the commit itself; a tokenizer named by hub id resolves the same way
    at = load_campaign(hub_campaign(tmp_path, data, f"acme/tiny-llama@{snap.name}"))
    assert at.campaign.model.path == str(snap)
    tok_only = add_model(cache, "acme/tok", tokenizer_files())
    c = yaml.safe_load(hub_campaign(tmp_path, data, "acme/tiny-llama").read_text())
    c["model"]["tokenizer"] = "acme/tok"
    with_tok = load_campaign(write(tmp_path / "camp" / "tok.yaml", c))
    assert with_tok.campaign.model.tokenizer == str(tok_only) and with_tok.hub["model.tokenizer"].repo_id == "acme/tok"
    assert len(load_tokenizer(with_tok.campaign)) == 2003
    # the run records the resolved revision
    rec = RunRecorder(Journal(tmp_path / "home"), loaded, kind="train")
    revs = json.loads((rec.dir / "revisions.json").read_text())
    assert revs["hub"]["model.path"]["repo_id"] == "acme/tiny-llama"
    assert revs["hub"]["model.path"]["commit"] == snap.name
    rec.finish("completed")
    with sqlite3.connect(tmp_path / "home" / "journal.sqlite") as db:
        (config,) = db.execute("SELECT config_json FROM runs").fetchone()
    assert snap.name in json.loads(config)["model"]["path"]


def test_hub_id_not_cached_is_exit_2(tmp_path, data, cache, cli):
    r = cli("validate", hub_campaign(tmp_path, data, "acme/absent-model"))
    assert r.code == 2
    assert f"not in the local Hugging Face cache {cache}" in r.err
    assert "`hf download acme/absent-model`" in r.err
    config_only(cache, "acme/other", dict(TINY_LLAMA, vocab_size=2003))
    r = cli("validate", hub_campaign(tmp_path, data, "acme/other@v2"))
    assert r.code == 2 and "at revision v2" in r.err and "--revision v2" in r.err


def test_config_only_hub_model_estimates_and_stages_that_run_it_say_so(tmp_path, data, cache, cli):
    config_only(cache, "acme/tiny-config", dict(TINY_LLAMA, vocab_size=2003))
    camp = hub_campaign(tmp_path, data, "acme/tiny-config")
    r = cli("validate", camp)
    assert r.code == 0, r.err
    r = cli("estimate", camp, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    assert "steady_step" in r.out and "nothing was allocated" in r.out
    for verb in ("pilot", "overfit", "train"):
        r = cli(verb, camp, "--home", tmp_path / "home")
        assert r.code == 2, (verb, r.err)
        assert "holds config.json but not its weights: model.safetensors missing" in r.err
        assert "`hf download acme/tiny-config`" in r.err
    journal = tmp_path / "home" / "journal.sqlite"  # no run was created (the estimate makes none)
    if journal.exists():
        with sqlite3.connect(journal) as db:
            assert db.execute("SELECT count(*) FROM runs").fetchone()[0] == 0
    # a sharded model whose index is cached but not every shard: the missing shard is named
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    snap = config_only(cache, "acme/sharded", dict(TINY_LLAMA, vocab_size=2003))
    (snap / "model.safetensors.index.json").write_text(json.dumps(index))
    (snap / "model-00001-of-00002.safetensors").write_bytes(b"x")
    r = cli("pilot", hub_campaign(tmp_path, data, "acme/sharded"), "--home", tmp_path / "home")
    assert r.code == 2 and "model-00002-of-00002.safetensors missing" in r.err
    assert "model-00001" not in r.err


@pytest.mark.slow
def test_imported_campaign_estimates_a_real_1b_config_without_weights(tmp_path, data, cache, cli):
    """Must show: estimate on an imported campaign whose model is Llama-3.2-1B's published config.json alone."""
    config_only(cache, "meta-llama/Llama-3.2-1B", LLAMA_32_1B)
    src = write(tmp_path / "lora.yml", dict(AXOLOTL_LORA, base_model="meta-llama/Llama-3.2-1B", sequence_len=512))
    assert cli("import", src).code == 0
    camp = tmp_path / "campaign.yaml"
    assert cli("validate", camp).code == 0
    r = cli("estimate", camp, "--json", "--home", tmp_path / "home")
    assert r.code == 0, r.err
    res = r.json["stages"][0]
    # Llama-3.2-1B's 1,235,814,400 (tied embeddings) + the r=16 LoRA on every linear layer
    assert "1,247,086,592 parameters (11,272,192 trainable)" in res["messages"][0]
    phases = {row["phase"] for row in res["rows"]}
    assert {"load", "first_step", "steady_step", "eval_longest"} <= phases
    assert all(not p.name.endswith(".safetensors") for p in cache.rglob("*"))


def test_all_and_sheet_say_once_what_is_not_reproduced(tmp_path, data, cache, cli):
    """`all` says it once, before its stages; the sheet says it once (here the sheet of no pilot yet)."""
    from pilotrun.rehearsal.all import _imported

    files = {p.name: p.read_bytes() for p in tiny_saved(tmp_path).iterdir()}
    add_model(cache, "acme/tiny-llama", {**files, **tokenizer_files()})
    cfg = dict(AXOLOTL_LORA, base_model="acme/tiny-llama", sequence_len=64)
    assert cli("import", write(tmp_path / "lora.yml", cfg)).code == 0
    loaded = load_campaign(tmp_path / "campaign.yaml")
    lines = not_reproduced_lines(loaded.campaign)
    assert lines[0].startswith("imported from Axolotl lora.yml: 5 of its settings the rehearsal does not reproduce")
    assert {x.strip().split(" = ")[0] for x in lines[1:-1]} == {
        "datasets[0].type", "eval_sample_packing", "pad_to_sequence_len", "flash_attention", "special_tokens"}
    assert any(x.strip().startswith("eval_sample_packing = false: ") for x in lines)
    assert set(lines[-1].strip().removeprefix("nothing to rehearse: ").split(", ")) == {
        "model_type", "tokenizer_type", "dataset_prepared_path", "output_dir", "wandb_project", "logging_steps",
        "test_datasets[0].split"}
    said = _imported(loaded)
    assert said.verdict == "warn" and said.summary == lines[0] and said.messages == lines[1:]
    r = cli("sheet", tmp_path / "campaign.yaml", "--home", tmp_path / "home")
    assert "no pilot run" in r.out
    assert r.out.count("eval_sample_packing = false") == 1 and r.out.count(lines[0]) == 1
    # its sheet begins with them: written again over it, it is still a sheet of pilotrun's (refuse_replacing)
    from test_sheet import record_pilot

    record_pilot(tmp_path / "campaign.yaml", tmp_path / "home", {})
    out = tmp_path / "sheet" / "imported.md"
    for _ in range(2):
        r = cli("sheet", tmp_path / "campaign.yaml", "--home", tmp_path / "home", "--out", out, "--gpu", "a100-80gb")
        assert r.code == 0, r.out + r.err
    assert out.read_text().startswith("## Not reproduced by the rehearsal\n")
    # a campaign not imported says nothing of the kind
    plain = hub_campaign(tmp_path, data, "acme/tiny-llama")
    assert not_reproduced_lines(load_campaign(plain).campaign) == [] and _imported(load_campaign(plain)) is None


@pytest.mark.slow
def test_sheet_without_a_pilot_from_a_cached_config(tmp_path, data, cache, cli):
    config_only(cache, "acme/tiny-config", dict(TINY_LLAMA, vocab_size=2003))
    cfg = dict(AXOLOTL_LORA, base_model="acme/tiny-config", sequence_len=64)
    assert cli("import", write(tmp_path / "lora.yml", cfg)).code == 0
    r = cli("sheet", tmp_path / "campaign.yaml", "--home", tmp_path / "home")
    assert r.code == 0, r.err
    assert "NO PILOT: only the config of acme/tiny-config is cached, not its weights (model.safetensors" in r.out
    assert "`hf download acme/tiny-config`" in r.out
    assert r.out.count("eval_sample_packing = false") == 1


def test_import_refuses_to_overwrite(tmp_path, data, cli):
    src = write(tmp_path / "lora.yml", AXOLOTL_LORA)
    (tmp_path / "campaign.yaml").write_text("name: mine\n")
    r = cli("import", src)
    assert r.code == 2 and "does not overwrite" in r.err and "--force" in r.err
    assert (tmp_path / "campaign.yaml").read_text() == "name: mine\n"
    with pytest.raises(BadInput, match="unknown format"):
        import_config(src, "torchtune")


@pytest.mark.parametrize("name, said", [
    ("axolotl.yml", "not a campaign file: an Axolotl config (base_model, datasets, micro_batch_size"),
    ("sft.json", "not a campaign file: a Hugging Face TrainingArguments / TRL config (per_device_train_batch_size"),
    ("accelerate.yaml", "not a campaign file: an accelerate launch config"),
])
def test_a_campaign_verb_given_the_config_to_import_says_so_once(tmp_path, cli, name, said):
    """`pilotrun all axolotl.yml` listed each key as unknown, the first "did you mean 'model'?" for base_model."""
    texts = {"axolotl.yml": "base_model: m\ndatasets:\n  - path: d.jsonl\n    type: alpaca\nmicro_batch_size: 2\n"
                            "seed: 42\n",
             "sft.json": json.dumps({"per_device_train_batch_size": 2, "learning_rate": 1e-4, "max_steps": 10}),
             "accelerate.yaml": "distributed_type: FSDP\nnum_processes: 8\nmachine_rank: 0\n"}
    (tmp_path / name).write_text(texts[name])
    for verb in ("validate", "all", "sheet"):
        r = cli(verb, tmp_path / name, "--home", tmp_path / "home")
        assert r.code == 2 and said in r.err, (verb, r.err)
        assert "unknown key" not in r.err and not (tmp_path / "home").exists()
        if name != "accelerate.yaml":
            assert f"fix: write the campaign from it with `pilotrun import {tmp_path / name}`" in r.err
    # a campaign with a typo in its top level still gets the unknown-key rule
    (tmp_path / "c.yaml").write_text("name: x\nmodle: {path: m}\n")
    assert "unknown key 'modle'" in cli("validate", tmp_path / "c.yaml").err


def test_a_pilotrun_campaign_given_to_import_says_it_is_one(cli, demo_campaign):
    """It was "cannot tell the config's format … say it: --from", and with --from axolotl it was imported as one."""
    for args in ((), ("--from", "axolotl"), ("--from", "hf")):
        r = cli("import", demo_campaign, *args, "--out", demo_campaign.parent / "again.yaml")
        assert r.code == 2 and "a pilotrun campaign already (model:, data:, train: …)" in r.err, r.err
        assert f"fix: run the verbs on it: pilotrun validate {demo_campaign}" in r.err
        assert not (demo_campaign.parent / "again.yaml").exists()
