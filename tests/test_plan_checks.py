"""Sweep arms are measured on the same validation examples: a variant that changes how validation records are
encoded (max_length, the prompt/response/messages templates, the tokenizer, the task, the validation file) is
refused with exit 2 naming the key and why — by `validate` (no torch) as well as by `sweep`, before any run."""

from __future__ import annotations

import pytest
import yaml

from conftest import write_campaign


def _plan(demo_dir, variants):
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=variants, seeds=[0])
    return write_campaign(demo_dir, c)


@pytest.mark.parametrize("variant, key, said", [
    ({"data.max_length": 32}, "data.max_length", "data.max_length is 32 here and 64 in the control"),
    ({"data.prompt": "Instruction: {instruction}\nAnswer: "}, "data.prompt", "data.prompt is 'Instruction:"),
    ({"data.response": "instruction"}, "data.response", "data.response is 'instruction' here and 'output'"),
    ({"data.messages": "turns"}, "data.messages", "data.messages is 'turns' here and None"),
    ({"model.tokenizer": "tok"}, "model.tokenizer", "model.tokenizer is"),
    ({"data": {"max_length": 48}}, "data", "data.validation is None here"),  # a section replaces the whole section
])
@pytest.mark.parametrize("verb", ["validate", "sweep"])
def test_variant_changing_validation_encoding_is_refused(demo_dir, cli, variant, key, said, verb):
    (demo_dir / "tok").mkdir()
    campaign = _plan(demo_dir, [{"train.lr": 1e-3}, variant])
    home = demo_dir / "home"
    r = cli(verb, campaign, "--home", home)
    assert r.code == 2, r.out + r.err
    err = " ".join(r.err.split())
    assert "plan.variants[1] changes the validation set or how its records are encoded" in err, err
    assert said in err, err
    assert "measured on other validation examples" in err, err
    assert f"(key {key})" in err and f"remove {key} from plan.variants[1]" in err, err
    assert "campaign.yaml:" in err
    assert not (home / "runs").exists()  # nothing ran


def test_validate_refuses_the_plan_without_importing_torch(demo_dir):
    import subprocess
    import sys

    campaign = _plan(demo_dir, [{"data.max_length": 32}])
    code = ("import sys; from pilotrun.cli.main import run; rc = run(['validate', %r]); "
            "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)" % str(campaign))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "plan.variants[0] changes the validation set or how its records are encoded" in " ".join(p.stderr.split())


def test_variants_that_keep_validation_encoding_pass_validate(demo_dir, cli):
    # lr, schedule, the training file and dropout-free model changes leave validation's tokens as they are
    campaign = _plan(demo_dir, [{"train.lr": 1e-3}, {"train.schedule": "constant"},
                                {"data.train": "data/test.jsonl"}, {"model.config.hidden_size": 32}])
    r = cli("validate", campaign, "--home", demo_dir / "home")
    assert r.code == 0, r.out + r.err
    assert "plan: control and 4 variants" in " ".join((r.out + r.err).split())


def test_same_setting_written_again_is_not_a_change(demo_dir):
    from pilotrun.campaign.arms import plan_arms
    from pilotrun.campaign.load import load_campaign

    arms = plan_arms(load_campaign(_plan(demo_dir, [{"data.max_length": 64, "train.lr": 1e-3}])))
    assert [a.name for a in arms] == ["control", "variant-1"]


@pytest.mark.parametrize("variants, said", [
    ([{"train.lr": 1e-3}, {}], "plan.variants[1] sets nothing, so it trains exactly what plan.control trains"),
    ([{"train.lr": 3e-3}], "plan.variants[0] sets train.lr=0.003, so it trains exactly what plan.control trains"),
    ([{"train.lr": 1e-3}, {"train.lr": 1e-3}], "plan.variants[1] sets train.lr=0.001, so it trains exactly what "
                                               "plan.variants[0] trains"),
    # what no weight depends on: the run's name, the rental, how often it saves (each passed as a variant)
    ([{"name": "other"}], "plan.variants[0] sets only name=other, which no weight of a run depends on, so it trains "
                          "exactly what plan.control trains"),
    ([{"hardware.gpus": 2}], "plan.variants[0] sets only hardware.gpus=2, which no weight of a run depends on"),
    ([{"train.lr": 1e-3}, {"train.lr": 1e-3, "train.save_every": 3}], "plan.variants[1] sets train.lr=0.001, "
     "train.save_every=3, so it trains exactly what plan.variants[0] trains"),
])
@pytest.mark.parametrize("verb", ["validate", "sweep"])
def test_an_arm_that_copies_another_is_refused_before_any_run(demo_dir, cli, variants, said, verb):
    home = demo_dir / "home"
    r = cli(verb, _plan(demo_dir, variants), "--home", home)
    assert r.code == 2, r.out + r.err
    err = " ".join(r.err.split())
    assert said in err and "would spend 1 run of the rental on a copy and compare it as a variant" in err, err
    assert not (home / "runs").exists()


@pytest.mark.parametrize("verb", ["validate", "sweep"])
def test_an_arm_whose_own_data_file_is_missing_is_refused_before_any_run(demo_dir, cli, verb):
    """The control's files were checked, a variant's were not: the sweep stopped at that arm, mid-rental."""
    home = demo_dir / "home"
    r = cli(verb, _plan(demo_dir, [{"train.lr": 1e-3}, {"data.train": "data/other.jsonl"}]), "--home", home)
    assert r.code == 2, r.out + r.err
    assert "plan.variants[1] (data.train=data/other.jsonl): data file not found (named by data.train)" in r.err
    assert str(demo_dir / "data" / "other.jsonl") in r.err and not (home / "runs").exists()


def test_a_warm_up_as_long_as_the_budget_warns(demo_dir, cli):
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())  # the demo_dir's budget: 12 updates, cosine
    for warmup, said in ((20, "ends at 12/20 of train.lr (0.0018, not 0.003); the cosine schedule's decay never starts"),
                         (12, "reaches train.lr at its last update only; the cosine schedule's decay never starts")):
        c["train"]["warmup"] = warmup
        r = cli("validate", write_campaign(demo_dir, c), "--json")
        assert r.code == 0 and r.json["verdict"] == "warn", r.err
        assert f"train.warmup: warm-up {warmup} updates ≥ the budget's 12: the learning rate rises for the whole run " \
               f"and {said}" in r.json["summary"]
    c["train"]["warmup"] = 11
    c["plan"]["variants"] = [{"train.warmup": 30}]
    r = cli("validate", write_campaign(demo_dir, c), "--json")
    assert r.json["verdict"] == "warn" and r.json["summary"].count("warm-up") == 1
    assert "plan.variants[0] (train.warmup=30): warm-up 30 updates" in r.json["summary"]
    c["plan"]["variants"] = [{"train.lr": 1e-3}]
    assert cli("validate", write_campaign(demo_dir, c), "--json").json["verdict"] == "ok"
