"""Launch files for the chosen GPU and plan, written next to sheet.md; each runs as written and survives a
preemption.

- ``STEM.commands.sh``: the sweep on a machine at hand, ``pilotrun sweep --id ID`` (one process per lane
  the plan placed runs on, each on its own GPUs); the runs' own ``pilotrun train`` commands as comments.
- ``STEM.sky.yaml``: a SkyPilot managed job (``sky jobs launch``): resources, recovery, the home on the
  instance's disk mirrored to a bucket (``mirrored``; journal/mirror.py), every file the campaign reads
  uploaded, set-up installing the checked stack, the sweep.
- ``STEM.sbatch``: a SLURM batch script: ``--gres``, ``--time`` from the time plan, ``--signal=TERM@GRACE``,
  ``--requeue``; the home on the shared file system; the same sweep command on every start.
- ``pilotrun-VERSION-py3-none-any.whl`` beside them unless pilotrun comes from a pushed git revision.

The sweep's id is fixed in the files (``launch_sweep_id``: the campaign's name and its config
sha256): a requeued, recovered or rerun job runs the same command, which continues the sweep, skipping
the runs that finished. On several nodes each run spans them all through ``torchrun`` (c10d rendezvous on
the first node).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from pilotrun.campaign.arms import plan_arms
from pilotrun.campaign.load import parse_set
from pilotrun.campaign.sweep_runs import arm_command, launch_sweep_id, slug
from pilotrun.errors import BadInput
from pilotrun.journal.files import atomic_write_text, refuse_replacing
from pilotrun.sheet.catalogue import BY_KEY
from pilotrun.sheet.options import OPTIONS
from pilotrun.sheet.options_view import pick
from pilotrun.sheet.plan import fmt_duration
from pilotrun.sheet.shell import comment, default, export, under_home, word, words
from pilotrun.sheet.ship import build_wheel, campaign_inputs, pilotrun_source, pins, remote_path
from pilotrun.tasks.hub import fetch_command, split_id

TIME_MARGIN = 0.5  # the time plan is an estimate: half again on the campaign's time
GRACE_S = 120  # SIGTERM this long before the limit: the current update and a checkpoint (SLURM --signal)
STARTUP_S = 60  # python start-up, the journal, reading the data: once per job start
SETUP_S = 900  # the job's first start creates a venv and installs torch, transformers, peft: ~15 min on a rental
SETUP_ENV = "PILOTRUN_SETUP_S"  # the set-up's seconds where the site knows better (a prebuilt venv: 0)
PORT = 29500  # torchrun's rendezvous port on the first node
SKY_HOME = "/pilotrun-home"  # the bucket mount the home is copied to (journal/mirror.py: not where SQLite runs)
LOCAL_HOME = "pilotrun-local"  # below $HOME: the home on the instance's own disk, where the journal is written
MIRROR_S = 120  # seconds between the copies of the home to the bucket while the sweep runs


def sweep_commands(loaded, sets: tuple[str, ...] = ()) -> list[dict]:
    """The sweep's runs in the sheet's order (seeds outer, control then variants), each with its command."""
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


def setup_seconds() -> float:
    """The set-up's seconds in the time limit: ``PILOTRUN_SETUP_S`` when set, else SETUP_S (a stated default)."""
    raw = os.environ.get(SETUP_ENV)
    if raw is None or not raw.strip():
        return float(SETUP_S)
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value < 0:
        raise BadInput(f"{SETUP_ENV}={raw!r} is not a number of seconds", where=SETUP_ENV,
                       fix=f"set it to the seconds the job's set-up takes (0 for a prebuilt venv), or unset it for "
                           f"the default {SETUP_S} s")
    return value


