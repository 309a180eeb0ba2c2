"""The bad-input corpus, round two (issue 20): YAML bombs and oversized files, duplicate keys, non-finite
numbers, seeds out of range, record fields of the wrong type, unreadable or looping paths, a home below a
file, damaged journals. Every case through the real CLI: exit 2, a message naming the file/line/key, no
traceback, and no journal row or run folder left behind."""

from __future__ import annotations

import math

import pytest
from conftest import simple_records, tiny_causal_campaign, write_jsonl
from test_corpus import _edit, _no_traces, _set


def _base(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))


def _check(r, home, *expected):
    assert r.code == 2, (r.code, r.err)
    for e in expected:
        assert e in r.err, (e, r.err)
    assert "Traceback" not in r.err and "fix" in r.err, r.err
    _no_traces(home)


# --- values the schema must refuse (validate and train) -----------------------------------------------------
VALUE_CASES = [
    ("lr-inf", _set("train", lr=math.inf), "key 'train.lr' = Infinity: Input should be a finite number"),
    ("lr-nan", _set("train", lr=math.nan), "key 'train.lr' = NaN"),
    ("epochs-inf", _set("train", epochs=math.inf, updates=None), "key 'train.epochs' = Infinity"),
    ("weight-decay-inf", _set("train", weight_decay=math.inf), "train.weight_decay"),
    ("reserve-nan", _set("hardware", reserve=math.nan), "hardware.reserve"),
    ("diverge-factor-inf", lambda c: c["train"].update(stop={"diverge_factor": math.inf}), "train.stop.diverge_factor"),
    ("seed-negative", lambda c: c.update(seed=-1), "seed -1 is outside 0..4294967295"),
    ("seed-too-large", lambda c: c.update(seed=2**32), "seed 4294967296 is outside"),
    ("seed-huge", lambda c: c.update(seed=2**70), "is outside 0..4294967295"),
    ("plan-seed-too-large", lambda c: c.update(plan={"seeds": [0, 2**64]}), "plan.seeds.1"),
]


@pytest.mark.parametrize("case, breaker, expected", VALUE_CASES, ids=[c[0] for c in VALUE_CASES])
@pytest.mark.parametrize("verb", ["validate", "train"])
def test_value_case(cli, tmp_path, case, breaker, expected, verb):
    path = _base(tmp_path)
    _edit(path, breaker)
    r = cli(verb, path, "--home", tmp_path / "home")
    _check(r, tmp_path / "home", expected, str(path))


SET_CASES = [
    ("set-lr-inf", ["train.lr=.inf"], "key 'train.lr' = Infinity"),
    ("set-lr-nan", ["train.lr=.nan"], "key 'train.lr' = NaN"),
    ("set-epochs-inf", ["train.epochs=.inf", "train.updates=null"], "key 'train.epochs' = Infinity"),
    ("set-seed-negative", ["seed=-5"], "seed -5 is outside"),
]


@pytest.mark.parametrize("case, sets, expected", SET_CASES, ids=[c[0] for c in SET_CASES])
def test_set_case(cli, tmp_path, case, sets, expected):
    args = [a for s in sets for a in ("--set", s)]
    r = cli("train", _base(tmp_path), *args, "--home", tmp_path / "home")
    _check(r, tmp_path / "home", expected)


# --- the campaign file's YAML itself (validate and train) ---------------------------------------------------
BOMB = "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else ', '.join(['lol'] * 9)}]\n"
               for i in range(10))


def _text(fn):
    return lambda path: path.write_text(fn(path.read_text()))


YAML_CASES = [
    ("billion-laughs", _text(lambda t: BOMB + t), "repeated by aliases", ":9:"),
    ("billion-laughs-under-known-key", _text(lambda t: t + "plan:\n  control:\n" +
                                             "".join("    " + line + "\n" for line in BOMB.splitlines())),
     "at most 100,000 may come from aliases", ":"),
    ("recursive-alias", _text(lambda t: t + "plan: &p {variants: [*p]}\n"), "refers to the value that contains it", ":"),
    ("oversized-campaign", _text(lambda t: t + "# " + "x" * (300 << 10) + "\n"), "a campaign file may hold at most 256 KiB",
     "campaign.yaml"),
    ("duplicate-top-key", _text(lambda t: t + "name: again\n"), "key 'name' appears twice in one mapping (lines 1 and",
     "campaign.yaml:"),
    ("duplicate-nested-key", _text(lambda t: t.replace("  lr: 0.001\n", "  lr: 0.001\n  lr: 0.1\n")),
     "key 'lr' appears twice", "campaign.yaml:"),
]


@pytest.mark.parametrize("case, breaker, expected, where", YAML_CASES, ids=[c[0] for c in YAML_CASES])
@pytest.mark.parametrize("verb", ["validate", "train"])
def test_yaml_case(cli, tmp_path, case, breaker, expected, where, verb):
    path = _base(tmp_path)
    breaker(path)
    r = cli(verb, path, "--home", tmp_path / "home")
    _check(r, tmp_path / "home", expected, where)


def test_campaign_symlink_loop(cli, tmp_path):
    (tmp_path / "a.yaml").symlink_to(tmp_path / "b.yaml")
    (tmp_path / "b.yaml").symlink_to(tmp_path / "a.yaml")
    r = cli("validate", tmp_path / "a.yaml", "--home", tmp_path / "home")
    _check(r, tmp_path / "home", "a.yaml", "symlink loop")


def test_duplicate_key_clean_case(cli, tmp_path):
    """The same key in two different mappings, and a merge key, are not duplicates."""
    path = _base(tmp_path)
    path.write_text(path.read_text() + "plan:\n  control: {train.warmup: 0}\n  variants:\n"
                    "    - {train.warmup: 1}\n")
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err


def test_small_aliases_are_still_accepted(cli, tmp_path):
    path = _base(tmp_path)
    path.write_text(path.read_text() + "plan:\n  seeds: &s [1, 2]\n  control: &c {train.warmup: 0}\n"
                    "  variants:\n    - {<<: *c, train.lr: 0.002}\n")
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err


# --- control characters in what an error message repeats ---------------------------------------------------
ESCAPES = [
    ("escape-in-an-unknown-key", lambda t: t + '"nmae\\e]0;PWNED\\a\\e[2J": x\n', "unknown key 'nmae\\x1b]0;PWNED\\x07"),
    ("escape-in-a-bad-value", lambda t: t.replace("  lr: 0.001\n", '  lr: "fast\\e[2J"\n'),
     "key 'train.lr' = \"fast\\u001b[2J\""),
    ("escape-in-a-set-key", None, "unknown key 'train.l\\x1b[2Jr'"),
]


@pytest.mark.parametrize("case, edit, expected", ESCAPES, ids=[c[0] for c in ESCAPES])
def test_control_characters_are_escaped_in_errors(cli, tmp_path, case, edit, expected):
    path = _base(tmp_path)
    args = ["--set", "train.l\x1b[2Jr=1"] if edit is None else []
    if edit is not None:
        path.write_text(edit(path.read_text()))
    r = cli("validate", path, *args, "--home", tmp_path / "home")
    _check(r, tmp_path / "home", expected)
    assert "\x1b" not in r.err and "\x07" not in r.err
