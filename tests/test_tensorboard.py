"""`pilotrun show RUN_ID --tensorboard DIR`: the run's metrics as standard event files, read back."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from conftest import needs

pytestmark = needs("tensorboard")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _scalars(folder: Path) -> dict:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_show_exports_the_loss_curve(cli, tmp_path):
    from pilotrun.journal.store import Journal

    shutil.copytree(EXAMPLES, tmp_path / "ex", ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    r = cli("train", tmp_path / "ex" / "tabular_campaign.yaml", "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    [run] = Journal(home).list_runs(kind="train")
    r = cli("show", run["run_id"], "--home", home, "--tensorboard", tmp_path / "tb")
    assert r.code == 0, r.err
    assert "scalars in" in r.err
    got = _scalars(tmp_path / "tb" / run["run_id"])
    loss = Journal(home).metrics(run["run_id"], "train", "loss")
    assert [s for s, _ in got["train/loss"]] == [m["step"] for m in loss]
    assert [v for _, v in got["train/loss"]] == pytest.approx([m["value"] for m in loss], rel=1e-6)
    val = Journal(home).metrics(run["run_id"], "validation", "val_loss")
    assert [s for s, _ in got["validation/val_loss"]] == [m["step"] for m in val] == [0, 20, 40, 60]


def test_show_tensorboard_unknown_run_is_exit_2(cli, tmp_path):
    from pilotrun.journal.store import Journal

    Journal(tmp_path / "home")
    r = cli("show", "no-such-run", "--home", tmp_path / "home", "--tensorboard", tmp_path / "tb")
    assert r.code == 2
    assert "no-such-run" in r.err
    assert not (tmp_path / "tb").exists()
