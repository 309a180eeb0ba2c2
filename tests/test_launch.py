"""The launch files as a rental would run them: what the campaign reads uploaded (or said why not), a hub
model downloaded by the set-up, pilotrun shipped as something an installer reaches, several nodes joined by
torchrun, the time limit from the plan."""

import math
import subprocess
import zipfile

import pytest
import yaml
from conftest import TINY_LLAMA, write_campaign, write_jsonl
from hubcache import config_only

from pilotrun.campaign.load import load_campaign
from pilotrun.errors import BadInput
from pilotrun.sheet.catalogue import BY_KEY
from pilotrun.sheet.launch import launch_plan, sbatch_script, sky_task, slurm_time, time_limit, write_launch


def _sheet(gpus=1, piloted=None):
    return {"campaign": "far", "hardware": {"gpus": gpus, "rental_days": [3, 7], "reserve": 0.2},
            "settings": {"ranks": 1}, "stack": {"piloted": piloted or {}}}


@pytest.fixture(autouse=True)
def _hub_cache(tmp_path, monkeypatch):
    """The hub model is in the local Hugging Face cache here (its config.json): the loader resolves it there."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    config_only(tmp_path / "hf-cache", "org-x/model.v2", TINY_LLAMA)


def _far_campaign(tmp_path, model_path="org-x/model.v2"):
    """Data beside the campaign folder (../shared/train.jsonl), one file named absolutely, a hub model."""
    rec = [{"instruction": "say hi", "output": "hi"}] * 8
    write_jsonl(tmp_path / "shared" / "train.jsonl", rec)
    write_jsonl(tmp_path / "elsewhere" / "val.jsonl", rec)
    write_jsonl(tmp_path / "camp" / "data" / "test.jsonl", rec)
    return write_campaign(tmp_path / "camp", {
        "name": "far", "model": {"path": model_path, "tokenizer": "byte"},
        "data": {"train": "../shared/train.jsonl", "validation": str(tmp_path / "elsewhere" / "val.jsonl"),
                 "test": "data/test.jsonl", "prompt": "instruction", "response": "output"},
        "train": {"micro_batch": 1, "accumulation": 2, "updates": 2}})


def test_files_outside_the_campaign_folder_are_mounted_where_the_campaign_file_finds_them(tmp_path):
    loaded = load_campaign(_far_campaign(tmp_path))
    launch = launch_plan(_sheet(piloted={"torch": "2.9.1+cpu", "transformers": "4.57.0", "peft": "0.17.1"}),
                         loaded, BY_KEY["h100-sxm"], None)
    wheel = tmp_path / "pilotrun-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    task = sky_task({"campaign": "far"}, launch, wheel)
    mounts = task["file_mounts"]
    # relative from the workdir (~/sky_workdir/../shared → ~/shared); an absolute path stays absolute
    assert mounts["~/shared/train.jsonl"] == str(tmp_path / "shared" / "train.jsonl")
    assert mounts[str(tmp_path / "elsewhere" / "val.jsonl")] == str(tmp_path / "elsewhere" / "val.jsonl")
    assert not any("test.jsonl" in k for k in mounts)  # inside the campaign folder: the workdir uploads it
    # the hub model: downloaded by the set-up into the folder the campaign's relative path names
    assert "[ -d org-x/model.v2 ] || hf download org-x/model.v2 --local-dir org-x/model.v2" in task["setup"]
    first = task["setup"].splitlines()[0]
    assert first == "pip install torch==2.9.1"  # the piloted torch, without the CPU build's local tag
    assert "transformers==4.57.0" in task["setup"] and "peft==0.17.1" in task["setup"]
    sbatch = sbatch_script({"campaign": "far"}, launch, wheel)
    assert f"data.train {tmp_path / 'shared' / 'train.jsonl'}: outside the campaign folder; it must be " \
           f"reachable at this path from the nodes" in sbatch
    assert "model.path org-x/model.v2: a hub id, downloaded by the set-up" in sbatch


def test_a_model_folder_that_exists_is_uploaded_not_downloaded(tmp_path):
    (tmp_path / "models" / "m").mkdir(parents=True)
    loaded = load_campaign(_far_campaign(tmp_path, model_path="../models/m"))
    launch = launch_plan(_sheet(), loaded, BY_KEY["a100-80gb"], None)
    task = sky_task({"campaign": "far"}, launch, None if launch["pilotrun"]["kind"] == "vcs" else tmp_path / "w.whl")
    assert task["file_mounts"]["~/models/m"] == str(tmp_path / "models" / "m")
    assert "hf download" not in task["setup"]
    # no pilot recorded versions: the installed ones, said so
    assert launch["pins_from"] == "the versions installed here (no pilot recorded them)"


def test_several_nodes_run_each_run_on_all_of_them_through_torchrun(tmp_path):
    loaded = load_campaign(_far_campaign(tmp_path))
    launch = launch_plan(_sheet(), loaded, BY_KEY["h100-sxm"], None, gpus=16,
                         run_sets=("train.strategy=fsdp", "train.nproc=16"), campaign_s=3 * 3600)
    assert (launch["nodes"], launch["per_node"]) == (2, 8)
    out = tmp_path / "sheet.md"
    files = write_launch({"campaign": "far"}, loaded, out, launch)
    sbatch = (tmp_path / "sheet.sbatch").read_text()
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:h100:8\n" in sbatch
    assert 'HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in sbatch
    line = next(x for x in sbatch.splitlines() if "torchrun" in x)
    assert line.startswith('srun --kill-on-bad-exit=1 torchrun --nnodes "$SLURM_NNODES" --nproc_per_node 8 '
                           '--rdzv-backend c10d --rdzv-endpoint "$HEAD:29500"')
    assert f"-m pilotrun sweep campaign.yaml --id {launch['sweep_id']}" in line
    assert "--set train.strategy=fsdp --set train.nproc=16" in line
    # 15 min set-up + 1 min start-up + 3 h × 1.7 + 1 min restart + 2 min grace, in minutes: the plan, not the tier
    assert f"#SBATCH --time={slurm_time(900 + 60 + 3 * 3600 * 1.7 + 60 + 120)}\n" in sbatch
    assert "--time=0-05:25:00" in sbatch
    sky = yaml.safe_load((tmp_path / "sheet.sky.yaml").read_text())
    assert sky["num_nodes"] == 2 and sky["resources"]["accelerators"] == "H100:8"
    run = sky["run"]
    assert 'HEAD=$(echo "$SKYPILOT_NODE_IPS" | head -n1)' in run
    assert '--nnodes "$SKYPILOT_NUM_NODES" --nproc_per_node 8 --node_rank "$SKYPILOT_NODE_RANK"' in run
    for f in files[:3]:
        assert subprocess.run(["bash", "-n", str(f)], capture_output=True).returncode == 0 or f.suffix == ".yaml"
    # the options row's settings are part of the id: a different experiment, a different sweep
    assert launch["sweep_id"] != launch_plan(_sheet(), loaded, BY_KEY["h100-sxm"], None)["sweep_id"]


def test_the_time_limit_counts_the_set_up_and_a_restart(monkeypatch):
    """Issue 43: the sbatch reserved 4 minutes for a 17 s campaign whose first step creates a venv and installs
    torch. The limit counts the set-up (a stated default, PILOTRUN_SETUP_S overrides), the start-up, the plan with
    its margin, one requeue's restart and the grace; only the tier without a plan."""
    monkeypatch.delenv("PILOTRUN_SETUP_S", raising=False)
    limit, how = time_limit(17.0, 0.2, 3)
    assert limit == 1200 and "17 s × (1 + 0.5 margin + 0.2 reserve)" in how  # 900 + 60 + 28.9 + 60 + 120 s → 20 min
    assert how.startswith("15.0 min set-up (the first start's venv and stack; PILOTRUN_SETUP_S=SECONDS sets it)")
    assert time_limit(None, 0.2, 3) == (3 * 86400, "the 3-day plan (no campaign time in the time plan)")
    assert slurm_time(90061) == "1-01:02:00"
    monkeypatch.setenv("PILOTRUN_SETUP_S", "0")  # a prebuilt venv
    assert time_limit(17.0, 0.2, 3)[0] == 300 and "from PILOTRUN_SETUP_S" in time_limit(17.0, 0.2, 3)[1]
    monkeypatch.setenv("PILOTRUN_SETUP_S", "ten minutes")
    with pytest.raises(BadInput) as e:
        time_limit(17.0, 0.2, 3)
    assert e.value.where == "PILOTRUN_SETUP_S" and "0 for a prebuilt venv" in e.value.fix


