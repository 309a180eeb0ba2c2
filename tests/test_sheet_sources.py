"""The sheet on real pilots of the demo and of a campaign with very uneven lengths: sizes never above
what can exist, every memory and time figure naming its source, the latency-bound sentence, the launch
files parsing, one "written to" line, and a Markdown a reader can read (lines under 100 characters)."""

import math
import subprocess
import zipfile

import pytest
import yaml
from conftest import TINY_LLAMA, run_cli_process, tiny_causal_campaign

from pilotrun.campaign.load import load_campaign
from pilotrun.sheet import gpu_memory as GM
from pilotrun.sheet.sizes import Prober, largest, largest_sizes, longest_record
from pilotrun.campaign.prepare import prepare
from pilotrun.rehearsal.rental.sheet import sheet_stage

MAX_POSITIONS = 96


def _uneven(n: int, start: int = 0) -> list[dict]:
    """Nine short records in ten, and one far longer than the model's positions."""
    return [{"instruction": "say " + ("w" * 400 if i % 10 == 0 else "w" * (2 + i % 5)),
             "output": "x" * (40 if i % 10 == 0 else 3)} for i in range(start, start + n)]


def _piloted(path):
    home = path.parent / "home"
    p = run_cli_process("pilot", path, "--home", home, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    return path, home


@pytest.fixture(scope="module")
def uneven(tmp_path_factory):
    folder = tmp_path_factory.mktemp("uneven")
    path = tiny_causal_campaign(folder, _uneven(60), _uneven(20, 100),
                                model__config=dict(TINY_LLAMA, max_position_embeddings=MAX_POSITIONS),
                                data__max_length=64, train__micro_batch=4, train__accumulation=2,
                                train__eval_batch=8, train__updates=6, train__eval_every=3,
                                hardware__memory_per_gpu="24GiB")
    c = yaml.safe_load(path.read_text())
    c["plan"] = {"metric": "val_loss", "goal": "minimize", "control": {"train.lr": 1e-3},
                 "variants": [{"train.lr": 3e-4}], "seeds": [0]}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return _piloted(path)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from conftest import write_campaign

    from pilotrun.demo.synth import write_demo

    path = write_demo(tmp_path_factory.mktemp("demo") / "demo", n_conversations=120)
    c = yaml.safe_load(path.read_text())
    c["model"]["config"] = dict(TINY_LLAMA)
    c["train"].update(updates=12, eval_every=6, save_every=6, micro_batch=4, accumulation=2)
    c["plan"]["seeds"] = [0]
    write_campaign(path.parent, c)
    return _piloted(path)


@pytest.fixture(scope="module")
def sheets(demo, uneven):
    out = {}
    for name, (path, home) in (("demo", demo), ("uneven", uneven)):
        loaded = load_campaign(path)
        r = sheet_stage(loaded, home, out=str(path.parent / "sheet.md"))
        out[name] = (loaded, r)
    return out


@pytest.mark.parametrize("name", ["demo", "uneven"])
def test_no_size_above_what_can_exist(sheets, name):
    loaded, r = sheets[name]
    prep = prepare(loaded, splits=("train", "validation"))
    longest, exact = longest_record(prep)
    lg = r.data["largest"]
    assert lg["micro_batch"]["value"] <= len(prep.train)
    assert lg["eval_batch"]["value"] <= len(prep.validation)
    cap = min(MAX_POSITIONS if name == "uneven" else TINY_LLAMA["max_position_embeddings"], longest)
    assert 0 < lg["seq_len"]["value"] <= cap
    for k, v in lg.items():
        assert v["source"].startswith("predicted: the caching allocator's replay of the estimator's probes"), (k, v)
    if name == "uneven":
        # a record of ~450 byte tokens, a model of 96 positions: the model's limit binds, not the data
        assert longest > MAX_POSITIONS and lg["seq_len"] == dict(lg["seq_len"], value=MAX_POSITIONS,
                                                                  bound=f"model max positions: {MAX_POSITIONS}")
    else:
        assert lg["seq_len"]["value"] == longest and lg["seq_len"]["bound"] == f"longest record: {longest} tokens"
    assert lg["micro_batch"]["bound"] == f"train split: {len(prep.train)} examples per rank"


@pytest.mark.parametrize("name", ["demo", "uneven"])
def test_memory_is_the_cuda_prediction_with_its_constants_never_cpu_rss(sheets, name):
    from pilotrun.probe.trace import trace

    loaded, r = sheets[name]
    m = r.data["memory"]
    assert r.data["counter"] == "tensors+rss" and m["kind"] == "predicted"  # a CPU pilot: the exact counter and RSS
    predicted = {row["phase"]: row["peak_reserved"]
                 for row in trace(loaded, device="cuda", prep=prepare(loaded, ("train", "validation")))["rows"]}
    for p in m["phases"]:
        assert p["reserved"] == predicted[p["phase"]] and p["source"].startswith("predicted: the caching allocator's")
    top = max(predicted.values())
    # cuBLAS's workspaces are inside the replay's reserved; the context lives outside the allocator
    assert m["need"] == math.ceil((top + GM.CUDA_CONTEXT_BYTES) / (1 - GM.HEADROOM_FRACTION))
    assert [o["what"] for o in m["overheads"]] == ["CUDA context"]
    # the CPU ledger is kept as proof, beside, never as the figure
    rss = [row["rss_peak"] for row in m["proof"]]
    assert [row["phase"] for row in m["proof"]] == list(predicted) and m["need"] not in rss
    assert all(row["verdict"] == "ok" for row in m["proof"])
    md = r.data["markdown"]
    assert "RSS peak (CPU)" in md and "never the GPU figure" in md and "CUDA context: 768.0 MiB —" in md
    # every time figure names its source
    tm = r.data["time"]
    assert all(v["source"].startswith(f"run {r.data['pilot_run']} phase ") for v in tm["measured"].values())
    assert tm["scaling"]["text"].startswith("EXTRAPOLATION from a CPU measurement")
    assert "assumed 30% efficiency" in tm["scaling"]["text"] and "fp32 non-tensor rate" in tm["scaling"]["text"]


@pytest.mark.parametrize("name", ["demo", "uneven"])
def test_tiny_campaigns_say_they_are_latency_bound(sheets, name):
    _, r = sheets[name]
    why = r.data["time"]["why"]
    assert why and why[0].startswith("This campaign is latency-bound: an update takes the launch floor")
    assert why[0].endswith("every catalogue GPU gives the same time.")
    times = {f["campaign_s"] for f in r.data["fit"] if f["fits"]}
    assert len({round(t, 6) for t in times}) == 1
    assert "This campaign is latency-bound" in r.data["markdown"]


@pytest.mark.parametrize("name", ["demo", "uneven"])
def test_sheet_md_reads_in_100_columns_and_without_rates_names_the_missing_input(sheets, name):
    loaded, r = sheets[name]
    md = (loaded.source.parent / "sheet.md").read_text()
    long = [line for line in md.splitlines() if len(line) > 100]
    assert not long, long
    assert "No costs: the input missing is your prices. Pass `--rates FILE`" in md
    assert "## Options that fit (per GPU and count)" in md and "- lora: trains an adapter, not the model" in md
    # tables are aligned: every row of a table has the width of its header
    fit = md.split("## Fit table")[1].split("\n## ")[0]
    table = [line for line in fit.splitlines() if line.startswith("|")]
    assert len(table) == 17 and len({len(line) for line in table}) == 1


def test_launch_files_parse_and_hold_the_sweep_in_order(sheets):
    from pilotrun.rehearsal.training.sweep import launch_sweep_id, plan_arms
    from pilotrun.campaign.sweep_runs import arm_command

    loaded, r = sheets["uneven"]
    folder = loaded.source.parent
    wheel = folder / "pilotrun-0.1.0-py3-none-any.whl"
    assert r.data["written"] == [str(folder / f) for f in ("sheet.md", "sheet.commands.sh", "sheet.sky.yaml",
                                                           "sheet.sbatch")] + [str(wheel)]
    assert "pilotrun/engine/loop.py" in zipfile.ZipFile(wheel).namelist()  # pilotrun itself, from this source
    ch = r.data["launch"]
    assert ch["gpu"] == "rtx4090" and ch["days"] == 3 and "shortest plan that places every run" in ch["why"]
    expected = [arm_command("campaign.yaml", arm, 0) for arm in plan_arms(loaded)]
    assert expected[0].endswith("--set train.lr=0.001 --seed 0")  # the control first
    sid = launch_sweep_id(loaded)
    assert sid == ch["files"]["sweep_id"] and sid.startswith("sweep-tiny-")
    script = (folder / "sheet.commands.sh").read_text()
    # the runs' own commands as comments, in order; what runs is the sweep of the fixed id (resumable)
    assert [line.split(": ", 1)[1] for line in script.splitlines() if line.startswith("#   ")] == expected
    run_lines = [line for line in script.splitlines() if line.startswith("pilotrun")]
    assert run_lines == [f'pilotrun sweep campaign.yaml --id {sid} --home "$PILOTRUN_HOME"']
    assert f"PILOTRUN_HOME=${{PILOTRUN_HOME:-{folder}/home}}" in script.splitlines()  # the home, quoted by shell.py
    sky = yaml.safe_load((folder / "sheet.sky.yaml").read_text())
    assert sky["resources"]["accelerators"] == "RTX4090:1" and sky["workdir"] == str(folder.resolve())
    assert sky["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert sky["file_mounts"]["/pilotrun-home"]["mode"] == "MOUNT_CACHED"
    assert sky["file_mounts"][f"~/pilotrun-wheel/{wheel.name}"] == str(wheel)
    piloted = r.data["stack"]["piloted"]
    setup = sky["setup"].splitlines()
    assert setup[0] == "pip install torch==" + piloted["torch"].split("+")[0]
    assert f"transformers=={piloted['transformers']}" in setup[1] and f"peft=={piloted['peft']}" in setup[1]
    assert setup[1].endswith(f'"$HOME"/pilotrun-wheel/{wheel.name}') and " pilotrun " not in setup[1] + " "
    # the sweep on the instance's disk (SQLite's WAL and locks need a local file system), the home restored
    # from the bucket mount before it and copied back after it (journal/mirror.py)
    assert [line.strip() for line in sky["run"].splitlines() if line.strip().startswith("pilotrun")] == [
        'pilotrun _mirror-home /pilotrun-home "$PILOTRUN_LOCAL_HOME" --restore || exit 1',
        f'pilotrun sweep campaign.yaml --id {sid} --home "$PILOTRUN_LOCAL_HOME"',
        'pilotrun _mirror-home "$PILOTRUN_LOCAL_HOME" /pilotrun-home "$JOURNAL" || rc=1']
    sbatch = (folder / "sheet.sbatch").read_text()
    opts = dict(line[len("#SBATCH --"):].split("=", 1) if "=" in line else (line[len("#SBATCH --"):], "")
                for line in sbatch.splitlines() if line.startswith("#SBATCH"))
    assert opts["gres"] == "gpu:rtx4090:1" and opts["nodes"] == "1" and opts["signal"] == "TERM@120"
    assert "requeue" in opts
    # the limit is the time plan's campaign time with its margin, not the 3-day tier
    campaign_s = ch["plan"]["used_s"]
    d, hms = opts["time"].split("-")
    h, m, _ = map(int, hms.split(":"))
    limit = int(d) * 86400 + h * 3600 + m * 60
    # the set-up (15 min, PILOTRUN_SETUP_S unset), start-up, the plan × 1.7, one requeue's restart (start-up, load and
    # at most a run again, each within the campaign's time) and the grace, in whole minutes
    assert campaign_s + 900 < limit <= 900 + 60 + campaign_s * 3.7 + 60 + 120 + 60 and limit < 3600
    assert "set-up (the first start's venv and stack" in sbatch
    assert f"srun --kill-on-bad-exit=1 pilotrun sweep campaign.yaml --id {sid} --home" in sbatch
    assert sbatch.startswith("#!/bin/bash\n")
    for f in ("sheet.commands.sh", "sheet.sbatch"):
        check = subprocess.run(["bash", "-n", str(folder / f)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_skypilot_loads_the_task(sheets):
    sky_lib = pytest.importorskip(
        "sky", reason="skypilot is not installed: `pip install skypilot` here pulls ~50 packages and downgrades "
                      "click 8.5.1 → 8.1.8 (the CLI's own dependency), so its loader is not used")
    loaded, _ = sheets["uneven"]
    task = sky_lib.Task.from_yaml(str(loaded.source.parent / "sheet.sky.yaml"))
    assert "RTX4090" in str(task.resources)


def test_bisection_finds_the_memory_bound_when_memory_binds(uneven, monkeypatch):
    import pilotrun.sheet.sizes as sizes

    # the micro-batch's answer is checked below size by size; the other sizes' downward scans (seq_len from 96: 33
    # probes, 20 s) are not this test's, and a short scan only says where it stopped
    monkeypatch.setattr(sizes, "MAX_SCAN", 3)
    path, _ = uneven
    loaded = load_campaign(path)
    prep = prepare(loaded, splits=("train", "validation"))
    p = Prober(loaded, prep)
    at4, at8 = p.update(4, 64), p.update(8, 64)
    assert at8["allocated"] > at4["allocated"] and at8["reserved"] >= at8["allocated"]  # memory grows with the batch
    limit = (at4["reserved"] + at8["reserved"]) // 2
    got = largest_sizes(loaded, prep, limit, micro_batch=4, eval_batch=8, seq_len=64, eval_seq_len=64, prober=p)
    mb = got["micro_batch"]["value"]
    assert 4 <= mb < 8 and got["micro_batch"]["bound"] == "GPU memory"
    assert all(p.fits(p.update(n, 64), limit) for n in range(1, mb + 1)) and not p.fits(p.update(mb + 1, 64), limit)
    # the search itself: the largest size under any threshold, never a probe outside [1, cap]
    for cap, thr in ((1, 0), (1, 5), (50, 17), (300, 299), (300, 1000)):
        probes = []
        assert largest(lambda n: probes.append(n) or n, thr, 4, cap) == min(cap, thr)
        assert all(1 <= n <= cap for n in probes) and len(probes) == len(set(probes))
    # a cap that fits (a pilot's small split, its longest record) is answered by one probe, of the cap itself;
    # one that does not is followed by the piloted size, then the search between them
    for cap, start in ((76, 4), (20, 20), (1, 1)):
        probes = []
        assert largest(lambda n: probes.append(n) or n, cap, start, cap) == cap and probes == [cap]
    probes = []
    assert largest(lambda n: probes.append(n) or n, 100, 8, 10_000) == 100 and probes[:2] == [10_000, 8]