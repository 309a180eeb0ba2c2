"""Published configs, byte for byte from the tools' own example folders (tests/published_configs/, each with its
repository, commit and path in SOURCES.tsv): every one imports or is refused by a rule the README states, and
`estimate` runs on each imported one from a cache holding its base model's config.json alone.

A config is imported twice: as it is, in a folder of its own (its hub data sets are then refused by the README's
hub-data-set rule), and beside local folders named as its data sets (Axolotl and TRL read a local folder of that
name first), holding records of the shape its data set type declares. SOURCES.tsv says what each must give.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import SHARED_DATA, write_jsonl
from hubcache import config_json_only

from pilotrun.campaign.importers import import_config
from pilotrun.campaign.load import load_campaign
from pilotrun.errors import BadInput, BadInputs

CORPUS = Path(__file__).parent / "published_configs"
README = Path(__file__).parents[1] / "README.md"
ROWS = [r for r in csv.reader((CORPUS / "SOURCES.tsv").read_text(encoding="utf-8").splitlines(), delimiter="\t")
        if r and not r[0].startswith("#")]
# each rule of the README's formats table, by the words its message carries (the README states them too)
RULES = {
    "hub-data-set": "is a hub data set",
    "preference": "is a preference method pilotrun does not rehearse",
    "online-rl": "is online reinforcement learning",
    "reward-model": "trains a reward model",
    "multimodal": "a multimodal model",
    "typo": "did you mean",
    "several-data-sets": "a campaign trains on one file",
    "data-set-type": "does not say which fields are the prompt and the response",
    "accelerate": "an accelerate launch config",
    "axolotl-cloud": "an Axolotl cloud config",
    "llama-factory": "a LLaMA-Factory config",
    "torchtune": "a torchtune recipe config",
}
# a tiny config of each family the corpus's base models belong to: the estimate's config.json (no tokenizer)
COMMON = {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 1 << 17,
          "eos_token_id": 2, "bos_token_id": 1}
FAMILIES = {
    "llama": {}, "qwen2": {}, "qwen3": {}, "mistral": {}, "phi3": {"num_key_value_heads": 4, "pad_token_id": 0},
    "gemma2": {}, "gemma3_text": {"sliding_window": 64},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 64},
    "deepseek_v2": {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "kv_lora_rank": 16,
                    "q_lora_rank": None, "qk_rope_head_dim": 8, "v_head_dim": 16, "qk_nope_head_dim": 8,
                    "first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1},
    "falcon": {"new_decoder_architecture": True, "num_kv_heads": 2, "alibi": False, "head_dim": None},
}
# what the estimator cannot do yet for a family of the corpus, found by it: strict, so a fix shows
KNOWN = {
    "axolotl/deepseek-v2--qlora-fsdp-2_5.yaml": "DeepSeek-V2's builder converts a module to float32 after building, "
                                                "which fake tensors cannot do",
}
# configs whose estimate finds that they cannot run on this stack: exit 2 naming the key and the cause (peft 0.21
# wraps Mixtral's fused expert parameters, which transformers 5 holds as 3-D tensors, when all-linear is targeted,
# and refuses a LoRA dropout on them: Axolotl's run of the same config on this stack would stop there too)
REFUSED_BY_THE_STACK = {"axolotl/mistral--mixtral--mixtral-qlora-fsdp.yml": "does not work with lora_dropout != 0"}


def family_config(family: str) -> dict:
    return {k: v for k, v in dict(COMMON, model_type=family, **FAMILIES[family]).items() if v is not None}


def rule_of(error: BadInput) -> list[str]:
    problems = error.problems if isinstance(error, BadInputs) else [error]
    return sorted({rule for p in problems for rule, words in RULES.items() if words in str(p)})


def records(kind) -> list[dict]:
    alpaca = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))[:40]
    return [{k: r[k] for k in ("instruction", "input", "output")} for r in alpaca]


def pairs(d: dict) -> list[dict]:
    """Preference records of the shape an Axolotl DPO/ORPO data set declares, from real Stack Exchange pairs
    (response_j the better answer, response_k the worse)."""
    se = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text(encoding="utf-8"))
    kind = str(d.get("type"))
    if kind in ("chat_template.default", "chat_template"):
        field = d.get("field_messages") or "messages"
        return [{field: [{"role": "user", "content": r["question"][:300]}],
                 d.get("field_chosen") or "chosen": {"role": "assistant", "content": r["response_j"][:300]},
                 d.get("field_rejected") or "rejected": {"role": "assistant", "content": r["response_k"][:300]}}
                for r in se]
    return [{k: [{"role": "user", "content": r["question"][:300]}, {"role": "assistant", "content": r[f][:300]}]
             for k, f in (("chosen", "response_j"), ("rejected", "response_k"))} for r in se]


def shaped(d: dict, group: str, rl: str | None = None) -> list[dict]:
    """Records of the shape an Axolotl data set declares (its type's fields), from real Alpaca records (preference
    pairs from real Stack Exchange pairs)."""
    if rl in ("dpo", "ipo", "orpo", "simpo"):
        return pairs(d)
    base = records(d.get("type"))
    kind = d.get("type")
    if group == "pretraining_dataset" or kind in ("completion", "pretrain"):
        field = d.get("text_column") or d.get("field") or "text"
        return [{field: f"{r['instruction']} {r['output']}"} for r in base]
    if isinstance(kind, str) and kind.split(".")[0].split(":")[0] in ("chat_template", "sharegpt"):
        props = d.get("message_property_mappings") or {}
        role, content = props.get("role", "role"), props.get("content", "content")
        user, assistant = ("human", "gpt") if role == "from" else ("user", "assistant")
        field = d.get("field_messages") or ("conversations" if kind.startswith("sharegpt") else "messages")
        return [{field: [{role: user, content: r["instruction"]}, {role: assistant, content: r["output"]}]}
                for r in base]
    return base


def lay_out_data(cfg: dict, folder: Path) -> None:
    """A local folder (or file) at each data set's path, as Axolotl and TRL read a local path before a hub id."""
    if "dataset_name" in cfg:  # a TRL CLI file: plain text records
        write_jsonl(folder / str(cfg["dataset_name"]) / "train.jsonl",
                    [{"text": f"{r['instruction']} {r['output']}", "label": 1} for r in records(None)])
        return
    for group in ("datasets", "test_datasets", "pretraining_dataset"):
        for d in cfg.get(group) or []:
            d = d if isinstance(d, dict) else {"path": d}
            path = str(d.get("path") or "")
            if not path or "://" in path:
                continue
            files = d.get("data_files")
            files = [files] if isinstance(files, str) else list(files or [])
            name = Path(files[0]).name if len(files) == 1 else ("test.jsonl" if group == "test_datasets" else
                                                                 "train.jsonl")
            target = folder / path if not Path(path).suffix else folder / path
            if Path(path).suffix in (".jsonl", ".json"):
                write_jsonl(target, shaped(d, group, cfg.get("rl")))
            else:
                write_jsonl(target / name, shaped(d, group, cfg.get("rl")))