def test_a_restart_redoes_the_work_since_the_last_checkpoint(tmp_path, monkeypatch):
    """The second instance: a long run that checkpoints rarely. A requeued job starts again, loads the model and
    redoes the updates since the last checkpoint; the limit holds that, by the time plan's units."""
    from pilotrun.sheet.launch import STARTUP_S, restart_seconds

    monkeypatch.setenv("PILOTRUN_SETUP_S", "0")
    s = dict(_sheet(), time={"units": {"update": 2.0, "load": 30.0}, "per_run_s": 4000.0})
    assert restart_seconds(s, 500) == STARTUP_S + 30.0 + 1000.0
    assert restart_seconds(s, None) == STARTUP_S + 30.0 + 4000.0  # no checkpoint: the whole run again
    assert restart_seconds(_sheet(), 500) is None
    loaded = load_campaign(_far_campaign(tmp_path), {"train.save_every": 500})
    launch = launch_plan(s, loaded, BY_KEY["h100-sxm"], {"days": 3, "used_s": 3600.0, "placed": [], "not_fitting": []})
    assert launch["time_limit_s"] == math.ceil((60 + 3600 * 1.7 + 1090 + 120) / 60) * 60
    assert "18.2 min for a requeue's restart" in launch["time_how"], launch["time_how"]


