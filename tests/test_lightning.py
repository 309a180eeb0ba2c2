"""The Lightning callback: a real Lightning Trainer on a tiny Llama writes ledger rows and a loss curve."""

from __future__ import annotations

import pytest

import callback_workers as workers  # the tiny trainings, also run one per rank
from conftest import needs

pytestmark = needs("lightning")


def _rows_by_phase(rows):
    by_phase = {}
    for r in rows:
        by_phase.setdefault(r["phase"], []).append(r)
    return by_phase


def test_lightning_run_records_phases_and_loss_curve(tmp_path, cli):
    from pilotrun.integrations.lightning import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home, name="tiny-llama")
    trainer = workers.fit_tiny(tmp_path, cb)
    assert trainer.global_step == 4

    journal = Journal(home)
    run = journal.require_run(cb.run_id)
    assert run["kind"] == "lightning" and run["status"] == "completed"
    assert run["config"]["accumulate_grad_batches"] == 2 and run["config"]["hparams"]["lr"] == 1e-3
    assert run["seed"] == 0 and run["updates_done"] == 4 and run["examples_seen"] == 4 * 2 * 4
    rows = journal.phase_rows(cb.run_id)
    by_phase = _rows_by_phase(rows)
    assert set(by_phase) == {"load", "first_step", "steady_step", "evaluation", "save"}
    assert len(by_phase["load"]) == len(by_phase["first_step"]) == len(by_phase["steady_step"]) == 1
    # the sanity check, then after updates 2 and 4 (val_check_interval=4 micro-batches)
    assert [r["inputs"] for r in by_phase["evaluation"]] == [
        {"eval_batch": 4, "step": 0, "sanity_check": True}, {"eval_batch": 4, "step": 2},
        {"eval_batch": 4, "step": 4}]
    assert [r["inputs"] for r in by_phase["save"]] == [{"step": 3}]  # ModelCheckpoint(every_n_train_steps=3)
    for r in rows:
        assert r["verdict"] == "ok" and r["rank"] == 0 and r["note"] is None
        assert r["counter"] == "tensors+rss" and r["peak_allocated"] > 0 and r["end_allocated"] > 0
        assert r["peak_reserved"] > 0  # the process's RSS beside the exact tensor bytes
        assert r["duration_s"] > 0
    # a whole optimizer update: 2 micro-batches of 4
    assert by_phase["first_step"][0]["inputs"] == {"micro_batch": 4, "accumulation": 2, "step": 1}
    assert by_phase["steady_step"][0]["inputs"]["step"] == 2
    assert by_phase["load"][0]["inputs"] == {"model": "TinyCausalLM"}
    assert list((tmp_path / "ckpt").glob("*.ckpt"))

    loss = journal.metrics(cb.run_id, split="train", name="loss")
    assert [m["step"] for m in loss] == [1, 2, 3, 4]
    # the mean of the update's micro-batch losses, as the module computed them
    assert [m["value"] for m in loss] == pytest.approx(trainer.lightning_module.update_losses([2, 2, 2, 2]), rel=1e-6)
    assert [m["value"] for m in journal.metrics(cb.run_id, split="train", name="lr")] == [1e-3] * 4
    val = journal.metrics(cb.run_id, split="validation", name="val_loss")
    assert [m["step"] for m in val] == [2, 4] and all(m["value"] > 0 for m in val)

    cli("env", "--json")  # drains Lightning's own prints from the captured stdout
    r = cli("runs", "--home", home, "--kind", "lightning", "--json")
    assert r.code == 0, r.err
    assert [x["run_id"] for x in r.json["data"]["runs"]] == [cb.run_id] and r.json["data"]["runs"][0]["status"] == "completed"
    r = cli("show", cb.run_id, "--home", home, "--json")
    assert r.code == 0, r.err
    assert {p["phase"] for p in r.json["data"]["phases"]} == set(by_phase) and r.json["data"]["train_updates"] == 4
    r = cli("show", cb.run_id, "--home", home)
    assert r.code == 0, r.err
    assert "lightning" in r.out and "first_step" in r.out and "steady_step" in r.out


def test_short_update_at_an_epochs_end(tmp_path):
    """12 rows in micro-batches of 4 with accumulate_grad_batches=2: update 2 is the epoch's last batch alone.
    steady_step covers that one micro-batch and says so; its loss is that micro-batch's, not halved."""
    from pilotrun.integrations.lightning import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    trainer = workers.fit_tiny(tmp_path, cb, steps=3, rows=12)
    journal = Journal(home)
    rows = journal.phase_rows(cb.run_id)
    steady = next(r for r in rows if r["phase"] == "steady_step")
    assert steady["inputs"] == {"micro_batch": 4, "accumulation": 2, "step": 2, "micro_batches": 1}
    assert next(r for r in rows if r["phase"] == "first_step")["inputs"] == {"micro_batch": 4, "accumulation": 2,
                                                                            "step": 1}
    loss = [m["value"] for m in journal.metrics(cb.run_id, split="train", name="loss")]
    assert loss == pytest.approx(trainer.lightning_module.update_losses([2, 1, 2]), rel=1e-6)
    assert journal.require_run(cb.run_id)["examples_seen"] == 12 + 8