def time_limit(campaign_s: float | None, reserve: float, days: int,
               what: str = "the time plan's campaign time", restart_s: float | None = None) -> tuple[int, str]:
    """The scheduler's limit in seconds (whole minutes) and how: the job's set-up (its first start installs the
    stack: ``setup_seconds``), its start-up, the time plan's campaign time × (1 + margin + the rental's reserve
    share), one requeue's restart (``restart_s``: start-up, the model's load and the work since the last
    checkpoint, done again) and the SIGTERM grace; the tier's length when there is no plan."""
    if campaign_s is None or not math.isfinite(campaign_s):
        return days * 86400, f"the {days}-day plan (no campaign time in the time plan)"
    setup = setup_seconds()
    restart = STARTUP_S if restart_s is None else restart_s
    s = setup + STARTUP_S + campaign_s * (1 + TIME_MARGIN + reserve) + restart + GRACE_S
    limit = int(math.ceil(s / 60) * 60)
    said = f"{SETUP_ENV}=SECONDS sets it" if os.environ.get(SETUP_ENV, "").strip() == "" else f"from {SETUP_ENV}"
    return limit, (f"{fmt_duration(setup)} set-up (the first start's venv and stack; {said}) + "
                   f"{STARTUP_S} s start-up + {what} {fmt_duration(campaign_s)} × (1 + {TIME_MARGIN:g} margin + "
                   f"{reserve:g} reserve) + {fmt_duration(restart)} for a requeue's restart (start-up, load, the work "
                   f"since the last checkpoint) + {GRACE_S} s SIGTERM grace, in whole minutes")


def restart_seconds(s: dict, save_every: int | None) -> float | None:
    """What a requeued job does again before it is back where it stopped: the start-up, the model's load, and the
    updates since the run's last checkpoint (every ``save_every``; without one, a whole run), by the time plan's
    units. None without a time plan."""
    tm = s.get("time") or {}
    units = tm.get("units") or {}
    if not units.get("update"):
        return None
    per_run = tm.get("per_run_s") or 0.0
    lost = per_run if not save_every else min(per_run or math.inf, save_every * units["update"])
    return STARTUP_S + (units.get("load") or 0.0) + lost


def slurm_time(seconds: int) -> str:
    m = int(math.ceil(seconds / 60))
    return f"{m // 1440}-{m % 1440 // 60:02d}:{m % 60:02d}:00"


def _sweep_line(launch: dict, home: str, prefix: str = "pilotrun") -> str:
    """``home``: a shell expression (a variable the file set through ``shell.default``), never a value."""
    sets = "".join(f" --set {word(s)}" for s in launch["sets"])
    return f"{prefix} sweep {word(launch['campaign_file'])} --id {word(launch['sweep_id'])} --home {home}{sets}"


def _body(launch: dict, home: str, *, nodes_head: str | None = None, nnodes: str = "", node_rank: str = "",
          srun: str = "", pilotrun: str = "pilotrun") -> list[str]:
    """The job's commands: the sweep of the fixed id; lanes side by side on one node, or each run on all
    the nodes (torchrun, c10d rendezvous on ``nodes_head``)."""
    lines = ["set -u", default("PILOTRUN_CAMPAIGN_DIR", "PILOTRUN_CAMPAIGN_DIR", launch["campaign_dir"]),
             'cd "$PILOTRUN_CAMPAIGN_DIR" || exit 1']
    lines += [export(k, v) + "  # the allocator the sheet's memory figures were replayed with"
              for k, v in (launch.get("env") or {}).items()]
    if launch["nodes"] > 1:
        if nodes_head is None:  # by hand: the same script on each node, told the first node's address
            nodes_head = (f'"${{PILOTRUN_HEAD:?run this on each of the {launch["nodes"]} nodes with PILOTRUN_HEAD '
                          'set to the address of the first}"')
            nnodes = str(launch["nodes"])
        lines += [f"HEAD={nodes_head}",
                  f"{srun}torchrun --nnodes {nnodes} --nproc_per_node {launch['per_node']}{node_rank} "
                  f"--rdzv-backend c10d --rdzv-endpoint \"$HEAD:{PORT}\" --rdzv-id {word(launch['sweep_id'])} "
                  + _sweep_line(launch, home, "-m pilotrun")]
        return lines
    groups = [g for g in launch["lanes"] if g]
    if len(groups) <= 1:
        return lines + [f"{srun}{_sweep_line(launch, home, pilotrun)}"]
    lines.append("# one sweep process per lane; each claims the next run not yet taken (the same --id)")
    per = launch["ranks"]
    for k in range(len(groups)):
        ids = ",".join(str(k * per + j) for j in range(per))
        lines.append(f"CUDA_VISIBLE_DEVICES={ids} {srun}{_sweep_line(launch, home, pilotrun)} &")
    lines += ["failed=0", "for p in $(jobs -p); do wait \"$p\" || failed=1; done", 'exit "$failed"']
    return lines


