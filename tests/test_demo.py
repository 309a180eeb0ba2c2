"""The embedded demo end to end, through the real CLI in a fresh process."""

import json

import pytest
from conftest import run_cli_process


@pytest.mark.parametrize("budgets", [
    # the README's `make demo` has the campaign's budgets; the suite's default selection runs every stage with
    # small ones (overfit 4 examples, resume at update 2, train 100 of the demo's 200 updates), ~10 s less
    pytest.param([], marks=pytest.mark.slow, id="as-make-demo"),
    pytest.param(["--quick", "--train-updates", "100"], id="quick")])
def test_demo_end_to_end(tmp_path, budgets):
    out = tmp_path / "demo"
    p = run_cli_process("demo", "--out", out, "--json", *budgets, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(p.stdout)
    stages = {s["stage"]: s for s in data["stages"]}
    assert all(s["verdict"] == "ok" for s in stages.values()), {k: s["summary"] for k, s in stages.items()}
    vals = [v["val_loss"] for v in stages["train"]["data"]["validation"]]
    assert vals[-1] < 0.6 * vals[0], vals  # the validation loss visibly falls
    assert (out / "campaign.yaml").is_file() and (out / "data" / "train.jsonl").is_file()
    assert (out / ".pilotrun" / "journal.sqlite").is_file()
    assert "rehearsal summary" in p.stderr


def test_demo_data_is_deterministic_and_split_by_conversation(tmp_path):
    from pilotrun.demo.synth import write_demo

    a = write_demo(tmp_path / "a").parent
    b = write_demo(tmp_path / "b").parent
    for split in ("train", "validation", "test"):
        assert (a / "data" / f"{split}.jsonl").read_bytes() == (b / "data" / f"{split}.jsonl").read_bytes()
    ids = {}
    for split in ("train", "validation", "test"):
        recs = [json.loads(ln) for ln in (a / "data" / f"{split}.jsonl").read_text().splitlines()]
        ids[split] = {r["conversation_id"] for r in recs}
        assert len({r["family"] for r in recs}) == 4
    assert not (ids["train"] & ids["validation"]) and not (ids["train"] & ids["test"])


def test_the_demo_never_replaces_a_users_campaign_or_data(tmp_path, cli):
    """`pilotrun demo --out my-project` replaced the campaign.yaml and data/train.jsonl there with the demo's."""
    from pilotrun.demo.synth import write_demo

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "campaign.yaml").write_text("name: precious\n")
    r = cli("demo", "--out", mine)
    assert r.code == 2 and "campaign.yaml: holds a campaign.yaml the demo did not write" in r.err, r.err
    assert (mine / "campaign.yaml").read_text() == "name: precious\n" and not (mine / "data").exists()
    data = tmp_path / "data-only"
    (data / "data").mkdir(parents=True)
    (data / "data" / "train.jsonl").write_text('{"instruction": "mine", "output": "mine"}\n')
    r = cli("demo", "--out", data)
    assert r.code == 2 and "train.jsonl: holds a data file the demo did not write" in r.err, r.err
    assert "mine" in (data / "data" / "train.jsonl").read_text() and not (data / "campaign.yaml").exists()
    # the demo's own folder is written again (make demo, twice)
    first = write_demo(tmp_path / "again", n_conversations=20).read_text()
    assert write_demo(tmp_path / "again", n_conversations=20).read_text() == first
