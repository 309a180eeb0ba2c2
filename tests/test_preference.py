"""The preference task: pairs encoded as the concatenated forward sees them, the losses of DPO, IPO, SimPO and ORPO,
the reference beside the policy, and the checks a pair needs — each planted in pairs built from the Stack Exchange
records of ../shared/data (response_j the better answer, response_k the worse), with a clean case beside it."""

from __future__ import annotations

import math

import pytest
from conftest import write_jsonl
from preference_data import (bpe_tokenizer, by_question, llama_folder, preference_campaign, short_pairs,
                             stack_exchange)

from pilotrun.campaign.load import load_campaign
from pilotrun.tasks import IGNORE, make_task


def _task(path):
    loaded = load_campaign(path)
    return loaded, make_task(loaded)


# --- the losses, against the papers' formulas ------------------------------------------------------------------
def _sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo", "orpo"])
def test_each_loss_is_its_papers_formula(loss):
    import torch

    from pilotrun.tasks.preference_loss import DEFAULT_BETA, pair_terms

    beta, gamma = DEFAULT_BETA[loss], 0.5
    pc, pr, rc, rr = [-3.0, -0.4], [-5.0, -0.2], [-4.0, -0.3], [-4.5, -0.3]
    t = pair_terms(loss, beta, gamma, (torch.tensor(pc), torch.tensor(pr)),
                   (torch.tensor(rc), torch.tensor(rr)) if loss in ("dpo", "ipo") else None)
    for i in range(2):
        ratio = (pc[i] - rc[i]) - (pr[i] - rr[i])
        want = {"dpo": -math.log(_sig(beta * ratio)),
                "ipo": (ratio - 1 / (2 * beta)) ** 2,
                "simpo": -math.log(_sig(beta * (pc[i] - pr[i]) - gamma)),
                "orpo": -pc[i] - beta * math.log(_sig((pc[i] - math.log(1 - math.exp(pc[i])))
                                                      - (pr[i] - math.log(1 - math.exp(pr[i])))))}[loss]
        assert float(t.losses[i]) == pytest.approx(want, rel=1e-5)
    margin = (t.chosen_rewards - t.rejected_rewards).tolist()
    assert margin[0] > 0  # the first pair: the policy prefers chosen by more than the reference does


# --- encoding: both halves share the prompt, the answers are the only targets ------------------------------------
def test_a_pair_is_two_sequences_with_one_prompt_and_the_batch_concatenates_them(tmp_path):
    records = short_pairs()[:4]
    _, task = _task(preference_campaign(tmp_path, records))
    e = task.encode(task.records("train")[0])
    tok = task.tokenizer
    prompt = e.input_ids[: e.prompt_len]
    assert e.meta["rejected_ids"][: e.prompt_len] == prompt
    assert tok.decode(prompt) == f"Question: {records[0]['question']}\n\nAnswer: "
    assert tok.decode([t for t in e.labels if t != IGNORE]) == records[0]["response_j"] + "<|im_end|>"
    assert tok.decode([t for t in e.meta["rejected_labels"] if t != IGNORE]) == records[0]["response_k"] + "<|im_end|>"
    assert e.length == max(len(e.input_ids), len(e.meta["rejected_ids"])) and e.n_targets == 1
    examples = [task.encode(r) for r in task.records("train")]
    batch = task.collate(examples)
    n = len(examples)
    assert batch["input_ids"].shape == (2 * n, max(x.length for x in examples))  # chosen rows, then rejected
    assert batch["input_ids"][n, : len(e.meta["rejected_ids"])].tolist() == e.meta["rejected_ids"]
    assert task.count_targets(batch) == n


def test_conversations_render_with_the_chat_template_and_an_implicit_prompt_is_the_shared_start(tmp_path):
    base = short_pairs()[:3]
    records = [{"chosen": [{"role": "user", "content": r["question"]}, {"role": "assistant", "content": r["response_j"]}],
                "rejected": [{"role": "user", "content": r["question"]},
                             {"role": "assistant", "content": r["response_k"]}]} for r in base]
    path = preference_campaign(tmp_path, records)
    loaded = load_campaign(path, {"data.prompt": None, "data.chosen": "chosen", "data.rejected": "rejected"})
    task = make_task(loaded)
    e = task.encode(task.records("train")[0])
    tok = task.tokenizer
    assert tok.decode(e.input_ids[: e.prompt_len]) == \
        f"<|im_start|>user\n{base[0]['question']}<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode([t for t in e.labels if t != IGNORE]) == base[0]["response_j"] + "<|im_end|>\n"
    assert e.meta["rejected_ids"][: e.prompt_len] == e.input_ids[: e.prompt_len]
    # the same pairs with the prompt in its own field (UltraFeedback's layout: each answer repeats the user turn)
    for r, b in zip(records, base):
        r["prompt"] = b["question"]
    write_jsonl(tmp_path / "data" / "train.jsonl", records)
    ultra = make_task(load_campaign(path, {"data.prompt": "prompt", "data.chosen": "chosen",
                                           "data.rejected": "rejected", "data.chat_template": "model"}))
    u = ultra.encode(ultra.records("train")[0])
    assert (u.input_ids, u.labels, u.meta["rejected_ids"]) == (e.input_ids, e.labels, e.meta["rejected_ids"])


