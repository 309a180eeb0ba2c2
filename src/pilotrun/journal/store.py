"""The SQLite journal (WAL): runs, phase rows, metrics, predictions, notes, decisions, sweeps.

A run id is never reused and a run row is never deleted; its identity and resolved config are
immutable (triggers enforce it). Only its status and progress counters move forward. The tables and
their migrations are in ``schema.py``; the leases a running run and a sweep's claims renew, and the
fence that stops a reaped process, in ``leases.py`` (their names are imported here too: this module
is the journal's one entry point).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import sqlite3
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from pilotrun.errors import BadInput, utf8_path
from pilotrun.journal.leases import (LEASE_ENV, OWNER, Lease, check_fence, fence_inside, last_heartbeat, lease_s,
                                     wall_time)
from pilotrun.journal.schema import MIGRATIONS, SCHEMA, SCHEMA_VERSION
from pilotrun.journal.versions import as_bad_input, check_home, connect_read_only, open_checked, unopenable
from pilotrun import jsonsafe
from pilotrun.scratch import pid_alive

__all__ = ["FINAL", "SCHEMA", "SCHEMA_VERSION", "Journal", "Lease", "check_fence", "iso", "last_heartbeat", "lease_s",
           "new_run_id", "now", "resolve_home", "wall_time"]


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


FINAL = ("completed", "diverged", "stopped", "failed", "interrupted")


def now() -> str:
    return iso(wall_time())


RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}$")
"""How an id ``new_run_id`` draws ends (a prefix may lead): what tells a run's folder in a file of another journal."""


