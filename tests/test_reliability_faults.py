"""Out of memory and NaN inside every stage that runs the model: each gives a verdict, a run status and
exit code 1 (SPEC: a check gave a failing verdict), never a traceback, a hang or a run left `running`.

The out-of-memory error is planted with the test switch PILOTRUN_TEST_OOM_AT_UPDATE (engine/loop.py:
the K-th update of every run raises torch.OutOfMemoryError after its first backward pass), since a CPU
box cannot be made to run out of memory on cue; the NaN is real: a learning rate of 1e30.
"""

from __future__ import annotations

import sqlite3

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.engine.loop import OOM_ENV
from pilotrun.engine.state import is_complete
from pilotrun.journal.store import FINAL, Journal

NAN = ("--set", "train.lr=1e30")
OOM_TEXT = "out of memory at update"

# (verb, fault, extra args, planted OOM update, exit code, texts expected in the output, final run statuses)
CASES = [
    ("train", "oom", (), 2, 1, ["failed — out of memory at update 2", "lower train.micro_batch"], {"failed"}),
    ("train", "nan", NAN, None, 1, ["diverged — loss is nan at update 2"], {"diverged"}),
    ("overfit", "oom", ("--examples", "2", "--max-updates", "6"), 1, 1,
     ["the accumulation check ran out of memory", f"{OOM_TEXT} 1"], {"failed"}),
    ("overfit", "nan", ("--examples", "2", "--max-updates", "6", *NAN), None, 1,
     ["non-finite loss (nan) at update 2", "the lr (1.00e+30)"], {"diverged"}),
    ("pilot", "oom", (), 1, 1, ["oom at first_step", "planted at update 1"], {"failed"}),
    ("pilot", "nan", NAN, None, 1, ["nan at steady_step", "the optimizer step was skipped"], {"failed"}),
    ("resume", "oom", (), 1, 1, ["the reference run failed before update 8: out of memory at update 1"], {"failed"}),
    ("resume", "nan", NAN, None, 1, ["the reference run diverged before update 8: loss is nan"], {"diverged"}),
    ("sweep", "oom", (), 2, 1, ["control    seed 0: failed — out of memory at update 2", "did not finish"],
     {"failed"}),
    ("fit", "oom", ("--memory-limit", "64GiB"), 1, 1, ["the control exceeds 64.00 GiB at phase first_step",
                                                        "oom"], {"failed"}),
    ("estimate", "oom", ("--gpu-memory", "1MiB"), None, 1, ["is above 1.0 MiB at phase"], set()),
]


@pytest.fixture
def campaign(tmp_path):
    return tiny_causal_campaign(tmp_path, simple_records(16), simple_records(4, 100),
                                plan__control={}, plan__variants=[{"train.lr": 2e-3}], plan__seeds=[0])


def _integrity(home) -> str:
    db = sqlite3.connect(home / "journal.sqlite")
    try:
        return db.execute("PRAGMA integrity_check").fetchone()[0]
    finally:
        db.close()


def _assert_clean_journal(home) -> list[dict]:
    if not (home / "journal.sqlite").exists():
        return []
    assert _integrity(home) == "ok"
    runs = Journal(home).list_runs()
    assert all(r["status"] in FINAL for r in runs), [(r["run_id"], r["status"]) for r in runs]
    return runs


@pytest.mark.timeout(240)
@pytest.mark.parametrize("verb, fault, args, oom_at, code, texts, statuses", CASES,
                         ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_fault_gives_a_verdict_and_a_finished_run(cli, campaign, tmp_path, monkeypatch, verb, fault, args, oom_at,
                                                  code, texts, statuses):
    home = tmp_path / "home"
    if oom_at is not None:
        monkeypatch.setenv(OOM_ENV, str(oom_at))
    r = cli(verb, campaign, "--home", home, "--json", *args)
    assert r.code == code, r.err[-3000:]
    assert "internal error" not in r.err and "Traceback" not in r.err
    out = r.json
    assert out["verdict"] == "fail"
    text = "\n".join([out["summary"], *out["messages"]])
    for t in texts:
        assert t in text, (t, text[-3000:])
    runs = _assert_clean_journal(home)
    assert {x["status"] for x in runs} == statuses
    for x in runs:  # whatever a run saved before the fault is complete
        for ckpt in (Journal(home).run_dir(x["run_id"]) / "checkpoints").glob("[!.]*"):
            assert is_complete(ckpt), ckpt
    if verb == "train" and fault == "oom":
        run = runs[0]
        j = Journal(home)
        assert [m["step"] for m in j.metrics(run["run_id"], "train", "loss")] == [1]  # the update before the fault
        assert run["updates_done"] == 1 and "out of memory at update 2" in run["summary"]["reason"]
        assert not (j.run_dir(run["run_id"]) / "artifact").exists()  # nothing a later verify could trust
        assert is_complete(j.run_dir(run["run_id"]) / "checkpoints" / "final")


@pytest.mark.timeout(240)
def test_sweep_out_of_memory_then_continue_finishes(cli, campaign, tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv(OOM_ENV, "2")
    r = cli("sweep", campaign, "--home", home, "--json")
    assert r.code == 1 and r.json["verdict"] == "fail"
    sweep_id = r.json["data"]["sweep_id"]
    failed = {x["run_id"] for x in Journal(home).list_runs(sweep_id=sweep_id)}
    assert len(failed) == 2
    monkeypatch.delenv(OOM_ENV)
    r = cli("sweep", campaign, "--home", home, "--continue", sweep_id, "--json")
    assert r.code == 0, r.err[-3000:]
    runs = _assert_clean_journal(home)
    assert sorted(x["status"] for x in runs) == ["completed", "completed", "failed", "failed"]
    assert {x["supersedes"] for x in runs if x["status"] == "completed"} == failed


@pytest.mark.timeout(240)
def test_sweep_with_a_nan_arm_keeps_it_as_diverged(cli, tmp_path):
    """A variant that diverges is a result of the sweep, not a failed sweep: warn, exit 0 (sweep.py)."""
    path = tiny_causal_campaign(tmp_path, simple_records(16), simple_records(4, 100),
                                plan__control={}, plan__variants=[{"train.lr": 1e30}], plan__seeds=[0])
    r = cli("sweep", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err[-3000:]
    assert r.json["verdict"] == "warn" and "1 diverged" in r.json["summary"]
    runs = _assert_clean_journal(tmp_path / "home")
    assert sorted((x["arm"], x["status"]) for x in runs) == [("control", "completed"), ("variant-1", "diverged")]
    assert "loss is nan" in next(x for x in runs if x["arm"] == "variant-1")["summary"]["reason"]
