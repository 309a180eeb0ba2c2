from conftest import run_cli_process


def test_help_lists_verbs():
    p = run_cli_process("--help")
    assert p.returncode == 0
    for verb in ("demo", "init", "validate", "train", "all", "runs", "show", "note"):
        assert verb in p.stdout


def test_train_on_demo_json(cli, demo_campaign, tmp_path):
    r = cli("train", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    data = r.json
    assert data["data"]["status"] == "completed"
    vals = [v["val_loss"] for v in data["data"]["validation"]]
    assert vals[-1] < vals[0]
