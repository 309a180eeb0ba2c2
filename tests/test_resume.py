"""resume: the state saved at K, continued in a new process, compared update by update with the run that saved it."""

import json
import os
import re

from pilotrun.journal.store import Journal
from pilotrun.rehearsal.mechanics.resume import LOSS_RTOL, SKIP_ENV, first_difference


def test_clean_demo_resumes_exactly_across_epochs(cli, demo_campaign, tmp_path):
    r = cli("resume", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    res = r.json
    assert res["verdict"] == "ok" and res["data"]["exact"] is True
    assert set(res["data"]["restored"]) >= {"model", "optimizer", "scheduler", "rng", "sampler", "counters"}
    resumed = res["stages"][0]["rows"]
    assert [row["update"] for row in resumed] == [5, 6, 7, 8]
    assert all(row["loss"] == row["ref_loss"] and row["lr"] == row["ref_lr"] and row["same_examples"]
               for row in resumed)
    assert len({row["epoch"] for row in resumed}) > 1  # an epoch boundary after the resume
    run_dir = Journal(tmp_path / "home").run_dir(res["data"]["run_id"])
    worker = json.loads((run_dir / "resumed_history.json").read_text())
    assert worker["pid"] != os.getpid()  # a new interpreter did the resumed half
    assert (run_dir / "artifact" / "model" / "model.safetensors").is_file()
    # inside `all`, verify takes the most recent completed run of the campaign: this resume run's artifact
    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.all import STAGES
    from pilotrun.rehearsal.mechanics.verify import verify_latest

    names = [n for n, _ in STAGES]
    assert names.index("validate") < names.index("overfit") < names.index("resume") < names.index("verify") \
        < names.index("train")
    v = verify_latest(load_campaign(demo_campaign), tmp_path / "home")
    assert v.verdict == "ok", v.messages
    assert v.messages[0].startswith(f"verifying run {res['data']['run_id']} (kind resume)")


def test_scheduler_left_out_is_caught_by_the_lr(cli, demo_campaign, tmp_path, monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "scheduler")
    monkeypatch.setenv("PILOTRUN_FRESH", "cold")  # the cold interpreter's path, whatever zygote the session runs
    r = cli("resume", demo_campaign, "--home", tmp_path / "home", "--at", "3", "--set", "train.micro_batch=2", "--json")
    assert r.code == 1
    problem = r.json["data"]["problem"]
    assert re.search(r"^lr at update \d+ is [\d.e+-]+, reference [\d.e+-]+: scheduler state not restored$", problem), \
        problem
    assert r.json["summary"] == "scheduler state not restored"


def test_sampler_left_out_is_caught_by_the_data_order(cli, demo_campaign, tmp_path, monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "sampler")
    r = cli("resume", demo_campaign, "--home", tmp_path / "home", "--at", "3", "--set", "train.micro_batch=2", "--json")
    assert r.code == 1
    problem = r.json["data"]["problem"]
    assert problem.startswith("examples of update 4 differ from the reference")
    assert problem.endswith("sampler position not restored")


def _h(u, lr=1e-3, loss=2.0, ids=(("a:1",),), epoch=0):
    return {"update": u, "lr": lr, "loss": loss, "ids": [list(x) for x in ids], "epoch": epoch,
            "examples_seen": u, "finite": True}


def test_first_difference_names_the_component():
    ref = [_h(1), _h(2), _h(3, loss=1.5), _h(4, loss=1.2)]
    assert first_difference(ref, ref[2:], 2, exact=True) is None
    assert "optimizer state" in first_difference(ref, [_h(3, loss=1.5), _h(4, loss=1.3)], 2, exact=True)
    assert "model weights or RNG" in first_difference(ref, [_h(3, loss=1.6), _h(4, loss=1.2)], 2, exact=True)
    assert first_difference(ref, [_h(3, loss=1.5 * (1 + 1e-5)), _h(4, loss=1.2)], 2, exact=False) is None
    assert "counters not restored" in first_difference(ref, [_h(1), _h(2)], 2, exact=True)
    msg = first_difference(ref, [_h(3, lr=9.5e-5, loss=1.5), _h(4)], 2, exact=True)
    assert msg == "lr at update 3 is 9.5e-05, reference 1.0e-03: scheduler state not restored"


def test_a_resume_matched_within_tolerance_does_not_say_exactly():
    """bf16/fp16 or CUDA compare the loss within LOSS_RTOL, not bit for bit: the headline says so (an H200's
    `all` said "resumes exactly" of a CUDA resume), and an fp32 CPU resume still says "exactly"."""
    import torch

    from pilotrun.rehearsal.mechanics.resume import _Setting, _verdict

    ref = [_h(1), _h(2), _h(3, loss=1.5), _h(4, loss=1.2)]
    worker = {"history": [_h(3, loss=1.5 * (1 + 1e-5)), _h(4, loss=1.2)], "restored": ["model", "optimizer"]}
    for exact, headline in ((False, f"resumes with its loss within {LOSS_RTOL:g} relative at update 2 in a new process"),
                            (True, "resumes exactly at update 2 in a new process")):
        s = _Setting(n=8, per_epoch=4, per_update=2, ranks=1, at=2, total=4, device=torch.device("cpu"), exact=exact)
        r = _verdict("run-x", ref, worker, s, (), [], None, None)
        assert r.verdict == "ok" and r.summary == headline and r.data["exact"] is exact
