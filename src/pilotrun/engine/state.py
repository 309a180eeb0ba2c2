"""The full training state, saved atomically and loaded without unpickling arbitrary objects.

A checkpoint is a folder: model weights (safetensors; with an adapter only the trainable parameters
and ``base.json``, the base model's identity, see ``journal/base_identity.py``), optimizer state
(torch.save of tensors and numbers only, read back with ``weights_only=True``), RNG tensors (safetensors), a
preference run's precomputed reference log-probabilities (safetensors, ``tasks/preference_ref.py``), and JSON for
the scheduler, the grad scaler, the sampler position, the counters and Python/NumPy RNG states; under
FSDP the model and optimizer are one file pair per rank (``engine/sharded.py``). It is
written under a temporary name and renamed into place after everything, the manifest last, is on
disk, so a folder with a final name is always complete. Loading checks every file against the
manifest (and refuses files it does not list) before anything is read. ``checkpoints/final`` is a reference
to the last numbered checkpoint when that is the state the loop ended in (``save_final``); every reader
resolves it through ``journal/checkpoints.resolve``.

Test switch: ``PILOTRUN_TEST_KILL_SAVE_AT`` (``journal.files.kill_point``) kills the saving process at
a chosen step, for the tests that prove a killed save never leaves a partial checkpoint in place.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np

from pilotrun.engine.distributed import barrier, broadcast_from_rank0, world_rank
from pilotrun.engine.optim import load_keeping_kernel, save_optimizer_state
from pilotrun.engine.sharded import (check_world, is_sharded, load_shards, read_optimizer_shard, save_shards,
    shard_names, unshare)
from pilotrun.errors import BadInput
from pilotrun.journal.base_identity import BASE_FILE, base_of, check_base, load_trainable, trainable_state, write_base
from pilotrun.journal.checkpoints import named_by, resolve, write_reference
from pilotrun.journal.files import (MANIFEST, commit_dir, kill_point, remove_stale_temps, temp_path, reading_weights,
                                    write_manifest, writing)
from pilotrun.journal.leases import check_fence
from pilotrun import jsonsafe
from pilotrun.tasks.preference_ref import FILE as REFERENCE_FILE
from pilotrun.tasks.preference_ref import ReferenceLogps, attach_table, table_of

COMPONENTS = ("model", "optimizer", "scheduler", "scaler", "rng", "sampler", "counters")


def _np_state_to_json(st) -> dict:
    name, keys, pos, has_gauss, cached = st
    return {"name": name, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)}


def _np_state_from_json(d) -> tuple:
    return (d["name"], np.array(d["keys"], dtype=np.uint32), d["pos"], d["has_gauss"], d["cached"])


def save_state(state, path: str | Path, *, skip: tuple[str, ...] = ()) -> Path:
    """Write the state to ``path`` (a folder). ``skip`` leaves components out (tests plant defects with it).

    Under torch.distributed every rank calls it and rank 0 alone writes (the model and optimizer are
    replicated under DDP); under FSDP every rank writes its own shards first (``engine/sharded.py``).
    All ranks leave once the folder is complete. The RNG states saved are rank 0's.
    """
    import torch
    from safetensors.torch import save_file, save_model

    path = Path(path)
    world, rank = world_rank()
    sharded = is_sharded(state.model)
    tmp = None
    if rank == 0:
        remove_stale_temps(path.parent)  # what a killed save left behind
        tmp = temp_path(path)
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp)
    if sharded:  # every rank writes its own shards into rank 0's temporary folder
        tmp = broadcast_from_rank0(tmp)
        if rank == 0:
            tmp.mkdir(parents=True)
        barrier()
        with writing(path, tmp if rank == 0 else None):
            save_shards(state, tmp, rank, model="model" not in skip, optimizer="optimizer" not in skip)
        barrier()
    if rank != 0:
        barrier()
        return path
    with writing(path, tmp):  # a failed save leaves no temp; a full disk is exit 2 naming the checkpoint
        tmp.mkdir(parents=True, exist_ok=sharded)
        adapted = base_of(_unwrap(state.model)) is not None
        if "model" not in skip and not sharded:
            if adapted:  # the frozen base is named by base.json, not copied
                save_file(unshare(trainable_state(_unwrap(state.model))), str(tmp / "model.safetensors"))
                write_base(tmp, _unwrap(state.model))
            else:
                save_model(_unwrap(state.model), str(tmp / "model.safetensors"))
            kill_point("model")
        if "optimizer" not in skip and not sharded:
            save_optimizer_state(state.optimizer.state_dict(), tmp / "optimizer.pt")
            kill_point("optimizer")
        if "scheduler" not in skip:
            (tmp / "scheduler.json").write_text(json.dumps(state.scheduler.state_dict()))
            kill_point("scheduler")
        if "scaler" not in skip and state.scaler is not None:
            (tmp / "scaler.json").write_text(json.dumps(state.scaler.state_dict()))
            kill_point("scaler")
        if "rng" not in skip:
            tensors = {"torch": torch.get_rng_state()}
            if torch.cuda.is_available():
                for i, s in enumerate(torch.cuda.get_rng_state_all()):
                    tensors[f"cuda{i}"] = s
            save_file(tensors, str(tmp / "rng.safetensors"))
            py = random.getstate()
            (tmp / "rng.json").write_text(json.dumps({"python": [py[0], list(py[1]), py[2]],
                                                      "numpy": _np_state_to_json(np.random.get_state())}))
            kill_point("rng")
        if "sampler" not in skip:
            (tmp / "sampler.json").write_text(json.dumps(state.sampler.state_dict()))
            kill_point("sampler")
        if "counters" not in skip:
            (tmp / "counters.json").write_text(json.dumps(state.counters()))
            kill_point("counters")
        table = table_of(state.model)  # preference.reference: precomputed — what a resumed run compares with
        if table is not None:
            table.save(tmp)
        write_manifest(tmp, {"kind": "pilotrun-checkpoint", "components": [c for c in COMPONENTS if c not in skip],
                             "model": f"FSDP shards of all weights, one file per rank of {world}" if sharded else
                             "trainable parameters (adapter-only; base in base.json)" if adapted else "all weights",
                             **({"sharded": {"world": world}} if sharded else {})})
        kill_point("manifest")
        # the save's commit point: a process stopped mid-save (SIGSTOP) whose run the journal reaped meanwhile
        # must not add this checkpoint at SIGCONT (the loop's check before the save passed before the stop)
        check_fence()
        commit_dir(tmp, path)
    barrier()
    return path


def problems(path: str | Path) -> list[str]:
    """Why a checkpoint cannot be trusted: a file that differs from or is missing in the manifest, a file the
    manifest does not list (it would be loaded unchecked), or, for ``final`` as a reference, a missing or
    swapped checkpoint it names (``journal/checkpoints.resolve``). Empty for a complete checkpoint."""
    return resolve(path)[1]


def is_complete(path: str | Path) -> bool:
    return not problems(path)


def save_final(state, path: str | Path, saved: str | Path | None) -> bool:
    """Write ``checkpoints/final``: a reference to ``saved`` when the loop's last act was saving that numbered
    checkpoint (it is this very state), else a checkpoint of its own (``save_state``). Every rank calls it, as
    ``save_state``; rank 0 writes. True when it wrote a reference."""
    if saved is None:
        save_state(state, path)
        return False
    if world_rank()[1] == 0:
        write_reference(path, saved)
    barrier()
    return True


def load_state(state, path: str | Path) -> list[str]:
    """Restore every component present in the checkpoint; returns the components restored."""
    import torch
    from safetensors.torch import load_file, load_model

    asked = Path(path)
    path, found = resolve(asked)
    if found:
        raise BadInput("checkpoint does not match its manifest: " + "; ".join(found) + "; nothing was loaded",
                       where=str(asked), fix="use an earlier complete checkpoint")

    rank = world_rank()[1]
    written_by = check_world(path, jsonsafe.loads((path / MANIFEST).read_text()), state.model)
    if written_by is not None:
        opt = read_optimizer_shard(path, rank) if (path / shard_names(rank)[1]).is_file() else None
        restored = load_shards(state, path, rank, opt) if (path / shard_names(rank)[0]).is_file() else []
        return restored + _load_rest(state, path)
    adapter_only = (path / BASE_FILE).is_file()
    if adapter_only:
        check_base(path, _unwrap(state.model))  # before anything is restored
    opt_state = None
    if (path / "optimizer.pt").is_file():  # read before anything is restored: a refused file changes nothing
        import pickle

        try:  # tensors, numbers and containers only: never unpickle arbitrary objects
            opt_state = torch.load(path / "optimizer.pt", weights_only=True, map_location="cpu")
        except pickle.UnpicklingError as e:
            raise BadInput(f"optimizer.pt holds objects other than tensors and numbers; refused, nothing was "
                           f"loaded ({str(e).strip().splitlines()[0]})", where=str(path / "optimizer.pt"),
                           fix="use a checkpoint written by pilotrun; never load one from an untrusted source "
                               "with weights_only=False") from None
    restored = []
    if (path / "model.safetensors").is_file():
        with reading_weights(path / "model.safetensors", "checkpoint's model weights"):
            if adapter_only:
                load_trainable(_unwrap(state.model), load_file(str(path / "model.safetensors")), path)
            else:
                load_model(_unwrap(state.model), str(path / "model.safetensors"))
        restored.append("model")
    if opt_state is not None:
        load_keeping_kernel(state.optimizer, lambda: state.optimizer.load_state_dict(opt_state))
        restored.append("optimizer")
    return restored + _load_rest(state, path)


def _load_rest(state, path: Path) -> list[str]:
    """Scheduler, scaler, random states, sampler and counters (the same files on every rank)."""
    import torch
    from safetensors.torch import load_file

    restored = []
    if (path / "scheduler.json").is_file():
        state.scheduler.load_state_dict(jsonsafe.loads((path / "scheduler.json").read_text()))
        restored.append("scheduler")
    if (path / "scaler.json").is_file() and state.scaler is not None:
        state.scaler.load_state_dict(jsonsafe.loads((path / "scaler.json").read_text()))
        restored.append("scaler")
    if (path / "rng.safetensors").is_file():
        with reading_weights(path / "rng.safetensors", "checkpoint's random states"):
            t = load_file(str(path / "rng.safetensors"))
        torch.set_rng_state(t["torch"])
        cuda = [t[k] for k in sorted(k for k in t if k.startswith("cuda"))]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)
        r = jsonsafe.loads((path / "rng.json").read_text())
        random.setstate((r["python"][0], tuple(r["python"][1]), r["python"][2]))
        np.random.set_state(_np_state_from_json(r["numpy"]))
        restored.append("rng")
    if (path / "sampler.json").is_file():
        state.sampler.load_state_dict(jsonsafe.loads((path / "sampler.json").read_text()))
        restored.append("sampler")
    if (path / "counters.json").is_file():
        state.load_counters(jsonsafe.loads((path / "counters.json").read_text()))
        restored.append("counters")
    if (path / REFERENCE_FILE).is_file():  # the reference log-probabilities stored at the run's start
        with reading_weights(path / REFERENCE_FILE, "checkpoint's reference log-probabilities"):
            attach_table(state.model, ReferenceLogps.load(path / REFERENCE_FILE))
        restored.append("reference_logps")
    return restored


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The folder holding the complete checkpoint under folder with the most updates; ``final`` as a reference
    resolves to the checkpoint it names, an old full copy ``final`` wins a tie with the ``update-*`` of the
    same update; partial (temporary) folders and a ``final`` whose target is missing or damaged are never taken."""
    folder = Path(folder)
    if not folder.is_dir():
        return None

    def newest(found: tuple[Path, Path]):
        asked, held = found
        counters = held / "counters.json"
        update = jsonsafe.loads(counters.read_text()).get("update", -1) if counters.is_file() else -1
        return (update, held.name == "final", held.name)

    done = [(p, held) for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")
            for held, found in [resolve(p)] if not found]
    return max(done, key=newest)[1] if done else None