def _inputs_comments(launch: dict, where: str) -> list[str]:
    out = []
    for f in launch["inputs"]:
        if f["kind"] == "hub":
            out.append(f"{f['key']} {f['written']}: a hub id, downloaded by the set-up (`hf download`)")
        elif f["kind"] == "installed":
            out.append(f"{f['key']} {f['written']}: an installed module ({f['local']}), not uploaded: install "
                       f"its package in the set-up")
        elif not f["inside"]:
            out.append(f"{f['key']} {f['local']}: outside the campaign folder; {where}")
    return [comment(x) for x in out]


def commands_script(s: dict, launch: dict) -> str:
    head = ["#!/usr/bin/env bash",
            "# " + comment(f"The sweep of campaign {s['campaign']} on {launch['gpu_name']} × {launch['gpus']}, "
                           f"{launch['days']}-day plan: {len(launch['runs'])} runs, control first."),
            "# " + comment(f"Sweep {launch['sweep_id']}: run this again after an interruption and it continues the "
                           "sweep (finished runs are skipped)."),
            "# Its runs, as each records its own command:",
            *[f"#   {comment(r['label'])}: {comment(r['command'])}" for r in launch["runs"]],
            *[f"# not placed by the plan (does not fit its time): {comment(lab)}" for lab in launch["not_placed"]],
            default("PILOTRUN_HOME", "PILOTRUN_HOME", launch["home"])]
    return "\n".join(head + _body(launch, '"$PILOTRUN_HOME"')) + "\n"


def setup_lines(launch: dict, wheel_ref: str | None) -> list[str]:
    """Installs the checked stack and pilotrun (the wheel's path on the machine, or the VCS requirement)."""
    torch_line = f"pip install {word(launch['torch'])}"
    if launch["rocm"]:
        torch_line += " --index-url https://download.pytorch.org/whl/rocm6.4  # a ROCm build"
    ref = wheel_ref if wheel_ref is not None else word(launch["pilotrun"]["requirement"])
    lines = [torch_line, "pip install " + " ".join([words(launch["packages"]), ref]).strip()]
    for f in launch["inputs"]:
        if f["kind"] == "hub":
            lines.append(hub_download(f["written"]))
    return lines


def hub_download(spec: str) -> str:
    """The set-up line for a hub id as the campaign writes it (``org/name`` or ``org/name@rev``): huggingface_hub's
    CLI takes the revision as ``--revision``, never in the id; the folder is the path as written, so the
    campaign file, unchanged, reads the local folder (a local folder wins over a hub id, tasks/hub.py)."""
    repo, rev = split_id(spec)
    return f"[ -d {word(spec)} ] || {fetch_command(repo, rev)} --local-dir {word(spec)}"