# --- the data checks, each planted in real pairs, and the clean case ---------------------------------------------
def _checks(path):
    from pilotrun.data.checks import run_checks

    loaded, task = _task(path)
    return run_checks(task, loaded).checks


def _named(checks, name):
    return [c for c in checks if c.name == name]


def test_clean_stack_exchange_pairs_pass_every_pair_check(tmp_path):
    train, validation = by_question(short_pairs())
    checks = _checks(preference_campaign(tmp_path, train, validation))
    assert [c for c in checks if c.verdict != "ok"] == []


def test_identical_answers_fail_and_name_the_pairs(tmp_path):
    records = short_pairs()
    for r in records[:3]:
        r["response_k"] = r["response_j"]
    (found,) = _named(_checks(preference_campaign(tmp_path, records)), "identical-pair")
    assert found.verdict == "fail" and found.data["count"] == 3
    assert "3 of 25 pairs (12.0%) have a chosen answer identical to the rejected one" in found.message
    assert "train.jsonl:1" in found.message


def test_a_difference_past_max_length_fails_as_the_silent_one_and_says_the_length_that_keeps_it(tmp_path):
    records = [dict(r) for r in short_pairs(chars=2000)]
    for r in records[:2]:  # the worse answer is the better one with another ending, far past the cut
        r["response_k"] = r["response_j"][:200] + " -- which is why I would not do this."
    path = preference_campaign(tmp_path, records, data__max_length=64)
    checks = _named(_checks(path), "pair-truncation")
    cut = next(c for c in checks if "differ only past" in c.message)
    assert cut.verdict == "fail" and cut.data["count"] == 2
    assert "pairs differ only past data.max_length=64" in cut.message and "train.jsonl:1" in cut.message
    need = cut.data["keep_difference"]
    fixed = _named(_checks(preference_campaign(tmp_path / "fixed", records, data__max_length=need)),
                   "pair-truncation")
    assert not any("differ only past" in c.message for c in fixed)  # the length it names keeps every difference


def test_an_answer_cut_away_whole_fails(tmp_path):
    records = stack_exchange()  # the whole questions: up to 3454 tokens, far over 256
    found = [c for c in _named(_checks(preference_campaign(tmp_path, records, data__max_length=256)),
                                 "pair-truncation") if "lose a whole answer" in c.message]
    assert found and found[0].verdict == "fail"
    assert "(the prompt fills it)" in found[0].message


def test_a_prompt_in_both_splits_is_leakage_by_prompt(tmp_path):
    from pilotrun.data.leakage import leakage_checks

    records = short_pairs()
    leaky = preference_campaign(tmp_path / "leaky", records[::2], records[1::2])  # split by record, not question
    checks = leakage_checks(load_campaign(leaky))[0]
    (found,) = [c for c in checks if c.name == "shared-prompts"]
    assert found.verdict == "fail" and "validation prompts also occur in train" in found.message
    train, validation = by_question(records)
    clean = leakage_checks(load_campaign(preference_campaign(tmp_path / "clean", train, validation)))[0]
    assert [c for c in clean if c.verdict != "ok"] == []


