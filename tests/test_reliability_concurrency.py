"""Concurrency: processes writing to one journal at once lose no row. The journal is SQLite in WAL mode;
every write is one BEGIN IMMEDIATE transaction that waits (busy timeout, then retries) while another
process holds the write lock, and readers are never blocked."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal.store import Journal

SRC = str(Path(__file__).resolve().parents[1] / "src")

WRITER = r"""
import json, os, sys, time
sys.path.insert(0, {src!r})
from pilotrun.journal.store import Journal

home, go, n, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
while not os.path.exists(go):  # every writer starts at the same moment
    time.sleep(0.001)
j = Journal(home)  # the first open of a fresh home writes the schema: racing writers do it together
run_id = j.create_run(kind="test", name=tag, config={{"tag": tag}}, config_sha256="0" * 64, campaign_path=None,
                      seed=0, git_rev=None, packages={{}}, data={{}}, trust_remote_code=False)
for i in range(n):  # one transaction per row: the most lock hand-overs
    j.add_metrics(run_id, [("train", "loss", i, float(i), i, None)])
    if i % 25 == 0:
        j.add_phase_rows(run_id, [{{"phase": "steady_step", "rank": 0, "verdict": "ok", "note": f"{{tag}} {{i}}"}}])
        j.add_note(f"{{tag}} note {{i}}", run_id=run_id)
j.finish_run(run_id, "completed")
print(json.dumps({{"run_id": run_id}}))
"""


def _writers(tmp_path, k: int, n: int) -> list[str]:
    home, go = tmp_path / "home", tmp_path / "go"
    script = WRITER.format(src=SRC)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(home), str(go), str(n), f"w{i}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(k)]
    time.sleep(0.5)  # let every interpreter reach the start line; correctness does not depend on it
    go.write_text("go")
    ids = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        ids.append(json.loads(out)["run_id"])
    return ids


def _check(home: Path, ids: list[str], n: int) -> None:
    db = sqlite3.connect(home / "journal.sqlite")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT COUNT(*) FROM metrics").fetchone()[0] == len(ids) * n
        for rid in ids:
            steps = [r[0] for r in db.execute("SELECT step FROM metrics WHERE run_id=? ORDER BY step", (rid,))]
            assert steps == list(range(n)), rid
        per = -(-n // 25)
        assert db.execute("SELECT COUNT(*) FROM phases").fetchone()[0] == len(ids) * per
        assert db.execute("SELECT COUNT(*) FROM notes").fetchone()[0] == len(ids) * per
        assert {r[0] for r in db.execute("SELECT status FROM runs")} == {"completed"}
    finally:
        db.close()


@pytest.mark.timeout(300)
def test_two_processes_insert_every_row(tmp_path):
    n = 300
    ids = _writers(tmp_path, 2, n)
    assert len(set(ids)) == 2
    _check(tmp_path / "home", ids, n)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_four_processes_insert_every_row(tmp_path):
    n = 2000
    ids = _writers(tmp_path, 4, n)
    _check(tmp_path / "home", ids, n)


HOLDER = r"""
import sqlite3, sys, time
from pathlib import Path
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")  # the write lock, held
db.execute("INSERT INTO notes (run_id, text, decision, created_at) VALUES (NULL, 'held', 0, 'now')")
Path(sys.argv[2]).write_text("holding")
time.sleep(float(sys.argv[3]))
db.execute("COMMIT")
"""


@pytest.mark.timeout(120)
def test_a_writer_waits_for_a_held_lock_and_readers_do_not(tmp_path):
    home = tmp_path / "home"
    j = Journal(home)
    run_id = j.create_run(kind="test", name="t", config={}, config_sha256="0" * 64, campaign_path=None, seed=0,
                          git_rev=None, packages={}, data={}, trust_remote_code=False)
    flag = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(j.path), str(flag), "1.5"],
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert holder.poll() is None, holder.stderr.read()
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert [r["run_id"] for r in j.list_runs()] == [run_id]  # a reader is not blocked by the writer
        j.add_metrics(run_id, [("train", "loss", 1, 1.0, 4, None)])  # waits for the lock, then writes
        j.add_note("after", run_id=run_id)
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0, holder.stderr.read()
    assert [n["text"] for n in j.notes()] == ["held", "after"]  # the holder committed first; nothing lost
    assert len(j.metrics(run_id)) == 1


@pytest.mark.timeout(400)
def test_two_sweeps_on_one_home_lose_no_row(tmp_path):
    home = tmp_path / "home"
    campaigns = []
    for name in ("a", "b"):
        path = tiny_causal_campaign(tmp_path / name, simple_records(16), simple_records(4, 100), train__updates=4,
                                    train__eval_every=2, plan__control={}, plan__variants=[{"train.lr": 2e-3}],
                                    plan__seeds=[0])
        path.write_text(path.read_text().replace("name: tiny", f"name: camp-{name}"))
        campaigns.append(path)
    procs = [subprocess.Popen([sys.executable, "-m", "pilotrun", "sweep", str(c), "--home", str(home), "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=c.parent)
             for c in campaigns]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=360)
        assert p.returncode == 0, err[-3000:]
        results.append(json.loads(out))
    db = sqlite3.connect(home / "journal.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    j = Journal(home)
    assert len(j.list_runs()) == 4
    for res, c in zip(results, campaigns):
        runs = j.list_runs(sweep_id=res["data"]["sweep_id"])
        assert len(runs) == 2 and {r["status"] for r in runs} == {"completed"}
        assert {r["name"] for r in runs} == {f"camp-{c.parent.name}"}
        for r in runs:
            assert [m["step"] for m in j.metrics(r["run_id"], "train", "loss")] == [1, 2, 3, 4]
            assert [m["step"] for m in j.metrics(r["run_id"], "validation", "val_loss")] == [0, 2, 4]
            assert len(j.predictions(r["run_id"], "validation")) == 4
            assert len(j.predictions(r["run_id"], "control")) == 4
