"""Trackers without a server: the journal's tracker ids and their migration, what a run becomes in any
tracker, W&B offline files read back with W&B's own record classes, live logging to a tracker that is down or
refuses (the run completes, the journal has it all, the command says how to send it later), and the export
verb's bad input. The MLflow server tests are in test_trackers_mlflow.py (slow)."""

from __future__ import annotations

import ast
import math
import socket
import sqlite3
from pathlib import Path

import pytest

from conftest import write_demo_dir
from wandb_records import read_records

SRC = Path(__file__).resolve().parents[1] / "src" / "pilotrun"


def _recorded(home: Path, campaign: Path, *, status: str = "diverged", sweep: tuple | None = None,
              observer=None) -> str:
    """A run through the real run lifecycle (RunRecorder), with no training: four train points, one not
    finite, a validation point, two ledger rows; ended ``status``."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.journal.observers import observing
    from pilotrun.journal.runs import RunRecorder
    from pilotrun.journal.store import Journal

    journal = Journal(home)
    kw = {"sweep_id": sweep[0], "arm": sweep[1]} if sweep else {}
    with observing(observer) if observer else _nothing():
        rec = RunRecorder(journal, load_campaign(campaign), kind="sweep" if sweep else "train", **kw)
        for step, loss in enumerate((5.0, 4.0, 3.5, float("nan")), 1):
            rec.log("train", step, {"loss": loss, "lr": 1e-3}, examples_seen=8 * step, wall_s=0.5 * step)
        rec.log("validation", 2, {"val_loss": 4.2}, examples_seen=16, wall_s=1.0, flush=True)
        journal.add_phase_rows(rec.run_id, [
            {"phase": "observed_train", "rank": 0, "device": "cpu", "counter": "tensors+rss", "peak_allocated": 2**20,
             "duration_s": 0.25, "verdict": "ok", "inputs": {"micro_batch": 4}},
            {"phase": "observed_save", "rank": 0, "device": "cpu", "counter": "tensors+rss", "peak_allocated": 2**19,
             "duration_s": 0.1, "verdict": "ok"}])
        rec.seal()
        rec.finish(status, {"reason": "loss is nan at update 4"} if status == "diverged" else {})
    return rec.run_id


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


@pytest.fixture(autouse=True)
def _wandb_service_stopped():
    """W&B's service (wandb-core, a process of its own with files in the temp directory) lives as long as the
    process that started it: a user's CLI run ends it at exit; pytest's process lives on, so each test ends it."""
    yield
    import sys

    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    return write_demo_dir(tmp_path_factory.mktemp("trackers")) / "campaign.yaml"


def test_the_journal_keeps_tracker_ids_and_an_older_journal_gains_the_table(tmp_path):
    from pilotrun.journal.store import SCHEMA_VERSION, Journal
    from pilotrun.journal.tracked import record_tracked, tracked

    j = Journal(tmp_path / "home")
    j.add_note("before the migration")
    record_tracked(j, "mlflow", "http://127.0.0.1:1", "run-a", "abc", experiment="e", state="live")
    record_tracked(j, "mlflow", "http://127.0.0.1:1", "run-a", "abc", experiment="e", state="complete", digest="d1")
    row = tracked(j, "mlflow", "http://127.0.0.1:1", "run-a")
    assert (row["tracker_run_id"], row["state"], row["digest"]) == ("abc", "complete", "d1")
    assert tracked(j, "mlflow", "sqlite:///elsewhere.db", "run-a") is None  # per target: another store is another copy
    with pytest.raises(AssertionError):
        record_tracked(j, "mlflow", "t", "run-b", "x", experiment=None, state="sent")
    # a version-3 journal (before trackers) is backed up and gains the table, its rows kept
    db = sqlite3.connect(j.path)
    db.execute("DROP TABLE tracked")
    db.execute("PRAGMA user_version=3")
    db.commit()
    db.close()
    j = Journal(tmp_path / "home")
    assert (tmp_path / "home" / "journal.sqlite.bak-v3").is_file() and SCHEMA_VERSION == 4
    assert tracked(j, "mlflow", "http://127.0.0.1:1", "run-a") is None and [n["text"] for n in j.notes()] == [
        "before the migration"]
    record_tracked(j, "wandb", "offline:/x", "run-a", "run-a", experiment="p", state="complete")


def test_a_run_in_any_tracker_is_its_journal_content(tmp_path, demo):
    from pilotrun.integrations.trackers import content as C
    from pilotrun.journal.store import Journal

    home = tmp_path / "home"
    run_id = _recorded(home, demo)
    j = Journal(home)
    run = j.get_run(run_id)
    params = C.params(run)
    assert params["train.lr"] == str(run["config"]["train"]["lr"]) and params["seed"] == "0"
    assert params["plan.seeds"] == "[0]" and params["model.adapter"] == "None"
    assert "track" not in run["config"]  # where runs are logged is no part of the experiment (nor its sha256)
    tags = C.tags(run)
    assert tags["pilotrun.status"] == "diverged" and tags["pilotrun.shown_status"] == "diverged"
    assert tags["pilotrun.verdict"] == "fail" and tags["pilotrun.reason"] == "loss is nan at update 4"
    assert C.outcome(run)["failed"] and not C.outcome(run)["interrupted"]
    points = C.metric_points(j, run)
    loss = [p for p in points if p["key"] == "train/loss"]
    assert [p["step"] for p in loss] == [1, 2, 3, 4] and [p["value"] for p in loss[:3]] == [5.0, 4.0, 3.5]
    assert math.isnan(loss[3]["value"])  # the journal's NULL (a non-finite loss) is NaN in the tracker
    assert [(p["step"], p["value"]) for p in points if p["key"] == "validation/val_loss"] == [(2, 4.2)]
    assert loss[1]["time"] - loss[0]["time"] == pytest.approx(0.5)  # the run's start plus each point's wall_s
    columns, rows = C.ledger(j, run_id)
    assert columns[:2] == ["phase", "rank"] and [r[0] for r in rows] == ["observed_train", "observed_save"]
    assert {(p["key"], p["value"]) for p in C.ledger_points(j, run)} >= {
        ("ledger/observed_train/peak_allocated", 2**20), ("ledger/observed_train/duration_s", 0.25)}
    assert {f.name for f in C.run_files(j, run_id)} == {"config.yaml", "revisions.json", "README.md"}
    before = C.run_digest(j, run)
    j.add_note("lr 1e3 was a typo", run_id=run_id, decision=True)
    assert C.run_digest(j, run) != before  # a note added later is sent again
    assert "**decision**" in C.run_description(j, run) and "lr 1e3 was a typo" in C.run_description(j, run)
    # a completed run whose check failed is a failure too; an interrupted one is not a finished run
    ok = dict(run, status="completed", summary={"verdict": "fail"})
    assert C.outcome(ok)["shown_status"] == "check failed" and C.outcome(ok)["failed"]
    assert C.outcome(dict(run, status="interrupted", summary={}))["interrupted"]
    from pilotrun.integrations.trackers.mlflow_tracker import STATUS, key

    assert STATUS["diverged"] == STATUS["check failed"] == "FAILED" and STATUS["completed"] == "FINISHED"
    assert key("ledger/eval longest/peak (MiB)") == "ledger/eval longest/peak _MiB_" and key("../x") == ".._x"


def test_wandb_offline_files_hold_the_run(tmp_path, demo, monkeypatch, cli):
    """export --to wandb writes the offline files `wandb sync` uploads; read back with W&B's own record classes:
    the config, the history against `update`, the failure (exit code), the summary; a second export sends
    nothing twice."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_DIR", raising=False)
    home = tmp_path / "home"
    run_id = _recorded(home, demo)
    r = cli("export", run_id, "--to", "wandb", "--home", home, "--json")
    assert r.code == 0, r.err
    assert r.json["data"]["counts"] == {"sent": 1, "updated": 0, "unchanged": 0}
    assert "pilotrun export: sending 1 run to W&B" in r.err and "pilotrun export: ended (" in r.err, r.err
    (folder,) = (home / "wandb").glob(f"offline-run-*-{run_id}")
    recs = read_records(folder / f"run-{run_id}.wandb")
    run = recs["run"][0]
    assert run.run_id == run_id and run.project == "demo-tiny-sft" and run.job_type == "train"
    config = {u.key: u.value_json for u in run.config.update}
    assert config["seed"] == "0" and '"lr"' in config["train"]
    history = [{i.nested_key[0] if i.nested_key else i.key: i.value_json for i in h.item} for h in recs["history"]]
    losses = [(int(h["update"]), float(h["train/loss"])) for h in history if "train/loss" in h]
    assert losses[:3] == [(1, 5.0), (2, 4.0), (3, 3.5)] and losses[3][0] == 4 and math.isnan(losses[3][1])
    assert any(h.get("validation/val_loss") == "4.2" and h["update"] == "2" for h in history)
    assert recs["exit"][-1].exit_code == 1  # a diverged run is a failed run in W&B
    summary = {(u.nested_key[0] if u.nested_key else u.key): u.value_json for s in recs["summary"] for u in s.update}
    assert summary["status"] == '"diverged"' and summary["verdict"] == '"fail"'
    again = cli("export", run_id, "--to", "wandb", "--home", home, "--json")
    assert again.code == 0 and again.json["data"]["counts"]["unchanged"] == 1
    assert len(list((home / "wandb").glob("offline-run-*"))) == 1


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens once the socket is closed


