"""Prompt and answer mixed up: a prompt field that already holds the answer, a response field that already
holds the prompt (by fields, naming them), and an assistant turn that repeats its user turn (by tokens, chat).
Real Alpaca and chat data pass."""

from __future__ import annotations

import json

import yaml
from conftest import SHARED_DATA, tiny_causal_campaign, write_campaign

from pilotrun.campaign import load_campaign
from pilotrun.data.checks import run_checks
from pilotrun.campaign.prepare import prepare


def _checks(path):
    loaded = load_campaign(path)
    return run_checks(prepare(loaded, splits=()).task, loaded)


def _alpaca(n=40):
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))[:n]
    return [{"instruction": r["instruction"], "output": r["output"]} for r in recs]


def _one(report, name):
    hits = [c for c in report.checks if c.name == name]
    assert len(hits) == 1, [c.line() for c in report.checks]
    return hits[0]


def test_preformatted_text_as_the_prompt_holds_the_answer(tmp_path):
    recs = [dict(r, text=f"### Instruction:\n{r['instruction']}\n\n### Response:\n{r['output']}") for r in _alpaca()]
    path = tiny_causal_campaign(tmp_path, recs, data__prompt="text", data__max_length=1024)
    report = _checks(path)
    assert report.verdict == "fail"
    hit = _one(report, "target-in-prompt")
    assert hit.verdict == "fail" and hit.split == "train"
    n = sum(1 for r in recs if len(r["output"].split()) >= 4)  # a one-word answer inside the text is no evidence
    assert hit.data["count"] == n
    assert f"{n} of {len(recs)} examples ({n / len(recs):.1%}): the trained target already appears in the prompt" \
        in hit.message
    assert "data.response field 'output' = " in hit.message and "is inside prompt field 'text' = " in hit.message
    assert "train.jsonl:" in hit.message  # the example's record


def test_response_that_holds_the_prompt_trains_to_repeat_the_instruction(tmp_path):
    recs = [dict(r, full=f"{r['instruction']}\n{r['output']}") for r in _alpaca()]
    report = _checks(tiny_causal_campaign(tmp_path, recs, data__response="full", data__max_length=1024))
    hit = _one(report, "prompt-in-target")
    assert hit.verdict == "fail"
    n = sum(1 for r in recs if len(r["instruction"].split()) >= 4)
    assert f"{n} of {len(recs)} examples" in hit.message
    assert "the prompt appears inside the trained target: the model is trained to reproduce the instruction" \
        in hit.message
    assert "prompt field 'instruction' = " in hit.message and "is inside data.response field 'full'" in hit.message


def test_a_few_extractive_answers_only_warn(tmp_path):
    recs = _alpaca()
    # 4 of 40 records (10%) quote a sentence of their instruction as the answer: a warning, not a failure
    for r in recs[:4]:
        r["instruction"] = f"Repeat this sentence exactly: the cat sat on the mat {r['instruction']}"
        r["output"] = "the cat sat on the mat"
    hit = _one(_checks(tiny_causal_campaign(tmp_path, recs, data__max_length=1024)), "target-in-prompt")
    assert hit.verdict == "warn" and "4 of 40 examples (10.0%)" in hit.message


def test_chat_assistant_repeating_the_user_turn_by_tokens(tmp_path):
    said = "please summarise the quarterly report for the board meeting tomorrow"
    recs = [{"conversations": [{"role": "user", "content": f"{said} number {i}"},
                               {"role": "assistant", "content": said}]} for i in range(6)]
    path = tiny_causal_campaign(tmp_path, recs, data__prompt=None, data__response=None,
                                data__messages="conversations", data__max_length=256)
    hit = _one(_checks(path), "target-in-prompt")
    assert hit.verdict == "fail" and "6 of 6 examples (100.0%)" in hit.message
    assert "trained tokens occur inside the" in hit.message and "prompt tokens" in hit.message


def test_real_alpaca_and_chat_pass(tmp_path):
    recs = json.loads((SHARED_DATA / "alpaca_tiny.json").read_text(encoding="utf-8"))
    path = tiny_causal_campaign(tmp_path / "a", [], data__max_length=1024)
    c = yaml.safe_load(path.read_text())
    c["data"].update(train=str(SHARED_DATA / "alpaca_tiny.json"), prompt="{instruction}\n{input}\n")
    write_campaign(path.parent, c)
    report = _checks(path)
    assert not [ch.line() for ch in report.checks if ch.name in ("target-in-prompt", "prompt-in-target")]
    assert len(recs) == report.splits["train"]["examples"]
    chat = tiny_causal_campaign(tmp_path / "c", [], data__max_length=256)
    c = yaml.safe_load(chat.read_text())
    c["data"].update(train=str(SHARED_DATA / "chat_tiny.json"), prompt=None, response=None, messages="conversations")
    write_campaign(chat.parent, c)
    assert not [ch.line() for ch in _checks(chat).checks if ch.name in ("target-in-prompt", "prompt-in-target")]
