"""validate refuses a tokenizer that gives ids the model's embedding has no row for, read without torch
from the built-in byte tokenizer, tokenizer.json and config.json; the build refuses it naming both sizes."""

import yaml
from conftest import SHARED_DATA, TINY_LLAMA, minilm_campaign, simple_records, tiny_causal_campaign

from pilotrun.campaign.consistency import BYTE_TOKENIZER_SIZE


def test_byte_tokenizer_size_is_the_real_one():
    from transformers import ByT5Tokenizer

    assert len(ByT5Tokenizer()) == BYTE_TOKENIZER_SIZE


def test_config_vocabulary_smaller_than_the_byte_tokenizer(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), model__config=dict(TINY_LLAMA, vocab_size=100))
    r = cli("validate", path)
    assert r.code == 2, r.out + r.err
    assert "the tokenizer has 384 tokens but the model's embedding has 100 rows (the byte tokenizer gives ids " \
           "0..383; model.config.vocab_size is 100): ids 100..383 have no embedding row" in r.err
    assert "set the model's vocab_size to at least 384" in r.err
    assert cli("validate", tiny_causal_campaign(tmp_path / "ok", simple_records(8))).code == 0


def _saved_llama(folder, vocab_size):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = {k: v for k, v in TINY_LLAMA.items() if k != "model_type"}
    LlamaForCausalLM(LlamaConfig(**dict(cfg, vocab_size=vocab_size))).save_pretrained(folder)
    return str(folder)


def _bpe_folder(folder):
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                            eos_token="<|endoftext|>").save_pretrained(folder)
    return str(folder)


def test_saved_model_smaller_than_a_bpe_tokenizer_folder(cli, tmp_path):
    """A second instance: config.json of a saved model against a tokenizer folder's tokenizer.json (its
    2000-entry vocabulary and 3 added tokens): refused by validate, and by the build, each naming both sizes."""
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    c = yaml.safe_load(path.read_text())
    del c["model"]["config"]
    c["model"].update(path=_saved_llama(tmp_path / "model", 1000), tokenizer=_bpe_folder(tmp_path / "tok"))
    path.write_text(yaml.safe_dump(c))
    r = cli("validate", path)
    assert r.code == 2, r.out + r.err
    assert f"the tokenizer has 2003 tokens but the model's embedding has 1000 rows ({tmp_path / 'tok'}" \
           f"/tokenizer.json gives ids 0..2002; vocab_size in {tmp_path / 'model'}/config.json is 1000)" in r.err
    c["model"]["path"] = _saved_llama(tmp_path / "model_ok", 2003)
    path.write_text(yaml.safe_dump(c))
    assert cli("validate", path).code == 0


def test_real_wordpiece_model_and_tokenizer_pass(cli, tmp_path):
    r = cli("validate", minilm_campaign(tmp_path))
    assert r.code == 0, r.out + r.err


def test_build_refuses_what_validate_cannot_read(cli, tmp_path):
    """A saved ByT5 folder has no tokenizer.json or vocab.txt: validate cannot count it without transformers,
    so the build (train, before any run exists) refuses it, naming both sizes."""
    from transformers import ByT5Tokenizer

    ByT5Tokenizer().save_pretrained(tmp_path / "byt5")
    path = tiny_causal_campaign(tmp_path, simple_records(8), model__config=dict(TINY_LLAMA, vocab_size=100),
                                model__tokenizer=str(tmp_path / "byt5"))
    assert cli("validate", path).code == 0
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "the tokenizer has 384 tokens but the model's embedding has 100 rows" in r.err
    assert not (tmp_path / "home" / "runs").exists()