def test_a_tracker_that_is_down_never_stops_the_run(tmp_path, demo, monkeypatch):
    """Live logging to an MLflow server that is not there: tried, tried again, then reported with the export
    that sends the runs later; the run ends as it would have, every point in the journal, no tracker id kept."""
    from pilotrun.integrations.trackers.export import make_tracker
    from pilotrun.integrations.trackers.live import LiveTracker
    from pilotrun.journal.store import Journal
    from pilotrun.journal.tracked import tracked_rows

    home, uri = tmp_path / "home", f"http://127.0.0.1:{_closed_port()}"
    live = LiveTracker(lambda: make_tracker("mlflow", home, uri=uri), home, export_hint="pilotrun export C --to mlflow",
                       retries=(0.01, 0.01))
    run_id = _recorded(home, demo, status="completed", observer=live)
    lines = live.close(drain_s=120)
    j = Journal(home)
    assert j.get_run(run_id)["status"] == "completed" and len(j.metrics(run_id, "train", "loss")) == 4
    assert tracked_rows(j) == []
    assert len(lines) == 1 and "live logging to" in lines[0] and uri in lines[0], lines
    assert "tried 3 times" in lines[0] and "`pilotrun export C --to mlflow`" in lines[0]


def test_a_tracker_that_hangs_is_waited_for_a_bounded_time(tmp_path, demo):
    """An MLflow server that takes the connection and never answers: the run is recorded whole while the sender
    hangs; the verb's end says it is sending the rest, waits only the drain it was given, then says the sending
    had not finished and names the export that sends the rest (a warning, ``trouble``)."""
    from pilotrun.integrations.trackers.export import make_tracker
    from pilotrun.integrations.trackers.live import LiveTracker
    from pilotrun.journal.store import Journal

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)  # the kernel accepts; nothing ever reads or answers
        home, uri = tmp_path / "home", f"http://127.0.0.1:{server.getsockname()[1]}"
        live = LiveTracker(lambda: make_tracker("mlflow", home, uri=uri), home,
                           export_hint="pilotrun export C --to mlflow", retries=(0.01,))
        run_id = _recorded(home, demo, status="completed", observer=live)
        assert Journal(home).get_run(run_id)["status"] == "completed"
        said: list[str] = []
        (line,) = live.close(drain_s=1.0, say=said.append)
    assert said == [f"sending what is left to MLflow at {uri}, one experiment per campaign (at most 1s)"], said
    assert live.trouble and f"live logging to {uri} had not finished after 1s" in line, line
    assert "`pilotrun export C --to mlflow`" in line


