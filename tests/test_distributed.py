"""Real torch.distributed over gloo, 2 processes: the launcher, DDP's update arithmetic, rank-0 saving,
rank-aware phase rows. (The pilot's 2 × 7 rows are in test_pilot.py.)"""

import json
from pathlib import Path

import pytest
import torch
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.errors import BadInput

pytestmark = pytest.mark.distributed


def _examples(prep):
    return prep.train[:8]


def _rank_work(campaign_path: str, out: str, home: str, run_id: str) -> None:
    """One rank (module level: it is pickled into spawned processes)."""
    import torch.distributed as dist

    from pilotrun.engine.distributed import gather_to_rank0, world_rank, wrap_model
    from pilotrun.engine.loop import make_state, run_update
    from pilotrun.engine.state import save_state
    from pilotrun.probe.recorder import phase
    from pilotrun.campaign.prepare import prepare

    world, rank = world_rank()
    prep = prepare(load_campaign(campaign_path), splits=("train",))
    torch.manual_seed(0)
    model = wrap_model(prep.task.build_model(), "ddp", torch.device("cpu"))
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=0, total_updates=4,
                       device=torch.device("cpu"))
    mine = _examples(prep)[rank * 4:(rank + 1) * 4]  # this rank's half of one update of 8
    with phase("first_step", {"examples": len(mine)}, journal=home, run_id=run_id):
        result = run_update(state, prep.task, [mine[:2], mine[2:]], max_grad_norm=None)
    save_state(state, Path(out) / "ckpt")
    gathered = gather_to_rank0({"rank": rank, "world": world, "loss": result["loss"],
                                "backend": dist.get_backend()})
    if rank == 0:
        (Path(out) / "ranks.json").write_text(json.dumps(gathered))


def test_two_ranks_equal_one_process_with_the_whole_update(tmp_path):
    from safetensors.torch import load_file

    from pilotrun.engine.distributed import launch
    from pilotrun.engine.loop import make_state, run_update
    from pilotrun.engine.state import is_complete
    from pilotrun.journal import Journal
    from pilotrun.probe.recorder import own_run
    from pilotrun.campaign.prepare import prepare

    # lengths differ across examples, so a per-rank mean would not equal the global token mean
    records = [{"instruction": "x" * (3 + 5 * i), "output": "y" * (1 + 3 * i)} for i in range(8)]
    path = tiny_causal_campaign(tmp_path / "c", records, train__strategy="ddp", train__nproc=2, train__micro_batch=2,
                                train__accumulation=2, train__optimizer="sgd", train__lr=0.5)
    home = tmp_path / "home"
    with own_run(home, name="ddp-check") as run:
        launch(_rank_work, 2, (str(path), str(tmp_path), str(home), run.run_id))
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world"] for r in ranks} == {2}
    assert {r["backend"] for r in ranks} == {"gloo"}

    prep = prepare(load_campaign(path), splits=("train",))
    torch.manual_seed(0)
    model = prep.task.build_model()
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=0, total_updates=4,
                       device=torch.device("cpu"))
    ex = _examples(prep)
    single = run_update(state, prep.task, [ex[0:2], ex[2:4], ex[4:6], ex[6:8]], max_grad_norm=None)
    assert ranks[0]["loss"] == pytest.approx(single["loss"], rel=1e-6)
    assert ranks[1]["loss"] == pytest.approx(single["loss"], rel=1e-6)

    ckpt = tmp_path / "ckpt"
    assert is_complete(ckpt)
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # rank 1 wrote nothing beside it
    saved = load_file(str(ckpt / "model.safetensors"))
    for name, p in model.state_dict().items():
        assert torch.allclose(saved[name], p, atol=1e-6), name

    rows = Journal(home).phase_rows(run.run_id)
    assert sorted(r["rank"] for r in rows) == [0, 1]
    assert all(r["phase"] == "first_step" and r["verdict"] == "ok" and r["inputs"] == {"examples": 4}
               for r in rows)


