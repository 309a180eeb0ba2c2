"""inspect on plain prompt/response: a warning when the model ships a chat template (fix: data.messages,
or data.chat_template: model, which renders each pair as a user and an assistant turn), and when the
prompt's last word runs into the response's first."""

import json

from conftest import SHARED_DATA, TINY_LLAMA, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.tasks import IGNORE, make_task

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
ZEPHYR = ("{% for m in messages %}<|endoftext|>{{ '<' + m['role'] + '>' }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|endoftext|><assistant>\n{% endif %}")


def _pairs(n=6):
    rows = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text())
    distinct = list({r["question"]: r for r in rows}.values())  # each question once (the data pairs answers)
    return [{"question": r["question"].split("\n")[0][:120], "answer": r["response_j"].split("\n")[0][:80]}
            for r in distinct[:n]]


def _campaign(tmp_path, template=CHATML, records=None, **data):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if template:
        tok.chat_template = template
    tok.save_pretrained(tmp_path / "tok")
    write_jsonl(tmp_path / "data" / "train.jsonl", records or _pairs())
    c = {"name": "qa", "seed": 0, "task": "causal-lm",
         "model": {"config": dict(TINY_LLAMA, vocab_size=2048), "tokenizer": str(tmp_path / "tok")},
         "data": {"train": "data/train.jsonl", "prompt": "{question}\n\n", "response": "answer", "max_length": 128,
                  **data}}
    return write_campaign(tmp_path, c)


def _check(r, name):
    return next((c for c in r.json["data"]["checks"] if c["name"] == name), None)


def test_plain_pairs_on_a_model_with_a_chat_template_warn(cli, tmp_path):
    for k, template in enumerate((CHATML, ZEPHYR)):
        r = cli("inspect", _campaign(tmp_path / str(k), template), "--json")
        assert r.code == 0, r.out + r.err
        check = _check(r, "prompt format")
        assert check["verdict"] == "warn" and r.json["verdict"] == "warn"
        assert check["message"] == (
            "the tokenizer ships a chat template but the campaign trains plain prompt + response text (data.prompt / "
            "data.response): the model would be trained in a format it does not see at inference; fix: give the "
            "records as conversations (data.messages), or set data.chat_template: model to render each prompt and "
            "response as a user and an assistant turn of the model's template")


def test_chat_template_model_renders_each_pair_as_two_turns(cli, tmp_path):
    path = _campaign(tmp_path, chat_template="model")
    r = cli("inspect", path, "--json", "-n", "1")
    assert r.code == 0, r.out + r.err
    assert _check(r, "prompt format") is None and r.json["verdict"] == "ok"
    task = make_task(load_campaign(path))
    record = task.records("train")[0]
    e = task.encode(record)
    text = task.tokenizer.decode(e.input_ids)
    assert text.startswith("<|im_start|>user\nI'm writing a code using Java Swing")
    assert task.tokenizer.decode([t for t in e.labels if t != IGNORE]) == \
        record.fields["answer"] + "<|im_end|>\n"
    assert task.inference_prompt(record) == e.input_ids[: e.prompt_len]  # inference sees the template's prompt
    assert r.json["data"]["examples"][0]["vs_inference"].startswith("starts exactly like the inference prompt")


def test_no_template_and_a_separator_pass(cli, tmp_path):
    r = cli("inspect", _campaign(tmp_path, template=None), "--json")
    assert r.code == 0 and r.json["verdict"] == "ok", r.out


def test_prompt_running_into_its_response_warns(cli, tmp_path):
    """The found case: the question's last word runs into the answer's first (…'what' + 'The code…')."""
    records = [{"question": "I can't find what", "answer": "The code you are showing attaches listeners."},
               {"question": "How do I sort a list?", "answer": "Use sorted()."}]
    r = cli("inspect", _campaign(tmp_path, template=None, records=records, prompt="question"), "--json")
    check = _check(r, "prompt separator")
    assert check["verdict"] == "warn", r.out
    assert check["message"].startswith("1 of 2 train records' prompt and response meet with no separator: the "
                                       "prompt's last word and the response's first run into one, e.g. ")
    assert "…\"I can't find what\" + 'The code you are showing'…" in check["message"]
    assert "fix: end data.prompt with a separator" in check["message"]
    # a second instance: a prompt template whose last field runs into the response
    r = cli("inspect", _campaign(tmp_path / "t", template=None, records=records, prompt="Question: {question}"),
            "--json")
    assert _check(r, "prompt separator")["verdict"] == "warn"
