"""Mixtures of experts: the loss they train (the router's auxiliary loss), their LoRA defaults, and what the
options table says of them (expert parallelism, total and active parameters). The family matrix
(tests/test_architectures.py) loads, estimates and pilots each family."""

from __future__ import annotations

import pytest
from architectures import MOE, campaign, save_model
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign

QWEN3_MOE = {"model_type": "qwen3_moe", **MOE["qwen3_moe"], "num_hidden_layers": 2, "vocab_size": 384,
             "output_router_logits": True}


def _first_update(loaded) -> tuple[dict, object, dict]:
    """pilotrun's first update on the first micro-batch (accumulation 1), and transformers' own forward with labels
    on the same batch from the same weights (a second build under the campaign seed)."""
    import torch

    from pilotrun.campaign.prepare import prepare
    from pilotrun.engine.loop import make_state, run_update

    prep = prepare(loaded, splits=("train",))
    t = prep.c.train
    mb = prep.train[: t.micro_batch]
    state = make_state(prep.task.build_model(), t, n_train=len(prep.train), seed=prep.c.seed, total_updates=1)
    out = run_update(state, prep.task, [mb], max_grad_norm=t.max_grad_norm)
    batch = prep.task.collate(mb)
    with torch.no_grad():
        ref = prep.task.build_model()(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                       labels=batch["labels"])
    return out, ref, batch


@pytest.mark.parametrize("coef", [0.02, 0.5])
def test_the_router_aux_coefficient_moves_the_first_update_loss_as_transformers_forward_does(tmp_path, coef):
    """Qwen3-MoE with output_router_logits: the loss was the targets' cross-entropy whatever the coefficient (the
    same with the router logits on or off), while transformers' forward — so the HF Trainer, TRL, Axolotl — adds
    router_aux_loss_coef × aux. Now pilotrun's first update is transformers' loss, its part apart; with the router
    logits off neither adds it."""
    cfg = dict(QWEN3_MOE, router_aux_loss_coef=coef)
    on = load_campaign(tiny_causal_campaign(tmp_path / "on", simple_records(8), model__config=cfg,
                                            train__accumulation=1))
    out, ref, _ = _first_update(on)
    assert ref.aux_loss is not None
    assert out["loss"] == pytest.approx(float(ref.loss), rel=1e-6, abs=1e-6)
    assert out["loss_parts"]["router_aux"] == pytest.approx(coef * float(ref.aux_loss), rel=1e-5)
    off = load_campaign(tiny_causal_campaign(tmp_path / "off", simple_records(8),
                                             model__config=dict(cfg, output_router_logits=False),
                                             train__accumulation=1))
    plain, ref_off, _ = _first_update(off)
    assert "loss_parts" not in plain and plain["loss"] == pytest.approx(float(ref_off.loss), rel=1e-6)
    assert out["loss"] - plain["loss"] == pytest.approx(coef * float(ref.aux_loss), rel=1e-4)


def test_a_saved_mixtral_trains_its_router_loss_when_the_campaign_turns_the_router_logits_on(tmp_path):
    """A second instance, through a saved folder: Mixtral's config.json leaves output_router_logits off (as the
    published one does); model.config_overrides turns it on as Axolotl's model_config does, and the coefficient
    comes from config.json (0.02, set here to 0.1)."""
    folder = save_model(tmp_path / "mixtral", "mixtral", router_aux_loss_coef=0.1)
    loaded = load_campaign(campaign(tmp_path / "c", folder, seq_cls=False, train__accumulation=1,
                                    model__config_overrides={"output_router_logits": True}))
    out, ref, _ = _first_update(loaded)
    assert out["loss"] == pytest.approx(float(ref.loss), rel=1e-6)
    assert out["loss_parts"]["router_aux"] == pytest.approx(0.1 * float(ref.aux_loss), rel=1e-5)


# --- total and active parameters, expert parallelism: published models' numbers ---------------------------------
# the published config.json of Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1 (the keys that size them)
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                 "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 262144,
                 "rope_theta": 10000000, "router_aux_loss_coef": 0.001, "output_router_logits": False}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
                "vocab_size": 32000, "tie_word_embeddings": False, "max_position_embeddings": 32768,
                "rope_theta": 1e6, "router_aux_loss_coef": 0.02, "output_router_logits": False}
# what their model cards publish: (total, active) parameters
PUBLISHED = {"qwen3_moe": (30.5e9, 3.3e9), "mixtral": (46.7e9, 12.9e9)}


