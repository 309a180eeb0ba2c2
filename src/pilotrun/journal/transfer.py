"""Moving a run's rows between journals: a remote worker records into a scratch journal on its own disk,
then sends the rows back to the journal that owns the run (the sweep driver's), which takes them in one
transaction. Files travel as a tar archive of the run folder, checked against its manifest on arrival.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from pilotrun.journal.files import MANIFEST, atomic_write_bytes
from pilotrun.journal.store import Journal
from pilotrun import jsonsafe
from pilotrun.provenance import file_sha256

TABLES = ("phases", "metrics", "predictions")


def export_run(journal: Journal, run_id: str, *, with_run_row: bool = False) -> dict:
    """Every row the journal holds for ``run_id``, as plain values (picklable, JSON-able)."""
    out: dict[str, list[dict]] = {}
    with journal.connect() as db:
        if with_run_row:
            out["runs"] = [dict(r) for r in db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,))]
        for table in TABLES:
            out[table] = [dict(r) for r in db.execute(f"SELECT * FROM {table} WHERE run_id=?", (run_id,))]
    return out


def import_run(journal: Journal, bundle: dict, *, as_run_id: str | None = None) -> None:
    """Insert ``bundle``'s rows in one transaction. With ``as_run_id`` the rows join that existing run (its
    row stays this journal's own); without it the bundle's run row is inserted as it was (a pilot copied
    into a worker's scratch journal so the memory bound can be judged there)."""
    with journal.transaction() as db:
        if as_run_id is None:
            for row in bundle.get("runs", []):
                _insert(db, "runs", row)
        for table in TABLES:
            for row in bundle.get(table, []):
                row = {k: v for k, v in row.items() if k != "id"}  # the phase row ids are this journal's own
                if as_run_id is not None:
                    row["run_id"] = as_run_id
                _insert(db, table, row)


def _insert(db, table: str, row: dict) -> None:
    cols = list(row)
    db.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
               [row[c] for c in cols])


def pack_folder(root: Path, skip: tuple[str, ...] = ()) -> bytes:
    """The folder as an uncompressed tar (weights do not compress), regular files only."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for p in sorted(Path(root).rglob("*")):
            rel = p.relative_to(root).as_posix()
            if p.is_file() and not p.is_symlink() and rel not in skip and ".tmp-" not in p.name:
                tar.add(p, arcname=rel, recursive=False)
    return buf.getvalue()


def unpack_folder(data: bytes, root: Path) -> list[str]:
    """Write the archive's regular files under ``root``, each atomically; refuses anything that is not a
    plain file with a relative path inside ``root``. Returns the files written."""
    root = Path(root)
    written = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar.getmembers():
            target = (root / member.name).resolve()
            if not member.isfile() or member.name.startswith("/") or root.resolve() not in target.parents:
                raise ValueError(f"refusing archive member {member.name!r}: not a plain file inside the run folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(target, tar.extractfile(member).read())
            written.append(member.name)
    return written


def check_arrived(root: Path, written: list[str]) -> list[str]:
    """The files of ``written`` that do not match the manifest the worker wrote among them (empty when every
    file arrived whole); a folder that came without a manifest is a finding too."""
    if MANIFEST not in written:
        return [f"{MANIFEST}: missing"]
    files = jsonsafe.loads((Path(root) / MANIFEST).read_text()).get("files", {})
    return [rel for rel in written if Path(rel).name != MANIFEST  # a checkpoint's own manifest lists its files
            and (rel not in files or file_sha256(Path(root) / rel) != files[rel].get("sha256"))]