def _tuned_on(folder, texts: list[str]) -> str:
    """A tiny Llama trained until it prefers ``texts`` (a model tuned before DPO, as real campaigns start from)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    llama_folder(folder)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.tensor([(tok(t)["input_ids"] * 32)[:32] for t in texts])  # one batch: every text, 32 tokens
    for _ in range(12):
        model(input_ids=x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(folder)
    return str(folder)


def test_swapped_pairs_warn_when_the_starting_model_prefers_the_rejected_answers(tmp_path):
    from pilotrun.rehearsal.data_checks.inspect import swapped_pairs

    records = short_pairs(chars=120)
    model = {"path": _tuned_on(tmp_path / "sft", [r["response_j"] for r in records])}
    clean = swapped_pairs(*reversed(_task(preference_campaign(tmp_path / "clean", records, model=model))))
    assert clean.verdict == "ok" and clean.data["prefers_rejected"] < clean.data["pairs"] / 2
    swapped = [dict(r, response_j=r["response_k"], response_k=r["response_j"]) for r in records]
    found = swapped_pairs(*reversed(_task(preference_campaign(tmp_path / "swapped", swapped, model=model))))
    assert found.verdict == "warn", found.message
    assert "already prefers the rejected answer of" in found.message and "swapped?" in found.message


def test_inspect_shows_each_half_token_by_token_with_what_it_adds(tmp_path, cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    path = preference_campaign(tmp_path, short_pairs(chars=60)[:2])
    r = cli("inspect", path, "-n", "1", "--json")
    shown = r.json["data"]["examples"]
    assert [e["half"] for e in shown] == ["chosen", "rejected"]
    assert shown[0]["contributes"].startswith("chosen: ") and "enters the margin with +" in shown[0]["contributes"]
    assert "enters the margin with −" in shown[1]["contributes"]
    kinds = {k for _, _, k in shown[1]["tokens"]}
    assert {"masked", "trained"} <= kinds
    assert len(shown[0]["tokens"]) == len(shown[1]["tokens"])  # both rows padded to the pair's wider half
    # the BPE tokenizer ships a ChatML template and the pairs are plain text: the format the model sees is not its own
    (fmt,) = [c for c in r.json["data"]["checks"] if c["name"] == "prompt format"]
    assert fmt["verdict"] == "warn" and "data.chosen / data.rejected" in fmt["message"]


# --- campaign keys -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override, key, words", [
    ({"data.rejected": None}, "data.rejected", "preference needs data.rejected"),
    ({"preference.reference": "adapter"}, "preference.reference", "needs a LoRA adapter"),
    ({"preference.loss": "simpo", "preference.reference": "copy"}, "preference.reference", "uses no reference"),
    ({"preference.reference": "none"}, "preference.reference", "compares the policy with a reference"),
    ({"train.strategy": "fsdp", "train.nproc": 2}, "train.strategy", "does not rehearse a reference"),
    ({"train.strategy": "fsdp", "train.nproc": 2, "preference.reference": "precomputed"}, "train.strategy",
     "precomputed by the starting model"),
    ({"preference.loss": "orpo", "preference.reference": "precomputed"}, "preference.reference", "uses no reference"),
    ({"data.response": "response_j"}, "data.response", "not a preference key"),
])
def test_inconsistent_preference_keys_are_exit_2_naming_the_key(tmp_path, cli, override, key, words):
    path = preference_campaign(tmp_path, short_pairs()[:4])
    args = [a for k, v in override.items() for a in ("--set", f"{k}={'null' if v is None else v}")]
    r = cli("validate", path, *args)
    assert r.code == 2, r.err
    assert key in r.err and words in r.err


def test_preference_keys_on_another_task_are_refused(tmp_path, cli):
    path = preference_campaign(tmp_path, short_pairs()[:4])
    r = cli("validate", path, "--set", "task=causal-lm", "--set", "preference.beta=0.2", "--set", "data.chosen=null",
            "--set", "data.rejected=null", "--set", "data.response=response_j")
    assert r.code == 2 and "preference.* is set but task is causal-lm" in r.err


# --- mechanics: the reference stays, the policy moves -------------------------------------------------------------
def test_overfit_memorises_pairs_and_the_reference_does_not_move(tmp_path):
    from pilotrun.rehearsal.mechanics.overfit import overfit

    path = preference_campaign(tmp_path, short_pairs(chars=48)[:8], data__max_length=96)
    r = overfit(load_campaign(path), tmp_path / "home", examples=4, max_updates=40, sized=False)
    assert r.verdict == "ok", r.messages
    text = "\n".join(r.messages)
    assert "the reward prefers the chosen answer of every pair" in text
    assert "preference accuracy 4/4 (1.00); mean reward margin +0 → +" in text
    assert "the reference did not move" in text


MOVING_REFERENCE = '''
from pilotrun.tasks.preference import PreferenceTask
from pilotrun.tasks.preference_loss import attach_reference


class SharedReference(PreferenceTask):
    """The defect: the "reference" is the policy itself, so it moves with every update."""

    def build_model(self):
        model = self.build_policy()
        model.__dict__["pilotrun_reference"] = model
        return model
'''


def test_a_reference_that_moves_with_the_policy_fails_overfit(tmp_path):
    from pilotrun.rehearsal.mechanics.overfit import overfit

    (tmp_path / "moving_reference.py").write_text(MOVING_REFERENCE)
    path = preference_campaign(tmp_path, short_pairs(chars=48)[:8], data__max_length=96,
                               task="moving_reference:SharedReference")
    r = overfit(load_campaign(path), tmp_path / "home", examples=2, max_updates=3, sized=False)
    assert r.verdict == "fail"
    assert r.summary.startswith("the reference moved")
    assert "its log-probability of the chosen answer of" in "\n".join(r.messages)


def test_a_restored_state_holds_the_trained_policy_and_the_starting_reference(tmp_path):
    import torch

    from pilotrun.campaign.prepare import prepare
    from pilotrun.engine.loop import Hooks, make_state, train
    from pilotrun.engine.state import load_state, save_state
    from pilotrun.tasks.preference_loss import reference_of

    prep = prepare(load_campaign(preference_campaign(tmp_path, short_pairs(chars=48)[:8], data__max_length=96)),
                   splits=("train",))
    start = prep.task.build_model()
    first = {k: v.clone() for k, v in start.state_dict().items()}
    state = make_state(start, prep.c.train, n_train=8, seed=0, total_updates=2)
    train(state, prep.task, prep.train, [], prep.c.train, hooks=Hooks(stop_at=2))
    save_state(state, tmp_path / "ckpt")
    fresh = prep.task.build_model()  # what a resumed process builds, then loads the checkpoint into
    load_state(make_state(fresh, prep.c.train, n_train=8, seed=0, total_updates=2), tmp_path / "ckpt")
    assert all(torch.equal(v, start.state_dict()[k]) for k, v in fresh.state_dict().items())  # the trained policy
    assert all(torch.equal(v, first[k]) for k, v in reference_of(fresh).state_dict().items())  # the starting model
    assert not all(torch.equal(v, first[k]) for k, v in fresh.state_dict().items())
    assert "pilotrun_reference" not in "".join(fresh.state_dict())  # never in a checkpoint


# --- memory: both models in the ledger, the estimate on the pilot's figures -------------------------------------------
def test_the_estimate_holds_the_reference_copy_from_load_and_the_options_table_knows_lora_drops_it(tmp_path):
    from pilotrun.probe.trace import trace
    from pilotrun.sheet.options import options_table
    from pilotrun.sheet.options_view import params_said

    loaded = load_campaign(preference_campaign(tmp_path, short_pairs(chars=48)[:8], data__max_length=64))
    load = trace(loaded, device="cpu")["rows"][0]
    assert load["inputs"]["reference"] == "copy"
    table = options_table(loaded, gpus=[])  # the campaign as written, and its LoRA variant
    ref = table["reference"]
    assert ref["kind"] == "copy" and ref["bytes"] == pytest.approx(4 * table["params"], rel=1e-3)  # fp32 copy
    assert load["parameters"] == pytest.approx(2 * ref["bytes"], rel=1e-3)  # the policy and its frozen copy
    assert "a frozen reference copy" in params_said(table) and "no longer resident" in table["meanings"]["lora"]


@pytest.mark.slow  # the pilot's phases on a tiny model: the real model's test (test_preference_real.py) is slower
def test_the_pilot_ledger_holds_both_models_and_the_estimate_matches_it_per_phase(tmp_path):
    from pilotrun.rehearsal.memory.estimate import estimate
    from pilotrun.rehearsal.memory.pilot import pilot

    train, validation = by_question(short_pairs(chars=96))
    loaded = load_campaign(preference_campaign(tmp_path, train, validation, data__max_length=128))
    result = pilot(loaded, tmp_path / "home")
    assert result.verdict == "ok", result.messages
    load = result.data["rows"][0]
    assert load["inputs"]["reference"] == "copy" and load["inputs"]["reference_params"] == load["inputs"]["params"]
    assert load["peak_allocated"] >= 2 * load["inputs"]["reference_bytes"]  # the policy and its frozen copy
    measured = {r["phase"]: r["peak_allocated"] for r in result.data["rows"]}
    predicted = {r["phase"]: r["peak_allocated"] for r in estimate(loaded, device="cpu").data["phases"]}
    off = {k: (predicted[k], v) for k, v in measured.items() if abs(predicted[k] - v) > 0.05 * v}
    assert not off, off


def test_the_time_plan_counts_both_halves_and_the_references_forward():
    from pilotrun.sheet.plan import flops_per_update
    from pilotrun.sheet.shape import padded_tokens
    from pilotrun.tasks.preference import PairExample

    pair = PairExample([1] * 10, [1] * 10, "a", meta={"rejected_ids": [1] * 14, "rejected_labels": [1] * 14})
    assert padded_tokens([[pair, pair]]) == 2 * 2 * 14  # two pairs, each two rows padded to the wider half
    n, t = 1000, 56
    assert flops_per_update(n, n, t, False, reference=True) - flops_per_update(n, n, t, False) == 2 * n * t