def _meta_counts(cfg: dict) -> tuple[int, dict]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pilotrun.tasks.moe import expert_counts

    cfg = dict(cfg)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    return sum(p.numel() for p in model.parameters()), expert_counts(model)


@pytest.mark.parametrize("cfg", [QWEN3_30B_A3B, MIXTRAL_8X7B], ids=["qwen3-30b-a3b", "mixtral-8x7b"])
def test_published_moe_total_and_active_parameters_size_memory_and_compute(cfg):
    """Memory holds every expert (the total), a token computes with its top_k (the active): a calculator that sizes
    memory by the active count (Qwen3-30B-A3B as a 3B model) or compute by the total (9× too slow) is caught."""
    from pilotrun.sheet import plan as P
    from pilotrun.sheet.catalogue import CATALOGUE
    from pilotrun.sheet.option_time import active_counts, campaign_seconds
    from pilotrun.tasks.moe import active

    total, e = _meta_counts(cfg)
    act = active(total, e["expert_params"], e["experts"], e["top_k"])
    want_total, want_active = PUBLISHED[cfg["model_type"]]
    assert total == pytest.approx(want_total, rel=0.01) and act == pytest.approx(want_active, rel=0.02)
    tr = {"params": total, "trainable": total, "param_bytes": 2 * total, "trainable_bytes": 2 * total,
          "gradient_checkpointing": False, **e}
    assert active_counts(tr) == (act, act)
    h100 = next(g for g in CATALOGUE if g.key == "h100-sxm")
    work = {"precision": "bf16-true", "tokens_update": 8 * 4096, "evals": 0, "eval_batches": 0, "updates": 1,
            "runs": 1, "tokens_val": 0}
    seconds, _ = campaign_seconds(h100, 1, tr, "single", False, False, work, 1)
    rate = h100.rate_tflops("bf16-true") * 1e12 * P.ASSUMED_MFU
    assert seconds == pytest.approx(P.flops_per_update(act, act, 8 * 4096, False) / rate)  # not the total's


def test_expert_parallel_divides_the_routed_experts_by_its_degree_and_the_rest_by_all_gpus():
    """Mixtral-8x7B on 2 nodes of 8 (16 GPUs), expert parallel ×8 + FSDP: a GPU holds 1 of 8 experts of every MoE
    layer (÷ 8) and 1/16 of everything else; the experts' optimizer state ÷ 16. Dividing the routed experts by the
    16 GPUs (or by a tensor-parallel degree, Megatron-Bridge#3744's bug) would halve their bytes."""
    from pilotrun.sheet.options import ep_degree, with_expert_parallel

    total, e = _meta_counts(MIXTRAL_8X7B)
    n, ep = 16, ep_degree(e["experts"], 16)
    assert ep == 8 and ep_degree(e["experts"], 4) == 4 and ep_degree(0, 8) is None
    p_bytes, x_bytes = 2 * total, 2 * e["expert_params"]
    tr = {"params": total, "trainable": total, "param_bytes": p_bytes, "trainable_bytes": p_bytes, **e,
          "expert_bytes": x_bytes, "expert_trainable_bytes": x_bytes,  # bf16 (the meta build counted fp32)
          "inputs": {"steady_step": {"micro_batch": 1, "seq_len": 4096}}}
    opt = 2 * 4 * total  # AdamW's two fp32 moments
    fsdp = {"phase": "save", "parameters": p_bytes / n, "gradients": p_bytes / n, "optimizer_state": opt / n,
            "activations": 0, "temporaries": 0, "baseline": 0, "peak_allocated": (2 * p_bytes + opt) / n,
            "end_allocated": (2 * p_bytes + opt) / n, "peak_reserved": None, "end_reserved": None}
    row = with_expert_parallel([fsdp], tr, n, ep, "bf16-true", 4096)[0]
    held = (p_bytes - x_bytes) / n + x_bytes / ep
    assert row["parameters"] == pytest.approx(held) and row["gradients"] == pytest.approx(held)
    assert row["peak_allocated"] == pytest.approx(2 * held + opt / n, rel=1e-9)
    assert row["parameters"] > 1.9 * p_bytes / n  # the experts ÷ 16 would be p_bytes / 16
    # in a step, the routing worst case: every token of the 8 GPUs of the EP group sent to this GPU's experts
    from pilotrun.sheet.options import expert_activation_bytes

    step = dict(fsdp, phase="steady_step")
    skewed = with_expert_parallel([step], tr, n, ep, "bf16-true", 4096)[0]
    own = expert_activation_bytes(tr, 4096, "bf16-true", 4096)  # 2 of 8 experts per token, 14336 wide: 32 layers
    assert own == 4096 * 2 * 32 * (2 * 4096 + 3 * 14336) * 2
    assert skewed["activations"] == pytest.approx(7 * own)
    block_experts = x_bytes / 32  # a layer's experts: never gathered with its block under EP
    assert skewed["peak_allocated"] == pytest.approx(row["peak_allocated"] + 7 * own - 2 * block_experts, rel=1e-9)