def sky_task(s: dict, launch: dict, wheel: Path | None) -> dict:
    mounts: dict = {SKY_HOME: {"name": launch["bucket"], "mode": "MOUNT_CACHED"}}
    wheel_ref = None
    if wheel is not None:
        mounts[f"~/pilotrun-wheel/{wheel.name}"] = str(wheel)
        wheel_ref = under_home(f"pilotrun-wheel/{wheel.name}")
    for f in launch["inputs"]:
        if f["kind"] in ("hub", "installed") or f["inside"]:
            continue

        dest = remote_path(f)
        if dest is not None:
            mounts[dest] = f["local"]
    resources = {"accelerators": f"{launch['sky']}:{launch['per_node']}",
                 "job_recovery": {"strategy": "FAILOVER", "max_restarts_on_errors": 3}}
    task = {"name": f"pilotrun-{slug(s['campaign'])}", "resources": resources}
    if launch["nodes"] > 1:
        task["num_nodes"] = launch["nodes"]
    body = _body(launch, '"$PILOTRUN_LOCAL_HOME"', nodes_head='$(echo "$SKYPILOT_NODE_IPS" | head -n1)',
                 nnodes='"$SKYPILOT_NUM_NODES"', node_rank=' --node_rank "$SKYPILOT_NODE_RANK"')
    task.update({"workdir": launch["campaign_dir"], "file_mounts": mounts,
                 "setup": "\n".join(setup_lines(launch, wheel_ref)) + "\n",
                 "run": "\n".join(["export PILOTRUN_CAMPAIGN_DIR=.", *mirrored(body)]) + "\n"})
    return task


def mirrored(body: list[str]) -> list[str]:
    """The job's commands with the home on this instance's disk: restored from the bucket first (a recovered
    job), copied to it every MIRROR_S seconds and once more at the end; the journal from the first node only
    (rank 0 writes it), every node's own files (its FSDP shards) from each. journal/mirror.py says why."""
    to_bucket = f'pilotrun _mirror-home "$PILOTRUN_LOCAL_HOME" {word(SKY_HOME)} "$JOURNAL"'
    return ["# SQLite's WAL and locks need a local file system, which a bucket mount is not: the journal lives on",
            f"# this instance's disk and is copied to the bucket ({SKY_HOME}) as a whole snapshot, with the run",
            f"# folders, every {MIRROR_S} s and at the end; a recovered job restores it from there first",
            f"export PILOTRUN_LOCAL_HOME={under_home(LOCAL_HOME)}",
            'JOURNAL=--journal; [ "${SKYPILOT_NODE_RANK:-0}" = 0 ] || JOURNAL=--no-journal',
            f'pilotrun _mirror-home {word(SKY_HOME)} "$PILOTRUN_LOCAL_HOME" --restore || exit 1',
            # the loop's own sleep goes with it (an orphaned sleep would hold the job's output open)
            f"( trap 'kill $s 2>/dev/null; exit 0' TERM; while :; do sleep {MIRROR_S} & s=$!; wait $s; {to_bucket}; "
            "done ) &",
            "MIRROR=$!",
            "(", *[f"  {x}" for x in body], ")",
            "rc=$?",
            'kill "$MIRROR"; wait "$MIRROR"',
            f"{to_bucket} || rc=1",
            'exit "$rc"']


def sky_header(s: dict, launch: dict) -> str:
    lines = ["# " + comment(f"SkyPilot managed job for campaign {s['campaign']}: `sky jobs launch "
                            f"{launch['stem']}.sky.yaml` (add --use-spot for spot)."),
             "# " + comment("A preempted or failed node is recovered (job_recovery) and the run command starts "
                            f"again: sweep {launch['sweep_id']}"),
             "# " + comment(f"continues from the home restored from the bucket {launch['bucket']} ({SKY_HOME}; "
                            "rename it if the name is taken)."),
             "# " + comment(f"Stack: {launch['pins_from']}; pilotrun: {launch['pilotrun']['why']}."),
             "# Uploaded: the workdir (the campaign folder), and in file_mounts the files outside it."]
    lines += [f"#   {x}" for x in _inputs_comments(launch, "mounted at the path the campaign file names")]
    lines += ["#   " + comment("not reachable from the workdir by the path the campaign file writes, not uploaded: "
                                f"{f['key']} {f['written']}") for f in launch["inputs"]
              if f["kind"] not in ("hub", "installed") and not f["inside"] and _remote(f) is None]
    return "\n".join(lines) + "\n"


