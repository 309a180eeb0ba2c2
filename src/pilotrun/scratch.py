"""Temporaries in TMPDIR that name their owner, so the next writer of the same kind removes the dead ones.

``owned_name(prefix)`` is ``PREFIX<host>-<pid>-<random>``; ``remove_dead(prefix)`` removes every entry of
TMPDIR with that prefix whose host is this one and whose process is gone (a killed parent's progress file,
a killed train's rank folder). A live owner's (its PID exists, even reused) and another host's stay. Each
writer calls it when it starts (``console/progress.stage_progress``, ``rehearsal/training/train``), as
checkpoints remove a killed save's hidden folder (``journal/files.remove_stale_temps``).
"""

from __future__ import annotations

import functools
import os
import secrets
import shutil
import socket
import tempfile
from pathlib import Path


@functools.cache
def host_tag() -> str:
    """This host's name as it goes into a temporary's name (no ``-``, which separates the PID): the one rule for
    TMPDIR temporaries here and the hidden temps beside a file (``journal/files.temp_path``)."""
    return "".join(ch if ch.isalnum() or ch in "._" else "_" for ch in socket.gethostname()) or "host"


def owned_name(prefix: str) -> str:
    return f"{prefix}{host_tag()}-{os.getpid()}-{secrets.token_hex(4)}"


def pid_alive(pid: int | None) -> bool:
    """Whether process ``pid`` exists on this host (this process's own counts; another user's too; no PID, or
    0, is no process)."""
    if not pid:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_dead(prefix: str, folder: str | Path | None = None) -> list[Path]:
    """Remove ``prefix`` temporaries in ``folder`` (TMPDIR) whose owner on this host is gone; returns them."""
    folder = Path(folder or tempfile.gettempdir())
    removed = []
    try:
        entries = [p for p in folder.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    for p in entries:
        host, _, rest = p.name[len(prefix):].rpartition("-")[0].rpartition("-")
        pid = rest
        if host != host_tag() or not pid.isdigit() or pid_alive(int(pid)):
            continue
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)
        else:
            try:
                p.unlink()
            except OSError:
                continue
        removed.append(p)
    return removed


def make_dir(prefix: str) -> Path:
    """A fresh folder in TMPDIR named for this process, after removing the dead owners' of ``prefix``."""
    remove_dead(prefix)
    path = Path(tempfile.gettempdir()) / owned_name(prefix)
    path.mkdir(mode=0o700)
    return path
