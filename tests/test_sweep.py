"""sweep: arms × seeds through the one loop, a frozen plan, refused side effects, kept failures, --continue."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time

import pytest
import yaml

from conftest import run_cli_process, write_campaign


def _plan(demo_dir, control, variants, seeds, **train):
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control=control, variants=variants, seeds=seeds)
    c["train"].update(train)
    return write_campaign(demo_dir, c)


def _runs(home, sweep_id):
    from pilotrun.journal.store import Journal

    return Journal(home).list_runs(sweep_id=sweep_id)


def test_three_learning_rates_two_seeds_with_an_absurd_one(demo_dir, cli):
    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [{"train.lr": 1e-3}, {"train.lr": 1e3}], [0, 1],
                     updates=8, eval_every=4)
    home = demo_dir / "home"
    r = cli("sweep", campaign, "--home", home, "--json")
    assert r.code == 0, r.err[-3000:]
    data = r.json
    assert data["verdict"] == "warn" and "2 diverged" in data["summary"]
    for col in ("arm", "overrides", "at_budget", "vs_control", "verdict"):
        assert col in r.err  # the comparison table is printed
    assert "train.lr=1000.0" in r.err
    import re

    # the campaign-wide progress: each run announced before it starts, with the time left once one ran
    assert "run 1/6: control seed 0" in r.err and re.search(r"run \d/6: variant train.lr=1000.0 seed 1", r.err)
    assert re.search(r"run 6/6: .* about .* left for the sweep", r.err), r.err[-3000:]
    sweep_id = data["data"]["sweep_id"]
    runs = _runs(home, sweep_id)
    assert len(runs) == 6 and len({x["run_id"] for x in runs}) == 6
    assert {(x["arm"], x["seed"]) for x in runs} == {(a, s) for a in ("control", "variant-1", "variant-2")
                                                      for s in (0, 1)}
    assert all(x["kind"] == "sweep" for x in runs)
    from pilotrun.journal.store import Journal

    j = Journal(home)
    for x in runs:
        assert json.loads(json.dumps(x["config"]))["seed"] == x["seed"]
        n_val = len((demo_dir / "data" / "validation.jsonl").read_text().splitlines())
        assert len(j.predictions(x["run_id"], "validation")) == n_val  # every validation example
        assert j.metrics(x["run_id"], "train", "loss")  # the curve is kept, diverged or not
    absurd = [x for x in runs if x["arm"] == "variant-2"]
    assert all(x["status"] == "diverged" for x in absurd)
    assert all("diverge_factor" in x["summary"]["reason"] or "loss is" in x["summary"]["reason"] for x in absurd)
    assert all(x["config"]["train"]["lr"] == 1000.0 for x in absurd)
    assert all(x["status"] == "completed" for x in runs if x["arm"] != "variant-2")
    comp = {c["arm"]: c for c in data["data"]["comparison"]}
    assert comp["variant-2"]["diverged"] == 2 and comp["variant-2"]["verdict"] == "worse"
    assert "2 of 2 seeds diverged" in comp["variant-2"]["why"]
    assert len(comp["variant-2"]["per_seed"]) == 2  # kept in the table, not dropped
    assert comp["control"]["at_budget"]["n"] == 2 and comp["control"]["at_budget"]["lo"] is not None
    assert comp["variant-1"]["diff"]["seeds"] == [0, 1]
    # the frozen plan: budget, batch, eval_every, stop rules, metric, arms and seeds, with its sha256
    frozen = j.get_sweep(sweep_id)
    plan = frozen["plan"]
    assert plan["budget"] == {"updates": 8, "epochs": None} and plan["eval_every"] == 4
    assert plan["effective_batch"]["examples_per_update"] == 8 and plan["seeds"] == [0, 1]
    assert [a["overrides"] for a in plan["arms"]] == [{"train.lr": 3e-3}, {"train.lr": 1e-3}, {"train.lr": 1e3}]
    from pilotrun.provenance import config_sha256

    assert frozen["plan_sha256"] == config_sha256(plan)
    with pytest.raises(sqlite3.IntegrityError, match="frozen"):
        with j.transaction() as db:
            db.execute("UPDATE sweeps SET plan_json='{}' WHERE sweep_id=?", (sweep_id,))


@pytest.mark.parametrize("variant, key, what", [
    ({"train.micro_batch": 8}, "train.micro_batch", "effective batch"),
    ({"train.lr": 1e-3, "train.accumulation": 4}, "train.accumulation", "effective batch"),
    ({"train.updates": 24}, "train.updates", "budget"),
    ({"train.eval_every": 3}, "train.eval_every", "validation frequency"),
    ({"train.stop.patience": 2}, "train.stop.patience", "stop rules"),
    ({"data.validation": "data/test.jsonl"}, "data.validation", "validation set"),
])
def test_variant_with_a_side_effect_is_refused(demo_dir, cli, variant, key, what):
    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [{"train.lr": 1e-3}, variant], [0])
    home = demo_dir / "home"
    r = cli("sweep", campaign, "--home", home)
    assert r.code == 2, r.err
    assert "plan.variants[1]" in r.err and key in r.err and what in r.err
    assert f"campaign.yaml:" in r.err  # the line of the variant in the file
    assert not (home / "journal.sqlite").exists() and not (home / "runs").exists()  # nothing half-written


def test_compensated_micro_batch_is_allowed_and_the_seed_is_not(demo_dir):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.errors import BadInput
    from pilotrun.rehearsal.training.sweep import plan_arms

    # the fixture's 4 × 2: 8 × 1 keeps the effective batch, as `fit` does
    arms = plan_arms(load_campaign(_plan(demo_dir, {}, [{"train.micro_batch": 8, "train.accumulation": 1}], [0])))
    assert [a.name for a in arms] == ["control", "variant-1"]
    assert arms[1].loaded.c.train.micro_batch == 8 and arms[1].label == "train.micro_batch=8, train.accumulation=1"
    with pytest.raises(BadInput, match=r"plan.seeds = \[0, 0\]"):
        plan_arms(load_campaign(_plan(demo_dir, {}, [], [0, 0])))
    with pytest.raises(BadInput, match=r"plan.variants\[0\] sets seed"):
        plan_arms(load_campaign(_plan(demo_dir, {}, [{"seed": 3}], [0])))
    with pytest.raises(BadInput, match=r"plan.variants\[0\]: unknown key 'train.lrr'") as e:
        plan_arms(load_campaign(_plan(demo_dir, {}, [{"train.lrr": 1e-3}], [0])))
    assert "train.lr" in e.value.fix


def test_a_changed_campaign_is_a_new_sweep(demo_dir, cli):
    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [], [0], updates=4, eval_every=2)
    home = demo_dir / "home"
    first = cli("sweep", campaign, "--home", home, "--json")
    assert first.code == 0, first.err[-2000:]
    old = first.json["data"]
    from pilotrun.journal.store import Journal

    frozen_before = Journal(home).get_sweep(old["sweep_id"])
    _plan(demo_dir, {"train.lr": 2e-3}, [], [0])
    refused = cli("sweep", campaign, "--home", home, "--continue", old["sweep_id"])
    assert refused.code == 2 and "changed since sweep" in refused.err and "arms" in refused.err
    new = cli("sweep", campaign, "--home", home, "--json")
    assert new.code == 0
    assert new.json["data"]["sweep_id"] != old["sweep_id"]
    assert new.json["data"]["plan_sha256"] != old["plan_sha256"]
    assert Journal(home).get_sweep(old["sweep_id"]) == frozen_before  # the old sweep is untouched
    assert cli("sweep", campaign, "--home", home, "--continue", "sweep-nope").code == 2


def _wait_for(predicate, timeout=240.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("timed out waiting for the sweep process")


def test_killed_sweep_continues_and_loses_no_finished_run(demo_dir, cli):
    from pilotrun.journal.store import Journal

    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [{"train.lr": 1e-3}, {"train.lr": 5e-3}], [0],
                     updates=30, eval_every=10)
    home = demo_dir / "home"
    log = open(demo_dir / "sweep.log", "wb")  # a file, not a pipe nobody reads
    proc = subprocess.Popen([sys.executable, "-m", "pilotrun", "sweep", str(campaign), "--home", str(home)],
                            stdout=log, stderr=subprocess.STDOUT, cwd=demo_dir)

    def two_runs():
        if proc.poll() is not None:
            raise AssertionError("the sweep ended before it was killed: "
                                 + (demo_dir / "sweep.log").read_text(errors="replace")[-3000:])
        if not (home / "journal.sqlite").exists():
            return None
        db = sqlite3.connect(home / "journal.sqlite", timeout=30)
        try:
            rows = db.execute("SELECT run_id, status FROM runs ORDER BY created_at, run_id").fetchall()
        except sqlite3.OperationalError:  # the schema is not written yet
            return None
        finally:
            db.close()
        return rows if len(rows) >= 2 and rows[0][1] == "completed" and rows[1][1] == "running" else None

    try:
        rows = _wait_for(two_runs)
        os.kill(proc.pid, signal.SIGKILL)  # a real kill: no handler, no cleanup
    finally:
        proc.wait(timeout=60)  # reaped, so its pid is dead
        log.close()
    assert proc.returncode == -signal.SIGKILL
    finished_id, killed_id = rows[0][0], rows[1][0]
    j = Journal(home)  # opening the journal finds the dead pid
    killed = j.get_run(killed_id)
    assert killed["status"] == "interrupted"
    sweep_id = killed["sweep_id"]
    finished_before = (j.get_run(finished_id), j.metrics(finished_id), j.predictions(finished_id, "validation"))
    killed_before = (killed, j.metrics(killed_id))

    r = cli("sweep", campaign, "--home", home, "--continue", sweep_id, "--json")
    assert r.code == 0, r.err[-3000:]
    assert "supersedes " + killed_id in r.err
    runs = j.list_runs(sweep_id=sweep_id)
    assert len(runs) == 4  # 3 arms; the killed run stays beside the run that supersedes it
    assert (j.get_run(finished_id), j.metrics(finished_id), j.predictions(finished_id, "validation")) == \
        finished_before  # the finished run was skipped, not rerun
    assert (j.get_run(killed_id), j.metrics(killed_id)) == killed_before  # the superseded run remains unchanged
    successor = [x for x in runs if x["supersedes"] == killed_id]
    assert len(successor) == 1 and successor[0]["run_id"] not in (finished_id, killed_id)
    assert (successor[0]["arm"], successor[0]["seed"]) == (killed["arm"], killed["seed"])
    assert successor[0]["status"] == "completed"
    data = r.json["data"]
    assert {x["run_id"] for x in data["runs"]} == {x["run_id"] for x in runs} - {killed_id}
    assert data["superseded"] == [{"run_id": killed_id, "arm": killed["arm"], "seed": 0, "status": "interrupted"}]
    again = cli("sweep", campaign, "--home", home, "--continue", sweep_id, "--json")
    assert again.code == 0 and "0 run(s) now" in again.json["messages"][0]
    assert len(j.list_runs(sweep_id=sweep_id)) == 4


@pytest.mark.slow
def test_demo_campaign_own_plan(tmp_path):
    from pilotrun.demo.synth import write_demo

    campaign = write_demo(tmp_path / "demo")
    p = run_cli_process("sweep", campaign, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)["data"]
    assert len(data["runs"]) == 6 and {c["arm"] for c in data["comparison"]} == {"control", "variant-1",
                                                                                   "variant-2"}
    assert "vs_control" in p.stderr


def test_each_sweep_run_records_the_train_command_that_repeats_it(demo_dir, cli):
    import shlex

    from pilotrun.journal.store import Journal

    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [{"train.lr": 1e-3}], [3], updates=2, eval_every=2)
    home = demo_dir / "home"
    r = cli("sweep", campaign, "--home", home, "--set", "train.warmup=1", "--json")
    assert r.code == 0, r.err[-2000:]
    j = Journal(home)
    run = next(x for x in _runs(home, r.json["data"]["sweep_id"]) if x["arm"] == "variant-1")
    assert run["command"].startswith("pilotrun train ") and "--seed 3" in run["command"]
    assert run["command"] in (j.run_dir(run["run_id"]) / "README.md").read_text()
    again = cli(*shlex.split(run["command"])[1:], "--home", home, "--json")  # the line as printed
    assert again.code == 0, again.err[-2000:]
    repeat = j.get_run(again.json["data"]["run_id"])
    assert repeat["config_sha256"] == run["config_sha256"]  # warmup 1, lr 1e-3, seed 3: the same run


def test_a_fixed_sweep_id_starts_then_continues_without_redoing_a_finished_run(demo_dir, cli):
    """`sweep --id` is what the launch files run on every (re)start: the first start creates the sweep
    under that id, a later one continues it; a changed campaign under the same id is refused."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.training.sweep import launch_sweep_id, sweep

    campaign = _plan(demo_dir, {"train.lr": 3e-3}, [{"train.lr": 1e-3}], [0], updates=2, eval_every=2)
    home = demo_dir / "home"
    loaded = load_campaign(campaign)
    sid = launch_sweep_id(loaded)
    assert sid == launch_sweep_id(load_campaign(campaign))  # the same campaign, the same id

    def preempted(r):  # the job ends after its first run (as a requeue would)
        if r["index"] == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sweep(loaded, home, fixed_id=sid, progress=False, on_start=preempted)
    first = _runs(home, sid)
    assert [(r["arm"], r["status"]) for r in first] == [("control", "completed")]
    again = cli("sweep", campaign, "--home", home, "--id", sid, "--json")
    assert again.code == 0, again.err[-2000:]
    assert again.json["data"]["sweep_id"] == sid
    runs = _runs(home, sid)
    assert [(r["arm"], r["status"]) for r in runs] == [("control", "completed"), ("variant-1", "completed")]
    assert runs[0]["run_id"] == first[0]["run_id"]  # the finished run was not redone
    done = cli("sweep", campaign, "--home", home, "--id", sid, "--json")
    assert done.code == 0 and len(_runs(home, sid)) == 2  # a third start finds nothing to do
    _plan(demo_dir, {"train.lr": 2e-3}, [{"train.lr": 1e-3}], [0])
    refused = cli("sweep", campaign, "--home", home, "--id", sid)
    assert refused.code == 2 and f"changed since sweep {sid}" in refused.err and "new --id" in refused.err
    bad = cli("sweep", campaign, "--home", home, "--id", "a b/../c")
    assert bad.code == 2 and "--id" in bad.err and "letters, digits" in bad.err
    both = cli("sweep", campaign, "--home", home, "--id", sid, "--continue", sid)
    assert both.code == 2 and "--id and --continue" in both.err
