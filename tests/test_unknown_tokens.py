"""Unknown tokens: a word-level tokenizer (a real tokenizers.WordLevel, saved and reloaded) that maps most of
the data to [UNK] fails inspect, per split, naming the tokenizer; one whose vocabulary covers the data passes.
overfit's plateau names its likely causes in order of evidence: unknown tokens first when the inputs are
unknown, capacity alone when no data cause is measured."""

from __future__ import annotations

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign

from pilotrun.campaign import load_campaign
from pilotrun.data.checks import run_checks
from pilotrun.rehearsal.prepare import prepare

SPECIALS = ["[UNK]", "<eos>", "<pad>"]


def _word_tokenizer(folder, words) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIALS + sorted(set(words)))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return str(folder)


def _records(n, start=0):
    # prompts in a vocabulary the tokenizer lacks; answers in one it has
    return [{"instruction": f"traduire le mot numéro {i} s'il vous plaît", "output": f"word{i % 6} done"}
            for i in range(start, start + n)]


def _campaign(tmp_path, known_words):
    tok = _word_tokenizer(tmp_path / "wordtok", known_words)
    return tiny_causal_campaign(tmp_path, _records(16), _records(6, 100), model__tokenizer=tok)


def _checks(path):
    loaded = load_campaign(path)
    return run_checks(prepare(loaded, splits=()).task, loaded)


def test_tokenizer_that_maps_most_prompts_to_unk_fails_per_split(tmp_path):
    report = _checks(_campaign(tmp_path, [f"word{i}" for i in range(6)] + ["done"]))
    hits = {c.split: c for c in report.checks if c.name == "unknown-tokens"}
    assert set(hits) == {"train", "validation"}, [c.line() for c in report.checks]
    hit = hits["train"]
    assert hit.verdict == "fail" and report.verdict == "fail"
    # 10 pre-tokens per prompt (the apostrophe is one), all unknown; the answers (2 words + EOS) are known
    assert "160 of 160 prompt tokens (100.0%) and 0 of 48 target tokens (0.0%)" in hit.message, hit.message
    assert "are the unknown token (id 0) of the tokenizer " in hit.message
    assert "wordtok)" in hit.message and "train.jsonl:1" in hit.message
    assert "above 5% the model cannot read or write that part of the data" in hit.message


def test_tokenizer_covering_the_data_passes(tmp_path):
    words = " ".join(r["instruction"] + " " + r["output"] for r in _records(16) + _records(6, 100))
    from tokenizers import pre_tokenizers

    known = [w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(words)]
    report = _checks(_campaign(tmp_path, known))
    assert not [c.line() for c in report.checks if c.name == "unknown-tokens"]


def test_one_unknown_word_in_ten_fails(tmp_path):
    words = " ".join(r["instruction"] + " " + r["output"] for r in _records(16) + _records(6, 100))
    from tokenizers import pre_tokenizers

    known = sorted({w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(words)} - {"numéro"})
    hits = [c for c in _checks(_campaign(tmp_path, known)).checks if c.name == "unknown-tokens"]
    # one word in ten of each prompt: above 5%, a failure
    assert hits and all(c.verdict == "fail" for c in hits)
    assert "16 of 160 prompt tokens (10.0%)" in hits[0].message, hits[0].message


@pytest.mark.parametrize("case", ["unknown", "capacity"])
def test_overfit_plateau_names_causes_in_order_of_evidence(cli, tmp_path, case):
    if case == "unknown":
        path = _campaign(tmp_path, [f"word{i}" for i in range(6)] + ["done"])
        args = ["--max-updates", "30"]
    else:
        path = tiny_causal_campaign(tmp_path, simple_records(16))
        args = ["--max-updates", "3"]
    r = cli("overfit", path, "--home", tmp_path / "home", "--json", *args)
    assert r.code == 1, r.out + r.err
    text = " ".join(" ".join(r.json["messages"]).split())
    assert "likely causes, most evidence first: 1) " in text, text
    causes = text.split("most evidence first: ", 1)[1]
    if case == "unknown":
        assert causes.startswith("1) unknown tokens: ") and "prompt tokens (100%)" in causes, causes
        assert "of the tokenizer " in causes and "wordtok)" in causes
        assert "identical inputs with different targets" in causes
        assert causes.index("unknown tokens") < causes.index("identical inputs") < causes.index("capacity")
    else:
        assert causes.startswith("1) capacity: the model (") and "(no data cause measured)" in causes, causes
        assert "unknown tokens" not in causes and "constant targets" not in causes
