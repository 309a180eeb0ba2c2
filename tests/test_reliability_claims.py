"""`sweep --continue` claims its cells in one SQLite transaction before any work: processes claiming one sweep at
once never take the same cell, and a `--continue` that finds a cell claimed by another live process runs the
others and says which cell the other took (exit 0, verdict warn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign

from pilotrun.journal.store import Journal

CLAIMER = """
import json, sys, time
from pilotrun.journal.store import Journal
j = Journal(sys.argv[1])
cells = [(arm, seed) for arm in ("control", "v1", "v2") for seed in (0, 1, 2)]
sys.stdin.readline()  # every claimer starts at once
mine, taken = j.claim_cells(sys.argv[2], lambda runs: cells)
print(json.dumps({"mine": [list(c) for c in mine], "taken": [[c["arm"], c["seed"], c["pid"]] for c in taken]}),
      flush=True)
sys.stdin.readline()  # hold the claims until told
"""


def _claimers(home, sweep_id, n):
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(home), sweep_id], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return procs, [json.loads(p.stdout.readline()) for p in procs]


def test_claimers_at_once_never_take_the_same_cell(tmp_path):
    home = tmp_path / "home"
    sweep_id = Journal(home).create_sweep({"p": 1}, "sha", None)
    procs, got = _claimers(home, sweep_id, 4)
    try:
        claimed = [tuple(c) for g in got for c in g["mine"]]
        assert len(claimed) == 9 and len(set(claimed)) == 9  # every cell once, none twice
        winners = [g for g in got if g["mine"]]
        assert len(winners) == 1  # the first transaction takes every free cell
        pids = {p.pid for p in procs}
        for g in got:
            if not g["mine"]:  # the others are told which cells, and by whom
                assert len(g["taken"]) == 9 and {t[2] for t in g["taken"]} <= pids
    finally:
        for p in procs:
            p.stdin.write("done\n")
            p.stdin.flush()
            p.wait(timeout=30)
    # the holders are gone (same host, dead pids): their claims no longer hold anyone back
    mine, taken = Journal(home).claim_cells(sweep_id, lambda runs: [("control", 0)])
    assert mine == [("control", 0)] and taken == []


@pytest.mark.slow
def test_continue_runs_the_free_cells_and_names_the_taken_one(cli, tmp_path, monkeypatch):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), simple_records(4, 100), train__updates=2,
                                train__eval_every=2)
    c = yaml.safe_load(path.read_text())
    c["plan"] = {"control": {"train.lr": 1e-3}, "variants": [{"train.lr": 3e-3}], "seeds": [0]}
    path = write_campaign(path.parent, c)
    home = tmp_path / "home"
    monkeypatch.setenv("PILOTRUN_TEST_OOM_AT_UPDATE", "1")  # both cells fail: both are to do again
    r = cli("sweep", path, "--home", home, "--json")
    assert r.code == 1, r.err
    sweep_id = r.json["data"]["sweep_id"]
    monkeypatch.delenv("PILOTRUN_TEST_OOM_AT_UPDATE")
    holder = subprocess.Popen([sys.executable, "-c", CLAIMER.replace(
        'cells = [(arm, seed) for arm in ("control", "v1", "v2") for seed in (0, 1, 2)]', 'cells = [("control", 0)]'),
        str(home), sweep_id], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert json.loads(holder.stdout.readline())["mine"] == [["control", 0]]
        r = cli("sweep", path, "--home", home, "--continue", sweep_id)
        assert r.code == 0, r.err
        assert f"control    seed 0: taken by another sweep process (pid {holder.pid} on host " in r.out
        assert "1 of 2 runs are being run by another process, which claimed them first" in r.out
        runs = Journal(home).list_runs(sweep_id=sweep_id)
        assert [(x["arm"], x["status"]) for x in runs] == [("control", "failed"), ("variant-1", "failed"),
                                                          ("variant-1", "completed")]
    finally:
        holder.stdin.write("done\n")
        holder.stdin.flush()
        holder.wait(timeout=30)
    with Journal(home).connect() as db:  # this process released its own claims when it ended
        assert [tuple(r) for r in db.execute("SELECT arm, pid FROM claims")] == [("control", holder.pid)]
