"""Export a run's metrics to TensorBoard event files with the standard writer, so dashboards keep working.

Each journal metric becomes the scalar ``split/name`` (e.g. ``train/loss``, ``validation/val_loss``) at
its update; the phase ledger's peaks and durations become ``phase/<phase>/<counter>`` scalars per rank.
"""

from __future__ import annotations

from pathlib import Path

from pilotrun.errors import BadInput


def export_tensorboard(journal, run_id: str, out_dir) -> dict:
    """Write the run's event file under out_dir/<run_id>; returns where and how many scalars."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise BadInput(f"TensorBoard export needs the tensorboard package ({e})", where="--tensorboard",
                       fix="pip install tensorboard") from None
    run_id = journal.require_run(run_id)["run_id"]
    target = Path(out_dir) / run_id
    metrics = journal.metrics(run_id)
    phases = journal.phase_rows(run_id)
    n = 0
    writer = SummaryWriter(log_dir=str(target))
    try:
        for m in metrics:
            writer.add_scalar(f"{m['split']}/{m['name']}", float(m["value"]), global_step=int(m["step"]))
            n += 1
        for i, row in enumerate(phases):
            for key in ("peak_allocated", "peak_reserved", "duration_s"):
                if row.get(key) is not None:
                    writer.add_scalar(f"phase/{row['phase']}/rank{row['rank']}/{key}", float(row[key]), global_step=i)
                    n += 1
    finally:
        writer.close()
    return {"run_id": run_id, "dir": str(target), "scalars": n,
            "files": sorted(p.name for p in target.iterdir() if p.name.startswith("events.out.tfevents"))}
