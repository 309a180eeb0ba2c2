"""seq-cls labels written two ways: names in one split and ids in another warn; when a value reads as two
different classes (numeric names) it fails; a label that looks numeric but is no int ("²", "--1") is exit 2
through the real CLI, never an internal error. Labels written one way pass."""

from __future__ import annotations

import pytest
from conftest import TINY_LLAMA, write_campaign, write_jsonl

from pilotrun.campaign import load_campaign
from pilotrun.data.checks import run_checks
from pilotrun.campaign.prepare import prepare


def _seqcls(tmp_path, train, validation, labels):
    write_jsonl(tmp_path / "data" / "train.jsonl", [{"text": f"text number {i}", "label": v} for i, v in
                                                     enumerate(train)])
    write_jsonl(tmp_path / "data" / "validation.jsonl", [{"text": f"other text {i}", "label": v} for i, v in
                                                          enumerate(validation)])
    c = {"name": "cls", "task": "seq-cls", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
         "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "text": "text",
                  "label": "label", "labels": list(labels), "max_length": 64},
         "train": {"micro_batch": 2, "accumulation": 1, "updates": 2}}
    return write_campaign(tmp_path, c)


def _checks(path):
    loaded = load_campaign(path)
    return run_checks(prepare(loaded, splits=()).task, loaded)


def _forms(report):
    return [c for c in report.checks if c.name == "label-forms"]


def test_names_in_train_ids_in_validation_warn(tmp_path):
    report = _checks(_seqcls(tmp_path, ["neg", "pos", "neutral", "pos"], [1, 0, 2], ["neg", "pos", "neutral"]))
    [hit] = _forms(report)
    assert hit.verdict == "warn"
    assert "labels are written as class names in train (e.g. 'neg' at " in hit.message
    assert "and as ids in validation (e.g. 1 at " in hit.message and "validation.jsonl:1" in hit.message
    assert "check that id i means data.labels[i] in both" in hit.message


def test_numeric_names_and_ids_disagree_fail(tmp_path):
    # star ratings: data.labels are the names "1".."3"; validation gives ids 0..2 (JSON numbers)
    report = _checks(_seqcls(tmp_path, ["1", "2", "3", "2"], [0, 1, 2], ["1", "2", "3"]))
    [hit] = _forms(report)
    assert hit.verdict == "fail" and report.verdict == "fail"
    assert "the two readings disagree: '1' is the name of class 0 in data.labels ['1', '2', '3'], while the id 1 " \
           "is class 1 ('2')" in hit.message, hit.message
    assert "(4 records read as names, first " in hit.message and "train.jsonl:1" in hit.message
    assert "write every split's labels one way" in hit.message


def test_labels_written_one_way_pass(tmp_path):
    assert not _forms(_checks(_seqcls(tmp_path / "a", ["neg", "pos", "neutral"], ["pos", "neg", "neutral"],
                                      ["neg", "pos", "neutral"])))
    assert not _forms(_checks(_seqcls(tmp_path / "b", [0, 1, 2, 1], ["1", "0", "2"], ["neg", "pos", "neutral"])))
    # numeric names written as names everywhere: one reading, nothing to disagree about
    assert not _forms(_checks(_seqcls(tmp_path / "c", ["1", "2", "3"], ["3", "1", "2"], ["1", "2", "3"])))


@pytest.mark.parametrize("bad", ["²", "--1", "1.0", "①"])
def test_label_that_looks_numeric_but_is_no_int_is_exit_2(tmp_path, cli, bad):
    path = _seqcls(tmp_path, ["neg", bad, "pos"], ["pos", "neg"], ["neg", "pos"])
    for verb in ("inspect", "train"):
        r = cli(verb, path, "--home", tmp_path / "home")
        assert r.code == 2, (verb, r.out + r.err)
        err = " ".join(r.err.split())
        assert "Traceback" not in r.err
        assert f"{bad!r}" in err and "not in data.labels ['neg', 'pos']" in err, err
        assert "train.jsonl:2" in err


@pytest.mark.parametrize("labels", [["false", "true"], ["True", "False"]])
def test_a_boolean_label_is_the_class_named_so(tmp_path, cli, labels):
    # a JSON true (pandas' bool column, "is_spam": true) was "True is not in data.labels ['false', 'true']", read
    # as Python spells it; it is the class named "true" in any case
    from pilotrun.tasks.seq_cls import SeqClsTask

    path = _seqcls(tmp_path, [True, False, True, False], [False, True], labels)
    task = SeqClsTask(load_campaign(path).campaign)
    from pilotrun.records.readers import read_records

    ids = [task.label_id(r) for r in read_records(tmp_path / "data" / "train.jsonl")]
    true_id = [n.lower() for n in labels].index("true")
    assert ids == [true_id, 1 - true_id] * 2
    assert cli("inspect", path).code == 0


