"""The bad-input corpus: every case through the real CLI gives exit 2, a message naming the
file/line/key, no traceback, and leaves no journal row or run folder behind."""

from __future__ import annotations

import json

import pytest
import yaml
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign, write_campaign, write_jsonl


def _base(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))


def _edit(path, fn):
    c = yaml.safe_load(path.read_text())
    fn(c)
    path.write_text(yaml.safe_dump(c, sort_keys=False))


def _set(section, **kv):
    return lambda c: c.setdefault(section, {}).update(kv)


def _write_data(name, content: bytes):
    def apply(tmp_path, path):
        (tmp_path / "data" / name).write_bytes(content)
    return apply


# (id, how to break the campaign (c -> None) or the files ((tmp_path, path) -> None), verb args, expected text)
CONFIG_CASES = [
    ("unknown-top-key", lambda c: c.update(nmae="x"), "did you mean 'name'"),
    ("misspelt-train-key", _set("train", micro_bach=2), "did you mean 'train.micro_batch'"),
    ("misspelt-data-key", _set("data", respones="output"), "did you mean 'data.response'"),
    ("misspelt-model-key", _set("model", tokeniser="byte"), "did you mean 'model.tokenizer'"),
    ("wrong-type-lr", _set("train", lr="fast"), "train.lr"),
    ("wrong-type-bool", _set("train", drop_last="sometimes"), "train.drop_last"),
    ("zero-micro-batch", _set("train", micro_batch=0), "train.micro_batch"),
    ("negative-accumulation", _set("train", accumulation=-2), "train.accumulation"),
    ("zero-max-length", _set("data", max_length=0), "data.max_length"),
    ("negative-lr", _set("train", lr=-1.0), "train.lr"),
    ("bad-precision", _set("train", precision="fp8"), "train.precision"),
    ("bad-schedule", _set("train", schedule="step"), "train.schedule"),
    ("bad-optimizer", _set("train", optimizer="lion"), "train.optimizer"),
    ("bad-dtype", _set("model", dtype="int8"), "model.dtype"),
    ("both-budgets", _set("train", epochs=2, updates=10), "train.updates or train.epochs"),
    ("no-budget", _set("train", updates=None), "no budget"),
    ("nproc-single", _set("train", nproc=2), "train.strategy"),
    ("reserve-out-of-range", _set("hardware", reserve=1.5), "hardware.reserve"),
    ("diverge-factor-low", lambda c: c["train"].update(stop={"diverge_factor": 0.5}), "train.stop.diverge_factor"),
    ("unknown-task", lambda c: c.update(task="translation"), "unknown task"),
    ("custom-task-missing-module", lambda c: c.update(task="no_such_module:Task"), "cannot import 'no_such_module'"),
    ("no-model", lambda c: c.update(model={"tokenizer": "byte"}), "set model.path"),
    ("model-config-no-type", _set("model", config={"hidden_size": 8}), "model_type"),
    ("missing-model-dir", lambda c: c.update(model={"path": "models/none", "tokenizer": "byte"}), "model folder not found"),
    ("missing-tokenizer-dir", _set("model", tokenizer="tok/none"), "tokenizer folder not found"),
    ("no-train-data", _set("data", train=None), "data.train"),
    ("missing-train-file", _set("data", train="data/missing.jsonl"), "data file not found"),
    ("missing-validation-file", _set("data", validation="data/missing.jsonl"), "data file not found"),
    ("unknown-format", _set("data", train="data/train.txt"), "data file not found"),
    ("prompt-field-missing", _set("data", prompt="question"), "no field 'question'"),
    ("response-field-missing", _set("data", response="answer"), "no field 'answer'"),
    ("template-field-missing", _set("data", prompt="Q: {question}\nA: "), "no field 'question'"),
    # data.prompt is rendered with str.format: only {field} and {{ }} are taken (a width padded every prompt to a GB)
    ("template-brace-unpaired", _set("data", prompt="if (x) { return {instruction}"), "its braces do not pair"),
    ("template-width", _set("data", prompt="{instruction:>999999999}"), "the placeholder {instruction:>999999999}"),
    ("template-repr", _set("data", prompt="Q: {instruction!r}"), "converts the field (!r: its repr"),
    ("response-written-as-a-template", _set("data", response="{output}"),
     "fix: write data.response: output (it names a field; data.prompt alone is a template)"),
    ("group-by-missing", _set("data", group_by="conversation"), "no field 'conversation'"),
    ("seq-cls-keys-missing", lambda c: c.update(task="seq-cls"), "data.labels"),
    ("seq-cls-keys-on-causal", _set("data", labels=["a", "b"]), "data.labels is a seq-cls key"),
    # a preference campaign without its task: causal-lm trained on data.response alone, data.chosen read by nothing
    ("preference-keys-on-causal", _set("data", chosen="output"),
     "data.chosen: data.chosen is a preference key; this campaign is causal-lm, which does not read it"),
    ("causal-keys-on-seq-cls", lambda c: (c.update(task="seq-cls"), c["data"].update(text="instruction", label="output",
                                                                                    labels=["a", "b"])),
     "data.response is a causal-lm key; this campaign is seq-cls, which does not read it"),
    ("messages-and-prompt", _set("data", messages="conversations"), "choose one form"),
    ("too-few-examples", _set("train", micro_batch=8, accumulation=4), "fewer than one update"),
    ("bf16-true-with-fp16", lambda c: (c["train"].update(precision="bf16-true"), c["model"].update(dtype="float16")),
     "model.dtype"),
]