def test_pilotrun_ships_as_a_wheel_of_this_source_unless_a_pushed_revision_can_be_named(tmp_path):
    from pilotrun.sheet.ship import build_wheel, pilotrun_source, source_root

    src = pilotrun_source()
    root = source_root()
    assert root is not None and (root / "src" / "pilotrun" / "__init__.py").is_file()
    origin = subprocess.run(["git", "-C", str(root), "remote", "get-url", "origin"], capture_output=True,
                            text=True).stdout.strip()
    if src["kind"] == "vcs":  # a clean checkout with a reachable origin: the URL at the revision
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True).stdout.strip()
        assert src["requirement"].endswith(f"@{rev}") and origin in src["requirement"]
    else:
        assert src["kind"] == "wheel" and str(root) in src["why"]
        wheel = build_wheel(src, tmp_path / "out")
        names = zipfile.ZipFile(wheel).namelist()
        assert wheel.name == f"pilotrun-{src['version']}-py3-none-any.whl"
        assert "pilotrun/sheet/launch.py" in names and any(n.endswith("dist-info/METADATA") for n in names)


def test_the_wheel_from_the_build_backend_is_the_one_pip_builds(tmp_path):
    """The checkout's build backend, called directly (no pip start-up), writes the same wheel, member by member,
    as `pip wheel --no-deps`; a backend this cannot call (an in-tree one) leaves it to pip."""
    from pilotrun.sheet.ship import _backend_wheel, _pip_wheel_command, source_root

    root = source_root()
    direct = _backend_wheel(root, tmp_path / "direct")
    assert len(direct) == 1, "the build backend wrote no wheel"
    # pip as build_wheel runs it when it must: holding the checkout, as every build of it does
    done = subprocess.run(_pip_wheel_command(root, tmp_path / "pip"), cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-1000:]
    (by_pip,) = (tmp_path / "pip").glob("pilotrun-*.whl")
    a, b = zipfile.ZipFile(direct[0]), zipfile.ZipFile(by_pip)
    assert direct[0].name == by_pip.name and sorted(a.namelist()) == sorted(b.namelist())
    assert all(a.read(n) == b.read(n) for n in a.namelist())

    intree = tmp_path / "intree"
    intree.mkdir()
    (intree / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                           'backend-path = ["."]\n')
    assert _backend_wheel(intree, tmp_path / "none") == []


