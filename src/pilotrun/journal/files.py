"""Atomic writes and manifests: a file is either complete or absent, never half-written."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import stat
import sys
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Callable, Iterator, TypeVar

from pilotrun.errors import BadInput, DiskFull, from_os_error

from pilotrun import jsonsafe
from pilotrun.provenance import files_sha256
from pilotrun.scratch import host_tag, pid_alive

MANIFEST = "manifest.json"
KILL_ENV = "PILOTRUN_TEST_KILL_SAVE_AT"  # test switch only: see kill_point
SIGNAL_ENV = "PILOTRUN_TEST_SIGTERM_SAVE_AT"  # test switch only: the same steps, a SIGTERM instead
FULL_ENV = "PILOTRUN_TEST_ENOSPC_AT"  # test switch only: see full_point
T = TypeVar("T")


def kill_point(step: str) -> None:
    """Test switch: ``$PILOTRUN_TEST_KILL_SAVE_AT=STEP`` makes the process SIGKILL itself at that step of a
    checkpoint save (steps: each component name, ``manifest``, ``committed``), so tests can prove that a
    save cut short anywhere leaves the last complete checkpoint loadable; ``$PILOTRUN_TEST_SIGTERM_SAVE_AT=STEP#N``
    sends itself a SIGTERM there instead, the N-th time (default 1) this process reaches it (a scheduler stopping the run mid-save). Never set them outside tests."""
    if os.environ.get(KILL_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
    want, _, nth = os.environ.get(SIGNAL_ENV, "").partition("#")
    if want == step:
        _REACHED[step] = _REACHED.get(step, 0) + 1
        if _REACHED[step] == int(nth or 1):  # the handler (pilotrun.signals) takes it at the next bytecode
            os.kill(os.getpid(), signal.SIGTERM)


_REACHED: dict[str, int] = {}


def full_point(step: str, path: str | Path) -> None:
    """Test switch: ``$PILOTRUN_TEST_ENOSPC_AT=STEP`` raises the OSError a full disk raises (ENOSPC) at that
    step (``artifact``: the exported artifact, written but not yet renamed), for tests on machines where
    no small file system can be mounted. Never set it outside tests."""
    if os.environ.get(FULL_ENV) == step:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


def is_disk_full(exc: BaseException, where: str | Path | None = None) -> bool:
    """Whether a failed write ran out of space. safetensors and torch.save wrap the OSError in their own
    errors (torch's says only "unexpected pos"), so when ``where`` is given, a file system with almost
    nothing left counts too."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    text = str(exc)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    if where is not None and isinstance(exc, (OSError, RuntimeError)):
        p = Path(where)
        while not p.exists() and p != p.parent:
            p = p.parent
        try:
            st = os.statvfs(p)
        except OSError:
            return False
        return st.f_bavail * st.f_frsize < (1 << 20)
    return False


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        try:
            p.unlink(missing_ok=True)
        except OSError:  # a read-only folder: there is no temporary to remove either
            pass


@contextmanager
def writing(final: str | Path, tmp: str | Path | None = None) -> Iterator[None]:
    """Around a write of ``final`` (through ``tmp``): on any failure ``tmp`` is removed, and a full disk
    becomes :class:`pilotrun.errors.DiskFull` naming ``final`` (exit 2)."""
    try:
        yield
    except BaseException as e:
        if tmp is not None:
            _remove(Path(tmp))
        if isinstance(e, Exception) and not isinstance(e, BadInput) and is_disk_full(e, tmp or final):
            raise DiskFull(final) from None
        if isinstance(e, OSError) and e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise BadInput(f"cannot write {final}: {e.strerror}", where=str(final),
                           fix="write it on a writable disk (--out, or --home), or fix the folder's permissions"
                           ) from None
        refused = from_os_error(e, final) if isinstance(e, OSError) else None  # a name too long, a loop ...
        if refused is not None:
            raise refused from None
        raise


def write_dir_atomically(final: str | Path, write: Callable[[Path], T]) -> T:
    """``write(tmp)`` fills a hidden temporary folder beside ``final``, which is then fsynced and renamed
    into place (like a checkpoint): a kill or a full disk never leaves ``final`` half-written."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(final.parent)
    tmp = temp_path(final)
    if tmp.exists():
        _remove(tmp)
    with writing(final, tmp):
        tmp.mkdir()
        result = write(tmp)
        full_point(final.name, final)
        kill_point(final.name)
        commit_dir(tmp, final)
    return result


@contextmanager
def reading_weights(path: str | Path, what: str = "weights") -> Iterator[None]:
    """Around loading safetensors from ``path`` (a file, or a folder of them): any safetensors error (a
    truncated file, a pickle renamed .safetensors) is exit 2 naming the file, not an internal error."""
    try:
        yield
    except Exception as e:
        if type(e).__name__ != "SafetensorError":
            raise
        p = Path(path)
        if p.is_dir():  # name the file itself where the folder holds one
            files = sorted(p.glob("*.safetensors"))
            p = files[0] if len(files) == 1 else p
        raise BadInput(f"cannot read the {what}: not a valid safetensors file ({e}); nothing was loaded",
                       where=str(p), fix="the file is damaged or is not safetensors (a renamed pickle?): use a "
                                         "checkpoint or artifact written by pilotrun, or write it again") from None


def temp_path(path: str | Path) -> Path:
    """Where ``path`` is written before it is renamed into place: hidden, beside it, named after this
    host and process so that ``remove_stale_temps`` can tell a dead writer's leftovers from live work."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{host_tag()}-{os.getpid()}")


def remove_stale_temps(folder: str | Path) -> list[Path]:
    """Remove what killed writers on this host left in ``folder`` (``temp_path`` names whose process is
    gone); returns what was removed. Another host's temps (a shared file system) and unknown names stay."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    removed = []
    for p in folder.iterdir():
        if not p.name.startswith(".") or ".tmp-" not in p.name:
            continue
        host, _, pid = p.name.rsplit(".tmp-", 1)[1].rpartition("-")
        if host != host_tag() or not pid.isdigit() or pid_alive(int(pid)):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with writing(path, tmp):
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_via(path: str | Path, write: Callable[[Path], object]) -> None:
    """``write(tmp)`` fills a temp beside ``path``, which is then fsynced and renamed into place: ``path``
    holds the old file or the new one, never a part (a file copied, a database snapshot)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    with writing(path, tmp):
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    fsync_dir(path.parent)


def _stdio(st: os.stat_result) -> int | None:
    """1 or 2 where ``st`` is this process's own stdout or stderr (``/dev/stdout`` names it through a link)."""
    for fd in (1, 2):
        try:
            o = os.fstat(fd)
        except OSError:
            continue
        if (o.st_dev, o.st_ino) == (st.st_dev, st.st_ino):
            return fd
    return None


_TAKEN: set[int] = set()


def stdout_taken() -> bool:
    """Whether an output file went to this process's stdout (``--out /dev/stdout``): the verb's human lines then go
    to stderr, so what a pipe reads is the file alone."""
    return 1 in _TAKEN


def _special(mode: int) -> str | None:
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    return ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "a special file")


