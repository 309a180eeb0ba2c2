"""Writing a run's artifact (the model a user takes away) from the trained, possibly wrapped model."""

from __future__ import annotations

from pathlib import Path

from pilotrun.engine.distributed import barrier, broadcast_from_rank0
from pilotrun.journal.files import write_dir_atomically


def _unwrap(model):
    return getattr(model, "module", model)


def export_artifact(task, model, out_dir: Path, rank: int, strategy: str) -> list[str]:
    """Rank 0 writes the artifact (into a temporary folder renamed when complete); under FSDP every rank
    first helps gather the full weights."""
    if strategy == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        written = []
        if rank == 0:
            plain = task.build_model()
            plain.load_state_dict(full)
            written = write_dir_atomically(out_dir, lambda tmp: task.save_artifact(plain, tmp))
        barrier()
        return broadcast_from_rank0(written)
    written = []
    if rank == 0:
        written = write_dir_atomically(out_dir, lambda tmp: task.save_artifact(_unwrap(model), tmp))
    barrier()
    return broadcast_from_rank0(written)


