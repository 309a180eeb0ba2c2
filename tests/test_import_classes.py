"""`pilotrun import`: each class of config it refused or mis-read, on instances other than the ones first reported.

Real keys of the tools' schemas and plugins, TRL CLI files, ShareGPT turn mappings, prompt styles after a colon
or a dot, preference and RL configs (never SFT), sharded configs' ranks, pretraining data sets, save strategies,
shares rounded as the tools round them after the source's own validation split, and the formats refused with
what to do. The schemas themselves: the generator's parse of a planted source tree, and the installed tool's
classes winning over the stored data.
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from conftest import SHARED_DATA, write_jsonl

from pilotrun.campaign.importers import import_config, not_reproduced_lines, schemas
from pilotrun.campaign.load import load_campaign
from pilotrun.errors import BadInput


@pytest.fixture
def folder(tmp_path):
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    rows = [{k: r[k] for k in ("instruction", "input", "output")} for r in recs]
    write_jsonl(tmp_path / "alpaca.jsonl", rows[:60])
    write_jsonl(tmp_path / "qa" / "train.jsonl", [{"question": r["instruction"], "answer": r["output"]} for r in rows])
    write_jsonl(tmp_path / "sharegpt.jsonl", [{"conversations": [{"from": "human", "value": r["instruction"]},
                                                                 {"from": "gpt", "value": r["output"]}]} for r in rows])
    write_jsonl(tmp_path / "org" / "web-text" / "data" / "train-00000-of-00001.jsonl",
                [{"content": r["instruction"] + " " + r["output"]} for r in rows])
    write_jsonl(tmp_path / "org" / "web-text" / "data" / "test-00000-of-00001.jsonl",
                [{"content": r["output"]} for r in rows[:10]])
    return tmp_path


def write(path, obj):
    path.write_text(yaml.safe_dump(obj, sort_keys=False) if path.suffix != ".json" else json.dumps(obj))
    return path


def carried(imp):
    return {c.key: (c.source, c.value) for c in imp.carried}


def skipped(imp):
    return {n.key: n.reason for n in imp.not_carried}


BASE = {"base_model": "./model", "micro_batch_size": 2, "gradient_accumulation_steps": 2, "num_epochs": 1,
        "learning_rate": 1e-4, "sequence_len": 256}


# ---------------------------------------------------------------- ShareGPT mappings, prompt styles
def test_sharegpt_turns_in_the_older_forms_are_read(folder):
    cfg = dict(BASE, datasets=[{"path": "sharegpt.jsonl", "type": "chat_template", "field_messages": "conversations",
                                "message_field_role": "from", "message_field_content": "value",
                                "roles": {"user": ["human"], "assistant": ["gpt"]}}])
    imp = import_config(write(folder / "sg.yml", cfg))
    assert carried(imp)["data.messages"] == ("datasets[0].field_messages", "conversations")
    assert "pilotrun's chat reader takes these turn fields" in skipped(imp)["datasets[0].message_property_mappings"]
    assert "reads these role names" in skipped(imp)["datasets[0].roles"]
    # a mapping onto fields the reader does not take is still asked for, naming them
    odd = dict(cfg, datasets=[dict(cfg["datasets"][0], message_field_role="speaker")])
    with pytest.raises(BadInput, match="maps the turns' role to 'speaker'"):
        import_config(write(folder / "odd.yml", odd), out=folder / "odd.yaml")
    # roles read as another role than pilotrun's names for them
    bad = dict(cfg, datasets=[dict(cfg["datasets"][0], roles={"assistant": ["human"]})])
    with pytest.raises(BadInput, match="reads 'human' as assistant"):
        import_config(write(folder / "bad.yml", bad), out=folder / "bad.yaml")


def test_prompt_styles_after_a_colon_or_a_dot(folder):
    imp = import_config(write(folder / "qa.yml", dict(BASE, datasets=[{"path": "qa", "type": "alpaca_chat.load_qa"}])))
    got = carried(imp)
    assert got["data.train"] == ("datasets[0].path", "qa/train.jsonl")  # a local folder: its one data file
    assert "{question}" in got["data.prompt"][1] and "{input}" not in got["data.prompt"][1]
    assert got["data.response"] == ("datasets[0].type", "answer")
    imp = import_config(write(folder / "chatml.yml", dict(BASE, datasets=[{"path": "alpaca.jsonl",
                                                                           "type": "alpaca:chatml"}])),
                        out=folder / "c2.yaml")
    assert "prompt style 'chatml'" in skipped(imp)["datasets[0].type"]
    imp = import_config(write(folder / "sg2.yml", dict(BASE, datasets=[{"path": "sharegpt.jsonl",
                                                                        "type": "sharegpt:llama3"}])),
                        out=folder / "c3.yaml")
    assert carried(imp)["data.messages"][1] == "conversations"
    assert "built-in 'llama3' template" in skipped(imp)["chat_template"]
    loaded = load_campaign(imp.out, {"data.validation": str(folder / "sharegpt.jsonl")})
    assert loaded.campaign.data.messages == "conversations"


# ---------------------------------------------------------------- preference and RL: never SFT
@pytest.mark.parametrize("rl, words", [("kto", "is a preference method pilotrun does not rehearse (it learns from "
                                               "unpaired"),
                                       ("cpo", "is a preference method pilotrun does not rehearse"),
                                       ("gspo", "online reinforcement learning"),
                                       ("ppo", "online reinforcement learning")])
def test_rl_configs_are_refused_naming_rl(folder, rl, words, cli):
    cfg = dict(BASE, rl=rl, datasets=[{"path": "argilla/pairs", "type": "chat_template.argilla"}])
    r = cli("import", write(folder / f"{rl}.yml", cfg))
    assert r.code == 2 and f"rl: {rl}" in r.err and words in r.err
    assert "hub data set" not in r.err and "does not say which fields" not in r.err  # no side key named
    assert not (folder / "campaign.yaml").exists()


@pytest.mark.parametrize("cfg, key, words", [
    ({"num_generations": 8, "beta": 0.04, "max_completion_length": 256, "dataset_name": "trl-lib/tldr"},
     "num_generations: 8 is a key of TRL's GRPOConfig", "online reinforcement learning"),
    ({"num_ppo_epochs": 4, "kl_coef": 0.05, "reward_model_path": "rm"}, "num_ppo_epochs: 4 is a key of TRL's PPOConfig",
     "online reinforcement learning"),
    ({"desirable_weight": 1.0, "undesirable_weight": 1.0, "beta": 0.1}, "desirable_weight: 1.0 is a key of TRL's "
     "KTOConfig (kto)", "a preference method pilotrun does not rehearse")])
def test_trl_configs_of_other_trainers_are_refused_naming_their_key(folder, cfg, key, words, cli):
    """A GRPOConfig dict holds DPOConfig's beta: it imported with exit 0 as task: preference (and with a hub data set,
    was refused naming the data set); any trainer other than SFT and DPO is exit 2 naming its own key."""
    r = cli("import", write(folder / "trl.json", {"per_device_train_batch_size": 2, "learning_rate": 1e-6, **cfg}))
    assert r.code == 2 and key in r.err and words in r.err, r.err
    assert "hub data set" not in r.err and not (folder / "campaign.yaml").exists()


def _pairs(folder):
    """Stack Exchange pairs as Intel's orca_dpo_pairs lays them out (question, chosen, rejected) and as whole
    conversations (chosen / rejected: a user turn and an assistant turn)."""
    se = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text(encoding="utf-8"))
    write_jsonl(folder / "intel.jsonl", [{"system": "", "question": r["question"][:200], "chosen": r["response_j"][:200],
                                          "rejected": r["response_k"][:200]} for r in se])
    write_jsonl(folder / "argilla.jsonl", [{k: [{"role": "user", "content": r["question"][:200]},
                                                {"role": "assistant", "content": r[f][:200]}]
                                            for k, f in (("chosen", "response_j"), ("rejected", "response_k"))}
                                           for r in se])


def test_axolotl_offline_preference_configs_import_as_the_preference_task(folder):
    _pairs(folder)
    imp = import_config(write(folder / "simpo.yml", dict(BASE, rl="simpo", rl_beta=2.5, simpo_gamma=0.8,
                                                         dpo_label_smoothing=0.1,
                                                         datasets=[{"path": "intel.jsonl", "type": "chatml.intel"}])),
                        out=folder / "c.yaml")
    got, said = carried(imp), skipped(imp)
    assert got["task"] == ("rl", "preference") and got["preference.loss"] == ("rl", "simpo")
    assert got["preference.beta"] == ("rl_beta", 2.5) and got["preference.gamma"] == ("simpo_gamma", 0.8)
    assert got["data.prompt"][1] == "question" and got["data.chosen"][1] == "chosen"
    assert got["data.chat_template"][1] == "model" and "chatml markers" in said["datasets[0].type"]
    assert "adds the chosen answer's NLL × cpo_alpha (1.0, its default)" in said["cpo_alpha"]
    assert "label smoothing" in said["dpo_label_smoothing"]
    loaded = load_campaign(imp.out, {"data.validation": str(folder / "intel.jsonl")})
    assert loaded.campaign.task == "preference" and loaded.campaign.preference.loss == "simpo"
    # ORPO on two whole conversations: the prompt is their shared start; orpo_alpha is ORPO's λ (TRL's beta)
    imp = import_config(write(folder / "orpo.yml", dict(BASE, rl="orpo", orpo_alpha=0.2, precompute_ref_log_probs=True,
                                                        datasets=[{"path": "argilla.jsonl",
                                                                   "type": "chat_template.argilla"}])),
                        out=folder / "c2.yaml")
    got, said = carried(imp), skipped(imp)
    assert got["preference.beta"] == ("orpo_alpha", 0.2) and "data.prompt" not in got
    assert (got["data.chosen"][1], got["data.rejected"][1]) == ("chosen", "rejected")
    assert "orpo compares the policy with no reference model: nothing to precompute" in said["precompute_ref_log_probs"]
    assert "preference.reference" not in got
    # DPO with precompute_ref_log_probs: the reference's log-probabilities precomputed, no reference model resident
    imp = import_config(write(folder / "dpo.yml", dict(BASE, rl="dpo", precompute_ref_log_probs=True,
                                                       datasets=[{"path": "intel.jsonl", "type": "chatml.intel"}])),
                        out=folder / "c3.yaml")
    assert carried(imp)["preference.reference"] == ("precompute_ref_log_probs", "precomputed")
    assert "precompute_ref_log_probs" not in skipped(imp)
    loaded = load_campaign(imp.out, {"data.validation": str(folder / "intel.jsonl")})
    assert loaded.campaign.preference.reference == "precomputed"


def test_a_dpo_config_dict_imports_as_the_preference_task(folder):
    imp = import_config(write(folder / "dpo.json", {"per_device_train_batch_size": 2, "beta": 0.2,
                                                     "loss_type": ["ipo"], "max_length": 512, "label_smoothing": 0.0,
                                                     "max_prompt_length": 128, "rpo_alpha": 0.5,
                                                     "precompute_ref_log_probs": False}))
    got, said = carried(imp), skipped(imp)
    assert got["task"][1] == "preference" and got["preference.loss"] == ("loss_type", "ipo")
    assert got["preference.beta"] == ("beta", 0.2) and got["data.max_length"] == ("max_length", 512)
    assert [got[f"data.{k}"][1] for k in ("prompt", "chosen", "rejected")] == ["prompt", "chosen", "rejected"]
    assert "cuts the prompt to this first" in said["max_prompt_length"] and "RPO" in said["rpo_alpha"]
    assert "label_smoothing" not in said  # its default: nothing to say
    assert "preference.reference" not in got and "precompute_ref_log_probs" not in said  # False: its default
    imp = import_config(write(folder / "hinge.json", {"per_device_train_batch_size": 2, "beta": 0.1,
                                                       "loss_type": "hinge"}), out=folder / "h.yaml")
    assert carried(imp)["preference.loss"][1] == "dpo" and "the hinge loss" in skipped(imp)["loss_type"]
    pre = {"per_device_train_batch_size": 2, "beta": 0.1, "precompute_ref_log_probs": True,
           "precompute_ref_batch_size": 16}
    imp = import_config(write(folder / "pre.json", pre), out=folder / "p.yaml")
    got, said = carried(imp), skipped(imp)
    assert got["preference.reference"] == ("precompute_ref_log_probs", "precomputed")
    assert "precomputes train.eval_batch pairs a batch" in said["precompute_ref_batch_size"]


# ---------------------------------------------------------------- TRL: its dumps and its CLI files
def test_trl_cli_file_with_peft_and_a_local_dataset(folder):
    cfg = {"model_name_or_path": "Qwen/Qwen3-0.6B", "dataset_name": "org/web-text", "dataset_text_field": "content",
           "use_peft": True, "lora_r": 8, "lora_target_modules": ["q_proj", "v_proj"], "dtype": "bfloat16",
           "per_device_train_batch_size": 4, "num_train_epochs": 1, "bf16": True, "attn_implementation": "sdpa",
           "model_init_kwargs": None, "trust_remote_code": False, "report_to": "none"}
    imp = import_config(write(folder / "trl.yaml", cfg))
    assert imp.fmt == "hf" and imp.detected
    got = carried(imp)
    assert got["model.path"] == ("model_name_or_path", "Qwen/Qwen3-0.6B") and got["model.dtype"][1] == "bfloat16"
    assert got["model.adapter.kind"] == ("use_peft", "lora") and got["model.adapter.r"] == ("lora_r", 8)
    assert got["model.adapter.alpha"] == ("lora_alpha (TRL's default)", 32.0)  # ModelConfig's, TRL 1.16
    assert got["model.adapter.target_modules"] == ("lora_target_modules", ["q_proj", "v_proj"])
    assert got["data.train"][1] == "org/web-text/data/train-00000-of-00001.jsonl"
    assert got["data.validation"][1] == "org/web-text/data/test-00000-of-00001.jsonl"
    assert got["data.response"] == ("dataset_text_field", "content") and got["data.prompt"][1] == ""
    assert "eager attention" in skipped(imp)["attn_implementation"]
    # the hub data set itself (no folder of that name) is asked for, naming dataset_name
    with pytest.raises(BadInput, match="dataset_name = 'trl-lib/Capybara' is a hub data set"):
        import_config(write(folder / "hub.yaml", dict(cfg, dataset_name="trl-lib/Capybara")), out=folder / "h.yaml")


def test_unknown_trainer_key_far_from_any_is_named_with_the_versions(folder):
    imp = import_config(write(folder / "args.json", {"per_device_train_batch_size": 2, "max_steps": 10,
                                                      "fused_optimizer_hint": True}))
    reason = skipped(imp)["fused_optimizer_hint"]
    assert reason.startswith(f"unknown to transformers {schemas.primary('transformers').version} (installed)")
    assert "4.57.6, 4.44.2" in reason and "trl 1.16.0" in reason
    with pytest.raises(BadInput, match="did you mean 'per_device_eval_batch_size'"):
        import_config(write(folder / "t.json", {"per_device_train_batch_size": 2, "per_device_eval_bach_size": 4}),
                      out=folder / "t.yaml")


# ---------------------------------------------------------------- ranks, data sets, saves
def test_sharded_configs_say_their_ranks(folder):
    ds = dict(BASE, datasets=[{"path": "alpaca.jsonl", "type": "alpaca"}], deepspeed="deepspeed_configs/zero3_bf16.json")
    got = carried(import_config(write(folder / "ds.yml", ds)))
    assert got["train.strategy"][1] == "fsdp" and got["train.nproc"][1] == 2
    hsdp = dict(BASE, datasets=ds["datasets"], fsdp_version=2, fsdp_config={"reshard_after_forward": True},
                dp_shard_size=4, dp_replicate_size=2, tensor_parallel_size=2)
    imp = import_config(write(folder / "hsdp.yml", hsdp), out=folder / "h.yaml")
    assert carried(imp)["train.nproc"] == ("dp_shard_size x dp_replicate_size", 8)
    assert "train.nproc" not in imp.to_set and "tensor parallel" in skipped(imp)["tensor_parallel_size"]


def test_pretraining_dataset_is_read_or_refused_by_its_own_key(folder, cli):
    cfg = dict(BASE, pretraining_dataset=[{"path": "org/web-text", "text_column": "content", "type": "pretrain"}],
               streaming=True, max_steps=20)
    imp = import_config(write(folder / "pre.yml", cfg))
    assert carried(imp)["data.response"] == ("pretraining_dataset[0].field", "content")
    r = cli("import", write(folder / "pre2.yml", dict(cfg, pretraining_dataset=[{"path": "HuggingFaceFW/fineweb"}])),
            "--out", folder / "p2.yaml")
    assert r.code == 2 and "pretraining_dataset[0].path = 'HuggingFaceFW/fineweb' is a hub data set" in r.err


def test_a_data_file_missing_from_its_local_folder_is_named_with_what_the_folder_holds(folder, cli):
    """`path: org/set` with `data_files: [sub/train.json]`: a local folder of that name holding another file was
    "datasets[0].path = 'org/set' is no local file" (the folder is there); the file it lacks is named now."""
    write_jsonl(folder / "org" / "set" / "train.jsonl", [{"instruction": "a", "input": "", "output": "b"}])
    cfg = dict(BASE, datasets=[{"path": "org/set", "data_files": ["sub/train.json"], "type": "alpaca"}])
    r = cli("import", write(folder / "df.yml", cfg), "--out", folder / "df.yaml")
    assert r.code == 2, r.err
    assert "datasets[0].data_files = 'sub/train.json' is not in the local folder 'org/set' (it holds train.jsonl)" \
           in r.err and "fix: put the data set's file at org/set/sub/train.json" in r.err, r.err
    assert not (folder / "df.yaml").exists()
    write_jsonl(folder / "org" / "set" / "sub" / "train.json", [{"instruction": "a", "input": "", "output": "b"}])
    imp = import_config(folder / "df.yml")
    assert carried(imp)["data.train"][1].endswith("org/set/sub/train.json")


def test_a_local_folder_that_save_to_disk_wrote_is_read_as_axolotl_loads_it(folder):
    """Axolotl loads a local folder written by `save_to_disk` with `load_from_disk`; its state.json and
    dataset_info.json were two more "data files" beside a shard pilotrun could not read. Its shard is the file now,
    the split's in a DatasetDict."""
    import datasets

    rows = [{"instruction": f"say {i}", "input": "", "output": str(i)} for i in range(8)]
    datasets.Dataset.from_list(rows).save_to_disk(str(folder / "single"))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows), "test": datasets.Dataset.from_list(rows[:2])}
                         ).save_to_disk(str(folder / "splits"))
    for name, shard in (("single", "single/data-00000-of-00001.arrow"),
                        ("splits", "splits/train/data-00000-of-00001.arrow")):
        cfg = dict(BASE, datasets=[{"path": name, "type": "alpaca"}])
        imp = import_config(write(folder / f"{name}.yml", cfg), out=folder / f"{name}.yaml")
        assert carried(imp)["data.train"][1].endswith(shard), carried(imp)["data.train"]


