"""pilotrun's CUDA paths on one real GPU, and the estimator against the real counters, in one bounded run.

    bash bench/gpu_check.sh            # on a CUDA machine: writes $OUT/{report.md,report.json,log.txt,...}
    bash bench/gpu_check.sh --cpu      # the dry run: every command, import and path, CUDA hidden

What it does, each step a subprocess with its own timeout, all under one deadline (``--budget``):
- lane "measure" (in order): nvidia-smi; ``pilotrun env --json``; the CUDA context and cuBLAS workspace
  (one process, before any other lane starts: mem_get_info is device-wide); the gpu-marked tests; then per
  campaign (the demo in fp32 and bf16-mixed; a 4-layer 512-wide Llama on 512-token sequences in fp32 and
  bf16-mixed; an 8-layer 1024-wide one on 1024 tokens) ``pilotrun pilot`` (the CUDA counters per phase) and
  ``pilotrun estimate --device cuda`` (the prediction), predicted ÷ measured per phase; ``pilotrun sheet``
  on the demo's CUDA pilot.
- lane "tests" (beside it): the default test selection of the files that run the pilot, estimate,
  probe, loop, resume and verify, on a machine where ``default_device()`` is CUDA (pytest-xdist).
- lane "all" (beside it): ``pilotrun all --quick`` on the demo (every stage on CUDA, resume and verify in
  fresh processes, export and reload).

The per-process counters (torch.cuda.memory_allocated/reserved) are not shared between processes, so the
lanes do not disturb each other's memory figures; only their times.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20

DEMO_MODEL = None  # filled from pilotrun.demo.synth at start

# Larger tiny Llamas (byte tokenizer, vocabulary 384), built from configs: the numbers are then not
# dominated by cuBLAS's workspace.
WIDE = {"model_type": "llama", "vocab_size": 384, "hidden_size": 512, "intermediate_size": 1376,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
        "max_position_embeddings": 1024, "tie_word_embeddings": False}
WIDER = {"model_type": "llama", "vocab_size": 384, "hidden_size": 1024, "intermediate_size": 2752,
         "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
         "max_position_embeddings": 2048, "tie_word_embeddings": False}


class Runner:
    def __init__(self, out: Path, work: Path, budget_s: float, env: dict):
        self.out, self.work, self.env = out, work, env
        self.deadline = time.monotonic() + budget_s
        self.steps: list[dict] = []
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def say(self, line: str) -> None:
        with self.lock:
            print(f"[{time.strftime('%H:%M:%S')}] {line}", flush=True)

    def step(self, name: str, cmd: list[str], timeout: float, cwd: Path | None = None, env: dict | None = None,
             keep: str | None = None) -> dict:
        """Run one command; its stdout parsed as JSON when it is (pilotrun's --json envelope)."""
        t = min(timeout, self.left() - 5)
        rec = {"name": name, "cmd": " ".join(a if len(a) < 200 else a[:60] + "…" for a in cmd), "timeout_s": round(t, 1)}
        if t < 10:
            rec.update(rc=None, status="skipped: out of time")
            self.say(f"SKIP {name}: out of time")
            with self.lock:
                self.steps.append(rec)
            return rec
        self.say(f"RUN  {name}: {rec['cmd']} (timeout {t:.0f} s)")
        t0 = time.monotonic()
        try:
            p = subprocess.run(cmd, cwd=cwd or self.work, env={**self.env, **(env or {})}, capture_output=True,
                               text=True, timeout=t, errors="replace")
            rc, so, se = p.returncode, p.stdout, p.stderr
            status = "ok" if rc == 0 else f"exit {rc}"
        except OSError as e:
            rc, status, so, se = None, f"not started: {e}", "", ""
        except subprocess.TimeoutExpired as e:
            rc, status = None, "timeout"
            so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            se = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        rec.update(rc=rc, status=status, wall_s=round(time.monotonic() - t0, 1))
        try:
            rec["json"] = json.loads(so)
        except (json.JSONDecodeError, TypeError):
            rec["stdout_tail"] = so[-4000:]
        rec["stderr_tail"] = se[-3000:]
        if keep:
            with open(self.out / keep, "a") as f:
                f.write(f"===== {name}: {rec['cmd']}\n{so}\n----- stderr\n{se}\n")
        self.say(f"DONE {name}: {status} in {rec['wall_s']} s")
        if status != "ok":
            self.say(f"     stderr tail: {se[-1500:]}")
        with self.lock:
            self.steps.append(rec)
        return rec


def write_jsonl(path: Path, records) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def long_records(n: int, chars: int, seed: int) -> list[dict]:
    """Instruction/response records of about ``chars`` bytes (the byte tokenizer: one token per byte)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "kappa", "sigma", "omega", "theta", "lambda", "zeta"]

    def text(k):
        out = []
        while sum(len(w) + 1 for w in out) < k:
            out.append(rng.choice(words))
        return " ".join(out)

    return [{"instruction": text(rng.randint(chars // 3, chars // 2)), "output": text(rng.randint(chars // 3, chars // 2))}
            for _ in range(n)]


def campaign(name: str, model: dict, max_length: int, micro_batch: int, eval_batch: int) -> dict:
    return {
        "name": name, "seed": 0, "task": "causal-lm",
        "model": {"path": None, "config": model, "tokenizer": "byte", "dtype": "float32"},
        "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl",
                 "prompt": "Q: {instruction}\nA: ", "response": "output", "max_length": max_length},
        "train": {"micro_batch": micro_batch, "accumulation": 2, "precision": "fp32", "optimizer": "adamw",
                  "lr": 1.0e-3, "updates": 20, "eval_every": 10, "eval_batch": eval_batch, "save_every": None},
        "plan": {"seeds": [0]},
        "hardware": {"memory_per_gpu": "80GiB"},
    }


def write_campaign(folder: Path, c: dict, chars: int) -> Path:
    import yaml

    write_jsonl(folder / "data" / "train.jsonl", long_records(48, chars, 0))
    write_jsonl(folder / "data" / "validation.jsonl", long_records(16, chars, 1))
    path = folder / "campaign.yaml"
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def phase_table(pilot: dict | None, est: dict | None) -> list[dict]:
    """Per phase: measured (pilot rows, rank 0) and predicted (estimate rows) allocated/reserved, and their ratios."""
    if not pilot or not est:
        return []
    measured = {r["phase"]: r for r in (pilot.get("data") or {}).get("rows", []) if r.get("rank", 0) == 0}
    predicted = {r["phase"]: r for r in (est.get("data") or {}).get("phases", []) if r.get("rank", 0) == 0}
    out = []
    for ph, m in measured.items():
        p = predicted.get(ph, {})
        row = {"phase": ph, "verdict": m.get("verdict"), "counter": m.get("counter"), "device": m.get("device")}
        for k in ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved"):
            row[f"m_{k}"], row[f"p_{k}"] = m.get(k), p.get(k)
        for k in ("peak_allocated", "peak_reserved"):
            mv, pv = m.get(k), p.get(k)
            row[f"ratio_{k}"] = round(pv / mv, 3) if (mv and pv is not None) else None
        mb, pb = m.get("baseline"), p.get("baseline")
        if None not in (mb, pb, m.get("peak_allocated"), p.get("peak_allocated")):
            md, pd = m["peak_allocated"] - mb, p["peak_allocated"] - pb
            row["m_rise"], row["p_rise"] = md, pd
            row["ratio_rise"] = round(pd / md, 3) if md > 0 else None
        out.append(row)
    return out


CONTEXT_SNIPPET = r"""
import json, time, torch
out = {"cuda": torch.cuda.is_available()}
if torch.cuda.is_available():
    d = torch.device("cuda", 0)
    p = torch.cuda.get_device_properties(d)
    out.update(name=p.name, total=p.total_memory, cc=f"{p.major}.{p.minor}", torch=torch.__version__,
               cuda_version=torch.version.cuda)
    free0, total = torch.cuda.mem_get_info(d)
    out["used_before_any_kernel"] = total - free0
    x = torch.ones(4096, 4096, device=d)
    torch.cuda.synchronize()
    a_before = torch.cuda.memory_allocated(d)
    for dt in (torch.float32, torch.bfloat16):
        y = x.to(dt)
        a0 = torch.cuda.memory_allocated(d)
        z = y @ y
        torch.cuda.synchronize()
        out[f"matmul_{str(dt).split('.')[-1]}_extra_allocated"] = torch.cuda.memory_allocated(d) - a0 - z.numel() * z.element_size()
        del y, z
    # a backward pass runs on autograd's device thread: its own cuBLAS handle and workspace
    w = torch.randn(1024, 1024, device=d, requires_grad=True)
    a0 = torch.cuda.memory_allocated(d)
    (x[:1024, :1024] @ w).sum().backward()
    torch.cuda.synchronize()
    out["backward_extra_allocated"] = torch.cuda.memory_allocated(d) - a0 - w.grad.numel() * 4
    free1, _ = torch.cuda.mem_get_info(d)
    out["reserved"] = torch.cuda.memory_reserved(d)
    out["allocated"] = torch.cuda.memory_allocated(d)
    out["context_bytes"] = (total - free1) - out["reserved"]
    out["cublas_workspace_config"] = __import__("os").environ.get("CUBLAS_WORKSPACE_CONFIG")
print(json.dumps(out))
"""


def lane_gpu_tests(r: Runner, py: str) -> None:
    r.step("gpu-tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rA", "--continue-on-collection-errors", "tests/"], 200,
           cwd=ROOT, keep="tests_gpu.txt")
    r.step("env-tests", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA", "tests/test_env.py"], 90,
           cwd=ROOT, keep="tests_gpu.txt")


CONTEXT_AFTER_PILOT = r"""
import contextlib, json, sys, torch
from pilotrun.cli.main import run
with contextlib.redirect_stdout(sys.stderr):
    rc = run(["pilot", sys.argv[1], "--home", sys.argv[2]])
out = {"pilot_rc": rc, "cuda": torch.cuda.is_available()}
if torch.cuda.is_available():
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out.update(used=total - free, reserved=torch.cuda.memory_reserved(), allocated=torch.cuda.memory_allocated())
    out["context_bytes"] = out["used"] - out["reserved"]
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    out["context_bytes_after_empty_cache"] = (total - free) - torch.cuda.memory_reserved()
print(json.dumps(out))
"""


def lane_measure(r: Runner, py: str, cpu: bool, base: Path) -> dict:
    res: dict = {"campaigns": {}}
    lane_gpu_tests(r, py)
    cases = [("demo-fp32", base / "demo", []), ("demo-bf16", base / "demo", ["--set", "train.precision=bf16-mixed"]),
             ("wide512-fp32", base / "wide", []), ("wide512-bf16", base / "wide", ["--set", "train.precision=bf16-mixed"]),
             ("wider1024-bf16", base / "wider", ["--set", "train.precision=bf16-mixed"])]
    for name, folder, sets in cases:
        home = base / f"home-{name}"
        c = str(folder / "campaign.yaml")
        pilot = r.step(f"pilot {name}", [py, "-m", "pilotrun", "pilot", c, "--home", str(home), "--json", *sets], 150)
        est = r.step(f"estimate {name}", [py, "-m", "pilotrun", "estimate", c, "--device", "cuda", "--home", str(home),
                                          "--json", *sets], 150)
        res["campaigns"][name] = {"pilot_status": pilot["status"], "estimate_status": est["status"],
                                  "table": phase_table(pilot.get("json"), est.get("json"))}
        r.say(f"TABLE {name}: " + json.dumps([{k: v for k, v in row.items() if k.startswith("ratio") or k == "phase"}
                                              for row in res["campaigns"][name]["table"]]))
    # the sheet from the demo's CUDA pilot (measured rows: gpu_memory.gpu_rows' "measured" branch)
    c, home = str(base / "demo" / "campaign.yaml"), base / "home-demo-fp32"
    sheet = r.step("sheet demo-fp32", [py, "-m", "pilotrun", "sheet", c, "--home", str(home), "--json",
                                       "--out", str(base / "demo-sheet.md")], 120)
    res["sheet_status"] = sheet["status"]
    if (base / "demo-sheet.md").exists():
        (r.out / "demo_sheet.md").write_text((base / "demo-sheet.md").read_text())
    return res


def lane_tests(r: Runner, py: str, cpu: bool) -> None:
    files = ["tests/test_probe.py", "tests/test_pilot.py", "tests/test_estimate.py", "tests/test_loop.py",
             "tests/test_resume.py", "tests/test_verify.py", "tests/test_memory_bound.py", "tests/test_state.py",
             "tests/test_golden.py", "tests/test_fit.py", "tests/test_demo.py", "tests/test_exact_counter.py",
             "tests/test_sheet.py", "tests/test_architectures.py", "tests/test_fresh.py"]
    xdist = [] if cpu else ["-n", "6"]
    sel = ["--co"] if cpu else []
    r.step("tests-on-cuda", [py, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-rfE", "--timeout", "150",
                             *xdist, *sel, "--junitxml", str(r.out / "tests_cuda.xml"), *files], 330,
           cwd=ROOT, keep="tests_cuda.txt")


def lane_all(r: Runner, py: str, cpu: bool, base: Path) -> None:
    c = str(base / "demo-all" / "campaign.yaml")
    r.step("all demo --quick", [py, "-m", "pilotrun", "all", c, "--quick", "--home", str(base / "home-all"), "--json"],
           300, keep="all_demo.txt")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu", action="store_true", help="dry run: hide CUDA, small budgets, tests only collected")
    ap.add_argument("--budget", type=float, default=400.0, help="seconds for the whole check")
    ap.add_argument("--only", default="measure,tests,all",
                    help="lanes: measure (gpu tests + pilot vs estimate), gpu (the gpu tests alone), tests, all, "
                         "context (the CUDA context after a whole pilot, before the lanes)")
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or ROOT / "gpu-check-out")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("GPU_CHECK_WORK", "/tmp/pilotrun-gpu-check"))
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("PILOTRUN_HOME", None)  # every command names its --home; the tests make their own
    env["PYTHONPATH"] = os.pathsep.join(p for p in [env.get("PYTHONPATH", ""), str(ROOT / "src")] if p)
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
    py = sys.executable
    r = Runner(out, work, args.budget, env)
    report: dict = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu_dry_run": args.cpu,
                    "root": str(ROOT)}

    sys.path.insert(0, str(ROOT / "src"))
    from pilotrun.demo.synth import write_demo

    write_demo(work / "demo")
    write_demo(work / "demo-all")
    # the dry run (--cpu) shrinks the larger models: the same commands, at a size a CPU pilots in seconds
    small = dict(hidden_size=128, intermediate_size=344, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4)
    write_campaign(work / "wide", campaign("wide512", dict(WIDE, **small) if args.cpu else WIDE, 512, 8, 16),
                   200 if args.cpu else 1000)
    write_campaign(work / "wider", campaign("wider1024", dict(WIDER, **small) if args.cpu else WIDER, 1024, 4, 8),
                   300 if args.cpu else 2000)

    smi = r.step("nvidia-smi", ["nvidia-smi"], 20)
    report["nvidia_smi"] = smi.get("stdout_tail")
    envr = r.step("pilotrun env", [py, "-m", "pilotrun", "env", "--json"], 60)
    report["env"] = (envr.get("json") or {}).get("data")
    ctx = r.step("context+workspace", [py, "-c", CONTEXT_SNIPPET], 60)
    report["context"] = ctx.get("json")
    lanes = [x.strip() for x in args.only.split(",")]
    if "context" in lanes:  # the context once a whole pilot's kernels are loaded (alone on the device)
        c = str(work / "wide" / "campaign.yaml")
        after = r.step("context after a pilot", [py, "-c", CONTEXT_AFTER_PILOT, c, str(work / "home-context")], 120)
        report["context_after_pilot"] = after.get("json")

    def guarded(fn):
        def inner():
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a lane's bug is reported, the other lanes go on
                import traceback

                r.say(f"LANE FAILED: {e!r}\n{traceback.format_exc()}")
                results.setdefault("lane_errors", []).append(repr(e))
        return inner

    results: dict = {}
    threads = []
    if "gpu" in lanes:
        threads.append(threading.Thread(target=guarded(lambda: lane_gpu_tests(r, py))))
    if "measure" in lanes:
        threads.append(threading.Thread(target=guarded(lambda: results.update(measure=lane_measure(r, py, args.cpu, work)))))
    if "tests" in lanes:
        threads.append(threading.Thread(target=guarded(lambda: lane_tests(r, py, args.cpu))))
    if "all" in lanes:
        threads.append(threading.Thread(target=guarded(lambda: lane_all(r, py, args.cpu, work))))
    for t in threads:
        t.start()
        time.sleep(1)
    for t in threads:
        t.join()
    report["measure"] = results.get("measure")
    report["lane_errors"] = results.get("lane_errors")
    report["steps"] = r.steps
    report["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(render(report))
    print(render(report))
    return 0


def _mib(v) -> str:
    return "—" if v is None else f"{v / MiB:.1f}"


def render(report: dict) -> str:
    lines = ["# pilotrun on a GPU: the check's report", ""]
    ctx = report.get("context") or {}
    if ctx.get("cuda"):
        lines += [f"{ctx.get('name')} (cc {ctx.get('cc')}), torch {ctx.get('torch')} CUDA {ctx.get('cuda_version')}: "
                  f"context {_mib(ctx.get('context_bytes'))} MiB (device used − torch reserved after kernels), "
                  f"matmul extra allocated fp32 {_mib(ctx.get('matmul_float32_extra_allocated'))} MiB, bf16 "
                  f"{_mib(ctx.get('matmul_bfloat16_extra_allocated'))} MiB, backward extra "
                  f"{_mib(ctx.get('backward_extra_allocated'))} MiB", ""]
    after = report.get("context_after_pilot") or {}
    if after.get("cuda"):
        lines += [f"after a whole pilot (wide512, in-process): context {_mib(after.get('context_bytes'))} MiB, "
                  f"{_mib(after.get('context_bytes_after_empty_cache'))} MiB after empty_cache "
                  f"(device used − torch reserved)", ""]
    lines += ["## Steps", "", "| step | status | wall s |", "| --- | --- | --- |"]
    for s in report.get("steps", []):
        lines.append(f"| {s['name']} | {s['status']} | {s.get('wall_s', '—')} |")
    m = report.get("measure") or {}
    for name, c in (m.get("campaigns") or {}).items():
        lines += ["", f"## {name} (pilot {c['pilot_status']}, estimate {c['estimate_status']})", "",
                  "| phase | verdict | measured alloc MiB | predicted alloc MiB | pred÷meas alloc | measured reserved MiB "
                  "| predicted reserved MiB | pred÷meas reserved | rise meas MiB | rise pred MiB | pred÷meas rise |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for row in c["table"]:
            lines.append(f"| {row['phase']} | {row['verdict']} | {_mib(row['m_peak_allocated'])} | "
                         f"{_mib(row['p_peak_allocated'])} | {row['ratio_peak_allocated']} | {_mib(row['m_peak_reserved'])} | "
                         f"{_mib(row['p_peak_reserved'])} | {row['ratio_peak_reserved']} | {_mib(row.get('m_rise'))} | "
                         f"{_mib(row.get('p_rise'))} | {row.get('ratio_rise')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
