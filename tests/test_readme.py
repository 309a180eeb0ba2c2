"""The README's own-loop example, executed as written, and the own-loop API it shows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pilotrun.journal import Journal
from pilotrun.probe.recorder import own_run

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_block(name: str) -> str:
    text = README.read_text(encoding="utf-8")
    m = re.search(rf"<!-- readme-test: {re.escape(name)} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README has no python block marked readme-test: {name}"
    return m.group(1)


HARNESS = '''
import torch
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = [torch.randn(8, 4) for _ in range(3)]
longest_batch = torch.randn(16, 4)

def train_step(model, batch):
    loss = model(batch).pow(2).mean()
    loss.backward(); opt.step(); opt.zero_grad()
    return loss

def evaluate(model, batch):
    with torch.no_grad():
        return model(batch)          # a (16, 1) tensor: check_finite takes any shape
'''


def test_readme_own_loop_example_runs_and_records_everything(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HARNESS + readme_block("own-loop"))
    p = subprocess.run([sys.executable, str(script), "--lr", "0.01"], cwd=tmp_path, capture_output=True, text=True,
                       timeout=300, env={**__import__("os").environ, "PILOTRUN_HOME": ""})
    assert p.returncode == 0, p.stderr
    j = Journal(tmp_path / ".pilotrun", create=False)  # the default home: ./.pilotrun
    (run,) = j.list_runs()
    assert run["status"] == "completed" and run["name"] == "my-loop"
    assert run["command"].endswith("train.py --lr 0.01") and not run["command"].startswith("pilotrun")
    assert [r["phase"] for r in j.phase_rows(run["run_id"])] == ["first_step", "steady_step", "steady_step",
                                                                  "eval_longest"]
    assert [m["step"] for m in j.metrics(run["run_id"], "train", "loss")] == [1, 2, 3]


def test_a_nan_phase_ends_the_run_diverged(tmp_path):
    with own_run(tmp_path / "home") as run:
        with run.phase("steady_step") as p:
            p.check_finite(torch.tensor([[1.0, float("nan")], [2.0, 3.0]]))
    r = Journal(tmp_path / "home").get_run(run.run_id)
    assert r["status"] == "diverged"
    assert "loss has 1 of 4 values not finite (shape (2, 2); the first is nan)" in r["summary"]["reason"]


def test_a_non_finite_logged_loss_ends_the_run_diverged(tmp_path):
    with own_run(tmp_path / "home") as run:
        run.log(1, loss=2.5)
        run.log(2, loss=torch.tensor(float("inf")))
    j = Journal(tmp_path / "home")
    r = j.get_run(run.run_id)
    assert r["status"] == "diverged" and r["summary"]["reason"] == "training loss is inf at step 2"
    assert [m["value"] for m in j.metrics(run.run_id, "train", "loss")] == [2.5, None]


@pytest.mark.parametrize("value", [torch.ones(3, 4, 5), torch.tensor(1.5), 2.0, torch.arange(6)])
def test_check_finite_takes_any_shape(value):
    rows = []
    with own_run_free_phase(rows) as p:
        assert p.check_finite(value) is True
    assert rows[0]["verdict"] == "ok"


def own_run_free_phase(rows):
    from pilotrun.probe.recorder import phase

    return phase("steady_step", rows=rows)


def test_callbacks_have_distinct_names_and_default_home(tmp_path, monkeypatch):
    from pilotrun.integrations import hf_trainer, lightning

    assert hf_trainer.PilotrunTrainerCallback.__name__ != lightning.PilotrunLightningCallback.__name__
    assert hf_trainer.PilotrunCallback is hf_trainer.PilotrunTrainerCallback
    monkeypatch.setenv("PILOTRUN_HOME", str(tmp_path / "env-home"))
    cb = hf_trainer.PilotrunTrainerCallback()
    assert cb.journal.home == (tmp_path / "env-home").resolve()
    monkeypatch.delenv("PILOTRUN_HOME")
    monkeypatch.chdir(tmp_path)
    assert lightning.PilotrunLightningCallback().journal.home == tmp_path / ".pilotrun"
