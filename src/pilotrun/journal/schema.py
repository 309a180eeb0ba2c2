"""The journal's tables (``SCHEMA``), the version stamped in the file, and the steps that bring an older
journal up to it (``MIGRATIONS``, applied by ``versions.open_checked``)."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    created_at TEXT NOT NULL,
    campaign_path TEXT,
    config_json TEXT NOT NULL,
    config_sha256 TEXT NOT NULL,
    seed INTEGER,
    git_rev TEXT,
    packages_json TEXT,
    data_json TEXT,
    trust_remote_code INTEGER NOT NULL DEFAULT 0,
    supersedes TEXT REFERENCES runs(run_id),
    sweep_id TEXT,
    arm TEXT,
    command TEXT,
    host TEXT,
    pid INTEGER,
    status TEXT NOT NULL,
    started_at TEXT,
    ended_at TEXT,
    updates_done INTEGER NOT NULL DEFAULT 0,
    examples_seen INTEGER NOT NULL DEFAULT 0,
    summary_json TEXT,
    seq INTEGER,
    heartbeat_at REAL
);
CREATE UNIQUE INDEX IF NOT EXISTS runs_by_seq ON runs(seq);
CREATE TRIGGER IF NOT EXISTS runs_seq_immutable BEFORE UPDATE OF seq ON runs
BEGIN SELECT RAISE(ABORT, 'a run''s sequence number is immutable'); END;
CREATE TRIGGER IF NOT EXISTS runs_no_delete BEFORE DELETE ON runs
BEGIN SELECT RAISE(ABORT, 'runs are never deleted'); END;
CREATE TRIGGER IF NOT EXISTS runs_immutable
BEFORE UPDATE OF run_id, kind, name, created_at, campaign_path, config_json, config_sha256, seed, git_rev,
    packages_json, data_json, trust_remote_code, supersedes, sweep_id, arm, command ON runs
BEGIN SELECT RAISE(ABORT, 'a run''s identity and config are immutable'); END;
CREATE TRIGGER IF NOT EXISTS runs_final_status BEFORE UPDATE OF status ON runs
WHEN OLD.status NOT IN ('created', 'running')
BEGIN SELECT RAISE(ABORT, 'a finished run keeps its status'); END;

CREATE TABLE IF NOT EXISTS phases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    phase TEXT NOT NULL,
    rank INTEGER NOT NULL DEFAULT 0,
    device TEXT,
    counter TEXT,
    inputs_json TEXT,
    baseline INTEGER,
    peak_allocated INTEGER,
    peak_reserved INTEGER,
    end_allocated INTEGER,
    end_reserved INTEGER,
    duration_s REAL,
    verdict TEXT NOT NULL,
    note TEXT,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    split TEXT NOT NULL,
    name TEXT NOT NULL,
    step INTEGER NOT NULL,
    value REAL,
    examples_seen INTEGER,
    wall_s REAL,
    PRIMARY KEY (run_id, split, name, step)
);
CREATE TABLE IF NOT EXISTS predictions (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    split TEXT NOT NULL,
    example_id TEXT NOT NULL,
    payload_json TEXT NOT NULL,
    PRIMARY KEY (run_id, split, example_id)
);
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT REFERENCES runs(run_id),
    text TEXT NOT NULL,
    decision INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sweeps (
    sweep_id TEXT PRIMARY KEY,
    created_at TEXT NOT NULL,
    campaign_path TEXT,
    plan_json TEXT NOT NULL,
    plan_sha256 TEXT NOT NULL,
    seq INTEGER
);
CREATE TRIGGER IF NOT EXISTS sweeps_immutable BEFORE UPDATE ON sweeps
BEGIN SELECT RAISE(ABORT, 'a sweep plan is frozen'); END;
CREATE TABLE IF NOT EXISTS claims (
    sweep_id TEXT NOT NULL REFERENCES sweeps(sweep_id),
    arm TEXT NOT NULL,
    seed INTEGER NOT NULL,
    owner TEXT NOT NULL,
    host TEXT,
    pid INTEGER,
    claimed_at TEXT NOT NULL,
    heartbeat_at REAL NOT NULL,
    PRIMARY KEY (sweep_id, arm, seed)
);
CREATE TABLE IF NOT EXISTS tracked (
    tracker TEXT NOT NULL,
    target TEXT NOT NULL,
    subject TEXT NOT NULL,
    tracker_run_id TEXT NOT NULL,
    experiment TEXT,
    state TEXT NOT NULL,
    digest TEXT,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (tracker, target, subject)
);
"""

SCHEMA_VERSION = 4
"""Stamped in the file as ``PRAGMA user_version``; bump it (and add a step to MIGRATIONS) with any change
to SCHEMA. A journal stamped higher is refused before anything is written to it."""


def _to_v2(db: sqlite3.Connection) -> str:
    """Version 2: the journal's sequence (``seq``: runs and sweeps in the order they were created, whatever
    the clocks said) and each run's lease (``heartbeat_at``). Existing rows take their insertion order."""
    have = {t: {r[1] for r in db.execute(f"PRAGMA table_info({t})")} for t in ("runs", "sweeps")}
    steps = ["DROP TRIGGER IF EXISTS sweeps_immutable;"]
    for table, col, kind in (("runs", "seq", "INTEGER"), ("runs", "heartbeat_at", "REAL"), ("sweeps", "seq", "INTEGER")):
        if col not in have[table]:
            steps.append(f"ALTER TABLE {table} ADD COLUMN {col} {kind};")
    steps += ["UPDATE runs SET seq=rowid WHERE seq IS NULL;", "UPDATE sweeps SET seq=rowid WHERE seq IS NULL;"]
    return "\n".join(steps)


MIGRATIONS: dict[int, object] = {
    0: "",  # journals written before the stamp: the schema is the same, only the stamp is new
    1: _to_v2,  # a step is SQL, or a function of the open connection that returns it
    2: "",  # version 3: the sweep cells' claims (a new table, created by SCHEMA)
    3: "",  # version 4: ``tracked``, each run's (sweep's, campaign's) id in a tracker (a new table, created by SCHEMA)
}
