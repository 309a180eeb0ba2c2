"""Adapter-only checkpoints: the trainable parameters plus the identity of the frozen base model.

A LoRA run trains a few hundred thousand parameters of a model of hundreds of millions; its checkpoint
holds only what training changes (the trainable parameters, with the optimizer state and the rest of
the training state beside them) and ``base.json``, which names the base model it was trained on: the
folder and the sha256 of each weight file, or, for a model built from ``model.config``, the sha256 of
that config and the seed its weights were drawn with. Loading refuses a checkpoint whose base differs.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun.provenance import file_sha256

ATTR = "pilotrun_base"  # set by tasks/loading.build_model on an adapted model
BASE_FILE = "base.json"
_HASHES: dict[tuple, str] = {}  # (path, size, mtime_ns) -> sha256: a 14 GB base is hashed once per process


def describe_base(c) -> dict:
    """What identifies the campaign's base model, before hashing (cheap; hashed at the first save)."""
    if c.model.path:
        return {"path": str(Path(c.model.path).resolve())}
    cfg = json.dumps(c.model.config, sort_keys=True, default=str)
    return {"config_sha256": hashlib.sha256(cfg.encode()).hexdigest(), "seed": c.seed}


def _sha256(p: Path) -> str:
    st = p.stat()
    key = (str(p), st.st_size, st.st_mtime_ns)
    if key not in _HASHES:
        _HASHES[key] = file_sha256(p)
    return _HASHES[key]


def identity(described: dict) -> dict:
    """The base model's identity: for a folder, the sha256 of every weight file in it."""
    if "path" not in described:
        return dict(described)
    folder = Path(described["path"])
    files = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
    return {"path": described["path"], "weights": {p.name: _sha256(p) for p in files}}


def base_of(model) -> dict | None:
    """The described base of an adapted model, or None for a model whose checkpoint holds every weight."""
    return getattr(model, ATTR, None)


def trainable_state(model) -> dict:
    """The trainable parameters by state-dict name (what an adapter-only checkpoint holds)."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def write_base(folder: Path, model) -> None:
    (folder / BASE_FILE).write_text(json.dumps(identity(base_of(model)), indent=1, sort_keys=True))


def check_base(folder: Path, model) -> None:
    """Refuse (nothing loaded) when the checkpoint was trained on another base model than this one."""
    saved = json.loads((folder / BASE_FILE).read_text())
    described = base_of(model)
    if described is None:
        raise BadInput(f"{folder} is an adapter-only checkpoint but this campaign's model has no adapter; nothing "
                       "was loaded", where="model.adapter", fix="resume with the campaign that wrote it (same "
                       "model.adapter)")
    now = identity(described)
    if saved == now:
        return
    if saved.get("path") != now.get("path"):
        what = f"base model {saved.get('path') or 'built from model.config'}, this campaign's is " \
               f"{now.get('path') or 'built from model.config'}"
    elif "weights" in saved:
        changed = sorted(n for n in set(saved["weights"]) | set(now.get("weights", {}))
                         if saved["weights"].get(n) != now.get("weights", {}).get(n))
        what = f"base model {saved['path']}, whose weight files have changed since ({', '.join(changed)})"
    else:
        what = "a base model built from another model.config or seed"
    raise BadInput(f"the checkpoint's adapter was trained on {what}; nothing was loaded", where=str(folder / BASE_FILE),
                   fix="resume with the base model the checkpoint names (the same folder and weight files)")


def load_trainable(model, tensors: dict, folder: Path) -> None:
    """Load an adapter-only checkpoint's tensors; every trainable parameter must be among them."""
    want = set(trainable_state(model))
    missing = sorted(want - set(tensors))
    extra = sorted(set(tensors) - set(dict(model.named_parameters())))
    if missing or extra:
        raise BadInput(f"the checkpoint's trainable parameters do not match the model's (missing {missing[:3]}, "
                       f"unknown {extra[:3]}); nothing was loaded", where=str(folder),
                       fix="resume with the campaign that wrote the checkpoint (same model.adapter)")
    model.load_state_dict(tensors, strict=False)
