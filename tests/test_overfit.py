"""overfit: the accumulation check and the memorising run, each failure planted and named."""

from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal.store import Journal
from pilotrun.tasks.causal_lm import CausalLMTask


class PerMicroBatchMeanTask(CausalLMTask):
    """The classic defect: the loss averaged per micro-batch, reported as one target."""

    def loss(self, model, batch):
        total, n = super().loss(model, batch)
        return total / n, 1


class NaNLossTask(CausalLMTask):
    def loss(self, model, batch):
        total, n = super().loss(model, batch)
        return total * float("nan"), n


class DetachedLossTask(CausalLMTask):
    """A loss that ignores the model: the gradient never reaches the parameters."""

    def loss(self, model, batch):
        total, n = super().loss(model, batch)
        return total * 0.0, n


class FrozenTask(CausalLMTask):
    def build_model(self):
        return super().build_model().requires_grad_(False)


def test_clean_demo_memorises(cli, demo_campaign, tmp_path):
    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    res = r.json
    assert res["verdict"] == "ok"
    text = "\n".join(res["messages"])
    assert "accumulation arithmetic holds" in text
    assert res["data"]["accumulation"]["relative_difference"] <= 1e-5
    assert "memorise setting: 8 examples in one micro-batch" in text and "dropout 0" in text
    assert "argmax reproduces every target; greedy generation reproduces 3 of 3" in text
    assert res["data"]["losses"][-1] < 0.05
    run = Journal(tmp_path / "home").get_run(res["data"]["run_id"])
    assert run["kind"] == "overfit" and run["status"] == "completed" and run["summary"]["verdict"] == "ok"


def test_every_label_masked(cli, demo_campaign, tmp_path):
    # the demo prompt "Q: ...\nA: " is longer than 8 bytes, so truncation leaves no response token
    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--set", "data.max_length=8", "--json")
    assert r.code == 1
    assert r.json["verdict"] == "fail"
    assert "every label of the first 8 training examples is masked" in r.json["summary"] + "\n".join(r.json["messages"])


def test_per_micro_batch_mean_fails_accumulation_check(cli, demo_campaign, tmp_path):
    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--max-updates", "2", "--json",
            "--set", "task=test_overfit:PerMicroBatchMeanTask")
    assert r.code == 1
    acc = r.json["data"]["accumulation"]
    assert acc["verdict"] == "fail" and acc["relative_difference"] > 1e-5
    assert "accumulated gradients differ from one batch of the same examples by" in acc["message"]
    assert f"{acc['relative_difference']:.2e}" in acc["message"]
    assert "likely a per-micro-batch mean where a sum over targets is needed" in acc["message"]
    assert r.json["summary"].startswith("accumulation arithmetic is wrong")


def test_lr_zero_loss_flat(cli, demo_campaign, tmp_path):
    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--set", "train.lr=0", "--max-updates", "10",
            "--json")
    assert r.code == 1
    text = "\n".join(r.json["messages"])
    assert "loss flat at its start value" in text and "the lr is 0 (train.lr = 0)" in text
    assert r.json["data"]["accumulation"]["verdict"] == "ok"  # the arithmetic is fine; the lr is the defect


def test_non_finite_loss_named(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(12))
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "3", "--json",
            "--set", "task=test_overfit:NaNLossTask")
    assert r.code == 1
    assert "non-finite loss (nan) at update 1" in "\n".join(r.json["messages"])
    assert Journal(tmp_path / "home").get_run(r.json["data"]["run_id"])["status"] == "diverged"


def test_zero_gradient_named(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(12))
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "2", "--json",
            "--set", "task=test_overfit:DetachedLossTask")
    assert r.code == 1
    assert "gradient norm is 0 at update 1" in "\n".join(r.json["messages"])


def test_no_trainable_parameters_named(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(12))
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "2", "--json",
            "--set", "task=test_overfit:FrozenTask")
    assert r.code == 1
    assert "no trainable parameters" in "\n".join(r.json["messages"])
