"""The HF Trainer callback: a real Trainer on a tiny Llama writes ledger rows and a loss curve."""

from __future__ import annotations

import pytest

pytest.importorskip("accelerate")


def _tiny_trainer(tmp_path, callback, *, steps=4, eval_steps=2, save_steps=3):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64))
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (24, 16), generator=g)]
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=4,
                             per_device_eval_batch_size=4, gradient_accumulation_steps=2, logging_steps=1,
                             eval_strategy="steps", eval_steps=eval_steps, save_strategy="steps",
                             save_steps=save_steps, report_to=[], use_cpu=True, learning_rate=1e-3, seed=0,
                             disable_tqdm=True)
    return Trainer(model=model, args=args, train_dataset=rows, eval_dataset=rows[:8], callbacks=[callback])


def test_trainer_run_records_phases_and_loss_curve(tmp_path, cli):
    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home, name="tiny-llama")
    _tiny_trainer(tmp_path, cb).train()

    journal = Journal(home)
    run = journal.require_run(cb.run_id)
    assert run["kind"] == "hf-trainer" and run["status"] == "completed"
    rows = journal.phase_rows(cb.run_id)
    by_phase = {}
    for r in rows:
        by_phase.setdefault(r["phase"], []).append(r)
    assert set(by_phase) == {"load", "first_step", "steady_step", "evaluation", "save"}
    assert len(by_phase["first_step"]) == len(by_phase["steady_step"]) == 1
    assert len(by_phase["evaluation"]) == 2  # steps 2 and 4
    for r in rows:
        assert r["verdict"] == "ok" and r["rank"] == 0
        assert r["counter"] == "rss" and r["peak_allocated"] > 0 and r["end_allocated"] > 0
        assert r["peak_reserved"] is None  # RSS has no reserved counter
        assert r["duration_s"] > 0
    assert by_phase["first_step"][0]["inputs"] == {"micro_batch": 4, "accumulation": 2, "step": 1}
    assert by_phase["steady_step"][0]["inputs"]["step"] == 2

    loss = journal.metrics(cb.run_id, split="train", name="loss")
    assert [m["step"] for m in loss] == [1, 2, 3, 4]
    assert all(m["value"] > 0 for m in loss)
    val = journal.metrics(cb.run_id, split="validation", name="val_loss")
    assert [m["step"] for m in val] == [2, 4]

    cli("env", "--json")  # drains the Trainer's own prints from the captured stdout
    r = cli("runs", "--home", home, "--kind", "hf-trainer", "--json")
    assert r.code == 0, r.err
    assert cb.run_id in r.out and '"hf-trainer"' in r.out
    r = cli("show", cb.run_id, "--home", home, "--json")
    assert r.code == 0, r.err
    assert {p["phase"] for p in r.json["phases"]} == set(by_phase) and r.json["train_updates"] == 4


def test_over_budget_phase_in_trainer(tmp_path):
    """A memory limit below what a step needs turns that row's verdict to over-budget, naming the phase."""
    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home, memory_limit=1024)
    _tiny_trainer(tmp_path, cb, steps=2, eval_steps=10, save_steps=10).train()
    rows = Journal(home).phase_rows(cb.run_id)
    first = next(r for r in rows if r["phase"] == "first_step")
    assert first["verdict"] == "over-budget"
    assert "above the limit" in first["note"] and "first_step" in first["note"]
