"""Pack a run's folder into a .tar.gz for the user's backups, and unpack one without escaping the target.

The archive holds ``RUN_ID/`` with every file of the run folder (artifact, checkpoints, config.yaml,
revisions.json, metrics.jsonl, control.safetensors, README.md, manifest.json; ``checkpoints/final`` as a
reference travels with the checkpoint it names, checked before packing), plus what lives only in
the journal: ``run.json`` (the run row: status, summary, command, provenance) and
``control_predictions.json``; a README with the exact command is generated when the folder has none.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import time
import zlib
from pathlib import Path, PurePosixPath

from pilotrun.console.progress import head, note
from pilotrun.errors import BadInput
from pilotrun.journal.checkpoints import reference, resolve
from pilotrun.journal.files import (MANIFEST, output_file, output_kind, refuse_replacing, remove_stale_temps,
                                    verify_manifest, writing)
from pilotrun.journal.runs import missing_run_folder, still_alive, write_run_readme
from pilotrun.journal.store import RUN_ID, packed_run
from pilotrun.sizes import fmt_bytes


NAME_MAX = 255  # bytes of one name in a path (ext4, xfs, btrfs, tmpfs)


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
    tar.addfile(info, io.BytesIO(data))


def _an_archive(first: bytes) -> bool:
    """Whether a file beginning with ``first`` is an archive ``pack`` wrote: gzip, whose first member lies in a run's
    folder (``RUN_ID/``)."""
    run = packed_run(io.BytesIO(first)) if first.startswith(b"\x1f\x8b") else None
    return run is not None and RUN_ID.search(run) is not None


def pack(journal, run_id: str, out: str | Path) -> dict:
    """Write ``out`` (atomically: a temporary name, renamed when complete); returns what went in."""
    run = journal.require_run(run_id)
    run_id = run["run_id"]
    run_dir = journal.run_dir(run_id)
    if not run_dir.is_dir():
        raise missing_run_folder(journal, run_id)
    if run["status"] == "running":  # the journal reaps a lapsed lease at open: this one's process is alive
        raise BadInput(f"run {run_id} is still running ({still_alive(run)}): its files are being written, so an "
                       "archive now would be no consistent copy (a checkpoint half-saved, no manifest yet)",
                       where=run_id, fix=f"archive it once it ends (`pilotrun show {run_id}` says its status), or "
                                         "stop it (its interruption is recorded) and archive then")
    out = Path(out).expanduser().absolute()
    stream = output_kind(out) == "stream"  # /dev/stdout, a pipe: written into as it is packed
    refuse_replacing(out, "--out", _an_archive, "archive")
    real = Path(os.path.realpath(out))  # a link is written through: the file it names is what gets replaced
    if run_dir.resolve() in real.parents:
        raise BadInput(f"--out {out} is inside the run folder it packs", where="--out", fix="write it elsewhere")
    if not stream:
        remove_stale_temps(real.parent)  # what a killed archive of this host left there
    links = sorted(p for p in run_dir.rglob("*") if p.is_symlink())
    if links:  # pilotrun writes no links; packing one would carry whatever it points at, or an unusable member
        raise BadInput(f"{links[0]} is a link (to {os.readlink(links[0])}); a run folder holds plain files only",
                       where=str(links[0]), fix="replace the link by the file itself, or remove it, then archive")
    final = run_dir / "checkpoints" / "final"
    if reference(final) is not None:  # the archive carries the checkpoint final stands for, or it is refused
        found = resolve(final)[1]
        if found:
            raise BadInput(f"{found[0]}; the archive would not hold the state final stands for", where=str(final),
                           fix="archive the run from a copy that still holds that checkpoint, or resume the run "
                               "from an earlier checkpoint")
    files = sorted(p for p in run_dir.rglob("*") if p.is_file() and ".tmp-" not in p.name)
    differs = manifest_problems(run_dir)
    extra = {"run.json": json.dumps(run, indent=2, sort_keys=True, default=str).encode(),
             "control_predictions.json": json.dumps(journal.predictions(run_id, "control"), indent=2).encode()}
    if not (run_dir / "README.md").is_file():
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            write_run_readme(Path(tmp), run)
            extra["README.md"] = (Path(tmp) / "README.md").read_bytes()
    # complete or absent (a full disk, a read-only folder: exit 2 naming --out, the partial copy removed)
    packed = _Packed(files)
    with output_file(out, "--out") as f, tarfile.open(fileobj=f, mode="w|gz") as tar:
        for p in files:
            info = tar.gettarinfo(p, arcname=f"{run_id}/{p.relative_to(run_dir).as_posix()}")
            with open(p, "rb") as src:
                tar.addfile(info, packed.reading(src, p.relative_to(run_dir).as_posix()))
        for name, data in extra.items():
            _add_bytes(tar, f"{run_id}/{name}", data)
    names = [p.relative_to(run_dir).as_posix() for p in files] + sorted(extra)
    return {"path": str(out), "run_id": run_id, "files": names, "bytes": None if stream else out.stat().st_size,
            "problems": differs}


class _Packed:
    """How far the packing is, on the stage's progress line: the run's bytes read into the archive (gzip packs a
    model's weights at ~30 MiB/s on one core: a run of a few GB is minutes), said at each file and every 16 MiB."""

    EVERY = 2**24

    def __init__(self, files: list[Path]):
        self.total = sum(p.stat().st_size for p in files)
        self.done, self.file, self.n, self.said = 0, 0, len(files), 0
        head(f"packing {self.n} files, {fmt_bytes(self.total)}")

    def reading(self, f, name: str) -> "_Reading":
        """``f`` (the file ``name``) as tarfile reads it, in pieces, each counted."""
        self.file += 1
        self.name = name
        self._say()
        return _Reading(f, self)

    def read(self, n: int) -> None:
        self.done += n
        if self.done - self.said >= self.EVERY:
            self._say()

    def _say(self) -> None:
        self.said = self.done
        note(f"{fmt_bytes(self.done)} of {fmt_bytes(self.total)} — file {self.file}/{self.n}: {self.name}",
             done=self.done >> 20, total=max(self.total >> 20, 1))


class _Reading:
    def __init__(self, f, packed: _Packed):
        self.f, self.packed = f, packed

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.packed.read(len(data))
        return data


def manifest_problems(run_dir: Path) -> list[str]:
    """What differs from the manifests in the run folder (its own and each checkpoint's), as ``verify`` finds it:
    a file changed since it was written (sha256), or missing. Packed as they are, said beside the archive."""
    out = []
    for m in sorted(run_dir.rglob(MANIFEST)):
        if m.is_file():
            under = m.parent.relative_to(run_dir).as_posix()
            out += [p if p.startswith("/") or under == "." else f"{under}/{p}" for p in verify_manifest(m.parent)]
    return list(dict.fromkeys(out))  # a checkpoint's file is listed in its own manifest and the run's


def _check_member(m: tarfile.TarInfo) -> None:
    name = m.name
    parts = PurePosixPath(name).parts
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise BadInput(f"archive member '{name}' has an absolute path", where=name,
                       fix="refused: it would be written outside the target folder")
    if ".." in parts or "\\" in name:
        raise BadInput(f"archive member '{name}' climbs out of the target folder ('..')", where=name,
                       fix="refused: an archive written by pilotrun never has such a member")
    if m.issym() or m.islnk():
        raise BadInput(f"archive member '{name}' is a link (to '{m.linkname}')", where=name,
                       fix="refused: links could point outside the target folder")
    if not (m.isfile() or m.isdir()):
        raise BadInput(f"archive member '{name}' is a device, FIFO or other special file", where=name,
                       fix="refused: only plain files and folders are unpacked")
    if not parts and m.isfile():
        raise BadInput(f"archive member '{name}' is a file without a name", where=name or "(empty name)",
                       fix="refused: an archive written by pilotrun never has such a member")
    long = next((p for p in parts if len(os.fsencode(p)) > NAME_MAX), None)
    if long is not None:  # the file system would refuse it midway (ENAMETOOLONG): refused before anything is written
        raise BadInput(f"archive member '{name[:120]}…' has a name of {len(os.fsencode(long))} bytes; file systems "
                       f"take at most {NAME_MAX}", where=name[:120],
                       fix="refused: an archive written by pilotrun never has such a member")


def _check_layout(members: list[tarfile.TarInfo], target: Path) -> None:
    """Refuse, before anything is written: a name that is both a file and a folder (or a file twice), and
    members that would not fit in the free space where they are unpacked (an archive bomb)."""
    files: set[PurePosixPath] = set()
    dirs: set[PurePosixPath] = set()
    for m in members:
        p = PurePosixPath(m.name)
        dirs.update(p.parents)
        if m.isdir():
            dirs.add(p)
        elif p in files:
            raise BadInput(f"archive member '{m.name}' appears twice", where=m.name,
                           fix="refused: an archive written by pilotrun holds each file once")
        else:
            files.add(p)
    both = sorted(files & dirs)
    if both:
        raise BadInput(f"archive member '{both[0]}' is both a file and a folder", where=str(both[0]),
                       fix="refused: an archive written by pilotrun never has such members")
    total = sum(m.size for m in members if m.isfile())
    free = shutil.disk_usage(target).free
    if total > free:
        big = max((m for m in members if m.isfile()), key=lambda m: m.size)
        raise BadInput(f"the archive unpacks to {total:,} bytes (largest member '{big.name}', {big.size:,} bytes) but "
                       f"only {free:,} bytes are free in {target}", where=str(target),
                       fix="free space there or extract elsewhere; an archive that unpacks to far more than "
                           "its own size may be an archive bomb")


def _members(tar: tarfile.TarFile, archive: Path) -> list[tarfile.TarInfo]:
    try:
        return tar.getmembers()
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise BadInput(f"the archive is damaged or truncated ({e})", where=str(archive),
                       fix="copy it again from its source (a complete .tar.gz from pilotrun archive)") from None


def extract(archive: str | Path, target: str | Path) -> list[Path]:
    """Unpack into ``target`` after checking every member; nothing is written when one is refused."""
    archive, target = Path(archive), Path(target)
    try:
        tar = tarfile.open(archive, "r:*")
    except (tarfile.TarError, EOFError, zlib.error, OSError) as e:
        raise BadInput(f"cannot read the archive: {e}", where=str(archive), fix="pass a .tar.gz from pilotrun archive")
    with tar:
        members = _members(tar, archive)
        for m in members:
            _check_member(m)
        # "./" (what `tar -C dir .` writes first) is the target folder itself: nothing to create
        members = [m for m in members if PurePosixPath(m.name).parts]
        target.mkdir(parents=True, exist_ok=True)
        _check_layout(members, target)
        staging = target / f".extract-{os.getpid()}"
        staging.mkdir()
        written = []
        try:
            for m in members:
                dest = staging / PurePosixPath(m.name)
                if m.isdir():
                    dest.mkdir(parents=True, exist_ok=True)
                    continue
                dest.parent.mkdir(parents=True, exist_ok=True)
                with writing(dest), open(dest, "wb") as f:
                    try:
                        shutil.copyfileobj(tar.extractfile(m), f)
                    except (tarfile.TarError, EOFError, zlib.error) as e:
                        raise BadInput(f"the archive is damaged or truncated at member '{m.name}' ({e})",
                                       where=str(archive), fix="copy it again from its source") from None
                os.chmod(dest, 0o644)
                written.append(PurePosixPath(m.name))
            for top in sorted({PurePosixPath(m.name).parts[0] for m in members}):
                final = target / top
                if final.exists() or final.is_symlink():  # a link, dangling or not, is no place to restore a run
                    what = f"a symlink (to {os.readlink(final)})" if final.is_symlink() else "there"
                    raise BadInput(f"{final} already exists: {what}", where=str(final),
                                   fix="extract into an empty folder, or remove it first")
                os.replace(staging / top, final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return [target / p for p in written]