@pytest.mark.slow  # ~15 s: the options table of a 48-layer, 128-expert model traced from 2 and 3 layers
def test_estimate_options_on_qwen3_30b_a3b_from_config_json_alone(tmp_path, cache, cli):
    """The published Qwen3-30B-A3B config.json alone in the hub cache: the options table states total and active
    parameters and has expert-parallel rows (the routed experts ÷ EP, the routing worst case), with the words."""
    import json

    from conftest import write_jsonl
    from hubcache import config_json_only

    config_json_only(cache, "Qwen/Qwen3-30B-A3B", dict(QWEN3_30B_A3B, architectures=["Qwen3MoeForCausalLM"],
                                                         bos_token_id=151643, eos_token_id=151645))
    write_jsonl(tmp_path / "train.jsonl", simple_records(64))
    c = {"name": "qwen3-30b", "model": {"path": "Qwen/Qwen3-30B-A3B", "dtype": "bfloat16"},
         "data": {"train": "train.jsonl", "prompt": "instruction", "response": "output", "max_length": 2048},
         "train": {"micro_batch": 1, "accumulation": 8, "precision": "bf16-true", "updates": 50, "lr": 1e-5,
                   "save_every": None, "eval_every": 100}, "plan": {"seeds": [0]}}
    (tmp_path / "campaign.yaml").write_text(json.dumps(c))
    r = cli("estimate", tmp_path / "campaign.yaml", "--options", "--json", "--home", tmp_path / "home")
    assert r.code in (0, 1), r.err
    table = r.json["stages"][0]["data"]
    moe = table["moe"]
    assert moe["total"] == pytest.approx(30.5e9, rel=0.01) and moe["active"] == pytest.approx(3.3e9, rel=0.02)
    assert (moe["experts"], moe["top_k"], moe["moe_layers"]) == (128, 8, 48)
    ep = [x for x in table["rows"] if x["option"] == "ep_fsdp"]
    assert {x["ep"] for x in ep} == {2, 4, 8} and all(x["label"] == f"expert parallel ×{x['ep']} + FSDP" for x in ep)
    said = " ".join(r.json["stages"][0]["messages"])
    assert "30,532,122,624 parameters in total, 3,353,032,704 active per token" in said, said
    assert "time assumes balanced routing" in said and "routing worst case" in said


def test_axolotl_moe_keys_are_carried_or_named(tmp_path):
    """An Axolotl MoE config: model_config (the router's loss turned on, its coefficient) becomes
    model.config_overrides; expert_parallel_size (the EP plugin's), experts_implementation and unfrozen_parameters
    are named with what leaving them out does (the options table prices EP; the rehearsal trains every parameter)."""
    import yaml
    from conftest import write_jsonl

    from pilotrun.campaign.importers import import_config

    write_jsonl(tmp_path / "data" / "train.jsonl", [{"instruction": f"q{i}", "input": "", "output": f"a{i}"}
                                                    for i in range(8)])
    cfg = {"base_model": "Qwen/Qwen3-30B-A3B", "plugins": ["axolotl.integrations.expert_parallel.ExpertParallelPlugin"],
           "expert_parallel_size": 8, "experts_implementation": "grouped_mm",
           "model_config": {"output_router_logits": True, "router_aux_loss_coef": 0.005},
           "unfrozen_parameters": [r"model.layers.\d+.mlp.gate"],
           "datasets": [{"path": "data/train.jsonl", "type": "alpaca"}], "sequence_len": 1024,
           "micro_batch_size": 1, "gradient_accumulation_steps": 4, "num_epochs": 1, "learning_rate": 1e-5,
           "bf16": True}
    (tmp_path / "ax.yml").write_text(yaml.safe_dump(cfg))
    imp = import_config(tmp_path / "ax.yml", "axolotl", tmp_path / "campaign.yaml")
    assert imp.campaign["model"]["config_overrides"] == {"output_router_logits": True, "router_aux_loss_coef": 0.005}
    skipped = {n.key: n.reason for n in imp.not_carried}
    assert "`pilotrun estimate --options` prices expert parallel × FSDP rows" in skipped["expert_parallel_size"]
    assert "grouped_mm" in skipped["experts_implementation"]
    assert "trains them all" in skipped["unfrozen_parameters"]


