"""resume with a custom Python task: a loss difference also names the task's own random state (a generator
the task keeps, which the saved state does not hold). The tabular example, which keeps none, resumes exactly."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

NOISY_TASK = textwrap.dedent('''
    import numpy as np
    import torch
    from tabular_task import TabularTask

    class NoisyTask(TabularTask):
        """Augments the features with noise from its own generator, seeded per run when the model is built:
        runs in one process agree, but the saved state does not hold it, so a resumed process starts it over."""
        def build_model(self):
            self.noise_rng = np.random.default_rng(self.c.seed)
            return super().build_model()

        def collate(self, examples):
            batch = super().collate(examples)
            noise = self.noise_rng.normal(0.0, 0.5, tuple(batch["x"].shape)).astype("float32")
            batch["x"] = batch["x"] + torch.from_numpy(noise)
            return batch
''')


def _campaign(tmp_path: Path, task: str | None) -> Path:
    folder = tmp_path / "tab"
    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "noisy_task.py").write_text(NOISY_TASK)
    c = yaml.safe_load((folder / "tabular_campaign.yaml").read_text())
    if task:
        c["task"] = task
    path = folder / "resume.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def test_custom_task_random_state_is_named(cli, tmp_path):
    r = cli("resume", _campaign(tmp_path, "noisy_task:NoisyTask"), "--home", tmp_path / "home", "--json")
    assert r.code == 1, r.out + r.err
    problem = " ".join(r.json["data"]["problem"].split())
    assert problem.startswith("loss at update 5 is"), problem  # the first update in the new process
    assert "or the custom task noisy_task:NoisyTask's own random state (self.noise_rng (numpy Generator))" \
        in problem, problem
    assert "not a task's own generators" in problem


def test_custom_task_without_its_own_generator_resumes_exactly(cli, tmp_path):
    r = cli("resume", _campaign(tmp_path, None), "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["verdict"] == "ok"


def test_builtin_tasks_are_not_blamed_on_task_state():
    from types import SimpleNamespace

    from pilotrun.rehearsal.mechanics.resume import custom_task_note, first_difference

    assert custom_task_note(SimpleNamespace(task="causal-lm"), object()) is None
    ref = [{"update": u, "lr": 1e-3, "ids": [["a"]], "epoch": 0, "loss": 1.0 + u, "examples_seen": u, "finite": True}
           for u in (1, 2, 3)]
    other = [dict(ref[2], loss=9.0)]
    assert "custom task" not in first_difference(ref, other, 2, exact=True)
    note = custom_task_note(SimpleNamespace(task="m:T"), SimpleNamespace())
    assert "any generator it keeps" in note and note in first_difference(ref, other, 2, exact=True, task_note=note)
