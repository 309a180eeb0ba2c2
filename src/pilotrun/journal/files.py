"""Atomic writes and manifests: a file is either complete or absent, never half-written."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"


def fsync_dir(path: Path) -> None:
    fd = os.open(str(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def sha256_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fsync_tree(root: Path) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted({p.parent for p in root.rglob("*")} | {root}):
        fsync_dir(d)


def write_manifest(root: str | Path, extra: dict | None = None) -> dict:
    """sha256 of every file under root (except the manifest itself), written atomically."""
    root = Path(root)
    files = {str(p.relative_to(root)): {"sha256": sha256_file(p), "bytes": p.stat().st_size}
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST and ".tmp-" not in p.name}
    manifest = {"files": files, **(extra or {})}
    atomic_write_json(root / MANIFEST, manifest)
    return manifest


def verify_manifest(root: str | Path, only: str | None = None) -> list[str]:
    """Problems found (missing manifest, missing file, hash mismatch); empty when every file matches."""
    root = Path(root)
    mpath = root / MANIFEST
    if not mpath.is_file():
        return [f"{mpath}: no manifest"]
    manifest = json.loads(mpath.read_text())
    problems = []
    for rel, info in manifest.get("files", {}).items():
        if only and not rel.startswith(only):
            continue
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif sha256_file(p) != info["sha256"]:
            problems.append(f"{rel}: sha256 differs from manifest.json")
    return problems


def commit_dir(tmp: Path, final: Path) -> None:
    """Make a fully written folder visible under its final name in one rename."""
    fsync_tree(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)
