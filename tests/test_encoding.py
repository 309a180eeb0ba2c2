"""What the loss sees: prompt and padding masked, EOS trained (even when pad == eos), chat, seq-cls ids."""

import json

import pytest
import yaml
from conftest import SHARED_DATA, TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.tasks import IGNORE, make_task


@pytest.fixture
def bpe_tokenizer_dir(tmp_path):
    """The shared trained BPE tokenizer (no pad token), given an EOS and saved like a real model's."""
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token="<|endoftext|>")
    assert tok.pad_token is None
    out = tmp_path / "bpe"
    tok.save_pretrained(out)
    return out


def _task(path):
    loaded = load_campaign(path)
    return make_task(loaded)


def test_prompt_and_padding_masked(tmp_path):
    path = tiny_causal_campaign(tmp_path, [{"instruction": "reverse abc", "output": "cba"},
                                           {"instruction": "hi", "output": "a much longer answer"}])
    task = _task(path)
    recs = task.records("train")
    ex = [task.encode(r) for r in recs]
    prompt_len = len(task.tokenizer("reverse abc", add_special_tokens=False)["input_ids"])
    assert ex[0].labels[:prompt_len] == [IGNORE] * prompt_len
    assert ex[0].labels[prompt_len:] == ex[0].input_ids[prompt_len:]
    assert ex[0].prompt_len == prompt_len
    batch = task.collate(ex)
    pad_positions = batch["attention_mask"] == 0
    assert pad_positions.any()
    assert (batch["labels"][pad_positions] == IGNORE).all()
    assert task.tokenizer.decode([t for t in ex[0].labels if t != IGNORE]) == "cba</s>"


def test_eos_trained_when_pad_is_eos(tmp_path, bpe_tokenizer_dir):
    """The BPE tokenizer sets no pad: pilotrun pads with EOS, and the response's EOS stays a target."""
    path = tiny_causal_campaign(tmp_path, [{"instruction": "Say hi", "output": "hi"},
                                           {"instruction": "Say a long thing", "output": "a long thing indeed"}],
                                model__tokenizer=str(bpe_tokenizer_dir))
    c = yaml.safe_load(path.read_text())
    c["model"]["config"]["vocab_size"] = 2048
    write_campaign(tmp_path, c)
    task = _task(path)
    assert task.pad == task.eos
    ex = [task.encode(r) for r in task.records("train")]
    batch = task.collate(ex)
    short = 0
    n = ex[short].length
    assert batch["labels"][short, n - 1] == task.eos  # EOS at the end of the response is trained
    assert batch["input_ids"][short, n:].eq(task.eos).all()  # padding uses the same id ...
    assert batch["labels"][short, n:].eq(IGNORE).all()  # ... but is masked by position
    assert task.count_targets(batch) == sum(e.n_targets for e in ex)


def test_truncation_from_the_right(tmp_path):
    path = tiny_causal_campaign(tmp_path, [{"instruction": "x" * 10, "output": "y" * 100}], data__max_length=32)
    task = _task(path)
    e = task.encode(task.records("train")[0])
    assert e.length == 32 and e.target_len_full == 101 and e.n_targets == 22


def test_chat_loss_only_on_assistant_turns(tmp_path):
    convs = json.loads((SHARED_DATA / "chat_tiny.json").read_text())
    write_jsonl(tmp_path / "data" / "train.jsonl", convs)
    c = {"name": "chat", "task": "causal-lm", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
         "data": {"train": "data/train.jsonl", "messages": "conversations", "max_length": 4096},
         "train": {"micro_batch": 1, "accumulation": 1, "updates": 1}}
    path = write_campaign(tmp_path, c)
    task = _task(path)
    for rec in task.records("train"):
        e = task.encode(rec)
        trained = task.tokenizer.decode([t for t in e.labels if t != IGNORE])
        msgs = rec.fields["conversations"]
        assistant = [m["value"] for m in msgs if m["from"] == "gpt"]
        others = [m["value"] for m in msgs if m["from"] != "gpt"]
        assert trained == "".join(a + "</s>" for a in assistant)
        for o in others:
            assert o not in trained