def test_a_boolean_label_without_its_class_and_booleans_in_data_labels(tmp_path, cli):
    path = _seqcls(tmp_path, [True, False, True, False], [False, True], ["ham", "spam"])
    r = cli("inspect", path)
    assert r.code == 2, r.err
    assert "2 label values are not in data.labels ['ham', 'spam']: true (3 records, first " in r.err, r.err
    assert "(yes/no values: JSON or Parquet booleans)" in r.err
    assert 'fix: name the classes "false" and "true" in data.labels, in the order of their ids' in r.err
    # YAML reads labels: [false, true] unquoted as booleans: "Input should be a valid string"
    path.write_text(path.read_text().replace("- ham\n", "- false\n").replace("- spam\n", "- true\n"))
    r = cli("validate", path)
    assert r.code == 2, r.err
    assert "data.labels: item 0 (false) is a yes/no: YAML reads false, true, no, yes, off and on unquoted as " \
           "booleans" in r.err, r.err


def test_a_label_written_in_another_case_is_named_with_its_class_not_as_a_class_to_add(tmp_path, cli):
    """A CSV written by pandas says True and False for a bool column; against data.labels ["false", "true"] the fix
    said "add these classes to data.labels", which would have made four classes of two."""
    (tmp_path / "data").mkdir()
    rows = "text,label\n" + "good movie,True\nbad film,False\ngreat, true\nawful,FALSE\n" * 3
    for split in ("train", "validation"):
        (tmp_path / "data" / f"{split}.csv").write_text(rows)
    path = _seqcls(tmp_path / "c", [], [], ["false", "true"])
    c = path.read_text().replace("data/train.jsonl", str(tmp_path / "data" / "train.csv"))
    path.write_text(c.replace("data/validation.jsonl", str(tmp_path / "data" / "validation.csv")))
    r = cli("inspect", path)
    assert r.code == 2, r.err
    err = " ".join(r.err.split())
    assert "4 label values are not in data.labels ['false', 'true']: 'True' (6 records, first " in err, err
    assert ("fix: these are classes of data.labels written in another case or with spaces ('True' → 'true', "
            "'False' → 'false', ' true' → 'true', 'FALSE' → 'false'; a CSV written by pandas says True and False)"
            in err), err
    # a value that is no class in any case is still a class to add
    (tmp_path / "data" / "train.csv").write_text(rows + "meh,neutral\n")
    r = cli("inspect", path)
    assert r.code == 2 and "add these classes to data.labels" in r.err and "another case" not in r.err, r.err


@pytest.mark.parametrize("labels, said, fix", [
    # Hugging Face's multi_label_classification: the fix said to add [0, 1] to data.labels as a class
    ([[0, 1], [1], [0], [0, 1]], "several classes a record (multi-label classification), where seq-cls trains one "
     "class of data.labels a record", "fix: give each record one class"),
    # a score to predict: 0.25 … were "classes to add"
    ([0.25, 0.5, 0.75, 0.1], "are fractions (0.25 …): a score to predict (regression), where seq-cls trains one class",
     "fix: give each record a class name of data.labels or its id 0..n-1 (bin the scores into classes)"),
])
def test_labels_of_another_task_are_named_as_that_task_not_as_classes_to_add(tmp_path, cli, labels, said, fix):
    path = _seqcls(tmp_path, labels, labels[:2], ["neg", "pos"])
    for verb in ("validate", "inspect") if isinstance(labels[0], list) else ("inspect",):  # validate reads no values
        r = cli(verb, path)
        err = " ".join(r.err.split())
        assert r.code == 2 and said in err and fix in err, (verb, err)
        assert "add these classes" not in err


@pytest.mark.parametrize("labels, said", [
    (["neg"], "data.labels ['neg'] names 1 class: a classifier chooses among two or more"),
    ([], "data.labels [] names no classes"),
    (["neg", "pos", ""], "data.labels item 2 is '': a class with no name"),
    (["neg", " ", "pos"], "data.labels item 1 is ' ': a class with no name"),
])
def test_data_labels_name_two_or_more_classes_each_with_a_name(tmp_path, cli, labels, said):
    """One class (its softmax is 1 whatever the weights: the loss is 0), none, or a blank name (a trailing comma's)
    passed validate."""
    path = _seqcls(tmp_path, ["neg", "pos"], ["pos"], labels)
    r = cli("validate", path)
    assert r.code == 2 and said in r.err, r.err
    assert cli("validate", _seqcls(tmp_path / "ok", ["neg", "pos"], ["pos"], ["neg", "pos"])).code == 0
