"""Ground floor: where a run came from — its config's hash, package versions, git revision, command line.

Every path that makes a run (``train`` and the other stages, the framework callbacks, the own-loop
recorder) hashes its config with :func:`config_sha256`, so the same campaign has one hash wherever it
ran: the sheet and the memory bound match runs to pilots by it.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
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


def file_sha256(path: str | Path) -> str:
    """sha256 of the file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
