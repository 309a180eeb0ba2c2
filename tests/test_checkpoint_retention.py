"""Resource bounds and disk: train.keep_checkpoints keeps the last N numbered checkpoints plus the best by
plan.metric (resume stays exact), the batch arithmetic says how many checkpoints a run keeps and, after a
pilot, how much disk they take; train.nproc beyond this machine's cores is exit 2 before any process starts."""

from __future__ import annotations

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.engine.state import is_complete, kept_checkpoints, numbered_checkpoints
from pilotrun.journal.store import Journal


@pytest.mark.parametrize("goal", ["minimize", pytest.param("maximize", marks=pytest.mark.slow)])
def test_keep_checkpoints_keeps_the_last_n_and_the_best(cli, tmp_path, goal):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), simple_records(6, 100), train__updates=8,
                                train__save_every=2, train__eval_every=2, train__keep_checkpoints=1,
                                plan__goal=goal, plan__metric="val_loss")
    home = tmp_path / "home"
    r = cli("train", path, "--home", home)
    assert r.code == 0, r.err
    journal = Journal(home)
    (run,) = journal.list_runs()
    vals = {m["step"]: m["value"] for m in journal.metrics(run["run_id"], "validation", "val_loss")}
    saved = [2, 4, 6, 8]
    best = (min if goal == "minimize" else max)(saved, key=lambda u: vals[u])
    ckpts = home / "runs" / run["run_id"] / "checkpoints"
    on_disk = sorted(p.name for p in ckpts.iterdir())
    assert on_disk == sorted({"final", "update-000008", f"update-{best:06d}"})
    assert all(is_complete(ckpts / n) for n in on_disk)
    assert [p.name for p in kept_checkpoints(ckpts, 1, best)] == [p.name for p in numbered_checkpoints(ckpts)]


def test_keep_checkpoints_null_keeps_all_and_the_arithmetic_says_so(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), train__updates=6, train__save_every=2)
    r = cli("validate", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    assert "checkpoints: 3 saved (train.save_every), all kept (train.keep_checkpoints: null), plus final" in r.out
    assert "their size: `pilotrun pilot` measures one (its save row)" in r.out
    r = cli("train", path, "--home", tmp_path / "home")
    (run,) = Journal(tmp_path / "home").list_runs()
    names = sorted(p.name for p in (tmp_path / "home" / "runs" / run["run_id"] / "checkpoints").iterdir())
    assert names == ["final", "update-000002", "update-000004", "update-000006"]


def test_the_arithmetic_sizes_the_kept_checkpoints_from_the_pilots_save_row(cli, tmp_path):
    from pilotrun.campaign.load import load_campaign as load
    from pilotrun.journal.runs import create_run

    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), train__updates=100, train__save_every=10,
                                train__keep_checkpoints=3)
    home = tmp_path / "home"
    loaded = load(path)
    journal = Journal(home)
    pilot = create_run(journal, kind="pilot", name=loaded.campaign.name, config=loaded.resolved_dict())
    journal.add_phase_rows(pilot, [{"phase": "save", "rank": 0, "verdict": "ok", "inputs": {"bytes": 3 * 2**20}}])
    journal.finish_run(pilot, "completed")
    r = cli("validate", path, "--home", home)
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if "checkpoints:" in x)
    # update 100 is saved, so final stands for it (a reference): no fifth copy on disk
    assert ("checkpoints: 10 saved (train.save_every), at most 4 kept (the last 3, train.keep_checkpoints, and the "
            "best by plan.metric), plus final (a reference to the last one saved, no second copy); 4 × 3.0 MiB (the "
            "pilot's save row) = 12.0 MiB on disk per run") in line
    # a last update no save falls on: final is a copy of its own, one more checkpoint's disk
    r = cli("validate", path, "--home", home, "--set", "train.updates=105")
    assert r.code == 0, r.err
    line = next(x for x in r.out.splitlines() if "checkpoints:" in x)
    assert ("checkpoints: 10 saved (train.save_every), at most 4 kept (the last 3, train.keep_checkpoints, and the "
            "best by plan.metric), plus final; 5 × 3.0 MiB (the pilot's save row) = 15.0 MiB on disk per run") in line


@pytest.mark.parametrize("extra", [1, 5000])
def test_nproc_beyond_the_cores_is_exit_2_before_any_process(cli, tmp_path, extra):
    from pilotrun.engine.distributed import usable_cores

    cores = usable_cores()
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), train__strategy="ddp", train__nproc=cores + extra,
                                train__micro_batch=1, train__accumulation=1)
    for verb in ("train", "sweep", "pilot"):
        r = cli(verb, path, "--home", tmp_path / "home")
        assert r.code == 2, (verb, r.err)
        assert f"train.nproc: train.nproc={cores + extra} but this machine has {cores} CPU cores" in r.err
        assert f"set train.nproc={cores} or fewer" in r.err
    home = tmp_path / "home"
    assert not (home / "journal.sqlite").exists() or not Journal(home).list_runs()


@pytest.mark.slow
def test_resume_stays_exact_with_keep_checkpoints(cli, demo_campaign, tmp_path):
    r = cli("resume", demo_campaign, "--home", tmp_path / "home", "--set", "train.keep_checkpoints=1",
            "--set", "train.save_every=1", "--json")
    assert r.code == 0, r.err
    assert r.json["verdict"] == "ok"