def test_a_tracker_that_refuses_is_reported_and_the_clean_case_logs_live(tmp_path, demo, monkeypatch):
    """W&B offline into a folder that cannot be one (WANDB_DIR is a file): refused, reported, the run unharmed.
    The same run with a usable folder: logged live, its W&B run complete, and an export after it sends nothing
    twice."""
    from pilotrun.integrations.trackers.export import make_tracker
    from pilotrun.integrations.trackers.live import LiveTracker
    from pilotrun.journal.store import Journal
    from pilotrun.journal.tracked import tracked_rows

    monkeypatch.delenv("WANDB_MODE", raising=False)
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "afile"))
    home = tmp_path / "home"
    live = LiveTracker(lambda: make_tracker("wandb", home), home, export_hint="pilotrun export C --to wandb",
                       retries=(0.01,))
    run_id = _recorded(home, demo, observer=live)
    (line,) = live.close(drain_s=120)
    assert "live logging to offline:" in line and "stopped" in line and "pilotrun export C --to wandb" in line
    assert Journal(home).get_run(run_id)["status"] == "diverged" and tracked_rows(Journal(home)) == []

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-here"))
    live = LiveTracker(lambda: make_tracker("wandb", home), home, export_hint="x", retries=(0.01,))
    run_id = _recorded(home, demo, observer=live)
    (line,) = live.close(drain_s=120)
    assert line.startswith("logged live to W&B (offline)") and "1 run(s)" in line, line
    (row,) = tracked_rows(Journal(home))
    assert (row["subject"], row["state"]) == (run_id, "complete")
    (folder,) = (tmp_path / "wandb-here" / "wandb").glob(f"offline-run-*-{run_id}")
    recs = read_records(folder / f"run-{run_id}.wandb")
    assert sorted({int(float(h)) for h in _values(recs, "update")}) == [1, 2, 3, 4]
    assert [float(v) for v in _values(recs, "train/loss")][:3] == [5.0, 4.0, 3.5]
    assert recs["exit"][-1].exit_code == 1


