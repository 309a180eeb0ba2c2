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
from pilotrun.campaign.prepare import prepare

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


# --- an unk id that is also a special token the task adds (GPT-2, Pythia, OPT: one <|endoftext|>) ----------
def _endoftext_tokenizer(folder, *, byte_level=True, leading=False) -> str:
    """The shared byte-level BPE (no pad) with eos = bos = unk = <|endoftext|>; or, ``byte_level=False``, a
    character BPE of ASCII only whose unknown characters really are that one id. ``leading``: the tokenizer puts
    <|endoftext|> before every text (as OPT's tokenizer puts its BOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from conftest import SHARED_DATA

    eot = "<|endoftext|>"
    if byte_level:
        tok = Tokenizer.from_file(str(SHARED_DATA / "tiny_bpe_tokenizer.json"))
    else:
        chars = [chr(c) for c in range(33, 127)]
        tok = Tokenizer(models.BPE(vocab={eot: 0, **{ch: i + 1 for i, ch in enumerate(chars)}}, merges=[],
                                   unk_token=eot))
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tok.add_special_tokens([eot])
    if leading:
        tok.post_processor = processors.TemplateProcessing(single=f"{eot} $A", special_tokens=[(eot, tok.token_to_id(eot))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eot, bos_token=eot, unk_token=eot)
    assert fast.pad_token is None and fast.unk_token_id == fast.eos_token_id
    fast.save_pretrained(folder)
    return str(folder)


def _short_answers(n, start=0, word="yes"):
    return [{"instruction": f"answer number {i}", "output": word} for i in range(start, start + n)]


def test_eos_that_is_also_unk_is_not_unknown(tmp_path):
    """The EOS ending every answer was counted as unknown: a false FAIL on one-word answers (1 of 2 target
    tokens), shared by overfit's diagnosis. The byte-level BPE has no unknown tokens at all."""
    from pilotrun.data.unknown import counts, own_positions

    tok = _endoftext_tokenizer(tmp_path / "bpe")
    path = tiny_causal_campaign(tmp_path, _short_answers(16), _short_answers(6, 100), model__tokenizer=tok)
    loaded = load_campaign(path)
    prep = prepare(loaded, splits=("train",))
    assert not [c.line() for c in run_checks(prep.task, loaded).checks if c.name == "unknown-tokens"]
    e = prep.train[0]
    assert e.labels[-1] == prep.task.eos == prep.task.tokenizer.unk_token_id  # the planted overlap is there
    own = own_positions(prep.task, prep.task.eos)
    assert counts(e, prep.task.eos, own)[2] == 0 and counts(e, prep.task.eos)[2] == 1
    from pilotrun.rehearsal.mechanics.plateau import plateau_causes

    assert not [c for c in plateau_causes(prep.task, prep.train) if "unknown tokens" in c]


def test_genuine_unknowns_are_still_counted_when_unk_is_eos(tmp_path):
    """A character BPE without byte fallback maps what it lacks (é) to unk, which is also its EOS: the answers'
    EOS is not counted, the prompts' unknown characters are."""
    tok = _endoftext_tokenizer(tmp_path / "chars", byte_level=False)
    recs = [{"instruction": f"numéro {i} é", "output": "ok"} for i in range(16)]
    report = _checks(tiny_causal_campaign(tmp_path, recs, model__tokenizer=tok))
    hit = next(c for c in report.checks if c.name == "unknown-tokens")
    assert hit.verdict == "fail"
    assert "32 of " in hit.message and "and 0 of 48 target tokens (0.0%)" in hit.message, hit.message


def test_leading_special_that_is_also_unk_is_not_unknown_in_seq_cls(tmp_path):
    """A classification tokenizer that puts <|endoftext|> (its bos, eos and unk) before each text: that position is
    the tokenizer's own, so short texts do not FAIL; an unknown character in them still counts."""
    from conftest import write_jsonl

    tok = _endoftext_tokenizer(tmp_path / "chars", byte_level=False, leading=True)
    for name, text in (("clean", "a b"), ("unknown", "a é")):
        folder = tmp_path / name
        write_jsonl(folder / "train.jsonl", [{"text": f"{text} {i}", "label": "x" if i % 2 else "y"} for i in range(12)])
        c = {"name": name, "task": "seq-cls", "model": {"config": {"model_type": "bert", "vocab_size": 128,
                                                                   "hidden_size": 32, "num_hidden_layers": 1,
                                                                   "num_attention_heads": 2,
                                                                   "intermediate_size": 64}, "tokenizer": tok},
             "data": {"train": "train.jsonl", "text": "text", "label": "label", "labels": ["x", "y"], "max_length": 16},
             "train": {"micro_batch": 2, "accumulation": 1, "updates": 1}}
        hits = [x for x in _checks(write_campaign(folder, c)).checks if x.name == "unknown-tokens"]
        if name == "clean":
            assert not [h.line() for h in hits]
        else:
            assert hits and hits[0].verdict == "fail" and "12 of 50 prompt tokens (24.0%)" in hits[0].message, \
                [h.line() for h in hits]