def test_nan_loss_in_lightning_marks_the_step_and_the_run(tmp_path, cli):
    """Weights poisoned with NaN after update 1: update 2's loss is NaN → steady_step's verdict nan,
    the run diverged at step 2."""
    from pilotrun.integrations.lightning import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    trainer = workers.fit_tiny(tmp_path, cb, steps=6, poison_after=1)
    journal = Journal(home)
    run = journal.require_run(cb.run_id)
    assert run["status"] == "diverged"
    assert run["summary"]["reason"] == "training loss is nan at step 2"
    assert trainer.global_step == 2 and run["summary"]["updates"] == 2  # stopped there, not at max_steps 6
    by_phase = _rows_by_phase(journal.phase_rows(cb.run_id))
    assert by_phase["first_step"][0]["verdict"] == "ok"
    steady = by_phase["steady_step"][0]
    assert steady["verdict"] == "nan" and steady["note"] == "training loss is nan at step 2"
    cli("env", "--json")
    r = cli("show", cb.run_id, "--home", home, "--json")
    assert r.code == 0, r.err
    assert r.json["data"]["run"]["status"] == "diverged" and "nan at step 2" in r.json["data"]["run"]["summary"]["reason"]
    r = cli("show", cb.run_id, "--home", home)  # the NaN val_loss (NULL in SQLite) renders as nan
    assert r.code == 0, r.err
    assert "diverged" in r.out and "training loss is nan at step 2" in r.out and "2: nan" in r.out


def test_over_budget_phase_in_lightning(tmp_path):
    """A memory limit below what a step needs turns that row's verdict to over-budget, naming the phase."""
    from pilotrun.integrations.lightning import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home, memory_limit=1024)
    workers.fit_tiny(tmp_path, cb, steps=2)
    rows = Journal(home).phase_rows(cb.run_id)
    first = next(r for r in rows if r["phase"] == "first_step")
    assert first["verdict"] == "over-budget"
    assert "above the limit" in first["note"] and "first_step" in first["note"]
    assert Journal(home).require_run(cb.run_id)["summary"]["failing"] == len(rows)


def test_error_in_fit_fails_the_run(tmp_path):
    """A training_step that raises: the open step row has verdict error, the run is failed with the reason."""
    from pilotrun.integrations.lightning import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    with pytest.raises(RuntimeError, match="planted failure"):
        workers.fit_tiny(tmp_path, cb, steps=3, raise_at=2)
    journal = Journal(home)
    run = journal.require_run(cb.run_id)
    assert run["status"] == "failed" and "planted failure" in run["summary"]["reason"]
    steady = next(r for r in journal.phase_rows(cb.run_id) if r["phase"] == "steady_step")
    assert steady["verdict"] == "error" and "planted failure" in steady["note"]


@pytest.mark.distributed
def test_lightning_ddp_on_two_ranks_writes_one_run_and_rows_per_rank(tmp_path):
    """Two real processes with torchrun's environment: Lightning's DDP (gloo on CPU) joins them instead of
    spawning its own; one journal, one run, one row per phase per rank, the loss averaged over ranks."""
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    ranks = workers.launch_ranks("lightning", home, tmp_path / "out")
    run, per_rank = workers.one_run_of_two_ranks(ranks, home, "lightning")
    journal = Journal(home)
    assert run["config"]["world_size"] == 2 and run["config"]["strategy"] == "DDPStrategy"
    for phase, n in (("load", 1), ("first_step", 1), ("steady_step", 1), ("evaluation", 3), ("save", 1)):
        assert [len(per_rank[(phase, rank)]) for rank in (0, 1)] == [n, n], phase
    loss = journal.metrics(run["run_id"], split="train", name="loss")
    assert [m["step"] for m in loss] == [1, 2, 3, 4]
    # each update's loss is the mean over both ranks' micro-batches (they differ: each rank has its own shard)
    assert ranks[0]["update_losses"] != ranks[1]["update_losses"]
    assert [m["value"] for m in loss] == pytest.approx(
        [(a + b) / 2 for a, b in zip(ranks[0]["update_losses"], ranks[1]["update_losses"])], rel=1e-6)
    assert [m["step"] for m in journal.metrics(run["run_id"], split="validation", name="val_loss")] == [2, 4]
    assert run["updates_done"] == 4 and run["examples_seen"] == 4 * 2 * 4 * 2