def _values(recs, key: str) -> list[str]:
    return [i.value_json for h in recs["history"] for i in h.item
            if (i.nested_key[0] if i.nested_key else i.key) == key]


def test_export_bad_input(tmp_path, demo, cli):
    home = tmp_path / "home"
    run_id = _recorded(home, demo)
    r = cli("export", run_id, "--home", home)
    assert r.code == 2 and "--to" in r.err and "track: {to: mlflow}" in r.err
    r = cli("export", "20991231-nope", "--to", "wandb", "--home", home)
    assert r.code == 2 and "run 20991231-nope does not exist" in r.err
    r = cli("export", run_id, "--to", "wandb", "--uri", "http://x", "--home", home)
    assert r.code == 2 and "--uri is MLflow's tracking URI" in r.err
    uri = f"http://127.0.0.1:{_closed_port()}"
    r = cli("export", run_id, "--to", "mlflow", "--uri", uri, "--home", home, "--json")
    assert r.code == 2 and r.json["error"]["where"] == uri and "did not take the export" in r.err, r.err
    assert "export again" in r.err and "Traceback" not in r.err
    assert cli("export", str(demo), "--to", "mlflow", "--uri", uri, "--home", tmp_path / "other").code == 2
    # a password in the address (MLflow takes https://user:password@host) reaches the client, never the output
    secret = f"http://alice:s3cret@127.0.0.1:{_closed_port()}"
    r = cli("export", run_id, "--to", "mlflow", "--uri", secret, "--home", home, "--json")
    assert r.code == 2 and r.json["error"]["where"] == secret.replace("s3cret", "***"), r.err
    assert "s3cret" not in r.err + r.out and "alice:***@127.0.0.1" in r.err
    # a URI MLflow itself refuses (a folder store, MLflow 3's old default; a scheme it lacks) was exit 3
    for uri, said in ((str(tmp_path / "mlruns"), "The filesystem tracking backend"), ("foo://bar", "foo://bar")):
        r = cli("export", run_id, "--to", "mlflow", "--uri", uri, "--home", home)
        assert r.code == 2, r.err
        assert f"MLflow tracking URI: MLflow refuses the tracking URI {uri}: " in r.err and said in r.err, r.err
        assert "fix: pass a database (--uri sqlite:///PATH/mlflow.db)" in r.err