def _wheel_source(monkeypatch):
    """pilotrun ships as a wheel of this checkout, whatever its remote (a pushed clean checkout would ship a URL)."""
    from pilotrun.sheet import ship

    src = {"kind": "wheel", "root": str(ship.source_root()), "version": "x", "why": "the test's"}
    monkeypatch.setattr(ship, "pilotrun_source", lambda: dict(src))
    return src


def test_the_wheel_built_beside_the_traces_is_the_one_build_wheel_ships(tmp_path, monkeypatch):
    """Issue 50: the sheet's launch files wait for a wheel built during its traces, not for a build after them.
    Inside ``wheel_beside`` the backend runs in the background; ``build_wheel`` takes its wheel (the planted
    defect, a build_wheel that ignored it, would call the backend again: made to fail here), member by member the
    one the backend builds in the foreground; its TMPDIR folder is gone after the block."""
    from pilotrun.sheet import ship

    src = _wheel_source(monkeypatch)
    direct = ship._backend_wheel(ship.source_root(), tmp_path / "direct")
    assert len(direct) == 1, "the build backend wrote no wheel"
    out = tmp_path / "out"
    with ship.wheel_beside(out):
        record = dict(ship._BESIDE)
        assert record and record["tmp"].is_dir() and not out.exists()  # nothing in the user's folder yet

        def again(*a, **k):
            raise AssertionError("built again after the background build")

        monkeypatch.setattr(ship, "_backend_wheel", again)
        wheel = ship.build_wheel(src, out)
    assert wheel.parent == out and wheel.name == direct[0].name
    a, b = zipfile.ZipFile(direct[0]), zipfile.ZipFile(wheel)
    assert sorted(a.namelist()) == sorted(b.namelist()) and all(a.read(n) == b.read(n) for n in a.namelist())
    assert sorted(p.name for p in out.iterdir()) == sorted([wheel.name, ship.WHEEL_KEY])
    assert not record["tmp"].exists() and record["proc"].poll() is not None and not ship._BESIDE


def _build_at(backend: str, root: str, out: str, start: float) -> tuple[int, str, list[str]]:
    """One build of the checkout's wheel in a process of its own, started at ``start`` (time.time())."""
    import time
    from pathlib import Path

    from pilotrun.sheet import ship

    time.sleep(max(0.0, start - time.time()))
    p = subprocess.run(ship._hook_command(backend, Path(out)), cwd=root, capture_output=True, text=True, timeout=300)
    wheels = sorted(Path(out).glob("pilotrun-*.whl"))
    return p.returncode, p.stderr[-300:], sorted(zipfile.ZipFile(wheels[0]).namelist()) if len(wheels) == 1 else []


def test_two_builds_of_one_checkout_at_once_each_ship_the_whole_wheel(tmp_path):
    """Two sheets (or `all`s) on one machine build pilotrun's wheel from the same checkout, whose build/ and egg-info
    folders setuptools shares between them: unserialised, one of the two failed in 9 of 12 tries ("Directory not
    empty", "File exists", "No such file"). Each build now holds the checkout; three rounds of two builds started
    at the same instant all give the same whole wheel."""
    import time
    from concurrent.futures import ProcessPoolExecutor

    from pilotrun.sheet import ship

    root = ship.source_root()
    backend = ship._backend_of(root)
    assert root is not None and backend is not None
    members = []
    with ProcessPoolExecutor(2) as pool:
        for round_ in range(3):
            start = time.time() + 1.0  # both processes are up and imported by then
            outs = [tmp_path / f"r{round_}-{k}" for k in range(2)]
            for out in outs:
                out.mkdir()
            for code, err, names in pool.map(_build_at, [backend] * 2, [str(root)] * 2, map(str, outs), [start] * 2):
                assert code == 0 and names, err
                members.append(names)
    assert all(m == members[0] for m in members) and "pilotrun/sheet/ship.py" in members[0]