def test_a_failing_rank_makes_launch_raise(tmp_path):
    from pilotrun.engine.distributed import launch

    with pytest.raises(Exception, match="rank 1 failed on purpose"):
        launch(_fail_on_rank1, 2)


def _fail_on_rank1() -> None:
    from pilotrun.engine.distributed import world_rank

    if world_rank()[1] == 1:
        raise RuntimeError("rank 1 failed on purpose")


def _register_finaliser(out: str) -> None:
    import atexit

    from pilotrun.engine.distributed import world_rank

    rank = world_rank()[1]
    Path(out, f"worked-{rank}").write_text("done")
    atexit.register(lambda: Path(out, f"finalised-{rank}").write_text("the interpreter finalised"))


def test_a_finished_rank_leaves_without_the_interpreters_finalisation(tmp_path):
    """Gloo's threads can abort interpreter finalisation (SIGABRT after the work is done, about 1 launch
    in 8 here): a rank that finished must end through exit_rank, which skips it, with its work kept."""
    from pilotrun.engine.distributed import launch

    launch(_register_finaliser, 2, (str(tmp_path),))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["worked-0", "worked-1"]


def test_pilot_under_torchrun_makes_one_run_with_both_ranks(tmp_path):
    import subprocess
    import sys

    from pilotrun.engine.distributed import free_port
    from pilotrun.journal import Journal
    from pilotrun.phases import phases_of

    path = tiny_causal_campaign(tmp_path, simple_records(16), simple_records(8, 50), train__strategy="ddp",
                                train__nproc=2)
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), "--log-dir", str(tmp_path / "torchrun-logs"),  # not in TMPDIR
                           "-m", "pilotrun", "pilot", str(path), "--home", str(home)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = Journal(home).list_runs(kind="pilot")  # one run, owned by rank 0, not one per rank
    rows = Journal(home).phase_rows(run["run_id"])
    phases = phases_of(load_campaign(path).campaign)
    assert sorted((r["phase"], r["rank"]) for r in rows) == sorted((p, k) for p in phases for k in (0, 1))
    assert all(r["verdict"] == "ok" and r["inputs"].get("ranks", 2) == 2 for r in rows)


def test_train_on_two_ranks_is_the_run_the_arithmetic_describes(tmp_path, cli):
    """`train` with ddp × 2 spawns two ranks into one run: each update takes micro_batch × accumulation × 2
    examples, so its loss curve is that of one process accumulating twice as many micro-batches."""
    from pilotrun.engine.state import is_complete
    from pilotrun.journal import Journal

    records = [{"instruction": "x" * (3 + 5 * (i % 7)), "output": "y" * (1 + 3 * (i % 5))} for i in range(24)]
    common = dict(train__micro_batch=2, train__updates=3, train__eval_every=3, train__optimizer="sgd", train__lr=0.5)
    two = tiny_causal_campaign(tmp_path / "two", records, records[:6], train__strategy="ddp", train__nproc=2,
                               train__accumulation=2, **common)
    one = tiny_causal_campaign(tmp_path / "one", records, records[:6], train__accumulation=4, **common)
    home = tmp_path / "home"
    r2 = cli("train", str(two), "--home", str(home), "--json")
    assert r2.code == 0, r2.err
    r1 = cli("train", str(one), "--home", str(home), "--json")
    assert r1.code == 0, r1.err
    journal = Journal(home)
    run2, run1 = journal.get_run(r2.json["data"]["run_id"]), journal.get_run(r1.json["data"]["run_id"])
    assert run2["status"] == run1["status"] == "completed"
    assert run2["summary"]["ranks"] == 2 and run2["summary"]["examples_seen"] == 3 * 2 * 2 * 2
    assert run2["summary"]["examples_seen"] == run1["summary"]["examples_seen"]
    loss2 = [m["value"] for m in journal.metrics(run2["run_id"], "train", "loss")]
    loss1 = [m["value"] for m in journal.metrics(run1["run_id"], "train", "loss")]
    assert len(loss2) == 3 and loss2 == pytest.approx(loss1, rel=1e-5)
    val2 = [m["value"] for m in journal.metrics(run2["run_id"], "validation", "val_loss")]
    val1 = [m["value"] for m in journal.metrics(run1["run_id"], "validation", "val_loss")]
    assert val2 == pytest.approx(val1, rel=1e-5)

    run_dir = Path(r2.json["data"]["run_dir"])
    assert is_complete(run_dir / "checkpoints" / "final") and (run_dir / "artifact").is_dir()
    assert r2.json["data"]["control_predictions"] > 0
    observed = [r for r in journal.phase_rows(run2["run_id"]) if r["phase"].startswith("observed_")]
    assert {r["rank"] for r in observed} == {0, 1}  # both ranks' peaks, gathered by rank 0
    assert any("on 2 ranks" in m for m in r2.json["messages"])