def numbered_checkpoints(folder: str | Path) -> list[Path]:
    """The complete ``update-NNNNNN`` checkpoints under ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("update-")
             and p.name[len("update-"):].isdigit() and is_complete(p)]
    return sorted(found, key=lambda p: int(p.name[len("update-"):]))


def kept_checkpoints(folder: str | Path, keep: int | None, best_update: int | None = None) -> list[Path]:
    """What ``train.keep_checkpoints`` keeps of the numbered checkpoints: the last ``keep``, the one of
    ``best_update`` (the best by plan.metric among those saved) and the one ``final`` stands for (a
    reference); all of them when ``keep`` is None."""
    numbered = numbered_checkpoints(folder)
    if keep is None:
        return numbered
    final = named_by(Path(folder) / "final")
    return [p for i, p in enumerate(numbered) if i >= len(numbered) - keep or p == final
            or (best_update is not None and p.name == f"update-{best_update:06d}")]


def retain_checkpoints(folder: str | Path, keep: int | None, best_update: int | None = None) -> list[Path]:
    """Remove the numbered checkpoints ``kept_checkpoints`` does not keep; ``final``, the checkpoint it stands
    for, other names and partial folders stay. Each goes by a rename to a hidden temporary first, so a kill mid-removal never leaves a
    partial folder under a checkpoint's name (the next save clears the temporary). Returns what was removed."""
    import shutil

    if keep is None:
        return []
    kept = set(kept_checkpoints(folder, keep, best_update))
    removed = []
    for p in numbered_checkpoints(folder):
        if p in kept:
            continue
        tmp = temp_path(p)
        os.replace(p, tmp)
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(p)
    return removed


def _unwrap(model):
    return getattr(model, "module", model)
