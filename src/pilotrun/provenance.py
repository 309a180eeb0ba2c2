"""Ground floor: where a run came from — its config's hash, package versions, git revision, command line.

Every path that makes a run (``train`` and the other stages, the framework callbacks, the own-loop
recorder) hashes its config with :func:`config_sha256`, so the same campaign has one hash wherever it
ran: the sheet and the memory bound match runs to pilots by it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

PACKAGES = ("pilotrun", "torch", "transformers", "peft", "safetensors", "numpy", "pyarrow", "pydantic")


def config_sha256(d: dict[str, Any]) -> str:
    """The one config hash: sha256 of the compact, key-sorted JSON of ``d``."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def plain_config(config: dict) -> dict:
    """A JSON-safe copy (anything else becomes its str)."""
    return json.loads(json.dumps(config, default=str))


RACY_NS = 20_000_000  # a file changed this recently may change again within its timestamp tick (≤ 10 ms), unseen
MEMO_MAX = 4096  # remembered hashes in one process
WAIT_BYTES = 32 << 20  # a file this big, just written, is hashed once its tick is over: reading it again later costs
# more than the wait (≤ RACY_NS; sha256 reads ~1.7 GB/s on one core)
_DIGESTS: dict[tuple, str] = {}  # (dev, inode, size, mtime_ns, ctime_ns) -> sha256 of the bytes read in this process


def file_identity(st: os.stat_result) -> tuple:
    """A file as it stands: device, inode, size, mtime and ctime (``file_sha256``'s memory; a cache of what a folder
    holds)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def file_sha256(path: str | Path, *, reuse: bool = False) -> str:
    """sha256 of the file's bytes, read now.

    Each hash read is remembered for this process under the file's identity: device, inode, size, mtime and
    ctime. ctime moves with every write, rename and metadata change and cannot be set back (``touch``, ``rsync
    -t`` and ``utime`` set mtime only). A hash is remembered only when the file stood unchanged while it was read
    and had not changed for RACY_NS before: a later write falls in a later timestamp tick.

    ``reuse``: give the remembered hash while the file's identity stands, without reading it again. That is for
    recording what a file holds (a run's manifest over the checkpoints it just hashed, a cache key, a base
    model's identity), never for checking it: a verification reads the bytes again."""
    with open(path, "rb") as f:
        before = file_identity(os.fstat(f.fileno()))
        if reuse and before in _DIGESTS:
            return _DIGESTS[before]
        wait = before[4] + RACY_NS - time.time_ns()
        if wait > 0 and before[2] >= WAIT_BYTES:
            time.sleep(wait / 1e9 + 0.001)
            before = file_identity(os.fstat(f.fileno()))
        started = time.time_ns()
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        steady = file_identity(os.fstat(f.fileno())) == before
    digest = h.hexdigest()
    if steady and started - before[4] > RACY_NS:
        _DIGESTS[before] = digest
        while len(_DIGESTS) > MEMO_MAX:
            _DIGESTS.pop(next(iter(_DIGESTS)))
    return digest


PARALLEL_BYTES = 64 * 2**20  # below this the files are hashed one after another: a thread costs more than it saves


def files_sha256(paths: list, *, reuse: bool = False) -> list[str]:
    """``file_sha256`` of each path, in order; the largest first and several at once where they are big enough and
    the process may use more than one CPU (hashlib lets go of the GIL while it hashes, and so do reads): a
    checkpoint's weights and optimizer state are two files, 0.54 and 1.08 GB on SmolLM2-135M. A file's error is
    raised as when it was hashed alone."""
    paths = [Path(p) for p in paths]
    sizes = [p.stat().st_size if p.is_file() else 0 for p in paths]
    workers = min(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                  sum(1 for n in sizes if n >= PARALLEL_BYTES // 4))
    if workers < 2 or sum(sizes) < PARALLEL_BYTES:
        return [file_sha256(p, reuse=reuse) for p in paths]
    from concurrent.futures import ThreadPoolExecutor

    order = sorted(range(len(paths)), key=lambda i: -sizes[i])
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="pilotrun-sha256") as pool:
        futures = {i: pool.submit(file_sha256, paths[i], reuse=reuse) for i in order}
        return [futures[i].result() for i in range(len(paths))]


def command_line() -> str:
    return "pilotrun " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "pilotrun"


def git_revision(folder: str | Path | None) -> str | None:
    if folder is None:
        return None
    try:
        rev = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain"], capture_output=True, text=True,
                               timeout=5).stdout.strip()
        return rev.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str | None]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out
