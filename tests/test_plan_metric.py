"""plan.metric is read, never guessed: a metric the task's validations do not log is bad input (validate for the
built-in tasks, the pilot's validation and a run's first one for a custom task), plan.goal must agree with a metric
that has a direction, and a journal whose runs never logged the plan's metric compares nothing rather than val_loss
in its place. Before, every reader fell back to val_loss: `plan.metric: val_accuracy` with `plan.goal: maximize`
ranked the arm with the highest validation loss best, kept the worst checkpoint as the best and said nothing."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import yaml
from conftest import write_campaign
from preference_data import preference_campaign, short_pairs

from pilotrun.errors import BadInput
from pilotrun.journal.store import Journal

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

# a custom task that reports its validation accuracy (logged as val_accuracy)
ACCURACY_TASK = '''
from tabular_task import TabularTask


class AccuracyTask(TabularTask):
    def __init__(self, campaign):
        super().__init__(campaign)
        self._seen = [0.0, 0.0]

    def loss(self, model, batch):
        out = super().loss(model, batch)
        import torch

        with torch.no_grad():
            hits = sum(p == t for p, t in zip(self.predict(model, batch), self.targets(batch)))
        self._seen[0] += hits
        self._seen[1] += len(batch["labels"])
        return out

    def take_metrics(self, reduce=lambda x: x):
        hits, n = (float(reduce(v)) for v in self._seen)
        self._seen = [0.0, 0.0]
        return {"accuracy": hits / n} if n else {}
'''


@pytest.mark.parametrize("sets, key, words, fix", [
    (["plan.metric=val_accuracy"], "plan.metric", "'val_accuracy' is not logged by a causal-lm campaign's "
     "validations (they log val_loss)", "set plan.metric: val_loss"),
    (["plan.metric=loss"], "plan.metric", "did you mean val_loss?", "set plan.metric: val_loss"),
    (["plan.goal=maximize"], "plan.goal", "maximize with plan.metric val_loss: a lower val_loss is better, so the "
     "comparison would call the worse arm better", "set plan.goal: minimize"),
])
def test_validate_refuses_a_metric_the_task_never_logs_and_a_goal_against_it(demo_dir, cli, sets, key, words, fix):
    r = cli("validate", demo_dir / "campaign.yaml", *[a for s in sets for a in ("--set", s)])
    assert r.code == 2, r.err
    assert f"{key}: " in r.err and words in r.err and f"fix: {fix}" in r.err
    clean = cli("validate", demo_dir / "campaign.yaml")
    assert clean.code == 0, clean.err  # val_loss, minimize: the demo as written


def test_a_preference_campaign_decides_on_its_reward_accuracy_upwards_only(tmp_path, cli):
    path = preference_campaign(tmp_path, short_pairs()[:4])
    ok = cli("validate", path, "--set", "plan.metric=val_reward_accuracy", "--set", "plan.goal=maximize")
    assert ok.code == 0, ok.err
    down = cli("validate", path, "--set", "plan.metric=val_reward_accuracy", "--set", "plan.goal=minimize")
    assert down.code == 2 and "plan.goal: minimize with plan.metric val_reward_accuracy: a higher" in down.err
    typo = cli("validate", path, "--set", "plan.metric=val_accuracy", "--set", "plan.goal=maximize")
    assert typo.code == 2 and "did you mean val_reward_accuracy?" in typo.err
    assert "val_loss, val_reward_accuracy, val_reward_margin" in typo.err


def test_plan_value_reads_a_logged_validation_metric_only():
    from pilotrun.engine.loop import plan_value

    ev = {"val_loss": 0.5, "val_accuracy": 0.75, "targets": 12, "examples": 12}
    assert plan_value(ev, "val_accuracy") == 0.75 and plan_value(ev, "val_loss") == 0.5
    for name in ("val_f1", "targets"):  # not logged; a count, not a metric
        with pytest.raises(BadInput) as e:
            plan_value(ev, name)
        assert e.value.where == "plan.metric" and "(val_accuracy, val_loss)" in str(e.value)


def _tabular(tmp_path, metric: str, goal: str, task: str = "tabular_task:TabularTask") -> Path:
    folder = tmp_path / "tabular"
    shutil.copytree(EXAMPLES, folder)
    (folder / "accuracy_task.py").write_text(ACCURACY_TASK)
    c = yaml.safe_load((folder / "tabular_campaign.yaml").read_text())
    c["task"] = task
    c["plan"].update(metric=metric, goal=goal)
    c["train"].update(updates=4, eval_every=2, save_every=2)
    return write_campaign(folder, c)


def test_a_custom_task_without_the_metric_stops_the_pilot_and_the_run_before_update_1(tmp_path, cli, monkeypatch):
    path = _tabular(tmp_path, "val_accuracy", "maximize")
    monkeypatch.chdir(path.parent)
    assert cli("validate", path).code == 0  # a custom task's metrics are known once it runs
    home = tmp_path / "home"
    pilot = cli("pilot", path, "--home", home)
    assert pilot.code == 2, pilot.err[-2000:]
    said = "plan.metric: 'val_accuracy' is not among the metrics this validation logged (val_loss)"
    assert said in pilot.err and "report it from the task's take_metrics" in pilot.err
    run = cli("train", path, "--home", home, "--json")
    assert run.code == 2 and said in run.err
    (train,) = [r for r in Journal(home).list_runs() if r["kind"] == "train"]
    assert train["status"] == "failed" and train["updates_done"] == 0  # stopped at the validation before update 1


def test_a_custom_task_that_reports_the_metric_decides_on_it(tmp_path, cli, monkeypatch):
    path = _tabular(tmp_path, "val_accuracy", "maximize", task="accuracy_task:AccuracyTask")
    monkeypatch.chdir(path.parent)
    home = tmp_path / "home"
    pilot = cli("pilot", path, "--home", home)
    assert pilot.code in (0, 1), pilot.err[-2000:]  # whatever its verdict, not bad input
    run = cli("train", path, "--home", home, "--json")
    assert run.code == 0, run.err[-2000:]
    (train,) = [r for r in Journal(home).list_runs() if r["kind"] == "train"]
    accuracy = Journal(home).metrics(train["run_id"], "validation", "val_accuracy")
    assert [m["step"] for m in accuracy] == [0, 2, 4] and all(0 <= m["value"] <= 1 for m in accuracy)


def test_runs_that_never_logged_the_plans_metric_compare_nothing(tmp_path, cli, monkeypatch):
    """A journal written before the check: its sweep's plan names val_accuracy, its runs logged val_loss alone. The
    comparison has no values (not val_loss ranked upwards) and the sweep's result says so."""
    from pilotrun.rehearsal.training.sweep import run_points, sweep_result

    path = _tabular(tmp_path, "val_loss", "minimize")
    monkeypatch.chdir(path.parent)
    home = tmp_path / "home"
    done = cli("sweep", path, "--home", home, "--json")
    assert done.code == 0, done.err[-2000:]
    sweep_id = done.json["data"]["sweep_id"]
    assert all(p["at_budget"] is not None for p in done.json["data"]["runs"])  # the clean case: val_loss compared
    journal = Journal(home)
    with sqlite3.connect(journal.path) as db:  # the old journal's frozen plan (sweeps are immutable since)
        db.execute("DROP TRIGGER sweeps_immutable")
        plan = journal.get_sweep(sweep_id)["plan"]
        plan.update(metric="val_accuracy", goal="maximize")
        db.execute("UPDATE sweeps SET plan_json=? WHERE sweep_id=?", (__import__("json").dumps(plan), sweep_id))
    runs = journal.list_runs(sweep_id=sweep_id)
    assert all(run_points(journal, r, "val_accuracy", "maximize")["at_budget"] is None for r in runs)
    result = sweep_result(Journal(home), sweep_id, 0)
    assert result.verdict == "fail"
    assert any(m.startswith(f"{len(runs)} runs validated without logging plan.metric val_accuracy") and
               "compared val_loss in its place" in m for m in result.messages), result.messages
    assert all(row["at_budget"] == "—" for row in result.data["rows"])
