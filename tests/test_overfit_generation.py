"""overfit's generation check: greedy generation is asked for the first answer through the end id that
stops it (the tokenizer's EOS and every generation_config end id), not the newline a template trains
after it; a prompt format generation does not see, and a target that never ends, still fail."""

import json

import pytest
from conftest import SHARED_DATA, TINY_LLAMA, simple_records, smollm2_folder, write_campaign, write_jsonl

from pilotrun.tasks.causal_lm import CausalLMTask

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Llama-3's shape: the header closed by a marker and a blank line, the turn closed by an end-of-turn id that is
# not the tokenizer's EOS (<|endoftext|> here) and nothing after it; generation_config lists both as ends
LLAMA3 = ("{% for m in messages %}<|im_start|>{{ m['role'] }}<|endoftext|>\n\n{{ m['content'] }}<|im_end|>"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant<|endoftext|>\n\n{% endif %}")
EOT, EOS = 2002, 2000  # <|im_end|>, <|endoftext|> in ../shared/data/tiny_bpe_tokenizer.json


def _tokenizer(folder, template, eos="<|im_end|>", **special):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token=eos, pad_token="<|endoftext|>", **special)
    if template:
        tok.chat_template = template
    tok.save_pretrained(folder)
    return str(folder)


def _chat_campaign(tmp_path, template, eos="<|im_end|>", config=None, **train):
    records = json.loads((SHARED_DATA / "chat_tiny.json").read_text())
    second = [{"from": "human", "value": "Name a prime."}, {"from": "gpt", "value": "Seven is prime."}]
    write_jsonl(tmp_path / "data" / "train.jsonl", records + [{"conversations": second}])
    c = {"name": "chat", "seed": 0, "task": "causal-lm",
         "model": {"config": config or dict(TINY_LLAMA, vocab_size=2048),
                   "tokenizer": _tokenizer(tmp_path / "tok", template, eos)},
         "data": {"train": "data/train.jsonl", "messages": "conversations", "max_length": 128},
         "train": {"micro_batch": 2, "accumulation": 1, "lr": 1e-3, "updates": 2, "save_every": None, **train}}
    return write_campaign(tmp_path, c)


def _overfit(cli, path, tmp_path, *more):
    return cli("overfit", path, "--home", tmp_path / "home", "--examples", "2", "--max-updates", "60", "--json", *more)


def test_chatml_turn_end_and_its_newline_memorised(cli, tmp_path):
    """The found case: ChatML trains "<|im_end|>\\n"; generation stops at <|im_end|> and is not asked for the \\n."""
    r = _overfit(cli, _chat_campaign(tmp_path, CHATML), tmp_path)
    assert r.code == 0, r.out + r.err
    assert "greedy generation reproduces 2 of 2 examples" in "\n".join(r.json["messages"])


def test_end_of_turn_listed_only_in_generation_config(cli, tmp_path):
    """A second template: turns end in an id that generation_config lists as an end, not the tokenizer's EOS."""
    config = dict(TINY_LLAMA, vocab_size=2048, eos_token_id=[EOS, EOT])
    r = _overfit(cli, _chat_campaign(tmp_path, LLAMA3, eos="<|endoftext|>", config=config), tmp_path)
    assert r.code == 0, r.out + r.err
    assert "greedy generation reproduces 2 of 2 examples" in "\n".join(r.json["messages"])


def test_turn_end_that_nothing_stops_at_fails(cli, tmp_path):
    """The same template where no end id closes a turn (generation_config names only the EOS): generation never stops."""
    config = dict(TINY_LLAMA, vocab_size=2048, eos_token_id=EOS)
    r = _overfit(cli, _chat_campaign(tmp_path, LLAMA3, eos="<|endoftext|>", config=config), tmp_path)
    assert r.code == 1, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert r.json["summary"] == "generation never stops"
    assert "reproduced by greedy generation) ends without an end id ('<|endoftext|>' (2000)), so generation never " \
           "stops" in text
    assert r.json["data"]["updates"] < 60  # memorised and diagnosed: no more updates mend a missing end id


class NoEOSTask(CausalLMTask):
    """The planted defect: the response is encoded without its EOS."""

    def encode(self, record):
        e = super().encode(record)
        if e.input_ids[-1] == self.eos:
            e.input_ids, e.labels = e.input_ids[:-1], e.labels[:-1]
            e.target_len_full -= 1
        return e


class TrainedWithHeaderTask(CausalLMTask):
    """The planted defect: batches carry a header the examples (and so generation) do not: a prompt format
    that training sees and generation does not."""

    def collate(self, examples):
        import torch

        batch = super().collate(examples)
        head = torch.tensor(self._tok("### System: answer in reverse\n"))
        n = batch["input_ids"].size(0)
        batch["input_ids"] = torch.cat([head.expand(n, -1), batch["input_ids"]], 1)
        batch["attention_mask"] = torch.cat([torch.ones(n, len(head), dtype=torch.long), batch["attention_mask"]], 1)
        batch["labels"] = torch.cat([torch.full((n, len(head)), -100), batch["labels"]], 1)
        return batch