def special_file(path: Path) -> str | None:
    """What ``path`` (its target, through symlinks) is when it exists and is no regular file nor folder: "a FIFO
    (named pipe)", "a character device" ...; else None. Its stat never blocks, where opening a FIFO does."""
    try:
        return _special(path.stat().st_mode)
    except OSError:
        return None


def output_kind(path: str | Path) -> str:
    """What a path the user named for an output file (``--out``, ``--write``) is, through links: "file" (a regular
    file, or nothing yet), "stream" (``special_file``'s devices, FIFOs and sockets: ``/dev/null``, ``/dev/stdout``, a
    named pipe; or this process's own stdout or stderr) or "folder"."""
    try:
        st = os.stat(Path(path).expanduser())
    except OSError:  # nothing there yet, or nothing readable: the write says why
        return "file"
    if stat.S_ISDIR(st.st_mode):
        return "folder"
    return "stream" if _special(st.st_mode) or _stdio(st) is not None else "file"


@contextmanager
def output_file(path: str | Path, key: str) -> Iterator[BinaryIO]:
    """A binary file to fill with an output the user named (``key``: its option). A file is written atomically
    (complete or absent) and a link is written through: the file it names is replaced, the link stays. A stream
    (``output_kind``) is written straight into and never replaced: renaming a file over ``/dev/null`` as root
    leaves a plain file where every program's null device was, and over ``/dev/stdout`` it unlinks what the shell
    redirected to. A folder is exit 2."""
    given = Path(path).expanduser()
    kind = output_kind(given)
    if kind == "folder":
        raise BadInput(f"{given} is a folder", where=key, fix=f"name a file, e.g. {key} {given / 'out'}")
    if kind == "stream":
        fd = _stdio(os.stat(given))
        if fd is not None:  # our own stdout: reopening it would truncate what was printed before
            sys.stdout.flush()
            sys.stderr.flush()
            _TAKEN.add(fd)
        with writing(given), (os.fdopen(os.dup(fd), "wb") if fd is not None else open(given, "wb")) as f:
            yield f
        return
    final = Path(os.path.realpath(given))
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(final)
    with writing(final, tmp):
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    fsync_dir(final.parent)


def write_output(path: str | Path, data: str | bytes, key: str) -> None:
    """``data`` into an output file the user named, as ``output_file`` writes one."""
    with output_file(path, key) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)


HEAD_BYTES = 64 * 1024  # what ``refuse_replacing`` reads of a file to tell whether pilotrun wrote it