def _remote(f):
    return remote_path(f)


def sbatch_script(s: dict, launch: dict, wheel: Path | None) -> str:
    n, g = launch["nodes"], launch["per_node"]
    wheel_ref = word(wheel) if wheel is not None else None
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name=pilotrun-{slug(s['campaign'])}",
             f"#SBATCH --nodes={n}",
             "#SBATCH --ntasks-per-node=1",
             f"#SBATCH --gres=gpu:{launch['gres']}:{g}",
             f"#SBATCH --cpus-per-task={8 * g}",
             f"#SBATCH --time={slurm_time(launch['time_limit_s'])}",
             f"#SBATCH --signal=TERM@{GRACE_S}",
             "#SBATCH --requeue",
             "#SBATCH --open-mode=append",
             "#SBATCH --output=pilotrun-%x-%j.out",
             f"# Time limit: {launch['time_how']}; the sheet's tier is the {launch['days']}-day plan.",
             "# " + comment(f"A requeued job (preemption, node failure) runs this script again: sweep "
                            f"{launch['sweep_id']} continues from the"),
             "# journal on the shared file system (PILOTRUN_HOME), skipping the runs that finished. SIGTERM comes "
             f"{GRACE_S} s before the limit.",
             f"# GPU type '{launch['gres']}' is the usual GRES name of the {launch['gpu_name']}; sites name "
             "their own (`sinfo -o %G`).",
             "# " + comment(f"Stack: {launch['pins_from']}; pilotrun: {launch['pilotrun']['why']}."),
             "# The files the campaign reads are read where they are: the campaign folder and these must be on "
             "the shared file system:",
             *[f"#   {x}" for x in _inputs_comments(launch, "it must be reachable at this path from the nodes")],
             default("VENV", "PILOTRUN_VENV", f"{launch['campaign_dir']}/.pilotrun/venv"),
             'if [ ! -x "$VENV/bin/pilotrun" ]; then  # once: a requeued job finds it',
             '  python3 -m venv "$VENV" && . "$VENV/bin/activate" || exit 1',
             *[f"  {x} || exit 1" for x in setup_lines(launch, wheel_ref)],
             "fi",
             '. "$VENV/bin/activate"']
    head = '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)'
    lines.append(default("PILOTRUN_HOME", "PILOTRUN_HOME", launch["home"]))
    lines += _body(launch, '"$PILOTRUN_HOME"', nodes_head=head, nnodes='"$SLURM_NNODES"', srun="srun --kill-on-bad-exit=1 ")
    return "\n".join(lines) + "\n"


# how each launch file begins (its suffix beside the sheet's stem → its first bytes): a file there that does not is
# not replaced (``refuse_launch_over``)
LAUNCH_HEADS = {".commands.sh": b"#!/usr/bin/env bash\n# The sweep of campaign ",
                ".sky.yaml": b"# SkyPilot managed job for campaign ",
                ".sbatch": b"#!/bin/bash\n#SBATCH --job-name=pilotrun-"}


def launch_files(out: Path) -> dict[str, Path]:
    """Each launch file's suffix → its path beside the sheet ``out`` (``sheet.md`` → ``sheet.commands.sh`` ...)."""
    stem = Path(out).with_suffix("")
    return {suffix: Path(f"{stem}{suffix}") for suffix in LAUNCH_HEADS}


def refuse_launch_over(out: Path, fix: str | None = None) -> None:
    """Exit 2 where a launch file's path beside ``out`` holds a file of the user's (their own ``train.sbatch`` beside
    ``--out train.md``), before anything is written."""
    for suffix, path in launch_files(out).items():
        head = LAUNCH_HEADS[suffix]
        refuse_replacing(path, "--out", lambda first, head=head: first.startswith(head), "launch file", fix)


