"""Journal: run ids never reused, rows never overwritten or deleted, WAL, notes, the journal verbs."""

import sqlite3

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal import Journal


def test_rerun_gets_new_id_and_old_row_unchanged(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), train__updates=2)
    home = tmp_path / "home"
    first = cli("train", path, "--home", home, "--json").json["data"]["run_id"]
    j = Journal(home)
    before = j.get_run(first)
    second = cli("train", path, "--home", home, "--json", "--supersedes", first).json["data"]["run_id"]
    assert second != first
    assert j.get_run(first) == before
    assert j.get_run(second)["supersedes"] == first
    assert before["config_sha256"] and before["packages"]["torch"] and before["data"]["train"]["sha256"]


def test_rows_are_immutable(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), train__updates=1)
    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.training.train import train_run

    run_id = train_run(load_campaign(path), tmp_path / "home", progress=False).data["run_id"]
    j = Journal(tmp_path / "home")
    with j.connect() as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
            db.execute("DELETE FROM runs WHERE run_id=?", (run_id,))
        with pytest.raises(sqlite3.IntegrityError, match="immutable"):
            db.execute("UPDATE runs SET config_json='{}' WHERE run_id=?", (run_id,))
        with pytest.raises(sqlite3.IntegrityError, match="keeps its status"):
            db.execute("UPDATE runs SET status='running' WHERE run_id=?", (run_id,))
    assert j.get_run(run_id)["status"] == "completed"


def test_dead_process_run_becomes_interrupted(tmp_path):
    j = Journal(tmp_path / "home")
    run_id = j.create_run(kind="train", name="x", config={}, config_sha256="0", campaign_path=None, seed=0,
                          git_rev=None, packages={}, data={}, trust_remote_code=False)
    with j.transaction() as db:  # pretend the writer was a process that has since died
        db.execute("UPDATE runs SET pid=999999999 WHERE run_id=?", (run_id,))
    assert Journal(tmp_path / "home").get_run(run_id)["status"] == "interrupted"


def test_runs_show_note(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 50), train__updates=2)
    home = tmp_path / "home"
    run_id = cli("train", path, "--home", home, "--json").json["data"]["run_id"]
    r = cli("runs", "--home", home, "--json")
    assert r.code == 0 and [x["run_id"] for x in r.json["data"]["runs"]] == [run_id]
    # a kind the journal never held is said as such (it read "0 runs of kind trian", as an empty journal would)
    r = cli("runs", "--home", home, "--kind", "trian", "--json")
    assert r.code == 0 and r.json["verdict"] == "warn" and r.json["data"]["runs"] == []
    assert r.json["summary"] == "no run of kind 'trian' in this journal; its kinds: train"
    assert cli("note", "lr looks high", "--run", run_id, "--home", home).code == 0
    assert cli("note", "go with lr 1e-3", "--decision", "--home", home).code == 0
    r = cli("show", run_id, "--home", home, "--json")
    assert r.code == 0
    d = r.json["data"]
    assert d["run"]["status"] == "completed" and d["train_updates"] == 2
    assert [n["text"] for n in d["notes"]] == ["lr looks high"]
    assert "manifest.json" in d["files"] and "artifact/model/model.safetensors" in d["files"]
    human = cli("show", run_id, "--home", home)
    assert run_id in human.out and "validation" in human.out
    notes = Journal(home).notes()
    assert [bool(n["decision"]) for n in notes] == [False, True]


def test_show_unknown_run_is_bad_input(cli, tmp_path):
    Journal(tmp_path / "home")
    r = cli("show", "nope", "--home", tmp_path / "home")
    assert r.code == 2 and "run nope does not exist" in r.err


def test_note_on_unknown_run_is_bad_input(cli, tmp_path):
    r = cli("note", "x", "--run", "nope", "--home", tmp_path / "home")
    assert r.code == 2 and "does not exist" in r.err


def test_run_folder_has_manifest_and_checkpoint(cli, tmp_path):
    from pilotrun.engine.state import latest_checkpoint
    from pilotrun.journal.checkpoints import reference
    from pilotrun.journal.files import verify_manifest

    path = tiny_causal_campaign(tmp_path, simple_records(8), train__updates=4, train__save_every=2)
    run_id = cli("train", path, "--home", tmp_path / "home", "--json").json["data"]["run_id"]
    run_dir = tmp_path / "home" / "runs" / run_id
    assert verify_manifest(run_dir) == []
    # update 4 was the loop's last act, so final stands for update-000004 (a reference, its manifest alone) and the
    # latest checkpoint is the folder holding that state's files
    final = run_dir / "checkpoints" / "final"
    assert reference(final)["checkpoint"] == "update-000004" and [p.name for p in final.iterdir()] == ["manifest.json"]
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "update-000004"
    assert (run_dir / "checkpoints" / "update-000002" / "model.safetensors").is_file()
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len([ln for ln in lines if '"train"' in ln]) == 4
