"""The pilot: 7 phases with real counters; over-budget, oom and nan planted; 2 ranks over gloo."""

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign

from pilotrun.campaign import load_campaign
from pilotrun.rehearsal.memory.pilot import pilot
from pilotrun.phases import phases_of
from pilotrun.sizes import fmt_bytes

COUNTERS = ("baseline", "peak_allocated", "end_allocated")


def test_demo_pilot_has_seven_ok_rows_with_real_numbers(cli, demo_campaign, tmp_path):
    r = cli("pilot", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    rows = r.json["data"]["rows"]
    assert [x["phase"] for x in rows] == list(phases_of(load_campaign(demo_campaign).campaign))
    for row in rows:
        assert row["verdict"] == "ok" and row["counter"] == "tensors+rss"  # live tensor bytes, RSS as reserved
        assert all(isinstance(row[k], int) and row[k] > 0 for k in COUNTERS if k != "baseline"), row
        assert row["baseline"] > 0 or row["phase"] == "load"  # no tensor lives before the model is built
        assert row["peak_reserved"] > row["peak_allocated"]  # RSS holds the interpreter and libraries too
        assert row["peak_allocated"] >= row["baseline"] and row["duration_s"] > 0
    first = next(x for x in rows if x["phase"] == "first_step")["inputs"]
    assert first["micro_batch"] == 4 and first["accumulation"] == 2 and first["seq_len"] > 0
    from pilotrun.journal import Journal

    assert len(Journal(tmp_path / "home").phase_rows(r.json["data"]["run_id"])) == 7
    # one figure for the GPU, named; RSS only as the host's memory (issue 43: "the peak is reload (2.47 GiB)" was RSS)
    top = max(rows, key=lambda x: x["peak_allocated"])
    assert r.json["summary"].endswith(f"the peak is {top['phase']} ({fmt_bytes(top['peak_allocated'])} live tensors)")
    rss = max(rows, key=lambda x: x["peak_reserved"])
    assert (f"host memory: the process RSS peaked at {fmt_bytes(rss['peak_reserved'])} at {rss['phase']} "
            "(the interpreter and libraries too: this machine's, never a GPU figure") in "\n".join(r.json["messages"])


def _long_validation_campaign(tmp_path):
    train = simple_records(16)
    val = [{"instruction": "q" * 1500, "output": "a" * 400} for _ in range(16)]
    path = tiny_causal_campaign(tmp_path, train, val, train__eval_batch=16, data__max_length=2048)
    c = yaml.safe_load(path.read_text())
    c["model"]["config"]["max_position_embeddings"] = 4096
    return write_campaign(tmp_path, c)


def test_long_validation_is_over_budget_at_eval_longest(tmp_path):
    path = _long_validation_campaign(tmp_path)
    home = tmp_path / "home"
    free = pilot(load_campaign(path), home, memory_limit="1TiB")
    assert free.verdict == "ok"
    from pilotrun.probe.recorder import peak_of

    peaks = {r["phase"]: peak_of(r) for r in free.data["rows"]}  # what a limit is checked against: RSS on CPU
    train_peak = max(peaks["load"], peaks["first_step"], peaks["steady_step"])
    assert peaks["eval_longest"] - train_peak > 64 * 2**20, peaks  # the planted gap is large and robust
    limit = (train_peak + peaks["eval_longest"]) // 2
    res = pilot(load_campaign(path), home, memory_limit=limit)
    assert res.verdict == "fail"
    verdicts = {r["phase"]: r["verdict"] for r in res.data["rows"]}
    assert verdicts["first_step"] == verdicts["steady_step"] == "ok"
    assert verdicts["eval_longest"] == "over-budget"
    text = "\n".join(res.messages)
    assert "over-budget at eval_longest" in text and "seq_len 1901" in text and "eval_batch 16" in text
    assert "train.eval_batch=8" in text


def test_injected_oom_keeps_the_other_phases(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 50))
    res = pilot(load_campaign(path), tmp_path / "home", inject={"oom": "eval_longest"})
    rows = {r["phase"]: r for r in res.data["rows"]}
    assert res.verdict == "fail" and list(rows) == list(phases_of(load_campaign(path).campaign))
    assert rows["eval_longest"]["verdict"] == "oom" and "out of memory" in rows["eval_longest"]["note"].lower()
    assert rows["eval_longest"]["inputs"]["eval_batch"] == 8
    assert all(rows[p]["verdict"] == "ok" for p in ("save", "export", "reload"))


def test_injected_nan_at_first_step(cli, tmp_path, monkeypatch):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 50))
    monkeypatch.setenv("PILOTRUN_PILOT_INJECT", "nan:first_step")
    r = cli("pilot", path, "--home", tmp_path / "home", "--json")
    assert r.code == 1
    rows = {x["phase"]: x for x in r.json["data"]["rows"]}
    assert rows["first_step"]["verdict"] == "nan" and "optimizer step was skipped" in rows["first_step"]["note"]
    assert rows["steady_step"]["verdict"] == "ok"


def test_bad_memory_limit_is_bad_input(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    r = cli("pilot", path, "--memory-limit", "lots", "--home", tmp_path / "home")
    assert r.code == 2 and "--memory-limit" in r.err
    assert not (tmp_path / "home" / "runs").exists()


@pytest.mark.distributed
def test_two_ranks_over_gloo(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(16), simple_records(8, 50), train__strategy="ddp",
                                train__nproc=2)
    res = pilot(load_campaign(path), tmp_path / "home")
    assert res.verdict == "ok", res.messages
    rows = res.data["rows"]
    assert len(rows) == 14
    assert sorted({r["rank"] for r in rows}) == [0, 1]
    for rank in (0, 1):
        assert [r["phase"] for r in rows if r["rank"] == rank] == list(phases_of(load_campaign(path).campaign))
    assert rows[1]["inputs"]["ranks"] == 2
    assert "ranks 2" in res.messages[1]