def write_launch(s: dict, loaded, out: Path, launch: dict) -> list[Path]:
    """The three files next to ``out`` (sheet.md), each written atomically, and pilotrun's wheel when it
    ships as one; returns their paths."""
    import yaml

    paths = launch_files(out)
    launch["stem"] = out.with_suffix("").name
    out = out.resolve()  # the wheel's path in the files: absolute, wherever the job is submitted from
    wheel = build_wheel(launch["pilotrun"], out.parent) if launch["pilotrun"]["kind"] != "vcs" else None

    class Dumper(yaml.SafeDumper):
        pass

    def text_block(dumper, v):  # multi-line setup/run as YAML literal blocks, as SkyPilot's examples write them
        return dumper.represent_scalar("tag:yaml.org,2002:str", v, style="|" if "\n" in v else None)

    Dumper.add_representer(str, text_block)
    sky = sky_header(s, launch) + yaml.dump(sky_task(s, launch, wheel), Dumper=Dumper, sort_keys=False, width=100)
    texts = {".commands.sh": commands_script(s, launch), ".sky.yaml": sky, ".sbatch": sbatch_script(s, launch, wheel)}
    files = {path: texts[suffix] for suffix, path in paths.items()}
    for path, text in files.items():
        atomic_write_text(path, text)
    return list(files) + ([wheel] if wheel is not None else [])


def launch_plan(s: dict, loaded, gpu, plan: dict | None, sets: tuple[str, ...] = (), *, gpus: int | None = None,
                run_sets: tuple[str, ...] = (), campaign_s: float | None = None,
                time_from: str = "the time plan's campaign time") -> dict:
    """What the files need: GPU, count and nodes, plan, the sweep's id, runs and lanes, the time limit, the
    pinned stack, pilotrun's source, the campaign's inputs. ``gpus``/``run_sets``/``campaign_s``: an options
    row's GPUs, its ``--set`` items and time (the sheet without a pilot, ``options_launch``)."""
    sets = tuple(sets) + tuple(run_sets)
    runs = sweep_commands(loaded, sets)
    tm = s.get("time") or {}
    ranks = (s.get("settings") or {}).get("ranks", 1)
    gpus = gpus or s["hardware"]["gpus"]
    nodes = max(1, math.ceil(gpus / 8)) if gpus > 8 else 1
    groups, left = lanes_of(plan, [r["label"] for r in runs], tm.get("lanes", 1))
    days = plan["days"] if plan else max(s["hardware"]["rental_days"])
    if campaign_s is None and plan is not None:
        campaign_s = plan["used_s"]
    limit, how = time_limit(campaign_s, s["hardware"].get("reserve", 0.0), days, time_from,
                            restart_seconds(s, loaded.campaign.train.save_every))
    torch, packages, pins_from = pins((s.get("stack") or {}).get("piloted"))
    campaign_dir = str(Path(loaded.source).resolve().parent)
    loaded_sets = loaded.with_overrides(parse_set(list(run_sets))) if run_sets else loaded
    sweep_id = launch_sweep_id(loaded_sets)
    return {"gpu": gpu.key if gpu else None, "gpu_name": gpu.name if gpu else "a GPU",
            "sky": (gpu.sky or gpu.key) if gpu else "GPU", "gres": gpu.slurm_gres if gpu else "gpu",
            "rocm": gpu is not None and gpu.vendor == "amd", "gpus": gpus, "nodes": nodes,
            "per_node": gpus // nodes, "ranks": ranks, "days": days, "runs": runs, "lanes": groups,
            "not_placed": left, "campaign_dir": campaign_dir, "campaign_file": Path(loaded.source).name,
            "sets": sets, "sweep_id": sweep_id, "bucket": f"pilotrun-{sweep_id}"[:63].rstrip("-").lower(),
            "home": s.get("home") or f"{campaign_dir}/.pilotrun", "time_limit_s": limit, "time_how": how,
            "torch": torch, "packages": packages, "pins_from": pins_from, "pilotrun": pilotrun_source(),
            "inputs": campaign_inputs(loaded, sets), "env": dict(s.get("launch_env") or {})}