def refuse_replacing(path: str | Path, key: str, ours: Callable[[bytes], bool], what: str,
                     fix: str | None = None) -> None:
    """Exit 2, before anything is written, where ``path`` holds a file that pilotrun did not write: ``ours`` tells
    pilotrun's own ``what`` (a selection sheet, a report, an archive) by its first ``HEAD_BYTES``. An output replaces
    a former output of its kind, never the campaign it read, a data file or the user's own script of the same name.
    An empty file, a stream (``/dev/stdout``) or nothing there is no file to lose; a folder is refused where
    written. ``fix``: what to do instead where the path is not one an option names (`all`'s home/sheet.md)."""
    given = Path(path).expanduser()
    try:
        st = os.stat(given)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return
        with open(given, "rb") as f:
            first = f.read(HEAD_BYTES)
    except OSError:  # nothing there, or nothing readable: the write says why
        return
    if ours(first):
        return
    line = first[:200].split(b"\n", 1)[0]
    try:
        begins = "binary data" if b"\0" in first[:512] else f"its first line: {line.decode('utf-8')[:60]!r}"
    except UnicodeDecodeError:
        begins = "binary data"
    raise BadInput(f"holds a file that is no {what} of pilotrun's ({begins}); writing the {what} would replace it",
                   where=str(path),
                   fix=fix or f"name a new file for {key}, or move {path} away first (pilotrun replaces only a "
                                  f"{what} it wrote)")


def refuse_stream(path: str | Path, key: str, why: str) -> None:
    """Exit 2 where an output must be a file in a folder (``why``) and ``path`` is a stream."""
    if output_kind(path) == "stream":
        raise BadInput(f"{path} is not a file (a device, a pipe or the terminal); {why}", where=key,
                       fix=f"name a file for {key}, e.g. {key} campaign.yaml")


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def dump_yaml(d: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(d, sort_keys=False, allow_unicode=True)


def fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in root.rglob("*")} | {root}):
        fsync_dir(d)


def write_manifest(root: str | Path, extra: dict | None = None) -> dict:
    """sha256 of every file under root (except the manifest itself), written atomically. A record, not a check: a
    file hashed before in this process and unchanged since is not read again (``file_sha256``'s ``reuse``: a run's
    manifest over the checkpoint whose own manifest was just written hashed its 1.6 GB twice on SmolLM2-135M)."""
    root = Path(root)
    paths = [p for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST and ".tmp-" not in p.name]
    files = {str(p.relative_to(root)): {"sha256": digest, "bytes": p.stat().st_size}
             for p, digest in zip(paths, files_sha256(paths, reuse=True))}
    manifest = {"files": files, **(extra or {})}
    atomic_write_json(root / MANIFEST, manifest)
    return manifest


def verify_manifest(root: str | Path, only: str | None = None) -> list[str]:
    """Problems found (missing manifest, missing file, hash mismatch); empty when every file matches."""
    root = Path(root)
    mpath = root / MANIFEST
    if not mpath.is_file():
        return [f"{mpath}: no manifest"]
    try:
        manifest = jsonsafe.loads(mpath.read_text())
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError("'files' is not a mapping")
    except (ValueError, KeyError, TypeError) as e:  # a truncated or hand-edited manifest is a finding, not a crash
        return [f"{mpath}: unreadable manifest ({type(e).__name__}: {e})"]
    found: list[tuple[str, str | None]] = []  # (rel, the problem, or None: to be hashed)
    for rel, info in files.items():
        if only and not rel.startswith(only):
            continue
        p = root / rel
        if PurePosixPath(rel).is_absolute() or ".." in PurePosixPath(rel).parts or "\\" in rel:
            found.append((rel, f"{rel}: a manifest entry outside the folder"))
        elif not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            found.append((rel, f"{rel}: no sha256 in manifest.json"))
        elif not p.is_file():
            found.append((rel, f"{rel}: missing"))
        else:
            found.append((rel, None))
    hashed = [rel for rel, problem in found if problem is None]
    digests = dict(zip(hashed, files_sha256([root / rel for rel in hashed])))
    return [problem if problem is not None else f"{rel}: sha256 differs from manifest.json"
            for rel, problem in found if problem is not None or digests[rel] != files[rel]["sha256"]]


def listed_files(root: str | Path) -> set[str] | None:
    """The paths manifest.json lists (None when it cannot be read)."""
    try:
        files = jsonsafe.loads((Path(root) / MANIFEST).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return set(files) if isinstance(files, dict) else None


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0


def commit_dir(tmp: Path, final: Path) -> None:
    """Make a fully written folder visible under its final name in one rename.

    Replacing an existing folder never deletes the old copy before the new one is in place: the two are
    swapped in one step where the OS can (Linux), else the old one is first renamed aside (hidden);
    only then is the old copy removed. A kill at any moment leaves a complete folder (old or new)."""
    fsync_tree(tmp)
    if not final.exists():
        os.replace(tmp, final)
        fsync_dir(final.parent)
        kill_point("committed")
        return
    if _exchange(tmp, final):  # final now holds the new copy, tmp the old one
        old = tmp
    else:
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(final, old)
        os.replace(tmp, final)
    fsync_dir(final.parent)
    kill_point("committed")
    shutil.rmtree(old)
