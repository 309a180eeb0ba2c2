"""The HF Trainer callback: a real Trainer on a tiny Llama writes ledger rows and a loss curve, on one
process and on two ranks (gloo)."""

from __future__ import annotations

import shlex
import sys

import pytest

import callback_workers as workers  # the tiny trainings, also run one per rank
from conftest import needs

pytestmark = needs("accelerate")


def _tiny_trainer(tmp_path, callback, **kwargs):
    return workers.tiny_hf_trainer(tmp_path, callback, **kwargs)


def test_trainer_run_records_phases_and_loss_curve(tmp_path, cli):
    from pilotrun.integrations.hf_trainer import PilotrunTrainerCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunTrainerCallback(home=home, name="tiny-llama")
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
        assert r["counter"] == "tensors+rss" and r["peak_allocated"] > 0 and r["end_allocated"] > 0
        assert r["peak_reserved"] > 0  # the process's RSS beside the exact tensor bytes
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
    assert {p["phase"] for p in r.json["data"]["phases"]} == set(by_phase) and r.json["data"]["train_updates"] == 4
    # this process's own command (pytest's, or a pytest-xdist worker's), not pilotrun's
    assert not run["command"].startswith("pilotrun") and run["command"].endswith(shlex.join(sys.orig_argv[1:])), \
        (run["command"], sys.orig_argv)
    human = cli("show", cb.run_id[:17], "--home", home)
    assert "training loss (4 updates logged): first " in human.out and "lowest" in human.out, human.out


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


def test_nan_in_trainer_makes_the_run_diverged(tmp_path, cli):
    """Embeddings poisoned with NaN after step 1: the Trainer's logging_nan_inf_filter keeps the NaN out of
    the logged loss, the gradient norm is NaN → the run is diverged at step 2, named in `show`."""
    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    _tiny_trainer(tmp_path, cb, steps=6, eval_steps=10, save_steps=10,
                  extra_callbacks=[workers.poison_hf_after(1)]).train()
    run = Journal(home).require_run(cb.run_id)
    assert run["status"] == "diverged"
    assert run["summary"]["reason"] == "gradient norm is nan at step 2"
    assert run["summary"]["updates"] == 2  # stopped there, not at max_steps 6

    keep_going = PilotrunCallback(home=home, stop_on_nan=False)
    _tiny_trainer(tmp_path / "on", keep_going, steps=4, eval_steps=10, save_steps=10,
                  extra_callbacks=[workers.poison_hf_after(1)]).train()
    run = Journal(home).require_run(keep_going.run_id)
    assert run["status"] == "diverged" and run["summary"]["updates"] == 4
    cli("env", "--json")
    r = cli("show", cb.run_id, "--home", home)
    assert r.code == 0, r.err
    assert "diverged" in r.out and "gradient norm is nan at step 2" in r.out


def test_clean_trainer_run_is_completed_without_reason(tmp_path):
    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    _tiny_trainer(tmp_path, cb, steps=2, eval_steps=10, save_steps=10).train()
    journal = Journal(home)
    run = journal.require_run(cb.run_id)
    assert run["status"] == "completed" and "reason" not in run["summary"]
    rows = journal.phase_rows(cb.run_id)
    assert all(r["verdict"] == "ok" for r in rows)
    assert run["summary"] == {"updates": 2, "phases": len(rows), "failing": 0}


@pytest.mark.distributed
def test_trainer_on_two_ranks_writes_one_run_and_rows_per_rank(tmp_path):
    """Two real processes (torchrun's environment, gloo), each a Trainer with the callback, one journal."""
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    ranks = workers.launch_ranks("hf", home, tmp_path / "out")
    run, per_rank = workers.one_run_of_two_ranks(ranks, home, "hf-trainer")
    journal = Journal(home)
    assert {phase for phase, _ in per_rank} == {"load", "first_step", "steady_step", "evaluation", "save"}
    for phase in ("load", "first_step", "steady_step"):
        assert [len(per_rank[(phase, rank)]) for rank in (0, 1)] == [1, 1], phase
    for rank in (0, 1):
        assert [r["inputs"]["step"] for r in per_rank[("evaluation", rank)]] == [2, 4]
        assert [r["inputs"]["step"] for r in per_rank[("save", rank)]] == [3, 4]  # save_steps=3, and the end
    loss = journal.metrics(run["run_id"], split="train", name="loss")
    assert [m["step"] for m in loss] == [1, 2, 3, 4] and all(m["value"] > 0 for m in loss)
    assert [m["step"] for m in journal.metrics(run["run_id"], split="validation", name="val_loss")] == [2, 4]
    # 4 updates of 4 examples × 2 accumulation × 2 ranks
    assert run["updates_done"] == 4 and run["examples_seen"] == 64


def test_an_exception_that_ends_the_process_ends_the_run_failed(tmp_path):
    """The Trainer has no exception hook: a crash in train() that ends the script must still end the run
    "failed" with the exception, not leave it "running" for ever."""
    import subprocess
    import sys

    from pilotrun.journal.store import Journal

    home, out = tmp_path / "home", tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, workers.__file__, "hf-crash", str(home), str(out)], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 1 and "planted crash at step 2" in proc.stderr  # the user's traceback is kept
    run = Journal(home).require_run((out / "run_id").read_text())
    assert run["status"] == "failed"
    assert run["summary"]["reason"] == "RuntimeError: planted crash at step 2"


def test_failed_records_a_crash_where_the_process_goes_on(tmp_path):
    from pilotrun.integrations.hf_trainer import PilotrunCallback
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    cb = PilotrunCallback(home=home)
    trainer = _tiny_trainer(tmp_path, cb, steps=4, eval_steps=10, save_steps=10,
                            extra_callbacks=[workers.raise_hf_at(2)])
    with pytest.raises(RuntimeError) as caught:
        trainer.train()
    cb.failed(caught.value)  # a notebook: the process lives on
    run = Journal(home).require_run(cb.run_id)
    assert run["status"] == "failed" and "planted crash at step 2" in run["summary"]["reason"]
