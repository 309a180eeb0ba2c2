"""Checkpoints of a model sharded with FSDP2 (``fully_shard``): each rank writes the shards it holds.

Per rank r: ``model.rank{r}.safetensors`` (the rank's local shards of the model's sharded state dict,
by parameter name) and ``optimizer.rank{r}.pt`` (its optimizer state, by parameter name, with local
shards in place of DTensors: tensors, numbers and names only, read back with ``weights_only=True``).
Gathering the full state onto one rank instead would need the whole model and optimizer state in one
process, which is what sharding avoids. Rank 0 writes the other components and the manifest (sha256
of every rank's files) once all ranks' files are on disk; the manifest names the world size, and a
checkpoint resumes on as many ranks as wrote it. The artifact, by contrast, is the full model
(``engine/artifact.py`` gathers it).
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.engine.distributed import world_rank
from pilotrun.engine.optim import load_keeping_kernel, save_optimizer_state
from pilotrun.errors import BadInput
from pilotrun.journal.files import kill_point, reading_weights


def is_sharded(model) -> bool:
    """True when the model's parameters are FSDP2 DTensors."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return any(isinstance(p, DTensor) for p in model.parameters())


def shard_names(rank: int) -> tuple[str, str]:
    return f"model.rank{rank}.safetensors", f"optimizer.rank{rank}.pt"


def unshare(sd: dict) -> dict:
    """safetensors refuses tensors that share memory (tied weights): give repeats their own copy."""
    seen, out = set(), {}
    for k, v in sd.items():
        v = v.detach().contiguous()
        out[k] = v.clone() if v.data_ptr() in seen else v
        seen.add(v.data_ptr())
    return out


def _local(t):
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def save_shards(state, tmp: Path, rank: int, *, model: bool = True, optimizer: bool = True) -> None:
    """This rank's model and optimizer shards into ``tmp`` (every rank calls it: the state dicts are collectives)."""
    import torch
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor

    msd, osd = get_state_dict(state.model, state.optimizer)
    model_file, opt_file = shard_names(rank)
    if model:
        save_file(unshare({k: _local(v) for k, v in msd.items()}), str(tmp / model_file))
        kill_point("model")
    if optimizer:
        dtensors = [[name, key] for name, st in osd["state"].items() for key, v in st.items()
                    if isinstance(v, DTensor)]
        local = {name: {key: _local(v).detach() if isinstance(v, torch.Tensor) else v
                        for key, v in st.items()} for name, st in osd["state"].items()}
        save_optimizer_state({"state": local, "param_groups": osd["param_groups"], "dtensors": dtensors},
                             tmp / opt_file)
        kill_point("optimizer")


def check_world(path: Path, manifest: dict, model) -> int | None:
    """The world size that wrote a sharded checkpoint (None for a full one), refusing one this run cannot load."""
    written = (manifest.get("sharded") or {}).get("world")
    world = world_rank()[0]
    if written is None:
        if is_sharded(model):
            raise BadInput("the checkpoint holds full weights, written without FSDP, and this run shards the model "
                           "(train.strategy=fsdp); nothing was loaded", where=str(path),
                           fix="resume with the train.strategy and train.nproc that wrote it")
        return None
    if not is_sharded(model) or written != world:
        raise BadInput(f"the checkpoint holds FSDP shards written by {written} ranks and this run has {world} "
                       f"rank(s){'' if is_sharded(model) else ' without FSDP'}; nothing was loaded", where=str(path),
                       fix=f"resume with train.strategy: fsdp and train.nproc: {written}")
    return written


def read_optimizer_shard(path: Path, rank: int) -> dict:
    """This rank's optimizer shard, tensors and numbers only (nothing else is unpickled)."""
    import pickle

    import torch

    file = path / shard_names(rank)[1]
    try:
        return torch.load(file, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        raise BadInput(f"{file.name} holds objects other than tensors and numbers; refused, nothing was loaded "
                       f"({str(e).strip().splitlines()[0]})", where=str(file),
                       fix="use a checkpoint written by pilotrun; never load one from an untrusted source "
                           "with weights_only=False") from None


def load_shards(state, path: Path, rank: int, opt: dict | None) -> list[str]:
    """This rank's shards into the sharded model (and optimizer, given ``opt``); returns what was restored."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_model_state_dict,
                                                         set_state_dict)
    from torch.distributed.tensor import DTensor

    template, _ = get_state_dict(state.model, state.optimizer)

    def like(name: str, local):
        t = template[name]
        if not isinstance(t, DTensor):
            return local.to(t.device)
        return DTensor.from_local(local.to(t.to_local().device), t.device_mesh, t.placements, run_check=False,
                                  shape=t.shape, stride=t.stride())

    model_file = path / shard_names(rank)[0]
    with reading_weights(model_file, "checkpoint's model shards"):
        local = load_file(str(model_file))
    msd = {name: like(name, v) for name, v in local.items()}
    if opt is None:
        set_model_state_dict(state.model, msd, options=StateDictOptions(strict=True))
        return ["model"]
    for name, key in opt.pop("dtensors"):
        opt["state"][name][key] = like(name, opt["state"][name][key])
    load_keeping_kernel(state.optimizer, lambda: set_state_dict(
        state.model, state.optimizer, model_state_dict=msd, optim_state_dict=opt, options=StateDictOptions(strict=True)))
    return ["model", "optimizer"]