@pytest.mark.slow  # the torchrun launch is test_pilot_under_torchrun's, two ranks training test_train_on_two_ranks'
def test_train_under_torchrun_makes_one_run_of_two_ranks(tmp_path):
    import subprocess
    import sys

    from pilotrun.engine.distributed import free_port
    from pilotrun.journal import Journal

    path = tiny_causal_campaign(tmp_path, simple_records(16), simple_records(4, 50), train__strategy="ddp",
                                train__nproc=2, train__updates=2, train__eval_every=2)
    home = tmp_path / "home"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                           str(free_port()), "--log-dir", str(tmp_path / "torchrun-logs"),  # not in TMPDIR
                           "-m", "pilotrun", "train", str(path), "--home", str(home)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run,) = Journal(home).list_runs(kind="train")  # rank 1 joined rank 0's run
    assert run["status"] == "completed" and run["summary"]["examples_seen"] == 2 * 2 * 2 * 2
    assert {r["rank"] for r in Journal(home).phase_rows(run["run_id"])} == {0, 1}


def test_a_model_that_cannot_be_built_stops_a_two_rank_train_before_any_run(tmp_path, cli):
    path = tiny_causal_campaign(tmp_path, simple_records(16), train__strategy="ddp", train__nproc=2,
                                model__config=dict(TINY_LLAMA, vocab_size=100))
    r = cli("train", str(path), "--home", str(tmp_path / "home"))
    assert r.code == 2 and "the model's embedding has 100 rows" in r.err
    assert not (tmp_path / "home" / "runs").exists()


@pytest.mark.parametrize("env, said", [
    ({"WORLD_SIZE": "2", "RANK": "1"}, "$WORLD_SIZE=2 and $RANK=1 are set, as torchrun sets them for each rank, but "
                                       "$MASTER_ADDR and $MASTER_PORT not"),
    ({"WORLD_SIZE": "x"}, "$WORLD_SIZE='x' is not a whole number"),
    ({"WORLD_SIZE": "2", "RANK": "7", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
     "$RANK=7 is not a rank of $WORLD_SIZE=2 (0 to 1)"),
], ids=["no-rendezvous", "not-a-number", "rank-past-world"])
def test_launcher_variables_left_in_a_shell_are_exit_2_naming_them(tmp_path, cli, monkeypatch, env, said):
    # WORLD_SIZE and RANK exported by hand (or left from a job script) with no torchrun: exit 3 inside torch
    # ("MASTER_ADDR expected, but not set"), and WORLD_SIZE=x a ValueError, in train, pilot, resume and sweep
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, start=100), train__updates=1)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and said in r.err and "env -u WORLD_SIZE -u RANK" in r.err, (r.code, r.err)
    assert "Traceback" not in r.err and not torch.distributed.is_initialized()
    for k in env:
        monkeypatch.delenv(k)
    monkeypatch.setenv("RANK", "5")  # RANK alone (no world of several): a process of its own, as before
    assert cli("train", path, "--home", tmp_path / "home").code == 0
