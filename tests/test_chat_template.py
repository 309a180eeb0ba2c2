"""Chat data in the model's own format: the tokenizer's chat template (a real BPE tokenizer with ChatML
special tokens, ../shared/data/tiny_bpe_tokenizer.json), assistant-only loss located in the rendered
text, special tokens as the tokenizer adds them, and inspect failing a format the model never sees."""

import json

import pytest
import yaml
from conftest import SHARED_DATA, TINY_LLAMA, minilm_path, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.errors import BadInput
from pilotrun.tasks import IGNORE, make_task

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _tokenizer(folder, template=CHATML):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  bos_token="<|endoftext|>", eos_token="<|im_end|>", pad_token="<|endoftext|>")
    if template:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return folder


def _campaign(tmp_path, template=CHATML, **data):
    records = json.loads((SHARED_DATA / "chat_tiny.json").read_text())
    write_jsonl(tmp_path / "data" / "train.jsonl", records * 4)
    c = {"name": "chat", "seed": 0, "task": "causal-lm",
         "model": {"config": dict(TINY_LLAMA, vocab_size=2048), "tokenizer": str(_tokenizer(tmp_path / "tok", template))},
         "data": {"train": "data/train.jsonl", "messages": "conversations", "max_length": 128, **data},
         "train": {"micro_batch": 2, "accumulation": 1, "updates": 2, "save_every": None}}
    return write_campaign(tmp_path, c)


def _first(path):
    task = make_task(load_campaign(path))
    return task, task.records("train")[0], task.encode(task.records("train")[0])


def test_conversation_is_rendered_with_the_tokenizers_template(tmp_path):
    task, record, e = _first(_campaign(tmp_path))
    assert task.chat_format == "model"
    msgs = [{"role": {"human": "user", "gpt": "assistant"}.get(m["from"], m["from"]), "content": m["value"]}
            for m in record.fields["conversations"]]
    assert task.tokenizer.decode(e.input_ids) == task.tokenizer.apply_chat_template(msgs, tokenize=False)
    trained = [t for t in e.labels if t != IGNORE]
    assert task.tokenizer.decode(trained) == "The meaning of life is 42.<|im_end|>\nI agree.<|im_end|>\n"
    # the prompt side (system, user turns, role headers) is masked: the first target follows the generation prompt
    prompt = task.tokenizer.decode(e.input_ids[: e.prompt_len])
    assert prompt.endswith("What is the meaning of life?<|im_end|>\n<|im_start|>assistant\n")
    # no BOS: tokenizer("Hello") adds none, so neither does the example (the template starts it)
    assert e.input_ids[0] == task.tokenizer.convert_tokens_to_ids("<|im_start|>")


def test_plain_format_on_a_model_with_a_template_fails_inspect(cli, tmp_path):
    path = _campaign(tmp_path, chat_template="plain")
    r = cli("inspect", path, "--json")
    assert r.code == 1, r.out + r.err
    check = next(c for c in r.json["data"]["checks"] if c["name"] == "chat format")
    assert check["verdict"] == "fail"
    assert check["message"] == ("the tokenizer ships a chat template but the campaign renders conversations as plain "
                                "'role: content' lines: the model would be trained in a format it does not see at "
                                "inference; fix: set data.chat_template: auto (the model's own template), or "
                                "remove the key")


def test_models_template_passes_inspect_and_shows_it(cli, tmp_path):
    path = _campaign(tmp_path)
    r = cli("inspect", path, "--json", "-n", "1")
    assert r.code == 0, r.out + r.err
    check = next(c for c in r.json["data"]["checks"] if c["name"] == "chat format")
    assert check["message"] == "conversations rendered with the tokenizer's own chat template; loss on assistant " \
                               "turns only"
    assert r.json["data"]["examples"][0]["vs_inference"].startswith("starts exactly like the inference prompt")


def test_tokenizer_without_template_trains_plain_or_an_explicit_template(cli, tmp_path):
    path = _campaign(tmp_path, template=None)
    task, _, e = _first(path)
    assert task.chat_format == "plain"
    assert task.tokenizer.decode(e.input_ids).startswith("system: You are an AI assistant.\nuser: ")
    assert cli("inspect", path, "--json").code == 0
    c = yaml.safe_load(path.read_text())
    c["data"]["chat_template"] = "model"
    path.write_text(yaml.safe_dump(c))
    with pytest.raises(BadInput, match="data.chat_template: model, but the tokenizer has no chat template"):
        make_task(load_campaign(path))
    (tmp_path / "fmt.jinja").write_text(CHATML.replace("<|im_start|>", "<|im_start|>#"))
    c["data"]["chat_template"] = "fmt.jinja"
    path.write_text(yaml.safe_dump(c))
    task, _, e = _first(path)
    assert task.chat_format == "explicit"
    assert task.tokenizer.decode(e.input_ids).startswith("<|im_start|>#system\n")
    assert task.tokenizer.decode([t for t in e.labels if t != IGNORE]).startswith("The meaning of life is 42.")


def test_special_tokens_follow_the_tokenizer(tmp_path):
    """A BOS only where tokenizer(text) adds one: none for this BPE tokenizer (like SmolLM2), [CLS] for BERT."""
    from transformers import AutoTokenizer

    from pilotrun.tasks.loading import leading_specials

    bpe = AutoTokenizer.from_pretrained(str(_tokenizer(tmp_path / "tok")))
    assert bpe.bos_token_id is not None and leading_specials(bpe) == []
    bert = AutoTokenizer.from_pretrained(str(minilm_path()))
    assert leading_specials(bert) == [bert.cls_token_id]
    write_jsonl(tmp_path / "p" / "train.jsonl", [{"q": "Hello there", "a": "hi"}] * 4)
    path = write_campaign(tmp_path / "p", {
        "task": "causal-lm", "model": {"config": dict(TINY_LLAMA, vocab_size=2048), "tokenizer": str(tmp_path / "tok")},
        "data": {"train": "train.jsonl", "prompt": "q", "response": "a"}})
    task = make_task(load_campaign(path))
    e = task.encode(task.records("train")[0])
    assert e.input_ids[: e.prompt_len] == bpe("Hello there")["input_ids"]  # no BOS prepended by pilotrun
