"""The software stack a campaign needs, and whether a target machine (its ``pilotrun env --json``) has it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pilotrun.errors import BadInput, utf8_of
from pilotrun import jsonsafe

TORCH_FLOOR = "2.4"  # pilotrun's own floor (pyproject.toml dependencies)
BF16_MIN_CC = 8.0  # bf16 tensor cores start at Ampere


def version_tuple(v: str | None) -> tuple[int, ...]:
    if not v:
        return ()
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def needs_bf16(c: dict) -> bool:
    return c["train"]["precision"] in ("bf16-mixed", "bf16-true") or c["model"]["dtype"] == "bfloat16"


def required_stack(c: dict, piloted: dict) -> dict:
    """``c``: the resolved campaign dict; ``piloted``: package versions the pilot ran with (its run row)."""
    t = c["train"]
    packages = ["transformers", "safetensors"] + (["peft"] if c["model"].get("adapter") else [])
    torch_v = piloted.get("torch")
    mm = ".".join(map(str, version_tuple(torch_v)[:2]))
    return {
        "torch": {"min": TORCH_FLOOR, "piloted": torch_v,
                  "range": f">={TORCH_FLOOR}" + (f" (piloted with {torch_v}; {mm}.* is the tested series)"
                                                 if torch_v else "")},
        "cuda": True,
        "bf16": needs_bf16(c),
        "compute_capability_min": BF16_MIN_CC if needs_bf16(c) else None,
        "gpus_per_run": t["nproc"] if t["strategy"] in ("ddp", "fsdp") else 1,
        "nccl": t["strategy"] in ("ddp", "fsdp") and t["nproc"] > 1,
        "packages": {p: piloted.get(p) for p in packages},
    }


def read_target_env(path: str | Path) -> dict:
    """A target's ``pilotrun env --json`` output (the whole result, or just its ``data``)."""
    p = Path(path)
    if not p.is_file():
        raise BadInput("target env file not found", where=str(p),
                       fix="on the target machine run `pilotrun env --json > target-env.json` and pass that file")
    try:
        doc = jsonsafe.loads(utf8_of(p.read_bytes(), p))
    except json.JSONDecodeError as e:
        raise BadInput(f"not JSON: {e}", where=str(p), fix="pass the output of `pilotrun env --json`") from None
    env = doc.get("data", doc) if isinstance(doc, dict) else None
    missing = [k for k in ("torch", "cuda", "devices", "bf16", "packages", "distributed")
               if not isinstance(env, dict) or k not in env]
    if missing:
        raise BadInput(f"not a `pilotrun env --json` output: missing {', '.join(missing)}", where=str(p),
                       fix="on the target machine run `pilotrun env --json > target-env.json`")
    wrong = _env_shape(env)
    if wrong:
        raise BadInput(f"not a `pilotrun env --json` output: {wrong}", where=str(p),
                       fix="on the target machine run `pilotrun env --json > target-env.json` again, and pass that "
                           "file as it is written")
    return env