def test_a_stage_that_ends_during_the_background_wheel_build_leaves_nothing(tmp_path, monkeypatch):
    """A failed or interrupted sheet (Ctrl-C is an exception here too) kills the build and removes its folder;
    the user's folder is never created; a folder that keeps this source's wheel starts no build at all."""
    from pilotrun.sheet import ship

    src = _wheel_source(monkeypatch)
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        with ship.wheel_beside(out):
            record = dict(ship._BESIDE)
            assert record["proc"].poll() is None  # still building (it takes ~0.7 s)
            raise KeyboardInterrupt
    assert record["proc"].poll() is not None and record["proc"].returncode != 0  # killed, not finished
    assert not record["tmp"].exists() and not out.exists() and not ship._BESIDE

    # `all` starts it while resume's fresh process runs (now=False); the sheet's own block inside leaves it be
    with ship.wheel_beside(out, now=False) as start:
        assert not ship._BESIDE
        start()
        record = dict(ship._BESIDE)
        with ship.wheel_beside(out):
            assert ship._BESIDE == record
        assert ship._BESIDE == record  # not the inner block's to stop
        wheel = ship.build_wheel(src, out)
    assert wheel.is_file() and not record["tmp"].exists() and not ship._BESIDE

    kept = ship.build_wheel(src, tmp_path / "kept")  # built in the foreground, kept by its source identity
    with ship.wheel_beside(tmp_path / "kept"):
        assert not ship._BESIDE  # nothing to build
        assert ship.build_wheel(src, tmp_path / "kept") == kept