# The options table's rows pilotrun's own engine runs (train.strategy single | ddp | fsdp, and
# model.gradient_checkpointing); optimizer offload, tensor parallelism and a 4-bit base are estimated there for
# what other tools run, so no launch file runs them.
ENGINE_RUNS = ("written", "ckpt", "fsdp", "fsdp_ckpt")
NOT_RUN = "pilotrun's engine runs single, DDP and FSDP with or without checkpointing, not optimizer offload, " \
          "tensor parallelism or a 4-bit base"


def row_sets(row: dict, c) -> tuple[str, ...]:
    """The ``--set`` items that make campaign ``c`` the options row: its strategy and world (``train.nproc``,
    every node's ranks), accumulation ÷ the data ranks (same effective batch), checkpointing."""
    t, n = c.train, row["count"]
    opt = {o[0]: o for o in OPTIONS}[row["option"]]
    strategy = "single" if n == 1 else "fsdp" if opt[4] == "fsdp" or (row["option"] == "written"
                                                                       and t.strategy == "fsdp") else "ddp"
    out = []
    if strategy != t.strategy:
        out.append(f"train.strategy={strategy}")
    if n != t.nproc:
        out.append(f"train.nproc={n}")
    if row["accumulation"] != t.accumulation:
        out.append(f"train.accumulation={row['accumulation']}")
    if opt[3] == "ckpt" and not c.model.gradient_checkpointing:
        out.append("model.gradient_checkpointing=true")
    return tuple(out)


def launch_row(table: dict) -> tuple[dict | None, str]:
    """The options row the sheet without a pilot writes launch files for, and why: the recommended row when
    pilotrun's engine runs it, else the cheapest (by the table's own measure) that it runs, keeps the
    experiment and fits; None and the reason when there is none."""
    rec = table["recommended"]
    if rec is None:
        return None, "no option that keeps the experiment fits (the reasons per option are above)"
    if rec["option"] in ENGINE_RUNS:
        return rec, "the recommended row"
    by = "cost" if table["by"] == "cost" else "gpu_hours"
    ours = [x for x in table["rows"] if x["fits"] and x["keeps"] and x["option"] in ENGINE_RUNS
            and x.get(by) is not None]
    head = f"the recommended row ({pick(rec, table)}) is not one pilotrun runs ({NOT_RUN})"
    if not ours:
        return None, f"{head}, and no row it runs keeps the experiment and fits"
    best = min(ours, key=lambda x: (x[by], x["seconds"]))
    return best, f"{head}; the files are for the cheapest row it runs that keeps the experiment"


def options_launch(sheet: dict, loaded, sets: tuple[str, ...], home: str) -> dict:
    """The launch files' plan for the sheet without a pilot (``no_pilot_sheet``'s data): ``launch_row``'s row on
    its GPUs and nodes, its ``--set`` items, the time limit from its estimated campaign time. Returns
    {"row", "why", "files"}; ``files`` None (and ``why`` the reason) when no row can be launched."""
    c = loaded.campaign
    row, why = launch_row(sheet["options"])
    if row is None:
        return {"row": None, "why": why, "files": None}
    s = {"campaign": c.name, "home": home, "stack": {"piloted": None}, "settings": {"ranks": row["count"]},
         "hardware": {"gpus": row["count"], "rental_days": c.hardware.rental_days, "reserve": c.hardware.reserve}}
    files = launch_plan(s, loaded, BY_KEY[row["gpu"]], None, sets, gpus=row["count"], run_sets=row_sets(row, c),
                        campaign_s=row["seconds"], time_from="the options row's estimated campaign time")

    return {"row": {k: row[k] for k in ("gpu", "name", "count", "nodes", "option", "label", "seconds")},
            "text": pick(row, sheet["options"]), "why": why, "files": files}
