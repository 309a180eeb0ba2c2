"""The journal's schema version, its damaged and read-only states, and where its home may not be.

The version is ``PRAGMA user_version``, read from the file header before any connection is opened, so a
journal written by a newer pilotrun is refused without one byte of it changing (opening a connection
could already switch its journal mode). An older journal is copied aside, then migrated in one
transaction.
"""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path

from pilotrun.errors import BadInput, DiskFull, from_os_error
from pilotrun.journal.files import temp_path

_MAGIC = b"SQLite format 3\x00"
RECOVER = ("restore a backup (journal.sqlite.bak-*) if there is one, or salvage it with "
           "`sqlite3 {path} .recover | sqlite3 recovered.sqlite` and pass that folder's copy as journal.sqlite")


def check_home(home: Path, *, reading: bool) -> bool:
    """Whether the journal can be written. A home that is a file, or below one, is exit 2; so is a home
    that cannot be written, for a writing verb."""
    for p in (home, *home.parents):
        if p.exists() or p.is_symlink():
            if not p.is_dir():
                raise BadInput(f"{p} is a file, so the journal home {home} cannot be a folder there",
                               where="--home" if p == home else str(p),
                               fix="point --home (or $PILOTRUN_HOME) at a folder, or at a path that does not exist yet")
            break
    if not reading:
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _not_writable(home, e) from None
    writable = os.access(home, os.W_OK) and (not (home / "journal.sqlite").exists()
                                              or os.access(home / "journal.sqlite", os.W_OK))
    if not writable and not reading:
        raise _not_writable(home, None)
    return writable


def _not_writable(home: Path, e: OSError | None) -> BadInput:
    why = "is on a read-only file system" if e is None or e.errno == errno.EROFS else f"cannot be written ({e.strerror})"
    if e is not None and e.errno == errno.ENOSPC:
        why = "cannot be created: no space left on device"
    return BadInput(f"the journal home {home} {why}; this verb writes to the journal", where="--home",
                    fix="pass --home (or $PILOTRUN_HOME) on a writable disk; `runs`, `show` and `report --out` "
                        "read a read-only home")


def header_version(path: Path) -> int | None:
    """The user_version stamped in the file header; None for an empty (new) file. A file that is not an
    SQLite database is exit 2 naming it and how to recover."""
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        raise BadInput(f"cannot read the journal: {e.strerror}", where=str(path),
                       fix="check its permissions (`ls -l`)") from None
    if not head:
        return None
    if len(head) < 100 or not head.startswith(_MAGIC):
        raise BadInput("the journal is damaged: not an SQLite database (truncated or overwritten)", where=str(path),
                       fix=RECOVER.format(path=path))
    return int.from_bytes(head[60:64], "big")


_SNAPSHOTS: dict[str, tuple[tuple, bytes]] = {}  # a read-only journal with a WAL, as SQLite reads it whole


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A connection that cannot write. On a read-only file system SQLite can take no lock, so the file is opened
    ``immutable``, which skips the write-ahead log: a home copied (or mounted read-only) while committed rows were
    still only in ``journal.sqlite-wal`` would lose them. Then the journal and its WAL are read through a private
    copy into memory (``_with_wal``), every committed row there."""
    if os.access(path.parent, os.W_OK):
        return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
    wal = path.with_name(path.name + "-wal")
    try:
        has_frames = wal.stat().st_size > 32  # a WAL's header alone holds no row
    except OSError:
        has_frames = False
    if not has_frames:
        return sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro&immutable=1", uri=True, timeout=30.0,
                               isolation_level=None)
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.deserialize(_with_wal(path, wal))
    db.execute("PRAGMA query_only=1")
    return db


def _with_wal(path: Path, wal: Path) -> bytes:
    """The journal with its WAL applied, as bytes: both copied into a private temporary folder (removed at once),
    opened there (SQLite replays the log), serialised. Kept per process while neither file changes."""
    import shutil
    import tempfile

    key = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in (path, wal))
    kept = _SNAPSHOTS.get(str(path))
    if kept is not None and kept[0] == key:
        return kept[1]
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix="pilotrun-journal-"))
        shutil.copyfile(path, tmp / path.name)
        shutil.copyfile(wal, tmp / wal.name)
        copy = sqlite3.connect(tmp / path.name, isolation_level=None)
        try:
            copy.execute("PRAGMA journal_mode=DELETE")  # the log folded in; a database in memory has no WAL
            data = copy.serialize()
        finally:
            copy.close()
    except (OSError, sqlite3.Error) as e:
        raise BadInput(f"the journal is on a read-only file system and its write-ahead log {wal} holds committed rows "
                       f"that a read-only open would skip; reading them through a copy failed ({e})", where=str(path),
                       fix=f"copy the home to a writable disk (`cp -a {path.parent} COPY`) and pass --home COPY; or "
                           "mount it writable once, so SQLite folds the log into the journal") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    _SNAPSHOTS[str(path)] = (key, data)
    return data


SQLITE_MAX_PATH = 512  # bytes: SQLite's unix VFS opens no longer path, its -journal and -wal names included


def unopenable(path: Path, e: sqlite3.OperationalError) -> BadInput:
    """SQLite's bare "unable to open database file", said as what it is: a path longer than SQLite opens, or the
    system's refusal (``errors.from_os_error``: a name too long, no permission, a read-only disk ...)."""
    full = len(os.fsencode(os.path.abspath(path)))
    if full + len("-journal") > SQLITE_MAX_PATH:
        return BadInput(f"the journal's path is {full} bytes long; SQLite opens paths of at most {SQLITE_MAX_PATH} "
                        "bytes, its -journal and -wal files' included", where="--home",
                        fix=f"pass a --home (or $PILOTRUN_HOME) whose path is at most "
                            f"{SQLITE_MAX_PATH - len('/journal.sqlite-journal')} bytes long")
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o644))
    except OSError as oe:
        refused = from_os_error(oe, path)
        if refused is not None:
            return refused
    return BadInput(f"SQLite cannot open the journal ({e})", where=str(path),
                    fix="check the folder's permissions and free space (`ls -ld`, `df -h`), or pass another --home")


