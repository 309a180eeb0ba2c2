"""Where `all`'s time goes (issue 34): each stage's wall divided into start-up, campaign load, data, model build
and the work itself, from the progress line's accounts (console/progress.py ``spent``), a fresh process's
accounts included; in the JSON always, in the text with --verbose, at 80 columns."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.console import progress
from pilotrun.console.progress import SPENT


def test_all_json_and_verbose_text_say_where_each_stage_time_went(cli, tmp_path, monkeypatch):
    from pilotrun.rehearsal import all as all_module

    names = ("validate", "inspect", "overfit")
    monkeypatch.setattr(all_module, "STAGES", [s for s in all_module.STAGES if s[0] in names])
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setenv("PILOTRUN_VERBOSE", "1")  # restored after the test (--verbose sets it for the process)
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    r = cli("--verbose", "all", path, "--home", tmp_path / "home", "--json", "--examples", "2", "--max-updates", "3")
    assert r.code in (0, 1), r.err
    stages = {s["stage"]: s for s in r.json["stages"]}
    for name in names:
        spent, wall = stages[name]["spent"], stages[name]["seconds"]
        assert set(spent) == set(SPENT) and all(v >= 0 for v in spent.values()), spent
        assert sum(spent.values()) <= wall + 1e-6, (name, spent, wall)  # inside the stage's wall ...
        assert sum(spent.values()) >= wall - 0.25, (name, spent, wall)  # ... and all of it, but the block's edges
    assert stages["overfit"]["spent"]["data"] > 0 and stages["overfit"]["spent"]["model"] > 0, stages["overfit"]
    assert stages["overfit"]["spent"]["work"] > 0, stages["overfit"]
    err = r.err.splitlines()
    at = err.index("where the time went")
    assert err[at + 1].split() == ["stage", "wall", "start-up", "campaign", "data", "model", "work"], err[at:]
    table = err[at + 1:]
    assert [ln.split()[0] for ln in table[1:len(names) + 2]] == list(names) + ["total"], table
    assert any(ln.startswith("start-up: the stage's imports") for ln in table), table
    shown = err[err.index("rehearsal summary"):]  # the summary and the breakdown (a log's progress lines are whole)
    assert max(map(len, shown)) <= 80, [ln for ln in shown if len(ln) > 80]


def test_all_text_has_no_breakdown_without_verbose(cli, tmp_path, monkeypatch):
    from pilotrun.rehearsal import all as all_module

    monkeypatch.setattr(all_module, "STAGES", all_module.STAGES[:1])
    monkeypatch.delenv("PILOTRUN_VERBOSE", raising=False)
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    r = cli("all", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    assert "where the time went" not in r.err
    assert set(r.json["stages"][0]["spent"]) == set(SPENT)  # the JSON has it always


CHILD = textwrap.dedent("""
    import time
    from pilotrun.console.progress import note, spend, spending
    with spending("data"):
        note("reading", log=True)
        time.sleep(0.4)
    spend("model")
    time.sleep(0.4)
    note("update 1/1", done=1, total=1, spent="work")
    time.sleep(0.2)
""")


def test_a_fresh_process_accounts_go_to_its_parent_stage(tmp_path):
    """The child's switches (data, model, work) reach the stage through the progress file; what came before
    its first switch (the interpreter's start, the imports) stays the parent's start-up."""
    with progress.stage_progress("resume", stream=open(tmp_path / "log", "w")) as cur:
        progress.head("resumed run (a new process)", spent="startup")
        subprocess.run([sys.executable, "-c", CHILD], check=True, timeout=120)
        progress.head("comparing")  # the parent's own work again
        time.sleep(0.1)
    spent = cur["spent"]
    assert spent["data"] >= 0.35 and spent["model"] >= 0.35, spent  # the child's sleeps, each where it was spent
    assert spent["startup"] > 0 and spent["work"] >= 0.25, spent  # the child's update and the parent's compare
    assert spent["campaign"] == 0, spent
    wall = sum(spent.values())
    assert abs(wall - (time.monotonic() - cur["t0"])) < 0.5, (wall, spent)


def test_a_child_whose_switches_never_arrive_leaves_its_time_on_the_parents_account(tmp_path):
    """The planted defect: a child outside the stage (no progress file) reports nothing; its time is not lost or
    invented, it stays on the account the parent said (start-up), and the accounts still add up to the wall."""
    with progress.stage_progress("resume", stream=open(tmp_path / "log", "w")) as cur:
        progress.head("resumed run (a new process)", spent="startup")
        env = {k: v for k, v in __import__("os").environ.items() if k != progress.FILE_ENV}
        subprocess.run([sys.executable, "-c", CHILD], check=True, timeout=120, env=env)
    spent = cur["spent"]
    assert spent["data"] == 0 and spent["model"] == 0, spent
    assert spent["startup"] >= 1.0, spent  # the child's 1 s of sleeps and its start


def test_an_unknown_account_is_refused():
    with pytest.raises(ValueError, match="spent='gpu': one of startup, campaign, data, model, work"):
        progress.note("x", spent="gpu")


def test_the_resumed_updates_are_resume_s_work_not_its_model_load(tmp_path, monkeypatch):
    """The fresh process's accounts: building the model and reading the saved state are ``model``; its updates are
    ``work`` from the first one (the loop's first note comes only after its first update, so the planted defect,
    no switch before the loop, put that update on ``model``). Its loop here takes 0.6 s more than it does."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.mechanics import resume as R

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    result = R.resume(load_campaign(path), tmp_path / "home")
    assert result.verdict == "ok", result.messages
    (spec,) = (tmp_path / "home").rglob("resume_spec.json")
    real = R.train

    def slow_train(*args, **kwargs):
        time.sleep(0.6)
        return real(*args, **kwargs)

    monkeypatch.setattr(R, "train", slow_train)
    with progress.stage_progress("resume", stream=open(tmp_path / "log", "w")) as cur:
        assert R.resume_worker(spec) == 0
    spent = cur["spent"]
    assert spent["work"] >= 0.6 and spent["model"] < 0.6, spent
