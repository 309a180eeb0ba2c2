"""leakage's shared prompts: a validation question seen in train with another answer is leakage of the
question, reported apart from whole-record duplicates; it fails from 1% of a split's prompts."""

import json

from conftest import SHARED_DATA, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.rehearsal.data_checks.leakage import leakage


def _campaign(tmp_path, train, validation, **data):
    write_jsonl(tmp_path / "data" / "train.jsonl", train)
    write_jsonl(tmp_path / "data" / "validation.jsonl", validation)
    c = {"name": "qa", "seed": 0, "task": "causal-lm", "model": {"config": {"model_type": "llama"}, "tokenizer": "byte"},
         "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", **data}}
    return load_campaign(write_campaign(tmp_path, c))


def _checks(result):
    return {c["name"]: c for c in result.data["checks"]}


def _pairs():
    """Stack Exchange questions, each with two answers (response_j, response_k)."""
    rows = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text())
    seen, out = set(), []
    for r in rows:
        if r["question"] not in seen:
            seen.add(r["question"])
            out.append(r)
    return out


def test_validation_questions_answered_otherwise_in_train_fail(tmp_path):
    pairs = _pairs()
    train = [{"question": r["question"], "answer": r["response_j"]} for r in pairs]
    # five validation questions asked in train: four with the other answer (one retyped in capitals), one whole
    validation = [{"question": r["question"], "answer": r["response_k"]} for r in pairs[:3]]
    validation.append({"question": pairs[3]["question"].upper() + "  ", "answer": pairs[3]["response_k"]})
    validation.append(dict(train[4]))
    loaded = _campaign(tmp_path, train, validation, prompt="question", response="answer")
    result = leakage(loaded)
    checks = _checks(result)
    assert result.verdict == "fail"
    shared = checks["shared-prompts"]
    assert shared["verdict"] == "fail" and shared["split"] == "validation"
    assert shared["message"].startswith("4 of 5 (80.0%) validation prompts also occur in train with another response "
                                        "(1 more repeat the whole record: exact-duplicates), normalised as for exact "
                                        "duplicates, e.g. ")
    assert "validation.jsonl:1 asks " in shared["message"] and "train.jsonl:1's prompt" in shared["message"]
    assert checks["exact-duplicates"]["message"].startswith("1 of 5 (20.0%) validation units repeat a train unit")


def test_chat_user_turn_seen_in_train_fails(tmp_path):
    """A second instance: conversations whose user turn (the non-target part) repeats across splits."""
    def conv(q, a):
        return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": q},
                             {"role": "assistant", "content": a}]}
    train = [conv(f"What is {i} squared?", f"{i * i}.") for i in range(20)]
    validation = [conv("What is 3 squared?", "Nine, since three times three is nine."),
                  conv("What is 30 squared?", "900.")]
    result = leakage(_campaign(tmp_path, train, validation, messages="messages"))
    shared = _checks(result)["shared-prompts"]
    assert shared["verdict"] == "fail"
    assert shared["message"].startswith("1 of 2 (50.0%) validation prompts also occur in train with another response,")


def test_distinct_prompts_pass_and_a_rare_repeat_warns(tmp_path):
    train = [{"q": f"question number {i}", "a": f"answer {i}"} for i in range(300)]
    validation = [{"q": f"question number {i}", "a": f"answer {i}"} for i in range(1000, 1150)]
    result = leakage(_campaign(tmp_path, train, validation, prompt="q", response="a"))
    assert "shared-prompts" not in _checks(result) and result.verdict == "ok", result.messages
    validation[0] = {"q": "Question number 7!", "a": "something else entirely"}  # 1 of 150: under 1%
    result = leakage(_campaign(tmp_path / "rare", train, validation, prompt="q", response="a"))
    shared = _checks(result)["shared-prompts"]
    assert shared["verdict"] == "warn" and shared["message"].startswith("1 of 150 (0.7%) validation prompts")