def test_only_the_tracker_modules_import_mlflow_or_wandb():
    """--help, validate and every stage import neither package: the imports live in integrations/trackers,
    inside functions (checked on the source, each import statement)."""
    found = []
    for f in sorted(SRC.rglob("*.py")):
        text = f.read_text(encoding="utf-8")
        if "mlflow" not in text and "wandb" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] in ("mlflow", "wandb") for n in names):
                found.append((f.relative_to(SRC).as_posix(), node.col_offset))
    assert found and {p for p, _ in found} <= {"integrations/trackers/mlflow_tracker.py",
                                               "integrations/trackers/wandb_tracker.py"}, found
    assert all(col > 0 for _, col in found), found  # indented: inside a function, never at import time


def test_wandb_points_count_as_sent_only_once_wandb_took_them(tmp_path):
    """A ``log`` that raises (W&B's service gone for a moment) left its points marked as sent, so live logging's
    retry skipped them: missing in W&B, present in the journal. Marked after the call, the retry sends them."""
    from pilotrun.integrations.trackers.wandb_tracker import WandbTracker

    class Flaky:  # stands for wandb's Run: only its log(), which fails the first time
        def __init__(self):
            self.logged, self.calls = [], 0

        def log(self, row):
            self.calls += 1
            if self.calls == 1:
                raise ConnectionError("the service went away")
            self.logged.append(row)

    points = [{"key": "train/loss", "step": s, "value": v} for s, v in ((1, 5.0), (2, 4.0))]
    tracker, wrun, sent = WandbTracker(tmp_path), Flaky(), set()
    with pytest.raises(ConnectionError):
        tracker._history(wrun, sent, points)
    tracker._history(wrun, sent, points)  # the retry
    assert [r["update"] for r in wrun.logged] == [1, 2] and sent == {("train/loss", 1), ("train/loss", 2)}


def test_pilotruns_own_error_during_an_export_is_a_bug_not_the_trackers_refusal(tmp_path, demo, cli, monkeypatch):
    """A defect planted in pilotrun's exporter (its journal lookup called with arguments it does not take: the
    TypeError is raised in export.py's own frame) is exit 3, an internal error, where the tracker's own errors
    (test_export_bad_input) are exit 2 naming the tracker; live logging says it is pilotrun's error, not the
    tracker's, and does not try it again. The clean case: the same export with the lookup intact sends the run."""
    from pilotrun.integrations.trackers import export as export_mod
    from pilotrun.integrations.trackers.export import make_tracker
    from pilotrun.integrations.trackers.live import LiveTracker

    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-here"))
    home = tmp_path / "home"
    run_id = _recorded(home, demo)
    real = export_mod.tracked
    monkeypatch.setattr(export_mod, "tracked", lambda: None)
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the internal error's traceback file lands here
    r = cli("export", run_id, "--to", "wandb", "--home", home)
    assert r.code == 3 and "internal error" in r.err and "did not take the export" not in r.err, (r.code, r.err)
    tries = []
    live = LiveTracker(lambda: tries.append(1) or make_tracker("wandb", home), home, export_hint="x",
                       retries=(0.01, 0.01))
    _recorded(home, demo, observer=live)
    (line,) = live.close(drain_s=120)
    assert "an error in pilotrun itself, not the tracker's (TypeError" in line and "tried" not in line, line
    monkeypatch.setattr(export_mod, "tracked", real)
    r = cli("export", run_id, "--to", "wandb", "--home", home)
    assert r.code == 0 and "1 sent" in r.out, r.err