@pytest.mark.slow
def test_a_pilotrun_installed_from_a_wheel_is_repacked_into_one_pip_installs(tmp_path):
    """No checkout: the installed files (RECORD) become the wheel; pip installs it into a fresh target."""
    import sys

    from pilotrun.sheet.ship import build_wheel, source_root

    wheel = build_wheel({"kind": "wheel", "root": str(source_root())}, tmp_path / "w")
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target"]
    assert subprocess.run(pip + [str(site), str(wheel)], capture_output=True).returncode == 0
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
            "from pilotrun.sheet import ship; assert ship.source_root() is None, ship.source_root(); "
            "print(ship.build_wheel(ship.pilotrun_source(), Path(sys.argv[2])))")
    p = subprocess.run([sys.executable, "-c", code, str(site), str(tmp_path / "re")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    repacked = p.stdout.strip()
    names = zipfile.ZipFile(repacked).namelist()
    assert "pilotrun/engine/loop.py" in names and not any(n.endswith(".pyc") for n in names)
    again = subprocess.run(pip + [str(tmp_path / "site2"), repacked], capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "site2" / "pilotrun" / "sheet" / "launch.py").read_text() == \
        (site / "pilotrun" / "sheet" / "launch.py").read_text()


def _sky_python(config) -> str:
    """A venv of its own holding SkyPilot (its click pin conflicts with the CLI's in one environment): made once
    in pytest's cache folder, not the temp directory the suite must leave as it found it ($PILOTRUN_SKY_VENV
    names another), reused after."""
    import os
    import sys
    from pathlib import Path

    venv = Path(os.environ.get("PILOTRUN_SKY_VENV") or config.cache.mkdir("pilotrun-skypilot-venv"))
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", "import sky"], capture_output=True).returncode == 0:
        return str(py)
    made = subprocess.run([sys.executable, "-m", "venv", str(venv)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"no venv for SkyPilot: {made.stderr[-500:]}")
    pip = subprocess.run([str(py), "-m", "pip", "install", "-q", "skypilot"], capture_output=True, text=True,
                         timeout=900)
    if pip.returncode != 0:
        pytest.skip(f"SkyPilot could not be installed into {venv} (no package index?): {pip.stderr[-500:]}")
    return str(py)


@pytest.mark.slow
def test_skypilots_own_loader_reads_the_two_node_task(tmp_path, _hub_cache, pytestconfig):
    """SkyPilot's Task.from_yaml (in an isolated venv) reads the file: two nodes of 8 H100, recovery, the
    journal's bucket as a storage mount, the wheel and the outside data as file mounts."""
    import json

    loaded = load_campaign(_far_campaign(tmp_path))
    launch = launch_plan(_sheet(), loaded, BY_KEY["h100-sxm"], None, gpus=16,
                         run_sets=("train.strategy=fsdp", "train.nproc=16"), campaign_s=3 * 3600)
    files = write_launch({"campaign": "far"}, loaded, tmp_path / "sheet.md", launch)
    code = ("import json, sys, sky; t = sky.Task.from_yaml(sys.argv[1]); r = list(t.resources)[0]; "
            "print(json.dumps({'nodes': t.num_nodes, 'acc': r.accelerators, 'recovery': r.job_recovery, "
            "'files': t.file_mounts, 'storage': {k: [v.name, str(v.mode)] for k, v in t.storage_mounts.items()}, "
            "'run': t.run, 'workdir': t.workdir}))")
    p = subprocess.run([_sky_python(pytestconfig), "-c", code, str(files[1])], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    task = json.loads(p.stdout.strip().splitlines()[-1])
    assert task["nodes"] == 2 and task["acc"] == {"H100": 8}
    assert task["recovery"]["strategy"] == "FAILOVER"
    assert task["storage"]["/pilotrun-home"][0] == launch["bucket"] and "MOUNT_CACHED" in \
        task["storage"]["/pilotrun-home"][1]
    assert task["files"]["~/shared/train.jsonl"] == str(tmp_path / "shared" / "train.jsonl")
    assert task["files"][f"~/pilotrun-wheel/{files[3].name}"] == str(files[3])
    assert f"--id {launch['sweep_id']}" in task["run"] and str(task["workdir"]).endswith("camp")


def _hf_download_params(line: str) -> dict:
    """The `hf download …` part of a set-up line as the installed huggingface_hub CLI parses it (its click
    command's own parser; nothing is run, nothing contacts the hub)."""
    import shlex

    import click
    from huggingface_hub.cli.hf import app

    words = shlex.split(line.split("|| ", 1)[1])
    assert words[:2] == ["hf", "download"], line
    cmd = app.get_command(click.Context(app), "download")
    cmd = cmd.materialize() if hasattr(cmd, "materialize") else cmd  # the CLI loads its commands lazily
    return cmd.make_context("download", words[2:]).params


def test_a_hub_revision_is_downloaded_with_the_clis_own_revision_option(tmp_path):
    """``org/name@rev``: the installed `hf download` takes the id and ``--revision rev`` (an ``@`` in the id is
    no revision to it), into the folder the campaign file names; the id without a revision gets none."""
    import json

    from hubcache import add_model, tokenizer_files

    commit = "0123456789abcdef0123456789abcdef01234567"
    add_model(tmp_path / "hf-cache", "org-y/model.v3", {"config.json": json.dumps(TINY_LLAMA).encode(),
                                                        **tokenizer_files()}, commit=commit)
    loaded = load_campaign(_far_campaign(tmp_path, model_path=f"org-y/model.v3@{commit}"))
    setup = sky_task({"campaign": "far"}, launch_plan(_sheet(), loaded, BY_KEY["h100-sxm"], None),
                     tmp_path / "w.whl")["setup"]
    line = next(x for x in setup.splitlines() if "hf download" in x)
    assert line == (f"[ -d org-y/model.v3@{commit} ] || hf download org-y/model.v3 --revision {commit} "
                    f"--local-dir org-y/model.v3@{commit}")
    params = _hf_download_params(line)
    assert (params["repo_id"], params["revision"], params["local_dir"]) == \
        ("org-y/model.v3", commit, f"org-y/model.v3@{commit}")
    plain = _hf_download_params("[ -d org-x/model.v2 ] || hf download org-x/model.v2 --local-dir org-x/model.v2")
    assert (plain["repo_id"], plain["revision"]) == ("org-x/model.v2", None)
    # the line the old set-up wrote: the CLI takes "@rev" as part of the id, and no revision
    old = _hf_download_params(f"[ -d x ] || hf download org-y/model.v3@{commit} --local-dir x")
    assert old["repo_id"].endswith(commit) and old["revision"] is None
