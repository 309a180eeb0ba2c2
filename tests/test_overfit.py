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


def _clashing_records() -> list[dict]:
    """Eight records; the last asks the first's question again with another answer (its first character)."""
    records = [{"id": i, "instruction": f"reverse word{i}", "output": f"{i}drow, reversed letter by letter"}
               for i in range(7)]
    return records + [{"id": 7, "instruction": "reverse word0", "output": "9drow, reversed letter by letter"}]


def test_identical_inputs_with_different_targets_named_before_positions(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, _clashing_records())
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "60", "--json")
    assert r.code == 1, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert r.json["summary"] == "identical inputs with different targets"
    assert "identical inputs with different targets: 2 of 8 examples read the same as another example whose " \
           "target differs (" in text and "train.jsonl:1, " in text and "train.jsonl:8)" in text
    assert "keep one answer per prompt" in text
    assert "predict and loss disagree on positions" not in text


def test_distinct_inputs_memorised_with_the_same_answers(cli, tmp_path):
    """The clean twin: the same answers, each question its own."""
    records = _clashing_records()
    records[-1]["instruction"] = "reverse word9"
    r = cli("overfit", tiny_causal_campaign(tmp_path, records), "--home", tmp_path / "home", "--max-updates", "60",
            "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["data"]["back_offs"] == []


class BounceTask(CausalLMTask):
    """The planted bounce: at the model's 25th loss the weights are knocked far from the minimum, as an
    Adam step at too high an lr does (the loss jumps by orders of magnitude)."""

    def loss(self, model, batch):
        import torch

        model._calls = getattr(model, "_calls", 0) + 1
        if model._calls == 25:
            with torch.no_grad():
                for p in model.parameters():
                    p.add_(torch.randn_like(p) * 0.2)
        return super().loss(model, batch)


def test_loss_spike_backs_the_lr_off_and_says_so(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "150", "--json",
            "--set", "task=test_overfit:BounceTask")
    text = "\n".join(r.json["messages"])
    assert "halved on a loss spike, down to train.lr" in text
    events = r.json["data"]["back_offs"]
    assert events and events[0].startswith("loss spiked to ") and "lr backed off to 2.50e-03" in events[0]
    assert events[0] in text
    rows = r.json["stages"][0]["rows"]
    assert rows[0]["lr"] == 5e-3 and rows[-1]["lr"] < 5e-3
    assert r.code == 0, r.out + r.err


BUILDS = []


class CountedBuildTask(CausalLMTask):
    def build_model(self):
        BUILDS.append(1)
        return super().build_model()


def test_accumulation_check_shares_the_one_build_and_says_its_cost(cli, tmp_path):
    BUILDS.clear()
    path = tiny_causal_campaign(tmp_path, simple_records(12))
    r = cli("overfit", path, "--home", tmp_path / "home", "--max-updates", "60", "--json",
            "--set", "task=test_overfit:CountedBuildTask")
    assert r.code == 0, r.out + r.err
    assert len(BUILDS) == 1  # the accumulation check and the memorising run share one model build
    acc = r.json["data"]["accumulation"]
    assert acc["verdict"] == "ok" and acc["seconds"] > 0
    text = "\n".join(r.json["messages"])
    # two micro-batches of the shortest examples, then one batch of the same: each example twice
    assert f"accumulation check cost: {acc['cost']}, about " in text and f"in {acc['seconds']:.1f} s" in acc["cost"]
    assert " examples' forward and backward (" in acc["cost"]
    assert " memorising updates (" in text and " s each)" in text


def test_memorising_run_stops_at_the_first_update_under_the_threshold(cli, demo_campaign, tmp_path):
    """The loop hands back as soon as the loss is under LOSS_THRESHOLD (Hooks.stop_when), not at the end of a chunk
    of updates; without a pilot in the journal the budget is sized from the run's own updates, and it says so."""
    from pilotrun.rehearsal.mechanics.overfit import LOSS_THRESHOLD

    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    losses, budget = r.json["data"]["losses"], r.json["data"]["budget"]
    first_under = next(i for i, x in enumerate(losses) if x < LOSS_THRESHOLD) + 1
    assert r.json["data"]["updates"] == first_under == len(losses)  # the first check reproduced every target
    assert budget["sized"] and budget["source"].startswith("the median of its own updates 2..4: no pilot")
    assert 40 <= budget["updates"] <= 150
    text = "\n".join(r.json["messages"])
    assert f"update budget: {budget['updates']} — 120 s at " in text and "no pilot of this campaign's config" in text


def test_budget_sized_from_a_pilot_of_the_same_config_only(cli, demo_campaign, tmp_path):
    """A pilot of the campaign's config in the journal sizes the budget (its time model read at the memorising
    batch's padded tokens); a config changed in what the pilot measured does not use it."""
    home = tmp_path / "home"
    p = cli("pilot", demo_campaign, "--home", home, "--json")
    assert p.code == 0, p.out + p.err
    r = cli("overfit", demo_campaign, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    budget = r.json["data"]["budget"]
    assert budget["source"].startswith(f"pilot {p.json['data']['run_id']}: ")
    assert budget["updates"] == max(40, min(150, int(120 // budget["seconds_per_update"])))
    text = "\n".join(r.json["messages"])
    assert f"update budget: {budget['updates']} — 120 s at" in text and f"pilot {p.json['data']['run_id']}" in text
    # a setting the pilot measured (its updates' time): not that pilot's (the seed or lr would be: issue 43)
    other = cli("overfit", demo_campaign, "--home", home, "--json", "--set", "model.gradient_checkpointing=true")
    assert other.code == 0, other.out + other.err
    assert other.json["data"]["budget"]["source"].startswith("the median of its own updates")


def test_budget_that_cut_the_run_is_named_with_its_fix(cli, demo_campaign, tmp_path, monkeypatch):
    """Planted: a time budget that holds 2 updates. The failure says the budget was sized, not given, and how to
    lift it; --max-updates is taken as given (no sizing)."""
    import pilotrun.rehearsal.mechanics.overfit as of

    monkeypatch.setattr(of, "BUDGET_SECONDS", 0.0)
    monkeypatch.setattr(of, "MIN_UPDATES", 2)
    monkeypatch.setattr(of, "SIZE_AFTER", 1)
    r = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 1
    assert r.json["data"]["updates"] == 2 and r.json["data"]["budget"]["updates"] == 2
    text = "\n".join(r.json["messages"])
    assert "in 2 updates (its budget, sized to 0 s at " in text
    assert "--max-updates 150 gives it the whole ceiling" in text
    given = cli("overfit", demo_campaign, "--home", tmp_path / "home", "--json", "--max-updates", "3")
    assert given.json["data"]["budget"] == {**given.json["data"]["budget"], "updates": 3, "sized": False,
                                            "source": "--max-updates"}
    assert "update budget: 3 (--max-updates)" in given.json["messages"] and "its budget, sized" not in \
        "\n".join(given.json["messages"])


def test_accumulation_check_judges_fp16_weights_at_fp16_rounding(tmp_path):
    """Issue 43's class (a comparison judged at fp32's precision when the math is not fp32): model.dtype float16
    under train.precision fp32 computes in fp16, whose rounding alone moves the gradients by ~1e-4 relative; the
    check judges that at the low-precision tolerance instead of failing it against fp32's 1e-5."""
    from pilotrun.campaign import load_campaign
    from pilotrun.campaign.prepare import prepare
    from pilotrun.engine.precision import compute_dtype
    from pilotrun.rehearsal.mechanics.overfit import LOW_PRECISION_TOLERANCE, TOLERANCE, accumulation_check

    assert [compute_dtype(d, p) for d, p in [("float32", "fp32"), ("bfloat16", "fp32"), ("float32", "bf16-true"),
                                             ("float32", "fp16-mixed"), ("float16", "bf16-mixed")]] == \
        ["float32", "bfloat16", "bfloat16", "float16", "bfloat16"]
    path = tiny_causal_campaign(tmp_path, simple_records(12), model__dtype="float16")
    out = accumulation_check(prepare(load_campaign(path)))
    assert out["verdict"] == "ok", out
    assert out["tolerance"] == LOW_PRECISION_TOLERANCE and out["relative_difference"] > TOLERANCE["float32"]