@pytest.mark.parametrize("mode", ["balanced", "skewed"])
def test_forced_routing_sends_the_tokens_where_it_says(mode):
    """The pilot's routing cases: balanced gives every expert the same number of token slots, skewed sends every
    token to the same top-k experts (the worst dropless routing allows); the router's weights are kept."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from pilotrun.tasks.moe import forced_routing, moe_parts

    cfg = dict(QWEN3_MOE, output_router_logits=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    seen = []
    banks = moe_parts(model)[1]
    for name in banks:
        dict(model.named_modules())[name].register_forward_hook(lambda m, args, out: seen.append(args[1].clone()))
    with forced_routing(model, mode) as forced:
        model(input_ids=torch.arange(30).view(3, 10))
    assert forced == len(banks) == 2 and len(seen) == 2
    for index in seen:
        counts = torch.bincount(index.flatten(), minlength=4)
        if mode == "balanced":
            assert counts.max() - counts.min() <= 1 and all(len(set(row.tolist())) == 2 for row in index)
        else:
            assert counts.tolist() == [30, 30, 0, 0]


def test_the_sheet_sizes_a_step_for_the_worst_routing_the_pilot_measured():
    from pilotrun.probe.watch import routing_worst

    steady = {"phase": "steady_step", "baseline": 100, "peak_allocated": 150, "peak_reserved": 200, "inputs": {}}
    load = {"phase": "load", "baseline": 0, "peak_allocated": 100, "peak_reserved": 120, "inputs": {}}
    routing = {"balanced": {"peak_allocated": 40, "seconds": 1.0}, "skewed": {"peak_allocated": 70, "seconds": 2.0}}
    out = routing_worst([load, steady], routing)
    assert out[0] == load and out[1]["peak_allocated"] == 170 and out[1]["peak_reserved"] == 220
    assert out[1]["inputs"]["routing"] == "skewed (forced; +20 bytes)"
    assert routing_worst([load, steady], {"skewed": {"peak_allocated": 50, "seconds": 1}})[1] == steady
    # the worst validation batches too, when the pilot measured them under forced routing (older pilots did not)
    ev = {"phase": "eval_longest", "baseline": 100, "peak_allocated": 130, "peak_reserved": 150, "inputs": {}}
    routing["balanced"].update(eval_peak_allocated=45, eval_seconds=0.5)
    routing["skewed"].update(eval_peak_allocated=35, eval_seconds=0.5)
    out = routing_worst([load, steady, ev], routing)
    assert out[2]["peak_allocated"] == 145 and out[2]["inputs"]["routing"] == "balanced (forced; +15 bytes)"
    older = {m: {"peak_allocated": v["peak_allocated"], "seconds": v["seconds"]} for m, v in routing.items()}
    assert routing_worst([load, steady, ev], older)[2] == ev


def test_a_run_within_the_worst_routing_is_within_its_pilot():
    """A run is judged against the rows the sheet sizes with: an update that routed worse than the pilot's router
    did, but not beyond the routing the pilot forced, is within the bound; beyond it, a warning."""
    from pilotrun.probe.watch import bound_rows, routing_worst

    pilot = [{"phase": "steady_step", "rank": 0, "counter": "tensors+rss", "baseline": 100, "peak_allocated": 150,
              "inputs": {}},
             {"phase": "eval_longest", "rank": 0, "counter": "tensors+rss", "baseline": 100, "peak_allocated": 130,
              "inputs": {}}]
    routing = {"skewed": {"peak_allocated": 70, "seconds": 1.0, "eval_peak_allocated": 40, "eval_seconds": 0.5}}

    def observed(train: int, evaluation: int) -> list[dict]:
        return [{"phase": "train", "rank": 0, "counter": "tensors+rss", "peak_allocated": train, "inputs": {}},
                {"phase": "evaluation", "rank": 0, "counter": "tensors+rss", "peak_allocated": evaluation,
                 "inputs": {}}]

    _, within = bound_rows(observed(165, 138), routing_worst(pilot, routing), "p")
    assert not within["warnings"] and within["kinds"]["evaluation"]["pilot_peak"] == 140, within
    _, raw = bound_rows(observed(165, 138), pilot, "p")  # planted: judged against the router's own routing
    assert [w.split(":")[0] for w in raw["warnings"]] == ["train", "evaluation"], raw["warnings"]
    _, beyond = bound_rows(observed(171, 141), routing_worst(pilot, routing), "p")
    assert [w.split(":")[0] for w in beyond["warnings"]] == ["train", "evaluation"], beyond["warnings"]


def test_a_preference_campaign_on_a_mixture_of_experts_trains_the_router_loss_beside_the_pair_loss(tmp_path):
    """The preference task too (TRL's DPOTrainer adds router_aux_loss_coef × the policy forward's aux loss to its
    mean over pairs; it left it out): at the first update the policy is the reference, so the DPO loss of every
    pair is log 2, and the update's loss is log 2 + coef × aux of the concatenated forward; with the router logits
    off, log 2 alone."""
    import math

    from preference_data import bpe_tokenizer, preference_campaign, short_pairs

    tok = str(bpe_tokenizer(tmp_path / "tok"))
    for on in (True, False):
        cfg = dict(QWEN3_MOE, vocab_size=2048, router_aux_loss_coef=0.3, output_router_logits=on)
        loaded = load_campaign(preference_campaign(tmp_path / str(on), short_pairs(80)[:2], model={"config": cfg,
                               "tokenizer": tok}, data__max_length=256, train__accumulation=1))
        out, ref, _ = _first_update(loaded)
        if on:
            assert out["loss_parts"]["router_aux"] == pytest.approx(0.3 * float(ref.aux_loss), rel=1e-5)
            assert out["loss"] == pytest.approx(math.log(2) + 0.3 * float(ref.aux_loss), rel=1e-5)
        else:
            assert "loss_parts" not in out and out["loss"] == pytest.approx(math.log(2), rel=1e-5)


def test_a_validation_holds_nothing_of_its_previous_batch_through_the_next(tmp_path, cli):
    """A mixture of experts' loss hands back its router's auxiliary term beside the sum (``loss_parts``); a
    validation of several batches kept the previous batch's term alive through the next batch's forward, and the
    pilot's eval_longest, one batch of the longest, never did: a run's validation read 4 bytes over the pilot's
    (Mixtral on bench_promises' uneven campaign, 1.0000000624 ×). Here the validation records are all of one length,
    so every batch has the pilot's worst shape."""
    from conftest import write_jsonl

    from pilotrun.journal.store import Journal
    from pilotrun.probe.watch import routing_worst

    folder = save_model(tmp_path / "mixtral", "mixtral")
    path = campaign(tmp_path / "c", folder, seq_cls=False, train__eval_batch=2,
                    model__config_overrides={"output_router_logits": True})
    write_jsonl(tmp_path / "c" / "data" / "validation.jsonl",
                [{"id": i, "instruction": f"reverse the word number {i}", "output": f"{i} rebmun drow eht"}
                 for i in range(100, 108)])
    home = tmp_path / "home"
    pilot = cli("pilot", path, "--home", home, "--json")
    assert pilot.code == 0, pilot.err
    r = cli("train", path, "--home", home, "--json")
    assert r.code == 0, r.err
    journal = Journal(home)
    kinds = journal.get_run(r.json["data"]["run_id"])["summary"]["memory_bound"]["kinds"]
    ev = kinds["evaluation"]
    assert ev["counter"] == "tensors+rss" and ev["pilot_phase"] == "eval_longest"
    assert ev["ratio"] <= 1.0, ev

    # the router's choice moves with the data and the weights, so a run's update or validation can route the same
    # shapes worse than the pilot's router did: the pilot measures its worst validation batches under forced routing
    # as it does its worst update, the sheet sizes both phases for the highest, and a run is judged against the same
    # rows (on this tiny Mixtral every routing peaks alike, at the logits: the planted case is
    # test_a_run_within_the_worst_routing_is_within_its_pilot)
    run = journal.get_run(pilot.json["data"]["run_id"])
    routing = run["summary"]["time_model"]["routing"]
    assert set(routing) == {"balanced", "skewed"}
    assert all(v["eval_peak_allocated"] > 0 and v["eval_seconds"] > 0 for v in routing.values()), routing
    said = next(m for m in pilot.json["messages"] if m.startswith("routing (a mixture of experts)"))
    assert "the worst validation batches rose" in said and "the runs' memory bound take the highest" in said, said
    rows = journal.phase_rows(run["run_id"])
    raw = next(x for x in rows if x["phase"] == "eval_longest")
    worst = next(x for x in routing_worst(rows, routing) if x["phase"] == "eval_longest")
    rise = max(v["eval_peak_allocated"] for v in routing.values())
    assert worst["peak_allocated"] == max(raw["peak_allocated"], raw["baseline"] + rise)
    assert ev["pilot_peak"] == worst["peak_allocated"]
