"""A home kept on the instance's own disk, mirrored to a bucket mount and restored from it.

Why not the journal on the bucket itself: SQLite's WAL needs shared memory (``journal.sqlite-shm``, an mmap)
and POSIX locks that every process of the database sees, on one host; SQLite's documentation says WAL does
not work over a network file system, and a bucket mount is one. SkyPilot's MOUNT_CACHED mode is rclone with
a VFS cache: a file is uploaded only once every process has closed it, whole, one file at a time — so a
journal that a sweep keeps open is not uploaded while it runs, and the database, its WAL and the run folders
reach the bucket at different moments (a torn set on the next instance). MOUNT (FUSE, close-to-open) does not
support random writes at all. So the launch files keep the home on the instance's disk, where SQLite's
guarantees hold, and copy it to the bucket: the journal as one self-contained snapshot (SQLite's online
backup, consistent while runs write), written under a temp name and renamed, so the bucket holds a whole
journal or the previous one; every other file under a temp name and renamed; a folder's ``manifest.json``
last, so a checkpoint copied in part is never complete (``engine/state.latest_checkpoint`` skips it); the
journal after the files, so the bucket's journal never names a checkpoint the bucket lacks.

``restore`` (job start) copies only what the local home lacks, the journal only when there is none here.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

from pilotrun.journal.checkpoints import reference
from pilotrun.journal.files import MANIFEST, atomic_write_via

JOURNAL = "journal.sqlite"
_SKIP_SUFFIXES = ("-wal", "-shm", "-journal")  # SQLite's own files beside the database: never copied


def snapshot_journal(src: Path, dest: Path) -> None:
    """A consistent copy of the SQLite database ``src`` (WAL included) as ``dest``, whole or not at all."""

    def backup(tmp: Path) -> None:
        source = sqlite3.connect(src, timeout=30.0)
        try:
            target = sqlite3.connect(tmp)
            try:
                source.backup(target)
            finally:
                target.close()
        finally:
            source.close()

    atomic_write_via(dest, backup)


def _files(root: Path) -> list[Path]:
    """The files to copy under ``root``, relative: no temp or hidden entries (a writer's work in progress),
    no journal (copied apart), each folder's manifest after its other files."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        here = Path(dirpath).relative_to(root)
        for n in sorted(n for n in filenames if not n.startswith(".")):
            rel = here / n
            if rel.as_posix() == JOURNAL or (rel.parent == Path(".") and n.startswith(JOURNAL)
                                             and n.endswith(_SKIP_SUFFIXES)):
                continue
            out.append(rel)
    # every manifest after every other file, the deepest first: a folder's manifest after all beneath it;
    # a reference (``final`` standing for a numbered checkpoint) after every checkpoint it could name, so a
    # copy cut between them never leaves a reference to a checkpoint the bucket does not hold complete
    manifests = sorted((r for r in out if r.name == MANIFEST),
                       key=lambda r: (reference(root / r.parent) is not None, -len(r.parts)))
    return [r for r in out if r.name != MANIFEST] + manifests


def _same(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()
    return sa.st_size == sb.st_size and int(sa.st_mtime) == int(sb.st_mtime)


def _copy(src: Path, dest: Path) -> None:
    atomic_write_via(dest, lambda tmp: shutil.copy2(src, tmp))


def mirror(src: str | Path, dest: str | Path, *, journal: bool = True, restore: bool = False) -> dict:
    """Copy home ``src`` to ``dest``: the files that ``dest`` lacks or holds at another size or time (with
    ``restore``, only those it lacks), then the journal's snapshot (with ``restore``, only when ``dest`` has
    no journal; never without ``journal``). Returns {"files": [relative paths copied], "journal": bool}."""
    src, dest = Path(src), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    if src.is_dir():
        for rel in _files(src):
            target = dest / rel
            if target.exists() and (restore or _same(src / rel, target)):
                continue
            _copy(src / rel, target)
            copied.append(rel.as_posix())
    took = journal and (src / JOURNAL).is_file() and not (restore and (dest / JOURNAL).exists())
    if took:
        snapshot_journal(src / JOURNAL, dest / JOURNAL)
    return {"files": copied, "journal": bool(took)}
