"""Models named by their hub id (``org/name``, optionally ``@revision``), found in the local Hugging Face cache.

Nothing is downloaded: the look-up is huggingface_hub's own offline one (``try_to_load_from_cache`` over
the cache ``HF_HUB_CACHE`` / ``HF_HOME`` name, in its ``models--ORG--NAME/snapshots/COMMIT`` layout). A hub id
resolves to its snapshot folder, which the rest of pilotrun reads as any local model folder; the commit it
resolved to is recorded with each run (:func:`provenance`).

A helper module (imports only the ground): the campaign loader, the model loader and the sheet's launch
files all ask it. ``is_hub_id`` says whether a ``model.path`` names a hub model (the rental must then fetch
it), ``snapshot_of`` which hub model a resolved folder is.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun import jsonsafe

# org/name as the hub spells them: letters, digits, - _ . (no leading dot), one slash; then @revision
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<rev>[\w./-]+))?$")
WEIGHT_SUFFIXES = (".safetensors",)


@dataclass(frozen=True)
class HubModel:
    """A hub id resolved in the local cache."""

    repo_id: str
    """org/name."""
    revision: str
    """What the campaign asked for: a branch, a tag or a commit (main when it named none)."""
    commit: str
    """The commit the cache holds for it: the snapshot's folder name."""
    snapshot: str
    """The snapshot folder (the files pilotrun reads)."""
    cache: str
    """The cache searched."""

    def as_dict(self) -> dict:
        return asdict(self)


def is_hub_id(spec: str | None, base_dir: str | Path | None = None) -> bool:
    """Whether ``spec`` (a model.path or model.tokenizer as written) names a hub model: ``org/name[@rev]`` and
    no folder of that name beside the campaign file (a local folder always wins)."""
    if not spec or spec == "byte" or not _HUB_ID.match(spec):
        return False
    here = Path(base_dir) / spec if base_dir is not None else Path(spec)
    try:
        return not here.exists()
    except OSError:
        return True


def split_id(spec: str) -> tuple[str, str]:
    """``org/name@rev`` → (org/name, rev); rev is main when not given."""
    m = _HUB_ID.match(spec)
    if not m:
        raise ValueError(f"not a hub id: {spec!r}")
    return m.group("repo"), m.group("rev") or "main"


def cache_dir() -> str:
    """The cache huggingface_hub reads: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub
    (read at each call, so a changed environment is seen)."""
    import os

    if os.environ.get("HF_HUB_CACHE"):
        return str(Path(os.environ["HF_HUB_CACHE"]).expanduser())
    if os.environ.get("HF_HOME"):
        return str(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    return str(Path("~/.cache/huggingface/hub").expanduser())


def fetch_command(repo_id: str, revision: str = "main") -> str:
    """The command that would put the model into the cache (run where there is a network)."""
    import shlex

    return f"hf download {shlex.quote(repo_id)}" + (f" --revision {shlex.quote(revision)}" if revision != "main" else "")


def resolve(spec: str, key: str = "model.path", local: Path | None = None) -> HubModel:
    """The cached snapshot of hub id ``spec``; exit 2 naming the cache searched and the fetch command when
    the cache holds no config.json (nor, for a tokenizer, tokenizer_config.json) for it."""
    from huggingface_hub import try_to_load_from_cache

    repo_id, revision = split_id(spec)
    cache = cache_dir()
    wanted = ("config.json",) if key == "model.path" else ("tokenizer_config.json", "tokenizer.json", "config.json")
    found = None
    for name in wanted:
        try:
            hit = try_to_load_from_cache(repo_id, name, cache_dir=cache, revision=revision)
        except (ValueError, OSError):  # an id huggingface_hub refuses, an unreadable cache
            hit = None
        if isinstance(hit, str):
            found = Path(hit)
            break
    if found is None:
        what = "model" if key == "model.path" else "tokenizer"
        at = f" at revision {revision}" if revision != "main" else ""
        # a relative folder and a hub id read alike (models/base): say both what was looked for and where
        head = f"{what} folder not found: {local}, and the {what}" if local is not None else f"the {what}"
        raise BadInput(f"{head} {repo_id}{at} is not in the local Hugging Face cache {cache}"
                       " (pilotrun never downloads)", where=key,
                       fix=f"fetch it once with `{fetch_command(repo_id, revision)}` (or set HF_HUB_CACHE / HF_HOME "
                           "to the cache that holds it), or point at a local folder")
    snapshot = found.parent
    return HubModel(repo_id=repo_id, revision=revision, commit=snapshot.name, snapshot=str(snapshot), cache=cache)


def snapshot_of(folder: str | Path | None) -> tuple[str, str] | None:
    """(org/name, commit) when ``folder`` is a snapshot in a hub cache (``models--ORG--NAME/snapshots/COMMIT``),
    else None."""
    if not folder:
        return None
    p = Path(folder)
    if p.parent.name != "snapshots" or not p.parent.parent.name.startswith("models--"):
        return None
    parts = p.parent.parent.name[len("models--"):].split("--")
    return "/".join(parts), p.name


def missing_weights(folder: str | Path) -> list[str]:
    """The weight files a cached snapshot lacks: the shards its model.safetensors.index.json names that are
    absent, or model.safetensors when no index is cached either (empty when the weights are there)."""
    p = Path(folder)
    index = p / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(jsonsafe.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values()))
        except (OSError, ValueError):
            shards = []
        return [s for s in shards if not (p / s).is_file()]
    if any(c.name.endswith(WEIGHT_SUFFIXES) for c in p.iterdir()):
        return []
    return ["model.safetensors"]