def as_bad_input(e: sqlite3.DatabaseError, path: Path) -> BadInput | None:
    text = str(e).lower()
    if "not a database" in text or "malformed" in text:
        return BadInput(f"the journal is damaged ({e})", where=str(path), fix=RECOVER.format(path=path))
    if "readonly" in text or "read-only" in text:
        return BadInput(f"the journal cannot be written ({e})", where=str(path),
                        fix="pass --home (or $PILOTRUN_HOME) on a writable disk")
    if "disk is full" in text or "disk full" in text:
        return DiskFull(path)
    return None


def _refuse_newer(path: Path, found: int, known: int) -> BadInput:
    return BadInput(f"the journal has schema version {found}, newer than this pilotrun knows ({known}); it was left "
                    "unchanged", where=str(path),
                    fix="use the pilotrun that wrote it, or a newer one (pip install -U pilotrun)")


def open_checked(journal, schema: str, version: int, migrations: dict[int, str]) -> None:
    """Refuse a damaged or newer journal before writing; create a new one, or migrate an older one (after a
    backup beside it) in one transaction."""
    path: Path = journal.path
    current, has_runs = None, False
    if path.exists():
        found = header_version(path)
        if found is not None and found > version:
            raise _refuse_newer(path, found, version)
        if found is not None:
            # the header can lag behind the write-ahead log: ask SQLite, on a connection that cannot write
            db = connect_read_only(path)
            try:
                has_runs = db.execute("SELECT 1 FROM sqlite_master WHERE name='runs'").fetchone() is not None
                current = db.execute("PRAGMA user_version").fetchone()[0]
            except sqlite3.DatabaseError as e:
                bad = as_bad_input(e, path)
                if bad is None:
                    raise
                raise bad from None
            finally:
                db.close()
            if current > version:
                raise _refuse_newer(path, current, version)
    if journal.read_only or current == version:
        return
    current = current or 0
    if has_runs:
        _backup(journal, current)
    with journal.connect() as db:
        # a step is SQL, or a function of the connection that returns it (to add only what is missing)
        steps = "".join(m(db) if callable(m) else m for m in (migrations[v] for v in range(current, version))
                        ) if has_runs else ""
        try:
            db.executescript(f"BEGIN IMMEDIATE;\n{steps}\n{schema}\nPRAGMA user_version={int(version)};\nCOMMIT;")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise


def _backup(journal, old: int) -> Path:
    """A consistent copy of the journal before it is migrated: journal.sqlite.bak-vOLD."""
    dest = journal.path.with_name(f"{journal.path.name}.bak-v{old}")
    if dest.exists():
        return dest
    tmp = temp_path(dest)
    try:
        with journal.connect() as src:
            dst = sqlite3.connect(tmp)
            try:
                src.backup(dst)
            finally:
                dst.close()
        os.replace(tmp, dest)
    except OSError as e:
        raise BadInput(f"cannot write the backup before migrating the journal: {e.strerror}", where=str(dest),
                       fix="free space or permissions in the home folder, then run again") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return dest
