"""Launch files for the chosen GPU and plan, written next to sheet.md.

- ``STEM.commands.sh``: the sweep's ``pilotrun train`` commands in the sheet's order (control first),
  the same lines the sweep's runs record (rehearsal/training/sweep.py ``arm_command``), grouped by the lane the
  plan placed each run on; lanes run side by side, each on its own GPUs.
- ``STEM.sky.yaml``: a SkyPilot task: resources (accelerator:count), setup installing the stack the
  sheet checked, run starting the sweep.
- ``STEM.sbatch``: a SLURM batch script: ``--gres=gpu:TYPE:COUNT``, ``--time`` from the plan.
Commands run from the campaign's folder with the campaign's file name.
"""

from __future__ import annotations

import shlex
from pathlib import Path


def sweep_commands(loaded, sets: tuple[str, ...] = ()) -> list[dict]:
    """The sweep's runs in the sheet's order (seeds outer, control then variants), each with its command."""
    from pilotrun.campaign.arms import plan_arms
    from pilotrun.rehearsal.training.sweep_runs import arm_command

    arms = plan_arms(loaded)
    out = []
    for seed in loaded.campaign.plan.seeds or [0]:
        for i, arm in enumerate(arms):
            label = ("control" if i == 0 else f"variant {i}") + f" seed {seed}"
            out.append({"label": label, "command": arm_command(Path(loaded.source).name, arm, seed, sets)})
    return out


def lanes_of(plan: dict | None, labels: list[str], lanes: int) -> tuple[list[list[str]], list[str]]:
    """Labels per lane in the plan's placement; the runs the plan could not place, apart."""
    if plan is None:
        return [labels], []
    out: list[list[str]] = [[] for _ in range(max(1, lanes))]
    for p in sorted(plan["placed"], key=lambda p: p["start_s"]):
        out[p["lane"]].append(p["label"])
    return out, list(plan["not_fitting"])


def _body(runs: list[dict], plan: dict | None, lanes: int, gpus_per_run: int, campaign_dir: str) -> list[str]:
    by_label = {r["label"]: r["command"] for r in runs}
    groups, left = lanes_of(plan, [r["label"] for r in runs], lanes)
    lines = ["set -u", f'cd "${{PILOTRUN_CAMPAIGN_DIR:-{campaign_dir}}}"', "failed=0"]
    parallel = sum(1 for g in groups if g) > 1
    for k, group in enumerate(groups):
        if not group:
            continue
        gpu_ids = ",".join(str(k * gpus_per_run + j) for j in range(gpus_per_run))
        lines.append(f"# lane {k + 1}" + (f": GPU(s) {gpu_ids}" if parallel else ""))
        cmds = [f"# {lab}\n{by_label[lab]} || failed=1" if not parallel else f"  {by_label[lab]} || exit 1"
                for lab in group]
        if parallel:
            lines += [f"(export CUDA_VISIBLE_DEVICES={gpu_ids}", *cmds, ") || failed=1 &"]
        else:
            lines += cmds
    if parallel:
        lines.append("wait")
    for lab in left:
        lines.append(f"# not placed by the plan (does not fit its time): {lab}\n# {by_label[lab]}")
    lines.append('exit "$failed"')
    return lines


def commands_script(s: dict, launch: dict) -> str:
    head = ["#!/usr/bin/env bash",
            f"# The sweep of campaign {s['campaign']} on {launch['gpu_name']} × {launch['gpus']}, "
            f"{launch['days']}-day plan: {len(launch['runs'])} runs, control first.",
            "# Each line is the `pilotrun train` command the sweep's run records; run from the campaign's folder."]
    return "\n".join(head + launch["body"]) + "\n"


def sky_task(s: dict, launch: dict) -> dict:
    return {"name": f"pilotrun-{_slug(s['campaign'])}",
            "resources": {"accelerators": f"{launch['sky']}:{launch['gpus']}"},
            "workdir": launch["campaign_dir"],
            "setup": "\n".join(launch["setup"]) + "\n",
            "run": "\n".join(["export PILOTRUN_CAMPAIGN_DIR=.", *launch["body"]]) + "\n"}


def sbatch_script(s: dict, launch: dict) -> str:
    days = launch["days"]
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=pilotrun-{_slug(s['campaign'])}",
             f"#SBATCH --gres=gpu:{launch['gres']}:{launch['gpus']}",
             f"#SBATCH --time={days}-00:00:00",
             "#SBATCH --nodes=1",
             "#SBATCH --ntasks=1",
             f"#SBATCH --cpus-per-task={8 * launch['gpus']}",
             "#SBATCH --output=pilotrun-%j.out",
             f"# GPU type '{launch['gres']}' is the usual GRES name of the {launch['gpu_name']}; sites name "
             "their own (`sinfo -o %G`).",
             f"# Time limit: the {days}-day plan. The stack the sheet checked:",
             *[f"#   {line}" for line in launch["setup"]],
             *launch["body"]]
    return "\n".join(lines) + "\n"


def setup_lines(s: dict, gpu) -> list[str]:
    req = s["stack"]["required"]
    pins = [f"{k}=={v}" if v else k for k, v in req["packages"].items()]
    torch = f"torch{req['torch']['range'].split(' ')[0]}"
    if gpu is not None and gpu.vendor == "amd":
        torch_line = f"pip install '{torch}' --index-url https://download.pytorch.org/whl/rocm6.4  # a ROCm build"
    else:
        torch_line = f"pip install '{torch}'"
    return [torch_line, "pip install " + " ".join(shlex.quote(p) for p in pins + ["pilotrun"])]


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name.lower()) or "campaign"


def write_launch(s: dict, loaded, out: Path, launch: dict) -> list[Path]:
    """The three files next to ``out`` (sheet.md), each written atomically; returns their paths."""
    import yaml

    from pilotrun.journal.files import atomic_write_text

    stem = out.with_suffix("")
    class Dumper(yaml.SafeDumper):
        pass

    def text_block(dumper, v):  # multi-line setup/run as YAML literal blocks, as SkyPilot's examples write them
        return dumper.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)

    Dumper.add_representer(str, text_block)
    files = {Path(f"{stem}.commands.sh"): commands_script(s, launch),
             Path(f"{stem}.sky.yaml"): yaml.dump(sky_task(s, launch), Dumper=Dumper, sort_keys=False, width=100),
             Path(f"{stem}.sbatch"): sbatch_script(s, launch)}
    for path, text in files.items():
        atomic_write_text(path, text)
    return list(files)


def launch_plan(s: dict, loaded, gpu, plan: dict | None, sets: tuple[str, ...] = ()) -> dict:
    """What the files need: GPU, count, plan, the commands and their lanes."""
    runs = sweep_commands(loaded, sets)
    tm = s.get("time") or {}
    ranks = s["settings"]["ranks"]
    gpus = s["hardware"]["gpus"]
    campaign_dir = str(Path(loaded.source).resolve().parent)
    return {"gpu": gpu.key if gpu else None, "gpu_name": gpu.name if gpu else "a GPU",
            "sky": (gpu.sky or gpu.key) if gpu else "GPU", "gres": gpu.slurm_gres if gpu else "gpu",
            "gpus": gpus, "days": plan["days"] if plan else max(s["hardware"]["rental_days"]),
            "runs": runs, "campaign_dir": campaign_dir, "setup": setup_lines(s, gpu),
            "body": _body(runs, plan, tm.get("lanes", 1), ranks, campaign_dir)}