def test_save_strategy_decides_what_save_steps_means(folder):
    """A dump's save_steps (500, the default it writes) is read only under save_strategy "steps"."""
    from transformers import TrainingArguments

    for strategy in ("epoch", "no"):
        args = TrainingArguments(output_dir=str(folder / "o"), save_strategy=strategy, per_device_train_batch_size=2,
                                 num_train_epochs=2, report_to="none")
        src = folder / f"{strategy}.json"
        src.write_text(args.to_json_string())
        imp = import_config(src, out=folder / f"{strategy}.yaml")
        assert "save_strategy is " + strategy in skipped(imp)["save_steps"]
        if strategy == "no":
            assert carried(imp)["train.save_every"] == ("save_strategy", None)
        else:  # once per epoch: the count needs the data, which a dump does not name
            assert "train.save_every" in imp.to_set and "train.save_every" not in carried(imp)


def test_shares_round_as_the_tools_do_after_the_validation_split(folder):
    # Axolotl: val_set_size 0.1 of 60 records leaves 54; the Trainer's count: ceil(54 / 2) = 27 micro-batches,
    # // 2 = 13 updates per epoch, x 2 epochs = 26 updates
    cfg = dict(BASE, num_epochs=2, datasets=[{"path": "alpaca.jsonl", "type": "alpaca"}], val_set_size=0.1,
               warmup_ratio=0.05, saves_per_epoch=1, evals_per_epoch=2)
    imp = import_config(write(folder / "ax.yml", cfg))
    got = carried(imp)
    total = math.ceil(13 * 2)
    assert got["train.save_every"][1] == math.ceil(total / 2)  # 1 per epoch over 2 epochs
    assert got["train.eval_every"][1] == math.ceil(total / 4)
    assert got["train.warmup"][1] == 2  # floor(0.05 x 26) = 1, which Axolotl makes 2
    assert "54 training examples (left after the source's validation split of 0.1: 6 records)" in \
           {c.key: c.note for c in imp.carried}["train.save_every"]
    # the Trainer takes the ceiling: 0.05 of 26 updates is 1.3 → 2
    hf = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2, "max_steps": 26, "warmup_ratio": 0.05}
    got = carried(import_config(write(folder / "hf.json", hf), out=folder / "hf.yaml"))
    assert got["train.warmup"][1] == 2 and "takes the ceiling" in {c.key: c.note for c in import_config(
        folder / "hf.json", out=folder / "hf.yaml", force=True).carried}["train.warmup"]
    # once the user splits and sets data.validation, val_set_size is no longer said
    loaded = load_campaign(imp.out, {"model.config": {"model_type": "llama"}, "model.path": None})
    assert any(line.strip().startswith("val_set_size") for line in not_reproduced_lines(loaded.campaign))
    split = load_campaign(imp.out, {"model.config": {"model_type": "llama"}, "model.path": None,
                                    "data.validation": str(folder / "alpaca.jsonl")})
    assert not any("val_set_size" in line for line in not_reproduced_lines(split.campaign))


