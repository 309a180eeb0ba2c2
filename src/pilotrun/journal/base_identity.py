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
from pilotrun import jsonsafe
from pilotrun.provenance import file_sha256

ATTR = "pilotrun_base"  # set by tasks/loading.build_model on an adapted model
BASE_FILE = "base.json"


def describe_base(c) -> dict:
    """What identifies the campaign's base model, before hashing (cheap; hashed at the first save); a quantised
    base (model.quantization) adds its settings, and its identity the sha256 of the bytes bitsandbytes made."""
    q = getattr(c.model, "quantization", None)
    extra = {} if q is None else {"quantization": q.model_dump()}
    if c.model.path:
        return {"path": str(Path(c.model.path).resolve()), **extra}
    cfg = json.dumps(c.model.config, sort_keys=True, default=str)
    return {"config_sha256": hashlib.sha256(cfg.encode()).hexdigest(), "seed": c.seed, **extra}


_FINGERPRINT = "_pilotrun_quantized_sha256"


def quantized_fingerprint(model) -> str:
    """sha256 over a quantised base's packed weights and their statistics (absmax, code, nested constants, 8-bit
    row scales), in module order: the base as bitsandbytes quantised it, which another bitsandbytes version or
    setting packs differently though the folder is the same. Kept on the model: hashed once per build."""
    import torch

    known = getattr(model, _FINGERPRINT, None)
    if known is not None:
        return known
    h = hashlib.sha256()
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        state, scb = getattr(w, "quant_state", None), getattr(w, "SCB", None)
        if state is None and scb is None:
            continue
        h.update(name.removeprefix("base_model.model.").encode())
        tensors = [w.data, scb]
        if state is not None:
            nested = getattr(state, "state2", None)
            tensors += [state.absmax, state.code] + ([nested.absmax, nested.code] if nested is not None else [])
        for t in tensors:
            if t is not None and t.numel():
                h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    digest = h.hexdigest()
    object.__setattr__(model, _FINGERPRINT, digest)
    return digest


def identity(described: dict, model=None) -> dict:
    """The base model's identity: for a folder, the sha256 of every weight file in it; for a quantised base (and
    ``model`` given), the sha256 of its quantised bytes too."""
    out = dict(described)
    if "path" in described:
        folder = Path(described["path"])
        files = sorted(p for p in folder.iterdir() if p.name.endswith(".safetensors"))
        out["weights"] = {p.name: file_sha256(p, reuse=True) for p in files}  # a 14 GB base: once a process
    if "quantization" in described and model is not None:
        out["quantized_sha256"] = quantized_fingerprint(model)
    return out


def base_of(model) -> dict | None:
    """The described base of an adapted model, or None for a model whose checkpoint holds every weight."""
    return getattr(model, ATTR, None)


def trainable_state(model) -> dict:
    """The trainable parameters by state-dict name (what an adapter-only checkpoint holds)."""
    return {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}


def write_base(folder: Path, model) -> None:
    (folder / BASE_FILE).write_text(json.dumps(identity(base_of(model), model), indent=1, sort_keys=True))


def check_base(folder: Path, model) -> None:
    """Refuse (nothing loaded) when the checkpoint was trained on another base model than this one."""
    saved = jsonsafe.loads((folder / BASE_FILE).read_text())
    described = base_of(model)
    if described is None:
        raise BadInput(f"{folder} is an adapter-only checkpoint but this campaign's model has no adapter; nothing "
                       "was loaded", where="model.adapter", fix="resume with the campaign that wrote it (same "
                       "model.adapter)")
    now = identity(described, model)
    if saved == now:
        return
    if saved.get("quantization") != now.get("quantization"):
        what = f"a base quantised as {_quant_said(saved.get('quantization'))}, this campaign's is " \
               f"{_quant_said(now.get('quantization'))}"
    elif saved.get("path") != now.get("path"):
        what = f"base model {saved.get('path') or 'built from model.config'}, this campaign's is " \
               f"{now.get('path') or 'built from model.config'}"
    elif "weights" in saved:
        changed = sorted(n for n in set(saved["weights"]) | set(now.get("weights", {}))
                         if saved["weights"].get(n) != now.get("weights", {}).get(n))
        what = f"base model {saved['path']}, whose weight files have changed since ({', '.join(changed)})"
    elif saved.get("weights") == now.get("weights") and saved.get("config_sha256") == now.get("config_sha256") \
            and saved.get("quantized_sha256") != now.get("quantized_sha256"):
        what = ("the same base quantised to other bytes (sha256 " f"{str(saved.get('quantized_sha256'))[:12]}…, now "
                f"{str(now.get('quantized_sha256'))[:12]}…): another bitsandbytes version or quantisation code")
    else:
        what = "a base model built from another model.config or seed"
    raise BadInput(f"the checkpoint's adapter was trained on {what}; nothing was loaded", where=str(folder / BASE_FILE),
                   fix="resume with the base model the checkpoint names (the same folder and weight files)")


def _quant_said(q: dict | None) -> str:
    if not q:
        return "unquantised (no model.quantization)"
    if q.get("bits") == 8:
        return "8-bit"
    return f"{q.get('bits')}-bit {q.get('type')}{' double-quantised' if q.get('double_quant') else ''} " \
           f"({q.get('compute_dtype')} compute)"


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