def _plain_campaign(tmp_path, **model):
    write_jsonl(tmp_path / "data" / "train.jsonl", simple_records(8))
    c = {"name": "plain", "seed": 0, "task": "causal-lm",
         "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte", **model},
         "data": {"train": "data/train.jsonl", "prompt": "instruction", "response": "output", "max_length": 64},
         "train": {"micro_batch": 2, "accumulation": 1, "lr": 1e-3, "updates": 2, "save_every": None}}
    return write_campaign(tmp_path, c)


def test_plain_response_without_eos_fails(cli, tmp_path):
    r = _overfit(cli, _plain_campaign(tmp_path), tmp_path, "--set", "task=test_overfit_generation:NoEOSTask")
    assert r.code == 1, r.out + r.err
    assert "ends without an end id ('</s>' (1), '<unk>' (2)), so generation never stops: the response needs the EOS" in \
        "\n".join(r.json["messages"])


def test_prompt_format_generation_does_not_see_fails(cli, tmp_path):
    r = _overfit(cli, _plain_campaign(tmp_path), tmp_path, "--set", "task=test_overfit_generation:TrainedWithHeaderTask")
    assert r.code == 1, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert r.json["summary"] == "greedy generation differs from what training taught"
    assert "teacher forcing reproduces every target but greedy generation of " in text
    assert "differs from its target at token " in text and " where the target has " in text
    assert "generation does not see what training saw" in text


def test_eos_that_is_also_unk_and_pad_memorised(cli, tmp_path):
    """A GPT-2-style tokenizer: one <|endoftext|> is EOS, unk and pad; plain prompt/response."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token="<|endoftext|>", unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    assert tok.eos_token_id == tok.unk_token_id == tok.pad_token_id
    tok.save_pretrained(tmp_path / "tok")
    path = _plain_campaign(tmp_path, tokenizer=str(tmp_path / "tok"), config=dict(TINY_LLAMA, vocab_size=2048))
    r = _overfit(cli, path, tmp_path)
    assert r.code == 0, r.out + r.err
    assert "greedy generation reproduces 2 of 2 examples" in "\n".join(r.json["messages"])


@pytest.mark.slow  # a 135M model on 2 cores: about 4 min, most of it the GGUF conversion and two model builds
def test_real_instruct_model_memorises_a_stack_exchange_answer_in_its_template(cli, tmp_path):
    """SmolLM2-135M-Instruct, its own ChatML template (a default system turn), one Stack Exchange answer."""
    pair = json.loads((SHARED_DATA / "stack_exchange_paired_tiny.json").read_text())[0]
    turn = [{"role": "user", "content": pair["question"].split("\n")[0][:160]},
            {"role": "assistant", "content": pair["response_j"].split("\n")[0][:100]}]
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"messages": turn}])
    c = {"name": "smollm2", "seed": 0, "task": "causal-lm", "model": {"path": str(smollm2_folder(tmp_path / "m"))},
         "data": {"train": "data/train.jsonl", "messages": "messages", "max_length": 128},
         "train": {"micro_batch": 1, "accumulation": 1, "lr": 1e-4, "updates": 2, "save_every": None}}
    r = cli("overfit", write_campaign(tmp_path, c), "--home", tmp_path / "home", "--examples", "1",
            "--max-updates", "40", "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["data"]["checks"]["generated"] == 1 and not r.json["data"]["checks"]["generation_wrong"]
    assert "greedy generation reproduces 1 of 1 examples" in "\n".join(r.json["messages"])


def test_examples_generated_together_give_what_each_gives_alone():
    """The check generates its examples in one batch, prompts of different lengths padded on the left and masked:
    each must get the tokens greedy generation gives it alone (pads left unmasked, or padded on the right, change
    the shorter prompts' tokens). Each target is what its prompt generates alone on a random tiny Llama, cut by
    data.max_length (so generation is not asked to stop)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pilotrun.rehearsal.mechanics.overfit import _generation_check
    from pilotrun.tasks.base import IGNORE, Example

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**dict(TINY_LLAMA, eos_token_id=1, pad_token_id=0))).eval()

    class Task:
        pad, eos, tokenizer = 0, 1, None

    examples = []
    for i, prompt in enumerate(([5, 9, 17], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49], [7, 8, 9, 10, 11, 12])):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            alone = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                   do_sample=False, eos_token_id=[1], pad_token_id=0)[0, len(prompt):].tolist()
        examples.append(Example(prompt + alone, [IGNORE] * len(prompt) + alone, f"r{i}", prompt_len=len(prompt),
                                target_len_full=len(alone) + 1))
    wrong, done = _generation_check(Task(), model, examples, torch.device("cpu"))
    assert done == 3 and wrong == [], [w["message"] for w in wrong]