# ---------------------------------------------------------------- formats refused with what to do
def test_a_deepspeed_json_is_refused_with_what_to_do(folder):
    with pytest.raises(BadInput, match="a DeepSpeed config") as e:
        import_config(write(folder / "ds_config.json", {"zero_optimization": {"stage": 2},
                                                         "train_micro_batch_size_per_gpu": "auto"}))
    assert "import the training config that names it" in e.value.fix


def _folder_files(folder):
    """The JSON files a Hugging Face model or output folder holds, each written by its own library."""
    from peft import LoraConfig
    from transformers import GenerationConfig, LlamaConfig, TrainerState

    model = folder / "out"
    LlamaConfig(vocab_size=128, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                intermediate_size=32).save_pretrained(model)
    GenerationConfig(max_new_tokens=16, do_sample=False).save_pretrained(model)
    LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]).save_pretrained(model / "adapter")
    TrainerState(global_step=10, max_steps=10, train_batch_size=8, num_train_epochs=1).save_to_json(
        str(model / "trainer_state.json"))
    (model / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 2048, "tokenizer_class":
                                                             "PreTrainedTokenizerFast", "pad_token": None}))
    return model


@pytest.mark.parametrize("name, said, fix", [
    ("config.json", "a model's config.json (model_type llama): it describes a model, not how to train it",
     "a campaign names this folder as model.path"),
    ("generation_config.json", "a model's generation config (generation_config.json)", "as model.path"),
    ("adapter/adapter_config.json", "a PEFT adapter's config (LORA, adapter_config.json): it describes a trained "
     "adapter", "model.adapter: {r: 4, alpha: 8, dropout: 0.0, target_modules: ['q_proj', 'v_proj']}"),
    # its train_batch_size made it "a DeepSpeed config (zero_optimization)"
    ("trainer_state.json", "the Trainer's record of a run (trainer_state.json: global_step 10, log_history)",
     "import the run's arguments: `trainer.args.to_json_string()`"),
    ("tokenizer_config.json", "a tokenizer's config (tokenizer_config.json)", "(or model.tokenizer)"),
])
def test_a_model_or_output_folders_own_file_is_named_not_read_as_a_training_config(folder, cli, name, said, fix):
    """Each was "cannot tell the config's format … say it: --from axolotl or --from hf", and --from then read a
    model's shape as training arguments; what each file is, and what to import instead, is said whatever --from
    says."""
    path = _folder_files(folder) / name
    for args in ((), ("--from", "hf"), ("--from", "axolotl")):
        r = cli("import", path, *args, "--out", folder / "c.yaml")
        assert r.code == 2 and said in r.err and fix in " ".join(r.err.split()), r.err
        assert not (folder / "c.yaml").exists()