FILE_CASES = [
    ("broken-jsonl-line", _write_data("train.jsonl", b'{"instruction": "a", "output": "b"}\n{oops\n'), "train.jsonl:2"),
    ("non-utf8", _write_data("train.jsonl", b'{"instruction": "\xff", "output": "b"}\n'), "not UTF-8"),
    ("empty-file", _write_data("train.jsonl", b""), "no records"),
    ("empty-response", _write_data("train.jsonl", b'{"instruction": "a", "output": ""}\n' * 8), "is empty"),
    ("jsonl-array-line", _write_data("train.jsonl", b'[1]\n'), "not an object"),
    ("jsonl-under-a-json-name", lambda tmp_path, path: (
        _write_data("train.json", b'{"instruction": "a", "output": "b"}\n{"instruction": "c", "output": "d"}\n')(
            tmp_path, path), _edit(path, _set("data", train="data/train.json"))),
     "fix: this reads as JSON Lines (one object per line): name the file train.jsonl"),
    ("broken-yaml", lambda tmp_path, path: path.write_text("name: x\ntrain: [\n"), "invalid YAML"),
    ("yaml-not-mapping", lambda tmp_path, path: path.write_text("- a\n- b\n"), "must be a mapping"),
]


def _no_traces(home):
    assert not (home / "runs").exists(), "a run folder was left behind"
    if (home / "journal.sqlite").exists():
        from pilotrun.journal import Journal

        assert Journal(home).list_runs() == [], "a journal row was left behind"


@pytest.mark.parametrize("case, breaker, expected", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
@pytest.mark.parametrize("verb", ["validate", "train"])
def test_config_case(cli, tmp_path, case, breaker, expected, verb):
    path = _base(tmp_path)
    _edit(path, breaker)
    home = tmp_path / "home"
    r = cli(verb, path, "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert expected in r.err, r.err
    assert "Traceback" not in r.err and "fix" in r.err
    _no_traces(home)


@pytest.mark.parametrize("case, breaker, expected", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_file_case(cli, tmp_path, case, breaker, expected):
    path = _base(tmp_path)
    breaker(tmp_path, path)
    home = tmp_path / "home"
    r = cli("train", path, "--home", home)
    assert r.code == 2, (r.code, r.err)
    assert expected in r.err and "Traceback" not in r.err
    _no_traces(home)


def test_set_unknown_key(cli, tmp_path):
    r = cli("train", _base(tmp_path), "--set", "train.lrate=1", "--home", tmp_path / "home")
    assert r.code == 2 and "unknown key 'train.lrate'" in r.err
    _no_traces(tmp_path / "home")


def test_unknown_run_id(cli, tmp_path):
    from pilotrun.journal import Journal

    Journal(tmp_path / "home")
    for verb in (("show", "nope"), ("verify", "nope"), ("archive", "nope", "--out", tmp_path / "x.tar.gz")):
        r = cli(*verb, "--home", tmp_path / "home")
        assert r.code == 2 and "nope" in r.err and "Traceback" not in r.err, (verb, r.err)


def test_model_dir_without_weights(cli, tmp_path):
    path = _base(tmp_path)
    (tmp_path / "m").mkdir()
    cfg = dict(TINY_LLAMA)
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    _edit(path, lambda c: c.update(model={"path": "m", "tokenizer": "byte"}))
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "no weights" in r.err
    _no_traces(tmp_path / "home")


def test_tokenizer_larger_than_vocabulary(cli, tmp_path):
    path = _base(tmp_path)
    _edit(path, lambda c: c["model"]["config"].update(vocab_size=100))
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "384 tokens but the model's embedding has 100 rows" in r.err
    _no_traces(tmp_path / "home")


def test_seq_cls_label_outside_labels(cli, tmp_path):
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"text": "a", "label": "x"}, {"text": "b", "label": "zzz"}] * 4)
    path = write_campaign(tmp_path, {
        "task": "seq-cls", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "text": "text", "label": "label", "labels": ["x", "y"]},
        "train": {"micro_batch": 2, "accumulation": 1, "updates": 1}})
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "'zzz' is not in data.labels" in r.err and "train.jsonl:2" in r.err
    _no_traces(tmp_path / "home")


def test_csv_missing_column(cli, tmp_path):
    path = _base(tmp_path)
    (tmp_path / "data" / "train.csv").write_text("instruction,output\na,b\nc\n")
    _edit(path, _set("data", train="data/train.csv"))
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "train.csv:3" in r.err
    _no_traces(tmp_path / "home")


def test_corpus_size():
    assert len(CONFIG_CASES) + len(FILE_CASES) + 6 >= 40