def _env_shape(env: dict) -> str | None:
    """What of a target env is not as ``pilotrun env --json`` writes it, in the keys the sheet reads (a file edited
    by hand: a memory of "80GB" was a TypeError, exit 3, and a negative one failed every phase), else None."""
    def integer(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    for key in ("torch", "cuda", "bf16", "packages", "distributed"):
        if not isinstance(env[key], dict):
            return f"{key} is {type(env[key]).__name__}, not an object"
    if not isinstance(env["torch"].get("version"), str):
        return f"torch.version is {env['torch'].get('version')!r}, not a version string"
    if not isinstance(env["devices"], list):
        return f"devices is {type(env['devices']).__name__}, not a list"
    for i, d in enumerate(env["devices"]):
        if not isinstance(d, dict):
            return f"devices[{i}] is {type(d).__name__}, not an object"
        if not isinstance(d.get("name"), str):
            return f"devices[{i}].name is {d.get('name')!r}, not a GPU's name"
        if not integer(d.get("memory_bytes")) or d["memory_bytes"] <= 0:
            return f"devices[{i}].memory_bytes is {d.get('memory_bytes')!r}, not a positive number of bytes"
        if d.get("compute_capability") is not None and not isinstance(d["compute_capability"], str):
            return f"devices[{i}].compute_capability is {d['compute_capability']!r}, not a string such as \"9.0\""
    if any(not isinstance(v, (str, type(None))) for v in env["packages"].values()):
        return "packages maps a name to something other than a version string"
    return None


def check_stack(req: dict, env: dict, need_bytes: int | None, gpu=None) -> list[dict]:
    """One row per requirement: check, needed, found, verdict (ok | warn | fail), message.
    ``gpu``: the catalogue GPU of the target, when known (an AMD one needs a ROCm build of torch)."""
    rows = []

    def add(check, needed, found, verdict, message=""):
        rows.append({"check": check, "needed": needed, "found": found, "verdict": verdict, "message": message})

    tv = env["torch"].get("version")
    if version_tuple(tv) < version_tuple(req["torch"]["min"]):
        add("torch", req["torch"]["range"], tv, "fail", f"torch {tv} is older than pilotrun's floor {TORCH_FLOOR}")
    elif req["torch"]["piloted"] and version_tuple(tv)[:2] != version_tuple(req["torch"]["piloted"])[:2]:
        add("torch", req["torch"]["range"], tv, "warn",
            f"torch {tv} is not the series the pilot ran with ({req['torch']['piloted']}); rerun the pilot there")
    else:
        add("torch", req["torch"]["range"], tv, "ok")
    devices = env.get("devices") or []
    cuda = env["cuda"].get("available")
    add("cuda", "a CUDA device", f"{len(devices)} device(s)" if cuda else "no CUDA", "ok" if cuda else "fail",
        "" if cuda else "the target has no usable CUDA device (`pilotrun env` there says why)")
    if gpu is not None and gpu.vendor == "amd":
        hip = env["cuda"].get("hip")
        add("rocm", "a ROCm build of torch (torch.version.hip)", hip or "none", "ok" if hip else "fail",
            "" if hip else f"the {gpu.name} runs torch through ROCm: install torch from the ROCm wheel index "
                           "(pip install torch --index-url https://download.pytorch.org/whl/rocm6.4)")
    n = req["gpus_per_run"]
    add("gpus", f">= {n} per run", str(len(devices)), "ok" if len(devices) >= n else "fail",
        "" if len(devices) >= n else f"train.nproc={n} needs {n} GPUs on one machine")
    if req["bf16"]:
        bad = [d for d in devices[:max(1, n)] if not d.get("bf16")]
        ok = bool(cuda and devices and not bad and env["bf16"].get("cuda"))
        found = ", ".join(f"{d['name']} (compute capability {d['compute_capability']})" for d in devices) or "none"
        add("bf16", f"compute capability >= {BF16_MIN_CC}", found, "ok" if ok else "fail",
            "" if ok else "the campaign uses bf16 (train.precision or model.dtype) and the target has no bf16 "
                          "support; choose a GPU of compute capability >= 8.0 (A10, L4, A100, H100 ...), or "
                          "set train.precision: fp16-mixed and rerun the pilot")
    if need_bytes is not None:
        small = [d for d in devices[:max(1, n)] if d.get("memory_bytes", 0) < need_bytes]
        ok = bool(devices) and not small
        found = ", ".join(f"{d['memory_bytes'] / 2**30:.1f} GiB" for d in devices) or "none"
        add("memory", f">= {need_bytes / 2**30:.1f} GiB per GPU", found, "ok" if ok else "fail",
            "" if ok else "the target GPU holds less than the measured peak plus the margin")
    if req["nccl"]:
        ok = bool(env["distributed"].get("nccl"))
        add("nccl", "available", str(ok), "ok" if ok else "fail",
            "" if ok else f"train.strategy={'ddp/fsdp'} on CUDA needs NCCL; install a CUDA build of torch")
    for name, piloted in req["packages"].items():
        found = (env.get("packages") or {}).get(name)
        if not found:
            add(name, piloted or "installed", "missing", "fail", f"pip install {name}" +
                (f"=={piloted}" if piloted else ""))
        elif piloted and version_tuple(found)[:2] != version_tuple(piloted)[:2]:
            add(name, piloted, found, "warn", f"{name} {found} differs from the piloted {piloted}")
        else:
            add(name, piloted or "installed", found, "ok")
    return rows