def test_empty_response_is_bad_input(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(3) + [{"instruction": "x", "output": "  "}])
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2
    assert "train.jsonl:4" in r.err and "is empty" in r.err
    assert not (tmp_path / "home" / "journal.sqlite").exists()


def _seq_cls_campaign(tmp_path, labels, records, model=None):
    write_jsonl(tmp_path / "data" / "train.jsonl", records)
    c = {"name": "cls", "task": "seq-cls",
         "model": model or {"config": {**TINY_LLAMA}, "tokenizer": "byte"},
         "data": {"train": "data/train.jsonl", "text": "text", "label": "label", "labels": labels, "max_length": 64},
         "train": {"micro_batch": 2, "accumulation": 1, "updates": 1}}
    return write_campaign(tmp_path, c)


def test_seq_cls_label_order(tmp_path):
    recs = [{"text": "great", "label": "positive"}, {"text": "bad", "label": "negative"},
            {"text": "meh", "label": "neutral"}, {"text": "ok", "label": 2}]
    path = _seq_cls_campaign(tmp_path, ["negative", "neutral", "positive"], recs)
    task = _task(path)
    ids = [task.encode(r).labels for r in task.records("train")]
    assert ids == [[2], [0], [1], [2]]
    model = task.build_model()
    assert model.config.id2label == {0: "negative", 1: "neutral", 2: "positive"}
    assert model.config.label2id == {"negative": 0, "neutral": 1, "positive": 2}


def test_seq_cls_unknown_label_is_bad_input(tmp_path):
    from pilotrun.errors import BadInput

    path = _seq_cls_campaign(tmp_path, ["neg", "pos"], [{"text": "x", "label": "pos"}, {"text": "y", "label": "maybe"}])
    task = _task(path)
    with pytest.raises(BadInput, match=r"train.jsonl:2.*'maybe' is not in data.labels"):
        [task.encode(r) for r in task.records("train")]


def test_model_from_local_folder(tmp_path):
    """model.path through from_pretrained, local only; pickle-only folders are refused."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from pilotrun.errors import BadInput

    cfg = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    model.save_pretrained(tmp_path / "m")
    path = tiny_causal_campaign(tmp_path, simple_records(4))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": "m", "tokenizer": "byte"}
    write_campaign(tmp_path, c)
    task = _task(path)
    loaded = task.build_model()
    assert sum(p.numel() for p in loaded.parameters()) == sum(p.numel() for p in model.parameters())
    (tmp_path / "m" / "model.safetensors").rename(tmp_path / "m" / "pytorch_model.bin")
    with pytest.raises(BadInput, match="pickle-based weights"):
        _task(path).build_model()


def test_lora_adapter(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(4),
                                model__adapter={"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    model = _task(path).build_model()
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora" in n for n in trainable)


def test_a_tokenizer_file_as_model_tokenizer_is_named_with_the_folder_to_name(cli, tmp_path, bpe_tokenizer_dir):
    """model.tokenizer naming a file was "tokenizer folder not found" of a file that is there: the shared BPE
    tokenizer saved alone (tokenizers' Tokenizer.save) is named with where to put it, a saved folder's own file
    with its folder."""
    for tok, said, fix in [
        (SHARED_DATA / "tiny_bpe_tokenizer.json", "tiny_bpe_tokenizer.json is a file, not a tokenizer folder",
         "is read from a folder holding it as tokenizer.json"),
        (bpe_tokenizer_dir / "tokenizer.json", f"is a file of the tokenizer folder {bpe_tokenizer_dir}, not the "
         "folder", f"fix: set model.tokenizer to the folder: {bpe_tokenizer_dir}"),
        (bpe_tokenizer_dir / "tokenizer_config.json", "is a file of the tokenizer folder", f"{bpe_tokenizer_dir}"),
    ]:
        path = tiny_causal_campaign(tmp_path / "c", simple_records(8), model__tokenizer=str(tok))
        for verb in ("validate", "inspect"):
            r = cli(verb, path)
            err = " ".join(r.err.split())
            assert r.code == 2 and f"model.tokenizer: {tok}" in err and said in err and fix in err, (verb, err)
