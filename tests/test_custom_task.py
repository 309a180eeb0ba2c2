"""Custom tasks by import path: the tabular example in examples/, a class missing a method, and a
loss that averages per micro-batch (which the overfit accumulation check must catch)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def tabular_dir(tmp_path) -> Path:
    """A copy of examples/ (campaign, task module, data) in a fresh folder."""
    out = tmp_path / "tab"
    shutil.copytree(EXAMPLES, out, ignore=shutil.ignore_patterns("__pycache__"))
    return out


def _campaign_with_task(folder: Path, task: str) -> Path:
    text = (folder / "tabular_campaign.yaml").read_text().replace("task: tabular_task:TabularTask", f"task: {task}")
    path = folder / "campaign_custom.yaml"
    path.write_text(text)
    return path


def test_example_trains_and_overfits(cli, tabular_dir, tmp_path):
    campaign = tabular_dir / "tabular_campaign.yaml"
    home = tmp_path / "home"
    r = cli("validate", campaign, "--home", home)
    assert r.code == 0, r.out + r.err
    r = cli("train", campaign, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    [res] = r.json if isinstance(r.json, list) else [r.json]
    assert res["verdict"] == "ok", res
    r = cli("overfit", campaign, "--home", home)
    assert r.code == 0, r.out + r.err
    assert "accumulation arithmetic holds" in r.out
    assert "memorised 8 examples" in r.out


def test_artifact_round_trips(tabular_dir, tmp_path):
    import torch

    from pilotrun.campaign.load import load_campaign
    from pilotrun.tasks import make_task

    loaded = load_campaign(tabular_dir / "tabular_campaign.yaml")
    task = make_task(loaded)
    model = task.build_model()
    examples = [task.encode(r) for r in task.records("validation")[:5]]
    batch = task.collate(examples)
    files = task.save_artifact(model, tmp_path / "art")
    assert files == ["model"]
    again = task.load_artifact(tmp_path / "art" / "model")
    with torch.no_grad():
        assert torch.equal(model.eval()(batch["x"]), again(batch["x"]))
    assert task.predict(model, batch) == task.predict(again, batch)


def test_missing_method_is_exit_2_naming_it(cli, tabular_dir, tmp_path):
    (tabular_dir / "no_predict_task.py").write_text(textwrap.dedent("""
        from tabular_task import TabularTask

        class NoPredict:
            kind = "broken"
            def __init__(self, campaign):
                self.inner = TabularTask(campaign)
        for name in ("build_model", "records", "encode", "collate", "loss", "count_targets", "group_key",
                     "save_artifact", "load_artifact"):
            setattr(NoPredict, name, lambda self, *a, _n=name: getattr(self.inner, _n)(*a))
    """))
    campaign = _campaign_with_task(tabular_dir, "no_predict_task:NoPredict")
    r = cli("train", campaign, "--home", tmp_path / "home")
    assert r.code == 2, r.out + r.err
    assert "lacks predict" in r.err
    assert "load_artifact" not in r.err.split("lacks", 1)[1].split("\n")[0]


def test_mean_loss_fails_accumulation_check(cli, tabular_dir, tmp_path):
    (tabular_dir / "mean_loss_task.py").write_text(textwrap.dedent("""
        from torch.nn import functional as F
        from tabular_task import TabularTask

        class MeanLoss(TabularTask):
            def loss(self, model, batch):
                logits = model(batch["x"])
                return F.cross_entropy(logits, batch["labels"]), batch["labels"].new_tensor(batch["labels"].numel())
    """))
    campaign = _campaign_with_task(tabular_dir, "mean_loss_task:MeanLoss")
    r = cli("overfit", campaign, "--home", tmp_path / "home")
    assert r.code == 1, r.out + r.err
    out = " ".join(r.out.split())
    assert "FAIL overfit: accumulation arithmetic is wrong" in out
    assert "per-micro-batch mean where a sum over targets is needed" in out, r.out


def test_example_passes_all(cli, tabular_dir, tmp_path):
    from pilotrun.rehearsal.all import STAGES

    r = cli("all", tabular_dir / "tabular_campaign.yaml", "--home", tmp_path / "home", "--json")
    results = r.json["stages"]
    verdicts = {res["stage"]: res["verdict"] for res in results}
    assert [name for name, _ in STAGES] == list(verdicts), verdicts
    assert r.code == 0, r.out + r.err
    assert all(v in ("ok", "warn") for v in verdicts.values()), verdicts