def import_case(row: list[str], tmp_path: Path, with_data: bool):
    name = row[0]
    folder = tmp_path / ("data" if with_data else "bare")
    folder.mkdir(parents=True, exist_ok=True)
    src = folder / Path(name).name
    shutil.copyfile(CORPUS / name, src)
    if with_data:
        lay_out_data(yaml.safe_load(src.read_text(encoding="utf-8")) or {}, folder)
    try:
        return import_config(src, out=folder / "campaign.yaml"), None
    except BadInput as e:
        return None, e


def test_the_corpus_is_what_sources_says():
    files = sorted(str(p.relative_to(CORPUS)) for p in CORPUS.rglob("*") if p.is_file() and p.name != "SOURCES.tsv")
    assert files == sorted(r[0] for r in ROWS) and len(ROWS) >= 40
    for name, repo, commit, path, expect, _ in ROWS:
        assert len(commit) == 40 and repo.count("/") == 1 and path.endswith((".yml", ".yaml", ".json"))
        assert expect == "import" or expect.removeprefix("refused:") in RULES
    readme = " ".join(README.read_text(encoding="utf-8").split())  # the words across line breaks
    assert all(words in readme for words in RULES.values()), [r for r, w in RULES.items() if w not in readme]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_published_config_imports_or_is_refused_by_a_readme_rule(row, tmp_path, cache):
    name, expect, family = row[0], row[4], row[5]
    # as published, alone in a folder: imported, or refused by a rule (its hub data sets: the hub-data-set rule)
    imp, err = import_case(row, tmp_path, with_data=False)
    if err is not None:
        assert rule_of(err), f"{name}: refused by no README rule: {err}"
        if expect != "import":
            assert expect.removeprefix("refused:") in rule_of(err) or "hub-data-set" in rule_of(err), (name, str(err))
        assert not (tmp_path / "bare" / "campaign.yaml").exists()
    # beside local copies of its data sets: what SOURCES.tsv says
    imp, err = import_case(row, tmp_path, with_data=True)
    if expect != "import":
        assert err is not None and rule_of(err) == [expect.removeprefix("refused:")], (name, str(err))
        return
    assert err is None, f"{name}: {err}"
    # validate from the base model's config.json alone (no tokenizer, no weights)
    config_json_only(cache, imp.campaign["model"]["path"].split("@")[0], family_config(family))
    loaded = load_campaign(imp.out, dict(s.split("=", 1) for s in _sets(imp)))
    from pilotrun.campaign.consistency import check_campaign

    check_campaign(loaded)


def _sets(imp) -> list[str]:
    """What the import left to set, set as the user would: a validation file (the training one), a learning rate."""
    sets = []
    if not imp.campaign["data"].get("validation"):
        sets.append(f"data.validation={imp.out.parent / imp.campaign['data']['train']}")
    if "train.lr" in imp.to_set:
        sets.append("train.lr=0.0001")
    return sets


@pytest.mark.slow
@pytest.mark.parametrize("row", [pytest.param(r, marks=[pytest.mark.xfail(strict=True, reason=KNOWN[r[0]])] if r[0] in KNOWN
                                              else []) for r in ROWS if r[4] == "import"],
                         ids=[r[0] for r in ROWS if r[4] == "import"])
def test_estimate_runs_on_each_imported_config_from_config_json_alone(row, tmp_path, cache, cli):
    imp, err = import_case(row, tmp_path, with_data=True)
    assert err is None, str(err)
    family = row[5]
    config_json_only(cache, imp.campaign["model"]["path"].split("@")[0], family_config(family))
    sets = [a for s in _sets(imp) for a in ("--set", s)]
    r = cli("estimate", imp.out, *sets, "--json", "--home", tmp_path / "home")
    if row[0] in REFUSED_BY_THE_STACK:
        assert r.code == 2 and "model.adapter.target_modules" in r.err and REFUSED_BY_THE_STACK[row[0]] in r.err
        return
    assert r.code in (0, 1), r.err  # 1: over the card's memory, a verdict
    res = r.json["stages"][0]
    assert any(m.startswith("sequence shapes: data.max_length") for m in res["messages"])
    assert {row["phase"] for row in res["data"]["phases"]} >= {"load", "first_step", "steady_step", "eval_longest"}
