"""A data set's local file, as the tools read a data set's path: a file, or a folder holding its data files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pilotrun.campaign.importers.builder import Builder
from pilotrun.records.readers import FORMATS, SAVE_TO_DISK_FILES, data_format


def local_path_of(b: Builder, value: Any) -> Path:
    p = Path(os.path.expanduser(str(value)))
    return p if p.is_absolute() else b.source.parent / p


def data_file(folder: Path, split: str) -> tuple[Path | None, list[Path]]:
    """The one data file of a local data-set folder (the split's, by datasets' naming, when it holds several; a
    folder ``save_to_disk`` wrote: its .arrow shard, as Axolotl loads such a folder with ``load_from_disk``):
    (file, []) or (None, the candidates)."""
    files = sorted(p for p in folder.rglob("*") if p.is_file() and data_format(p)[0] in FORMATS
                   and p.name not in SAVE_TO_DISK_FILES  # a save_to_disk folder's metadata: its shards are the data
                   and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    if len(files) == 1:
        return files[0], []
    named = [p for p in files if p.name.startswith(split) or p.parent.name == split]
    return (named[0], []) if len(named) == 1 else (None, named or files)
