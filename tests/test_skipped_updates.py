"""A non-finite loss with train.stop.on_nan=false: the update is skipped, the grad scaler stays consistent
(fp16-mixed: its update() lowers the scale and resets it for the next unscale_), training goes on, and the
journal records which updates were skipped — in fp16-mixed, bf16-mixed and under DDP (gloo, 2 ranks).

The task is the tabular example with a loss that is infinite on chosen records (planted by record id)."""

from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
POISON = ["s0003", "s0100"]

POISON_TASK = textwrap.dedent('''
    import torch
    from torch.nn import functional as F
    from tabular_task import TabularTask, _on
    from pilotrun.tasks import common

    POISON = set(%r)

    class PoisonTask(TabularTask):
        """The tabular task whose loss is +inf on the records named in POISON."""
        def encode(self, record):
            e = super().encode(record)
            e.meta["poison"] = str(common.field(record, "id", "id")) in POISON
            return e

        def collate(self, examples):
            batch = super().collate(examples)
            batch["poison"] = torch.tensor([e.meta["poison"] for e in examples])
            return batch

        def loss(self, model, batch):
            logits = model(_on(model, batch["x"])).float()
            labels = _on(model, batch["labels"])
            per = F.cross_entropy(logits, labels, reduction="none")
            # a constant factor (inf on poisoned records): the loss and those records' gradients are inf
            factor = torch.where(batch["poison"], float("inf"), 1.0)
            per = per * _on(model, factor)
            return per.sum(), labels.new_tensor(labels.numel())
''' % POISON)


def _campaign(tmp_path: Path, poison=POISON, module: str = "poison_task", **train) -> Path:
    """The module name differs per planted set: the in-process CLI keeps an imported task module."""
    folder = tmp_path / "tab"
    shutil.copytree(EXAMPLES, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / f"{module}.py").write_text(POISON_TASK.replace(repr(POISON), repr(poison)))
    c = yaml.safe_load((folder / "tabular_campaign.yaml").read_text())
    c["task"] = f"{module}:PoisonTask"
    c["train"].update(updates=10, eval_every=5, save_every=None, stop={"on_nan": False}, **train)
    path = folder / "poison.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _line_of(record_id: str) -> str:
    """The record's place in train.csv (the header is line 1), as pilotrun names records."""
    lines = (EXAMPLES / "data" / "train.csv").read_text().splitlines()
    return f"train.csv:{next(n for n, line in enumerate(lines, 1) if line.startswith(record_id + ','))}"


def _skipped_rows(home: Path, run_id: str) -> list[dict]:
    from pilotrun.journal.store import Journal

    return Journal(home, create=False).metrics(run_id, split="skipped", name="loss")


@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16-mixed", "fp32"])
def test_non_finite_loss_skips_update_and_training_goes_on(cli, tmp_path, precision):
    campaign = _campaign(tmp_path, precision=precision)
    home = tmp_path / "home"
    r = cli("train", campaign, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    res = r.json
    assert res["verdict"] == "warn", res
    assert res["data"]["status"] == "completed" and res["data"]["updates"] == 10, res
    text = " ".join(" ".join(res["messages"]).split())
    assert "update(s) skipped for a non-finite loss (train.stop.on_nan=false)" in text, text
    if precision == "fp16-mixed":  # the scaler's own update ran on the skipped update: the scale halved, no exit 3
        assert re.search(r"non-finite loss; fp16 loss scale (\d+) → (\d+)", text), text
        for before, after in re.findall(r"non-finite loss; fp16 loss scale (\d+) → (\d+)", text):
            assert int(after) * 2 == int(before), text
    from pilotrun.journal.store import Journal

    summary = Journal(home, create=False).get_run(res["data"]["run_id"])["summary"]
    bad = [s for s in summary["skipped_updates"] if s["kind"] == "non-finite"]
    # every update that drew a poisoned record was skipped, and only those
    assert bad and all(any(i.endswith(_line_of(p)) for p in POISON for i in s["ids"]) for s in bad), bad
    rows = _skipped_rows(home, res["data"]["run_id"])
    assert sorted(r["step"] for r in rows if r["value"] == float("inf")) == [s["attempt"] for s in bad], rows


def test_clean_fp16_run_skips_nothing(cli, tmp_path):
    campaign = _campaign(tmp_path, [], "clean_task", precision="fp16-mixed")
    home = tmp_path / "home"
    r = cli("train", campaign, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    res = r.json
    assert res["verdict"] == "ok", res
    assert "skipped" not in " ".join(res["messages"])
    assert _skipped_rows(home, res["data"]["run_id"]) == []


@pytest.mark.distributed
@pytest.mark.parametrize("precision", ["fp16-mixed", "bf16-mixed"])
def test_skipped_update_under_ddp(cli, tmp_path, precision):
    campaign = _campaign(tmp_path, precision=precision, strategy="ddp", nproc=2, micro_batch=8)
    home = tmp_path / "home"
    r = cli("train", campaign, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    res = r.json
    assert res["verdict"] == "warn" and res["data"]["updates"] == 10, res
    text = " ".join(" ".join(res["messages"]).split())
    assert "on 2 ranks" in text and "update(s) skipped for a non-finite loss" in text, text
    if precision == "fp16-mixed":  # the first skip halves the scale on both ranks alike
        assert "non-finite loss; fp16 loss scale 65536 → 32768" in text, text
    assert _skipped_rows(home, res["data"]["run_id"])


def test_all_records_non_finite_ends_diverged_not_a_hang(cli, tmp_path):
    ids = [line.split(",", 1)[0] for line in (EXAMPLES / "data" / "train.csv").read_text().splitlines()[1:]]
    campaign = _campaign(tmp_path, ids, "all_inf_task")
    r = cli("train", campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 1, r.out + r.err
    assert r.json["data"]["status"] == "diverged"
    assert "updates in a row (an epoch) had a non-finite loss" in r.json["data"]["reason"], r.json["data"]