def new_run_id(prefix: str = "") -> str:
    stamp = datetime.fromtimestamp(wall_time(), timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{prefix}{stamp}-{secrets.token_hex(3)}"


def resolve_home(home: str | Path | None, campaign_path: str | Path | None = None) -> Path:
    """--home, else $PILOTRUN_HOME, else .pilotrun/ beside the campaign file (or in the current folder)."""
    if home:
        resolved = Path(home).expanduser().resolve()
    elif os.environ.get("PILOTRUN_HOME"):
        resolved = Path(os.environ["PILOTRUN_HOME"]).expanduser().resolve()
    else:
        resolved = (Path(campaign_path).resolve().parent if campaign_path else Path.cwd()) / ".pilotrun"
    utf8_path(resolved, where="--home")  # the journal records paths under it
    return resolved


def _wal(db: sqlite3.Connection) -> None:
    """Switch a new journal to WAL (the mode is stored in the file, so later opens only read it).

    Two processes opening a fresh journal at once race for the switch, which needs the exclusive
    lock: SQLite answers "database is locked" at once there instead of waiting the busy timeout, so
    the switch is retried; an open that finds WAL already set takes no lock at all."""
    for attempt in range(100):
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or attempt == 99:
                raise
            time.sleep(min(0.01 * (attempt + 1), 0.2))


class Journal:
    """One journal per home folder. Connections are short-lived and every write is a transaction."""

    def __init__(self, home: str | Path, *, create: bool = True):
        """``create=False``: a reading verb. The journal must exist; on a home that cannot be written (a
        read-only file system) it is opened read-only. A writing verb there is exit 2."""
        self.home = Path(home)
        self.path = self.home / "journal.sqlite"
        self.read_only = False
        if not create and not self.path.exists():
            raise BadInput(f"no journal at {self.path}", where="--home",
                           fix="pass the --home of an earlier run, or run a stage first")
        writable = check_home(self.home, reading=not create)
        self.read_only = not writable
        try:
            open_checked(self, SCHEMA, SCHEMA_VERSION, MIGRATIONS)
        except sqlite3.OperationalError as e:
            if "unable to open" not in str(e):
                raise
            raise unopenable(self.path, e) from None
        self.order = "seq"
        if self.read_only:  # an older journal read where it cannot be migrated: insertion order is the same
            with self.connect() as db:
                if "seq" not in {r[1] for r in db.execute("PRAGMA table_info(runs)")}:
                    self.order = "rowid"
        if not self.read_only:
            self.reap_interrupted()

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / run_id

    @contextmanager
    def connect(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            db = connect_read_only(self.path)
        else:
            db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            if not self.read_only:
                db.execute("PRAGMA busy_timeout=30000")
                _wal(db)
                db.execute("PRAGMA synchronous=NORMAL")
                db.execute("PRAGMA foreign_keys=ON")
            yield db
        except sqlite3.DatabaseError as e:
            bad = as_bad_input(e, self.path)
            if bad is None:
                raise
            raise bad from None
        finally:
            db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        with self.connect() as db:
            for attempt in range(50):
                try:
                    db.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as e:
                    if "locked" not in str(e) or attempt == 49:
                        raise
                    time.sleep(0.05 * (attempt + 1))
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                # a signal's exception (SIGTERM, the fence) can land after COMMIT returned, still inside this block
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

    # --- runs -------------------------------------------------------------------------------------
    def create_run(self, *, kind: str, name: str, config: dict, config_sha256: str, campaign_path: str | None,
                   seed: int | None, git_rev: str | None, packages: dict, data: dict, trust_remote_code: bool,
                   supersedes: str | None = None, sweep_id: str | None = None, arm: str | None = None,
                   command: str | None = None, status: str = "running") -> str:
        if supersedes is not None:
            supersedes = self.resolve_run_id(supersedes, where="--supersedes")
        for _ in range(10):
            run_id = new_run_id()
            try:
                with self.transaction() as db:
                    db.execute(
                        "INSERT INTO runs (run_id, kind, name, created_at, campaign_path, config_json, config_sha256,"
                        " seed, git_rev, packages_json, data_json, trust_remote_code, supersedes, sweep_id, arm,"
                        " command, host, pid, status, started_at, seq, heartbeat_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,"
                        "?,?,?,?,?,?,?,?,(SELECT COALESCE(MAX(seq), 0) + 1 FROM runs),?)",
                        (run_id, kind, name, now(), campaign_path, json.dumps(config, sort_keys=True), config_sha256,
                         seed, git_rev, json.dumps(packages), json.dumps(data), int(trust_remote_code), supersedes,
                         sweep_id, arm, command, socket.gethostname(), os.getpid(), status, now(), wall_time()))
                if status == "running":
                    Lease.take(self, run_id)
                return run_id
            except sqlite3.IntegrityError:
                continue  # the same id drawn twice in one second: draw again, never reuse
        raise RuntimeError("could not draw a fresh run id")

    def update_progress(self, run_id: str, *, updates_done: int, examples_seen: int) -> None:
        check_fence(run_id)
        with self.transaction() as db:
            fence_inside(db, run_id)
            db.execute("UPDATE runs SET updates_done=?, examples_seen=? WHERE run_id=?",
                       (updates_done, examples_seen, run_id))

    def finish_run(self, run_id: str, status: str, summary: dict | None = None) -> None:
        assert status in FINAL, status
        Lease.release(run_id)
        with self.transaction() as db:
            db.execute("UPDATE runs SET status=?, ended_at=?, summary_json=? WHERE run_id=? AND status IN"
                       " ('created','running')", (status, now(), json.dumps(summary or {}, default=str), run_id))

    def reap_interrupted(self) -> None:
        """A run 'running' whose lease lapsed (no heartbeat for ``lease_s()``: its host gone, its process
        stopped or killed, whatever its PID now names) was interrupted; so was one whose process no longer
        exists on this host (known at once, without waiting for the lease)."""
        host, bound = socket.gethostname(), lease_s()
        with self.connect() as db:
            rows = db.execute("SELECT run_id, host, pid, heartbeat_at, started_at FROM runs WHERE status='running'"
                              ).fetchall()
        for r in rows:
            beat = last_heartbeat(dict(r))
            where = f"pid {r['pid']} on host {r['host']}"
            with self.transaction() as db:  # judged again inside the write: a renewal since the read wins
                lapsed = db.execute(
                    "UPDATE runs SET status='interrupted', ended_at=?, summary_json=? WHERE run_id=? AND "
                    "status='running' AND COALESCE(heartbeat_at, ?) < ?",
                    (now(), json.dumps({"reason": f"its lease lapsed: no heartbeat since {iso(beat)} ({where}; "
                                                  f"the bound is {bound:g}s, {LEASE_ENV})"}),
                     r["run_id"], beat, wall_time() - bound)).rowcount
            if not lapsed and r["host"] == host and not pid_alive(r["pid"]):
                self.finish_run(r["run_id"], "interrupted",
                                {"reason": f"the process ended without finishing the run ({where})"})

    def _decoded(self, text: str, what: str) -> Any:
        """A JSON column of the journal; one that is no JSON (a row edited by hand, a bad disk) is exit 2 naming the
        journal and the row, as a damaged journal is, not exit 3."""
        try:
            return jsonsafe.loads(text)
        except ValueError as e:
            raise BadInput(f"the journal is damaged: {what} is not JSON ({e}); pilotrun writes it once, so it was "
                           "changed outside pilotrun", where=str(self.path),
                           fix="restore a backup of the journal (journal.sqlite.bak-*, the mirror's copy) if there is "
                               "one, or write that column's JSON back by hand with sqlite3") from None

    def _run_dict(self, row: sqlite3.Row) -> dict:
        d = dict(row)
        for k in ("config_json", "packages_json", "data_json", "summary_json"):
            v = d.pop(k)
            d[k.removesuffix("_json")] = self._decoded(v, f"run {d['run_id']}'s {k}") if v else None
        return d

    def get_run(self, run_id: str) -> dict | None:
        with self.connect() as db:
            row = db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,)).fetchone()
        return self._run_dict(row) if row else None

    def require_run(self, run_id: str, *, where: str = "RUN_ID") -> dict:
        """The run whose id is ``run_id`` or starts with it (a unique prefix, as git takes hashes)."""
        return self.get_run(self.resolve_run_id(run_id, where=where))  # type: ignore[return-value]

    def resolve_run_id(self, prefix: str, *, where: str = "RUN_ID") -> str:
        """The full id of the one run whose id starts with ``prefix``; bad input (exit 2) naming the
        candidates when none or several do."""
        return _resolve_prefix(self, "runs", "run_id", prefix, where=where, what="run",
                               extra="kind, name, status, created_at")

    def resolve_sweep_id(self, prefix: str, *, where: str = "SWEEP_ID") -> str:
        return _resolve_prefix(self, "sweeps", "sweep_id", prefix, where=where, what="sweep", extra="created_at")

    def list_runs(self, *, kind: str | None = None, sweep_id: str | None = None, name: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM runs WHERE 1=1", []
        for col, val in (("kind", kind), ("sweep_id", sweep_id), ("name", name)):
            if val is not None:
                q += f" AND {col}=?"
                args.append(val)
        with self.connect() as db:
            # the journal's sequence, never a clock: a clock stepped back cannot reorder runs
            return [self._run_dict(r) for r in db.execute(q + f" ORDER BY {self.order}", args)]

    # --- metrics, phases, predictions, notes ------------------------------------------------------
    def add_metrics(self, run_id: str, rows: list[tuple[str, str, int, float, int | None, float | None]],
                    progress: tuple[int, int] | None = None) -> None:
        """rows of (split, name, step, value, examples_seen, wall_s); ``progress`` (updates_done,
        examples_seen) is written in the same transaction."""
        check_fence(run_id)
        with self.transaction() as db:
            fence_inside(db, run_id)
            db.executemany("INSERT OR REPLACE INTO metrics VALUES (?,?,?,?,?,?,?)",
                           [(run_id, *r) for r in rows])
            if progress is not None:
                db.execute("UPDATE runs SET updates_done=?, examples_seen=? WHERE run_id=?", (*progress, run_id))

    def metrics(self, run_id: str, split: str | None = None, name: str | None = None) -> list[dict]:
        q, args = "SELECT * FROM metrics WHERE run_id=?", [run_id]
        if split:
            q += " AND split=?"
            args.append(split)
        if name:
            q += " AND name=?"
            args.append(name)
        with self.connect() as db:
            return [dict(r) for r in db.execute(q + " ORDER BY split, name, step", args)]

    def add_phase_rows(self, run_id: str, rows: list[dict]) -> None:
        cols = ("phase", "rank", "device", "counter", "inputs_json", "baseline", "peak_allocated", "peak_reserved",
                "end_allocated", "end_reserved", "duration_s", "verdict", "note")
        check_fence(run_id)
        with self.transaction() as db:
            fence_inside(db, run_id)
            for r in rows:
                vals = [json.dumps(r.get("inputs", {})) if c == "inputs_json" else r.get(c) for c in cols]
                db.execute(f"INSERT INTO phases (run_id, {', '.join(cols)}, created_at) VALUES "
                           f"(?, {', '.join('?' * len(cols))}, ?)", (run_id, *vals, now()))

    def phase_rows(self, run_id: str) -> list[dict]:
        with self.connect() as db:
            rows = [dict(r) for r in db.execute("SELECT * FROM phases WHERE run_id=? ORDER BY id", (run_id,))]
        for r in rows:
            r["inputs"] = self._decoded(r.pop("inputs_json") or "{}", f"a phase row of run {run_id}")
        return rows

    def add_predictions(self, run_id: str, split: str, items: list[tuple[str, Any]]) -> None:
        check_fence(run_id)
        with self.transaction() as db:
            fence_inside(db, run_id)
            db.executemany("INSERT OR REPLACE INTO predictions VALUES (?,?,?,?)",
                           [(run_id, split, eid, json.dumps(p)) for eid, p in items])

    def predictions(self, run_id: str, split: str) -> dict[str, Any]:
        with self.connect() as db:
            return {r["example_id"]: self._decoded(r["payload_json"], f"a prediction of run {run_id}") for r in
                    db.execute("SELECT * FROM predictions WHERE run_id=? AND split=?", (run_id, split))}

    def add_note(self, text: str, run_id: str | None = None, decision: bool = False) -> int:
        if run_id is not None:
            run_id = self.resolve_run_id(run_id, where="--run")
        with self.transaction() as db:
            cur = db.execute("INSERT INTO notes (run_id, text, decision, created_at) VALUES (?,?,?,?)",
                             (run_id, text, int(decision), now()))
            return int(cur.lastrowid)

    def notes(self, run_id: str | None = None) -> list[dict]:
        return self.rows("notes", "run_id", run_id, order="id")

    def rows(self, table: str, column: str, value, order: str) -> list[dict]:
        """Every row of ``table`` (a name from this module or its peers, never user input), or only those whose
        ``column`` is ``value`` when a value is given, in ``order``."""
        q, args = f"SELECT * FROM {table}", []
        if value:
            q += f" WHERE {column}=?"
            args.append(value)
        with self.connect() as db:
            return [dict(r) for r in db.execute(f"{q} ORDER BY {order}", args)]

    # --- sweep cells: claimed before any work --------------------------------------------------------
    def claim_cells(self, sweep_id: str, wanted) -> tuple[list, list[dict]]:
        """In one transaction, before any work: ``wanted(runs)`` (the sweep's runs in the journal's sequence)
        names the cells to run, as tuples whose first two items are (arm, seed); each is claimed for this
        process unless another process holds a live claim on it (its lease renewed within ``lease_s()``, its
        process not gone from this host). Returns (the cells claimed, the others' claims on the rest)."""
        host, bound = socket.gethostname(), lease_s()
        with self.transaction() as db:
            runs = [self._run_dict(r) for r in db.execute(f"SELECT * FROM runs WHERE sweep_id=? ORDER BY {self.order}",
                                                     (sweep_id,))]
            cells = wanted(runs)
            held = {(r["arm"], r["seed"]): dict(r) for r in db.execute("SELECT * FROM claims WHERE sweep_id=?",
                                                                       (sweep_id,))}
            mine, taken = [], []
            for cell in cells:
                claim = held.get((cell[0], cell[1]))
                if claim and claim["owner"] != OWNER and claim["heartbeat_at"] >= wall_time() - bound and not (
                        claim["host"] == host and not pid_alive(claim["pid"])):
                    taken.append(claim)
                    continue
                db.execute("INSERT OR REPLACE INTO claims VALUES (?,?,?,?,?,?,?,?)",
                           (sweep_id, cell[0], cell[1], OWNER, host, os.getpid(), now(), wall_time()))
                mine.append(cell)
        if mine:
            Lease.take(self, f"claims:{sweep_id}", Lease.CLAIMS, (sweep_id, OWNER))
        return mine, taken

    def release_claims(self, sweep_id: str, cell: tuple | None = None) -> None:
        """Give up this process's claim on ``cell`` (arm, seed), or on every cell of the sweep."""
        q, args = "DELETE FROM claims WHERE sweep_id=? AND owner=?", [sweep_id, OWNER]
        if cell is not None:
            q += " AND arm=? AND seed=?"
            args += [cell[0], cell[1]]
        with self.transaction() as db:
            db.execute(q, args)
        if cell is None:
            Lease.release(f"claims:{sweep_id}")

    # --- sweeps -----------------------------------------------------------------------------------
    def create_sweep(self, plan: dict, plan_sha256: str, campaign_path: str | None, sweep_id: str | None = None) -> str:
        """A new sweep; with ``sweep_id`` (fixed by a launch file) one of that id unless it exists already
        (then nothing is written: the caller continues it)."""
        sweep_id = sweep_id or "sweep-" + new_run_id()
        with self.transaction() as db:
            db.execute("INSERT OR IGNORE INTO sweeps (sweep_id, created_at, campaign_path, plan_json, plan_sha256, seq)"
                       " VALUES (?,?,?,?,?,(SELECT COALESCE(MAX(seq), 0) + 1 FROM sweeps))",
                       (sweep_id, now(), campaign_path, json.dumps(plan, sort_keys=True), plan_sha256))
        return sweep_id

    def get_sweep(self, sweep_id: str) -> dict | None:
        with self.connect() as db:
            row = db.execute("SELECT * FROM sweeps WHERE sweep_id=?", (sweep_id,)).fetchone()
        if row is None:
            return None
        d = dict(row)
        d["plan"] = self._decoded(d.pop("plan_json"), f"sweep {sweep_id}'s plan")
        return d

    def find_sweep(self, plan_sha256: str) -> dict | None:
        with self.connect() as db:
            row = db.execute(f"SELECT sweep_id FROM sweeps WHERE plan_sha256=? ORDER BY {self.order} DESC LIMIT 1",
                             (plan_sha256,)).fetchone()
        return self.get_sweep(row["sweep_id"]) if row else None


def packed_run(f) -> str | None:
    """The folder an archive's first member lies in (``pilotrun archive`` writes ``RUN_ID/...``), read from the file
    object ``f`` (any compression tarfile reads; only the first header), or None when it is no tar or that member lies
    in no folder."""
    import tarfile
    import zlib

    try:
        with tarfile.open(fileobj=f, mode="r|*") as tar:
            first = tar.next()
    except (OSError, tarfile.TarError, ValueError, EOFError, zlib.error):
        return None
    return first.name.split("/")[0] if first is not None and "/" in first.name else None


def _archive_of(path: str) -> str | None:
    """The run a file named where a run id belongs packs (``pilotrun archive``'s first member is RUN_ID/...), or None
    when it is no such archive. Only the first header is read."""
    try:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as f:
            return packed_run(f)
    except (OSError, ValueError):
        return None


def _folder_of(journal: Journal, given: str, where: str) -> BadInput | None:
    """A path named where a run id belongs, as a shell completes it (``.pilotrun/runs/RUN_ID/``, a file in it, or
    ``RUN_ID/`` in runs/), said as the folder of its run: this journal's, or another home's (its journal.sqlite
    above runs/). None when no part of the path names a run so."""
    if "/" not in given and os.sep not in given:
        return None
    parts = Path(given).parts
    for i, part in enumerate(parts):
        if journal.get_run(part) is not None:
            return BadInput(f"{given} is a path, not a run id: the folder of run {part}" + (
                "" if i == len(parts) - 1 else " (a file in it)"), where=where, fix=f"pass the run's id ({part})")
    full = Path(os.path.abspath(given)).parts
    for i in range(2, len(full)):
        home = Path(*full[:i - 1])
        if full[i - 1] == "runs" and (home / "journal.sqlite").is_file() and home != journal.home.absolute():
            return BadInput(f"{given} is a path, not a run id: the folder of run {full[i]} in the journal at {home}",
                            where=where, fix=f"pass the run's id with that journal's home: {full[i]} --home {home}")
    return None


def _resolve_prefix(journal: Journal, table: str, col: str, prefix: str, *, where: str, what: str,
                    extra: str) -> str:
    prefix = (prefix or "").strip()
    if not prefix:
        raise BadInput(f"an empty {what} id", where=where, fix=f"pass a {what} id (or a unique prefix of one); "
                                                             "see `pilotrun runs`")
    with journal.connect() as db:
        exact = db.execute(f"SELECT {col} FROM {table} WHERE {col}=?", (prefix,)).fetchone()
        if exact is not None:
            return exact[0]
        rows = db.execute(f"SELECT {col}, {extra} FROM {table} WHERE substr({col}, 1, ?)=? ORDER BY {col} LIMIT 21",
                          (len(prefix), prefix)).fetchall()
    if not rows:
        packed = _archive_of(prefix) if what == "run" else None
        if packed is not None:  # `pilotrun verify run.tar.gz`: the archive's own run, if this journal holds it
            held = journal.get_run(packed) is not None
            raise BadInput(f"{prefix} is a file, not a run id: an archive of run {packed}", where=where,
                           fix=f"pass the run's id ({packed}), which this journal holds" if held
                           else "extract it (tar -xzf) and check its files against its manifest.json (each file's "
                                "sha256; its README.md says how the run was made); a run is named here by its id")
        folder = _folder_of(journal, prefix, where) if what == "run" else None
        if folder is not None:
            raise folder
        raise BadInput(f"{what} {prefix} does not exist in {journal.path} (no {what} id starts with it)", where=where,
                       fix="list them with `pilotrun runs` (and pass the same --home)")
    if len(rows) > 1:
        shown = [" ".join(str(r[k]) for k in r.keys() if r[k] is not None) for r in rows[:20]]
        more = "more than 20" if len(rows) > 20 else str(len(rows))
        err = BadInput(f"{what} id prefix {prefix!r} is ambiguous: {more} {what}s match\n    " + "\n    ".join(shown),
                       where=where, fix="type more characters of the id")
        err.candidates = [r[0] for r in rows[:20]]
        raise err
    return rows[0][0]
