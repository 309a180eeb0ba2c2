"""env: the software stack of this machine, to paste into a GPU order or a bug report.

``collect_env()`` is a plain dict (the ``--json`` form, and what ``sheet --target-env`` reads back);
``env_lines(env)`` is the human form. Nothing here needs a GPU: without CUDA the report says so.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from pilotrun.verdicts import StageResult

PACKAGES = ("pilotrun", "transformers", "peft", "safetensors", "accelerate", "tokenizers", "datasets", "numpy",
            "pydantic", "lightning", "pytorch_lightning", "tensorboard", "flash_attn", "bitsandbytes", "deepspeed")
ENV_KEYS = ("python", "platform", "torch", "cuda", "devices", "bf16", "attention", "packages", "distributed")


def _version(name: str) -> str | None:
    for candidate in (name, name.replace("_", "-")):
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    return None


def _safe(fn, default=None):
    """A probe of an optional torch feature: an old torch lacks the function, a broken driver raises."""
    try:
        return fn()
    except Exception:  # noqa: BLE001 - any failure means "not available here", reported as such
        return default


def _devices(torch) -> list[dict]:
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        major, minor = props.major, props.minor
        out.append({"index": i, "name": props.name, "memory_bytes": int(props.total_memory),
                    "compute_capability": f"{major}.{minor}", "multiprocessors": props.multi_processor_count,
                    # bf16 tensor cores start at Ampere (compute capability 8.0)
                    "bf16": major >= 8})
    return out


def collect_env() -> dict:
    import torch
    import torch.distributed as dist

    cuda_ok = bool(_safe(torch.cuda.is_available, False))
    cuda = {"available": cuda_ok, "device_count": torch.cuda.device_count() if cuda_ok else 0,
            "built_with": torch.version.cuda, "hip": getattr(torch.version, "hip", None)}
    if not cuda_ok:
        cuda["reason"] = ("no CUDA: this torch was built without CUDA" if torch.version.cuda is None
                          else "no CUDA: torch has CUDA support but finds no usable device or driver")
    devices = _devices(torch) if cuda_ok else []
    cudnn = _safe(torch.backends.cudnn.version) if cuda_ok or torch.version.cuda else None
    nccl = _safe(lambda: ".".join(map(str, torch.cuda.nccl.version()))) if cuda_ok else None
    backends_cuda = torch.backends.cuda
    attention = {
        "sdpa": hasattr(torch.nn.functional, "scaled_dot_product_attention"),
        "flash_sdp_kernel": bool(cuda_ok and _safe(backends_cuda.is_flash_attention_available, False)),
        "flash_sdp_enabled": bool(cuda_ok and _safe(backends_cuda.flash_sdp_enabled, False)),
        "mem_efficient_sdp_enabled": bool(cuda_ok and _safe(backends_cuda.mem_efficient_sdp_enabled, False)),
        "cudnn_sdp_enabled": bool(cuda_ok and _safe(backends_cuda.cudnn_sdp_enabled, False)),
        "flash_attn_package": _version("flash_attn"),
    }
    avail = dist.is_available()
    return {
        "host": _host(),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "cpu_capability": _safe(torch.backends.cpu.get_cpu_capability)},
        "torch": {"version": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn, "nccl": nccl,
                  "debug": bool(torch.version.debug)},
        "cuda": cuda,
        "devices": devices,
        "bf16": {"cuda": bool(_safe(torch.cuda.is_bf16_supported, False)) if cuda_ok else None,
                 "cpu": True},  # torch's CPU autocast always offers bf16 (emulated where the CPU lacks it)
        "attention": attention,
        "packages": {name: _version(name) for name in PACKAGES},
        "distributed": {"available": avail, "gloo": avail and dist.is_gloo_available(),
                        "nccl": avail and dist.is_nccl_available(), "mpi": avail and dist.is_mpi_available()},
    }


def _host() -> dict:
    import os

    ram = _safe(lambda: os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    usable = _safe(lambda: len(os.sched_getaffinity(0)))
    return {"cpu_count": os.cpu_count(), "cpus_usable": usable, "ram_bytes": int(ram) if ram else None}


def env_markdown(env: dict) -> str:
    """The report as Markdown, to paste into an issue or a GPU order as it is."""
    t, c, h = env["torch"], env["cuda"], env.get("host") or {}
    rows = [("pilotrun", env["packages"].get("pilotrun") or "?"),
            ("Python", f"{env['python']['version']} ({env['python']['implementation']})"),
            ("OS", f"{env['platform']['system']} {env['platform']['release']} {env['platform']['machine']}"),
            ("CPUs", f"{h.get('cpu_count')}" + (f" ({h['cpus_usable']} usable)" if h.get("cpus_usable")
                                                 and h["cpus_usable"] != h.get("cpu_count") else "")),
            ("RAM", _gib(h["ram_bytes"]) if h.get("ram_bytes") else "unknown"),
            ("torch", t["version"]), ("CUDA", t["cuda"] or "none"), ("cuDNN", str(t["cudnn"] or "none")),
            ("NCCL", t["nccl"] or "none")]
    if not c["available"]:
        rows.append(("GPU", c.get("reason") or "no CUDA"))
    for d in env["devices"]:
        rows.append((f"cuda:{d['index']}", f"{d['name']}, {_gib(d['memory_bytes'])}, compute capability "
                                            f"{d['compute_capability']}, bf16 {'yes' if d['bf16'] else 'no'}"))
    a, dist = env["attention"], env["distributed"]
    rows.append(("attention", f"sdpa {'yes' if a['sdpa'] else 'no'}, flash kernel "
                              f"{'yes' if a['flash_sdp_kernel'] else 'no'}"))
    rows.append(("distributed", ", ".join(f"{k} {'yes' if dist[k] else 'no'}" for k in ("gloo", "nccl", "mpi"))))
    lines = ["## pilotrun env", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in rows]
    lines += ["", "| package | version |", "|---|---|"]
    lines += [f"| {k} | {v or 'not installed'} |" for k, v in env["packages"].items() if k != "pilotrun"]
    return "\n".join(lines) + "\n"


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB"


def env_lines(env: dict) -> list[str]:
    t, c = env["torch"], env["cuda"]
    lines = [f"python {env['python']['version']} ({env['python']['implementation']}) on "
             f"{env['platform']['system']} {env['platform']['release']} {env['platform']['machine']}",
             f"torch {t['version']}: CUDA {t['cuda'] or 'none'}, cuDNN {t['cudnn'] or 'none'}, "
             f"NCCL {t['nccl'] or 'none'}"]
    if not c["available"]:
        lines.append(c.get("reason") or "no CUDA")
    for d in env["devices"]:
        lines.append(f"cuda:{d['index']}: {d['name']}, {_gib(d['memory_bytes'])}, compute capability "
                     f"{d['compute_capability']}, {d['multiprocessors']} SMs, bf16 {'yes' if d['bf16'] else 'no'}")
    b = env["bf16"]
    lines.append(f"bf16: cuda {'n/a' if b['cuda'] is None else ('yes' if b['cuda'] else 'no')}, cpu autocast yes")
    a = env["attention"]
    lines.append(f"attention: sdpa {'yes' if a['sdpa'] else 'no'}, flash kernel "
                 f"{'yes' if a['flash_sdp_kernel'] else 'no'}, flash_attn package {a['flash_attn_package'] or 'none'}")
    lines.append("packages: " + ", ".join(f"{k} {v}" for k, v in env["packages"].items() if v) +
                 "; not installed: " + (", ".join(k for k, v in env["packages"].items() if not v) or "none"))
    d = env["distributed"]
    lines.append("distributed backends: " +
                 ", ".join(f"{k} {'yes' if d[k] else 'no'}" for k in ("gloo", "nccl", "mpi")))
    return lines


def env_stage() -> StageResult:
    env = collect_env()
    devs = env["devices"]
    summary = (f"torch {env['torch']['version']}, " +
               (f"{len(devs)} CUDA device(s): {', '.join(d['name'] for d in devs)}" if devs else "no CUDA"))
    return StageResult("env", "ok", summary, env_lines(env), env)
