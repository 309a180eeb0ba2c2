"""The caching allocator's own event stream, captured on a GPU, for tests/test_snapshot_replay.py.

    python bench/gpu_snapshots.py                 # on a CUDA machine: $OUT/snapshots/*.json.gz + index.json
    python bench/gpu_snapshots.py --cpu           # the dry run: every case and command, CUDA hidden, the two
                                                  # larger Llamas shrunk (as bench/gpu_check.py's dry run does)

For each case — the five calibration campaigns (tests/calibration/h200-2026-12-04.json: the demo, wide512 and
wider1024 as bench/gpu_check.py measured them), MiniLM (seq-cls) and SmolLM2-135M-Instruct (chat), both real
weights, in fp32 and bf16-mixed — with torch's default allocator and with ``expandable_segments:True``: one fresh
process (the allocator reads PYTORCH_CUDA_ALLOC_CONF once, at CUDA's start) records the allocator's history
(``torch.cuda.memory._record_memory_history``) from before the first allocation, runs ``pilotrun pilot`` in that
process, and keeps ``torch.cuda.memory._snapshot()``'s trace of device 0 without stack frames
(``probe/snapshot.compact``), gzipped, with the versions it ran on (GPU, driver, torch, CUDA) and the pilot's rows.

Copy the snapshots to tests/calibration/snapshots/: the CPU test then replays each one's own events and must
reproduce the segments it allocated and its reserved peak exactly (probe/snapshot.py says why).
Not run on a GPU yet (issue 42 had none): its ``--cpu`` dry run is what ran.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {"default": "", "expandable": "expandable_segments:True"}

CAPTURE = r"""
import contextlib, gzip, json, os, subprocess, sys
import torch
out = sys.argv[3]
cuda = torch.cuda.is_available()
if cuda:
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=5_000_000)
from pilotrun.cli.main import run
with contextlib.redirect_stdout(sys.stderr):
    rc = run(["pilot", sys.argv[1], "--home", sys.argv[2], "--json"] + sys.argv[4:])
doc = {"rc": rc, "cuda": cuda, "torch": torch.__version__, "cuda_version": torch.version.cuda,
       "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
if cuda:
    from pilotrun.probe.snapshot import compact
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    p = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True)
    doc.update(gpu=p.name, total=p.total_memory, cc=f"{p.major}.{p.minor}", driver=smi.stdout.strip(),
               trace=compact(snap), reserved=torch.cuda.memory_reserved(), max_reserved=torch.cuda.max_memory_reserved())
with gzip.open(out, "wt") as f:
    json.dump(doc, f)
print(json.dumps({k: v for k, v in doc.items() if k != "trace"}))
"""


def cases(work: Path, cpu: bool) -> list[tuple[str, Path, list[str]]]:
    """(name, campaign, --set items): the calibration campaigns and the two real models, each in fp32 and bf16."""
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "tests"))
    import calibration

    paths = calibration.write_campaigns(work / "campaigns", small=cpu)
    out = [(name, paths[c["campaign"]], [s for kv in c["sets"] for s in ("--set", kv)])
           for name, c in calibration.fixture()["campaigns"].items()]
    from conftest import minilm_campaign, smollm2_folder, write_campaign, write_jsonl

    minilm = minilm_campaign(work / "minilm")
    chats = [{"messages": [{"role": "user", "content": f"Say {w} twice."}, {"role": "assistant", "content": f"{w} {w}"}]}
             for w in ("alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta")]
    write_jsonl(work / "smol" / "data" / "train.jsonl", chats[:6])
    write_jsonl(work / "smol" / "data" / "validation.jsonl", chats[6:])
    smol = None
    try:
        smol = write_campaign(work / "smol", {
            "name": "smollm2", "seed": 0, "task": "causal-lm", "model": {"path": str(smollm2_folder(work / "smol-m"))},
            "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "messages": "messages",
                     "max_length": 128},
            "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-4, "updates": 4, "save_every": None},
            "plan": {"seeds": [0]}})
    except Exception as e:  # noqa: BLE001 - the wheel may be missing on the GPU machine: said, not fatal (never
        # SystemExit: SIGTERM's handler raises it, and caught here the script went on to pilot every case)
        print(f"SmolLM2 skipped: {type(e).__name__}: {e}", flush=True)
    for name, path in (("minilm", minilm), ("smollm2", smol)):
        if path is not None:
            out += [(f"{name}-fp32", path, []), (f"{name}-bf16", path, ["--set", "train.precision=bf16-mixed"])]
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="dry run: CUDA hidden, each case piloted on the CPU")
    ap.add_argument("--budget", type=float, default=540.0, help="seconds for all the cases")
    ap.add_argument("--only", default="", help="comma-separated case names (default: all)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "gpu-snapshots-out") / "snapshots"
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT / "src"), env.get("PYTHONPATH", "")] if p)
    env.pop("PILOTRUN_HOME", None)
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    index = []
    # the pilots' scratch (campaigns, homes) under the output folder, not the system temp, and removed however the
    # script ends: SIGTERM (a scheduler's, the device tool's time limit) and SIGINT raise SystemExit here, so the
    # running child is killed by subprocess.run and the finally below runs; a SIGKILL leaves it beside the output
    work = out.parent / "scratch"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    try:
        wanted = {x for x in args.only.split(",") if x}
        for name, campaign, sets in cases(work, args.cpu):
            if wanted and name not in wanted:
                continue
            for label, conf in SETTINGS.items():
                left = deadline - time.monotonic()
                rec = {"case": name, "settings": conf or "torch's defaults"}
                if left < 20:
                    rec["status"] = "skipped: out of time"
                    index.append(rec)
                    continue
                file = out / f"{name}.{label}.json.gz"
                run_env = dict(env, PYTORCH_CUDA_ALLOC_CONF=conf) if conf else env
                t0 = time.monotonic()
                try:
                    p = subprocess.run([sys.executable, "-c", CAPTURE, str(campaign), str(work / f"home-{name}-{label}"),
                                        str(file), *sets], env=run_env, capture_output=True, text=True,
                                       timeout=min(left - 5, 240))
                    rec.update(status="ok" if p.returncode == 0 else f"exit {p.returncode}",
                               stderr_tail=p.stderr[-800:] if p.returncode else "")
                    if p.returncode == 0:
                        rec.update(json.loads(p.stdout.strip().splitlines()[-1]), file=file.name)
                except subprocess.TimeoutExpired:
                    rec["status"] = "timeout"
                rec["wall_s"] = round(time.monotonic() - t0, 1)
                print(json.dumps(rec)[:400], flush=True)
                index.append(rec)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (out / "index.json").write_text(json.dumps({"dry_run": args.cpu, "cases": index}, indent=1))
    bad = [r for r in index if r.get("status") != "ok"]
    return 1 if bad and not args.cpu else 0


if __name__ == "__main__":
    sys.exit(main())