# ---------------------------------------------------------------- the schemas
def test_the_generator_reads_pydantic_models_and_plugins_from_a_source_tree(tmp_path):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("import_schemas", Path(__file__).parents[1] / "tools" /
                                                  "import_schemas.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    pkg = tmp_path / "src" / "axolotl"
    (pkg / "utils" / "schemas").mkdir(parents=True)
    (pkg / "integrations" / "shiny").mkdir(parents=True)
    (tmp_path / "VERSION").write_text("9.9.9\n")
    (pkg / "utils" / "schemas" / "model.py").write_text(
        "class ModelInputConfig(BaseModel):\n    base_model: str\n    overrides: dict | None = Field(default=None, "
        "alias='model_config')\n")
    (pkg / "utils" / "schemas" / "config.py").write_text(
        "class AxolotlInputConfig(ModelInputConfig, BaseModel):\n    sequence_len: int = 512\n"
        "    lr: float | None = Field(2e-5, json_schema_extra={'description': 'x'})\n")
    (pkg / "utils" / "schemas" / "datasets.py").write_text("class SFTDataset(BaseModel):\n    path: str | None = None\n")
    (pkg / "integrations" / "shiny" / "args.py").write_text("class ShinyArgs(BaseModel):\n    shiny_level: int = 3\n")
    data = gen.axolotl(tmp_path, "acme/axolotl@abc")
    assert data["version"] == "9.9.9" and data["source"] == "acme/axolotl@abc"
    assert data["keys"]["sequence_len"] == {"type": "int", "default": 512, "from": "AxolotlInputConfig"}
    assert data["keys"]["lr"]["default"] == 2e-5 and data["keys"]["base_model"]["from"] == "ModelInputConfig"
    assert data["keys"]["model_config"]["alias_of"] == "overrides"
    assert set(data["groups"]["datasets"]) == {"path"}
    assert data["groups"]["plugin:axolotl.integrations.shiny"]["shiny_level"]["default"] == 3


def test_the_installed_tool_wins_and_the_stored_data_matches_its_version():
    import transformers

    primary = schemas.primary("transformers")
    assert primary.source == "installed" and primary.version == transformers.__version__
    stored = {s.version: s for s in schemas.stored("transformers")}
    if transformers.__version__ in stored:  # the data generated from this very version holds the same keys
        assert set(stored[transformers.__version__].keys) == set(primary.keys)
    assert {"evaluation_strategy", "eval_strategy"} <= schemas.known("transformers")  # 4.44's and 5.x's
    ax = schemas.primary("axolotl")
    assert ax.source.startswith("axolotl-ai-cloud/axolotl@") and "use_eaft" in ax.keys
    assert schemas.default("axolotl", "sequence_len") == 512


def test_the_import_names_the_schemas_it_checked_against(folder, cli):
    from pilotrun.campaign.importers.schemas import pydantic_keys
    from pilotrun.campaign.schema import TrainConfig

    cfg = dict(BASE, datasets=[{"path": "alpaca.jsonl", "type": "alpaca"}])
    r = cli("import", write(folder / "ax.yml", cfg))
    assert r.code == 0 and "keys checked against: axolotl 0.18.0 (axolotl-ai-cloud/axolotl@067b021c8b87)" in r.out
    assert "# keys checked against: axolotl 0.18.0" in (folder / "campaign.yaml").read_text()
    # an installed Axolotl's pydantic models are read as the generator reads the source: name, type, default
    keys = pydantic_keys(TrainConfig)
    assert keys["micro_batch"]["default"] == 2 and keys["micro_batch"]["from"] == "TrainConfig"


# ---------------------------------------------------------------- values of another type
EXAMPLES = __import__("pathlib").Path(__file__).parents[1] / "examples" / "imports"


@pytest.mark.parametrize("name", ["axolotl-lora.yml", "sft_config.json"])
def test_no_value_of_another_type_is_an_internal_error(tmp_path, name):
    """The mappers computed with what they read: `learning_rate: x`, `micro_batch_size: [2]`, `save_steps: nan`,
    `datasets: 3`, a base_model list or a NUL in a path were exit 3 (ValueError, TypeError, KeyError) in 71 of 954
    values tried on the two examples. Every key of both, each value below: imported, or bad input."""
    import copy
    import shutil

    shutil.copytree(EXAMPLES.parent / "data", tmp_path / "data")
    text = (EXAMPLES / name).read_text()
    base = yaml.safe_load(text) if name.endswith(".yml") else json.loads(text)
    (tmp_path / "imports").mkdir()
    source = tmp_path / "imports" / name
    for key in base:
        for value in ("x", "", [2], {"a": 1}, "nan", 10**30, "a\x00b", None, True):
            raw = copy.deepcopy(base)
            raw[key] = value
            source.write_text(yaml.safe_dump(raw) if name.endswith(".yml") else json.dumps(raw))
            try:
                import_config(source, out=tmp_path / "c.yaml", force=True)
            except BadInput as e:  # BadInputs too
                assert "Traceback" not in str(e)


@pytest.mark.parametrize("text, said", [
    ("learning_rate: x\n", "learning_rate = \"x\": axolotl 0.18.0 takes a number there"),
    ("micro_batch_size: [2]\n", "micro_batch_size = [2]: axolotl 0.18.0 takes a whole number there"),
    ("sequence_len: .nan\n", "sequence_len = NaN: axolotl 0.18.0 takes a whole number there (a finite one)"),
    ("datasets: 3\n", "datasets = 3: axolotl 0.18.0 takes a list of data sets there"),
    ("base_model: [a, b]\n", "base_model = [\"a\", \"b\"]: axolotl 0.18.0 takes text there"),
    ("lora_target_modules: 3\n", "lora_target_modules = 3: axolotl 0.18.0 takes text or a list there"),
])
def test_a_value_of_another_type_names_the_key_and_the_type_axolotl_declares(folder, cli, text, said):
    cfg = dict(BASE, datasets=[{"path": "alpaca.jsonl", "type": "alpaca"}])
    key = text.split(":")[0]
    cfg.pop(key, None)
    (folder / "t.yml").write_text(yaml.safe_dump(cfg) + text)
    r = cli("import", folder / "t.yml", "--out", folder / "t.yaml")
    assert r.code == 2 and said in r.err and f"fix: write {key} as " in r.err, r.err
    assert not (folder / "t.yaml").exists()


def test_numbers_written_as_text_are_read_as_the_tools_read_them(folder):
    """pydantic and HfArgumentParser take "8" and "2e-4"; the import took them too, as numbers."""
    cfg = dict(BASE, datasets=[{"path": "alpaca.jsonl", "type": "alpaca"}], adapter="lora", lora_r="8",
               lora_alpha="16", learning_rate="2e-4", micro_batch_size="2")
    got = carried(import_config(write(folder / "s.yml", cfg), out=folder / "s.yaml"))
    assert got["train.lr"][1] == 2e-4 and got["train.micro_batch"][1] == 2
    assert got["model.adapter.r"][1] == 8 and got["model.adapter.alpha"][1] == 16
    hf = {"per_device_train_batch_size": "4", "learning_rate": "1e-4", "max_steps": "10", "save_steps": None}
    with pytest.raises(BadInput, match=r"save_steps = null: transformers [0-9.]+ .*takes a number there"):
        import_config(write(folder / "h.json", hf), out=folder / "h.yaml")
    got = carried(import_config(write(folder / "h.json", dict(hf, save_steps=5)), out=folder / "h.yaml"))
    assert got["train.micro_batch"][1] == 4 and got["train.lr"][1] == 1e-4 and got["train.updates"][1] == 10


@pytest.mark.parametrize("key, value", [("roles", "x"), ("roles", {"user": True}), ("message_property_mappings", 3),
                                        ("message_property_mappings", ["role", "from"]), ("data_files", 3),
                                        ("data_files", [["a.jsonl"]])])
def test_a_turn_mapping_of_another_shape_is_asked_for(folder, cli, key, value):
    """A chat data set's roles, message_property_mappings or data_files of another shape was exit 3 (AttributeError:
    no .items(); TypeError) in the SFT and the preference importers alike."""
    d = {"path": "sharegpt.jsonl", "type": "chat_template", "field_messages": "conversations", key: value}
    r = cli("import", write(folder / "t.yml", dict(BASE, datasets=[d])), "--out", folder / "t.yaml")
    reads = "a file's path or a list of paths" if key == "data_files" else "a mapping of names"
    assert r.code == 2 and f"datasets[0].{key} = " in r.err and f"Axolotl reads {reads} there" in r.err, r.err
    d[key] = {"message_property_mappings": {"role": "from", "content": "value"}, "roles": {"user": ["human"]},
              "data_files": "sharegpt.jsonl"}[key]
    assert cli("import", write(folder / "t.yml", dict(BASE, datasets=[d])), "--out", folder / "t.yaml").code == 0
