"""The pilot on CUDA, for machines that have a GPU: the demo campaign under bf16-mixed on one GPU, and
with two or more GPUs the same under ddp and fsdp (2 ranks, nccl). Prints every phase row with
CUDA's allocated and reserved counters side by side, and checks that each row is ok, is labelled
"cuda" and has real numbers.

Run: ``python bench/gpu_pilot.py [--set KEY=VALUE ...] [--memory-limit SIZE] [--json OUT]``
(e.g. ``--set model.config.hidden_size=1024`` for a bigger model). Exits 0 with a note when there is
no GPU, 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

COUNTERS = ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved")


def _print_rows(label: str, rows: list[dict]) -> None:
    from pilotrun.sizes import fmt_bytes

    print(f"\n== {label}")
    print(f"{'phase':13} {'rank':>4} {'device':7} " + " ".join(f"{c:>14}" for c in COUNTERS) +
          f" {'seconds':>8}  verdict")
    for r in rows:
        print(f"{r['phase']:13} {r['rank']:>4} {r['device']:7} " +
              " ".join(f"{fmt_bytes(r[c]):>14}" for c in COUNTERS) + f" {r['duration_s']:8.3f}  {r['verdict']}"
              + (f"  ({r['note']})" if r.get("note") else ""))


def _problems(label: str, rows: list[dict], ranks: int) -> list[str]:
    out = []
    if len(rows) != 7 * ranks:
        out.append(f"{label}: {len(rows)} rows, expected {7 * ranks}")
    for r in rows:
        where = f"{label}: {r['phase']} rank {r['rank']}"
        if r["verdict"] != "ok":
            out.append(f"{where}: {r['verdict']} {r.get('note') or ''}")
        if r["counter"] != "cuda" or not all(isinstance(r[c], int) for c in COUNTERS):
            out.append(f"{where}: counters are not CUDA's ({r['counter']})")
        elif r["peak_reserved"] < r["peak_allocated"]:
            out.append(f"{where}: peak reserved below peak allocated")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--memory-limit", default=None, help="default: hardware.memory_per_gpu of the demo")
    ap.add_argument("--json", default=None, metavar="OUT", help="write every row to this file")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_pilot: no CUDA device here; nothing to check (run it on a machine with a GPU)")
        return 0
    from pilotrun.campaign.load import load_campaign, parse_set
    from pilotrun.demo.synth import write_demo
    from pilotrun.rehearsal.memory.pilot import pilot

    work = Path(tempfile.mkdtemp(prefix="pilotrun-gpu-pilot-"))
    path = write_demo(work / "demo")
    base = {"train.precision": "bf16-mixed", **parse_set(args.sets)}
    runs = [("single GPU, bf16-mixed", base, 1)]
    if torch.cuda.device_count() >= 2:
        runs += [("ddp × 2, bf16-mixed", {**base, "train.strategy": "ddp", "train.nproc": 2}, 2),
                 ("fsdp × 2, bf16-mixed", {**base, "train.strategy": "fsdp", "train.nproc": 2}, 2)]
    else:
        print("gpu_pilot: one GPU, so ddp and fsdp (2 ranks) are not run")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)} × {torch.cuda.device_count()}; "
          f"journal in {work / 'home'}")
    problems, everything = [], {}
    for label, overrides, ranks in runs:
        try:
            res = pilot(load_campaign(path, overrides), work / "home", memory_limit=args.memory_limit)
        except Exception as e:  # report and go on to the next configuration
            problems.append(f"{label}: {type(e).__name__}: {e}")
            continue
        rows = res.data["rows"]
        everything[label] = rows
        _print_rows(f"{label}: {res.verdict} — {res.summary}", rows)
        problems += _problems(label, rows, ranks)
    if args.json:
        Path(args.json).write_text(json.dumps(everything, indent=2, default=str))
    print("\n" + ("\n".join(f"FAIL {p}" for p in problems) if problems else "every row ok, with CUDA counters"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
