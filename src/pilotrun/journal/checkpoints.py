"""Which folder holds a checkpoint's files: the one resolver every reader of a checkpoint goes through.

A run's ``checkpoints/final`` is the state its loop ended in. When the loop's last act was saving a numbered
checkpoint (``update-NNNNNN``), that checkpoint already is this state, so ``final`` holds only a reference:
a ``manifest.json`` of kind ``pilotrun-checkpoint-ref`` naming the checkpoint beside it and the sha256 of
that checkpoint's own manifest (which itself lists every file's sha256), so a missing, swapped or rewritten
target is a finding, never a silent load of other weights. Otherwise (the last update was not saved, a
stop between saves) ``final`` is a checkpoint of its own, as every ``final`` was before references; such
old full copies load as they always did.

``resolve`` says which folder holds the files and why it cannot be trusted; ``engine/state.py`` (problems,
load, latest, retention), ``verify`` and ``archive`` read checkpoints through it.
"""

from __future__ import annotations

import re
from pathlib import Path

from pilotrun.journal.files import MANIFEST, commit_dir, listed_files, temp_path, verify_manifest, write_manifest
from pilotrun import jsonsafe
from pilotrun.provenance import file_sha256

REF_KIND = "pilotrun-checkpoint-ref"
NUMBERED = re.compile(r"update-\d{6,}")
RESTORE = "restore the run folder from an archive of the run (`pilotrun archive` carries the checkpoint final names)"


def reference(path: str | Path) -> dict | None:
    """The reference manifest of ``path`` when it is a reference (``final`` standing for a numbered checkpoint),
    else None (a checkpoint of its own, or no readable manifest: ``folder_problems`` says why)."""
    try:
        m = jsonsafe.loads((Path(path) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("kind") == REF_KIND else None


def folder_problems(path: Path) -> list[str]:
    """Why a folder holding a checkpoint's files cannot be trusted: a file that differs from or is missing in
    its manifest, or a file the manifest does not list (it would be loaded unchecked)."""
    if not path.is_dir():
        return [f"{path}: not a folder"]
    found = verify_manifest(path)
    listed = listed_files(path)
    if listed is not None:
        found += [f"{p.relative_to(path).as_posix()}: not listed in manifest.json" for p in sorted(path.rglob("*"))
                  if p.is_file() and p.name != MANIFEST and p.relative_to(path).as_posix() not in listed]
    return found


def resolve(path: str | Path, *, files: bool = True) -> tuple[Path, list[str]]:
    """(the folder holding the files of the checkpoint ``path`` stands for, why it cannot be trusted).

    A checkpoint of its own is its own folder. A reference resolves to the numbered checkpoint beside it,
    which must exist, have the very manifest the reference recorded, and match that manifest file by file
    (``files=False``: the reference alone, the target's files not hashed — for a caller that hashes them
    anyway, verify's check of the whole run folder)."""
    path = Path(path)
    ref = reference(path)
    if ref is None:
        return path, folder_problems(path)
    where = f"{path / MANIFEST}"
    name = ref.get("checkpoint")
    if not isinstance(name, str) or not NUMBERED.fullmatch(name):
        return path, [f"{where}: names {name!r}, not a numbered checkpoint (update-NNNNNN) beside it"]
    own = folder_problems(path)  # a reference folder holds its manifest and nothing else
    if own:
        return path, [f"{where}: {p}" for p in own]
    target = path.parent / name
    if not (target / MANIFEST).is_file():
        return target, [f"{where}: stands for checkpoint {name}, which is missing ({target}); {RESTORE}"]
    if file_sha256(target / MANIFEST) != ref.get("manifest_sha256"):
        return target, [f"{where}: stands for checkpoint {name}, but {name}/{MANIFEST} differs from the one "
                        f"recorded when final was written (the checkpoint was swapped or rewritten); {RESTORE}"]
    if reference(target) is not None:
        return target, [f"{where}: stands for {name}, itself a reference; a reference names a checkpoint"]
    return target, [f"{name}/{p}" for p in folder_problems(target)] if files else []


def named_by(path: str | Path) -> Path | None:
    """The numbered checkpoint the reference ``path`` names (whatever its state), None when it is no reference."""
    ref = reference(path)
    name = ref.get("checkpoint") if ref else None
    return Path(path).parent / name if isinstance(name, str) and NUMBERED.fullmatch(name) else None


def write_reference(path: str | Path, target: str | Path) -> Path:
    """Write ``path`` (``checkpoints/final``) as a reference to the complete checkpoint ``target`` beside it:
    a temporary folder holding only the manifest, renamed into place (over an earlier ``final``) in one step."""
    import shutil

    path, target = Path(path), Path(target)
    found = resolve(target)[1]
    if target.parent != path.parent or not NUMBERED.fullmatch(target.name) or found:
        raise ValueError(f"{path} can stand only for a complete numbered checkpoint beside it: {target} "
                         f"({'; '.join(found) or 'not a numbered checkpoint beside it'})")
    counters = jsonsafe.loads((target / "counters.json").read_text()) if (target / "counters.json").is_file() else {}
    tmp = temp_path(path)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    write_manifest(tmp, {"kind": REF_KIND, "checkpoint": target.name, "update": counters.get("update"),
                         "manifest_sha256": file_sha256(target / MANIFEST)})
    commit_dir(tmp, path)
    return path
