"""`pilotrun sheet`: from real pilot ledger rows in a real journal to the sheet, Markdown, JSON and HTML."""

import json
import os
from pathlib import Path

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign, write_campaign

from pilotrun.campaign.load import load_campaign
from pilotrun.journal.store import Journal
from pilotrun.rehearsal.rental.env import collect_env
from pilotrun.journal.runs import run_provenance
from pilotrun.journal.runs import find_pilot
from pilotrun.rehearsal.rental.sheet import sheet_stage
from pilotrun.sheet.build import sheet_section_html

GiB = 2**30
PHASES = ("load", "first_step", "steady_step", "eval_longest", "save", "export", "reload")


def campaign(tmp_path, **over) -> Path:
    over.setdefault("hardware__memory_per_gpu", "80GiB")
    path = tiny_causal_campaign(tmp_path / "camp", simple_records(40), simple_records(10, start=100), **over)
    c = yaml.safe_load(path.read_text())
    c["plan"] = {"metric": "val_loss", "goal": "minimize", "control": {"train.lr": 1e-3},
                 "variants": [{"train.lr": 3e-4}], "seeds": [0, 1]}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def record_pilot(path: Path, home: Path, peaks_gib: dict, *, device="cuda:0", device_name="NVIDIA H100 80GB HBM3",
                 steady_s=2.0, overrides=None, verdicts=None, params=200_000) -> str:
    """A pilot run as the pilot stage writes it: a run row of kind pilot and one ledger row per phase."""
    loaded = load_campaign(path, overrides)
    j = Journal(home)
    run = j.create_run(kind="pilot", name=loaded.c.name, **run_provenance(loaded))
    cuda = device.startswith("cuda")
    train_in = {"micro_batch": 2, "accumulation": 2, "ranks": 1, "seq_len": 60, "precision": loaded.c.train.precision}
    inputs = {"load": {"params": params, "trainable": params}, "first_step": train_in, "steady_step": train_in,
              "eval_longest": {"eval_batch": 8, "seq_len": 64}}
    secs = {"load": 3.0, "first_step": steady_s + 1.0, "steady_step": steady_s, "eval_longest": 0.5, "save": 1.0,
            "export": 2.0, "reload": 1.5}
    rows = []
    for ph in PHASES:
        peak = int(peaks_gib.get(ph, 2.0) * GiB)
        rows.append({"phase": ph, "rank": 0, "device": device, "counter": "cuda" if cuda else "rss",
                     "inputs": inputs.get(ph, {}), "baseline": GiB, "peak_allocated": peak - (GiB // 8 if cuda else 0),
                     "peak_reserved": peak if cuda else None, "end_allocated": GiB,
                     "end_reserved": GiB if cuda else None, "duration_s": secs[ph],
                     "verdict": (verdicts or {}).get(ph, "ok"), "note": None})
    j.add_phase_rows(run, rows)
    j.finish_run(run, "completed", {"device_name": device_name} if cuda else {})
    return run


def target_env(tmp_path, name, cc, memory_gib, bf16) -> Path:
    """This machine's real `env` report with its devices replaced by the target's."""
    env = collect_env()
    env["cuda"] = {"available": True, "device_count": 1, "built_with": "12.4", "hip": None}
    env["devices"] = [{"index": 0, "name": name, "memory_bytes": memory_gib * GiB, "compute_capability": cc,
                       "multiprocessors": 40, "bf16": bf16}]
    env["bf16"] = {"cuda": bf16, "cpu": True}
    env["distributed"]["nccl"] = True
    out = tmp_path / f"{name.replace(' ', '_')}.json"
    out.write_text(json.dumps({"stage": "env", "data": env}))
    return out


def test_no_pilot_is_a_failing_verdict_naming_the_fix(tmp_path, cli):
    path = campaign(tmp_path)
    r = sheet_stage(load_campaign(path), tmp_path / "home", options=False)
    assert r.verdict == "fail" and "no pilot run for campaign 'tiny'" in r.summary
    assert "run `pilotrun pilot" in r.messages[0]
    res = cli("sheet", path, "--home", tmp_path / "home")
    assert res.code == 1 and "pilotrun pilot" in res.out


def test_eval_over_24gib_fails_a_24gib_rental_and_fits_80gib(tmp_path):
    path = campaign(tmp_path, hardware__memory_per_gpu="24GiB")
    home = tmp_path / "home"
    run = record_pilot(path, home, {"load": 4, "first_step": 10, "steady_step": 10, "eval_longest": 30})
    r = sheet_stage(load_campaign(path), home, options=False)
    fit = {f["gpu"]: f for f in r.data["fit"]}
    for key in ("rtx4090", "l4", "a10"):
        assert fit[key]["verdict"] == "does not fit: eval_longest"
    assert fit["a100-80gb"]["fits"] and fit["h100-sxm"]["fits"]
    assert r.verdict == "fail"
    msg = next(p for p in r.data["problems"] if "hardware.memory_per_gpu" in p)
    assert "needs 32.37 GiB per GPU (phase eval_longest" in msg and f"run {run} phase eval_longest" in msg  # (30 + 0.75) / 0.95
    assert r.data["memory"]["source"].startswith(f"measured: run {run} phase eval_longest rank 0")
    assert r.data["memory"]["kind"] == "measured"
    # the terminal table is the fit table
    assert any(row["gpu"] == "L4 24GB" and row["verdict"] == "does not fit: eval_longest" for row in r.rows)
    # the same pilot with an 80 GiB rental: ok
    ok = sheet_stage(load_campaign(path, {"hardware.memory_per_gpu": "80GiB"}), home, options=False)
    assert ok.data["pilot_run"] == run  # found by what it measured: the config sha differs, the rental is no part of it
    assert not any("measured another" in w for w in ok.data["warnings"]), ok.data["warnings"]
    later = sheet_stage(load_campaign(path, {"train.micro_batch": 4}), home, options=False)
    assert later.data["pilot_run"] == run and later.data["warnings"][0].startswith(
        f"the latest pilot {run} measured another setting of train.micro_batch; rerun `pilotrun pilot`")


def test_target_without_bf16_fails_the_stack_check_of_a_bf16_campaign(tmp_path):
    path = campaign(tmp_path, train__precision="bf16-mixed")
    home = tmp_path / "home"
    record_pilot(path, home, {})
    t4 = target_env(tmp_path, "Tesla T4", "7.5", 16, False)
    r = sheet_stage(load_campaign(path), home, target_env_path=str(t4), options=False)
    assert r.verdict == "fail"
    bf16 = next(c for c in r.data["stack"]["checks"] if c["check"] == "bf16")
    assert bf16["verdict"] == "fail" and "compute capability >= 8.0" in bf16["message"]
    assert any(p.startswith("target env: bf16: the campaign uses bf16") for p in r.data["problems"])
    assert r.data["target"]["key"] == "t4"  # the plan is for the target's own GPU
    # the clean case: an H100 target passes every check
    h100 = target_env(tmp_path, "NVIDIA H100 80GB HBM3", "9.0", 80, True)
    ok = sheet_stage(load_campaign(path), home, target_env_path=str(h100), options=False)
    assert {c["check"]: c["verdict"] for c in ok.data["stack"]["checks"]}["bf16"] == "ok"
    assert all(c["verdict"] == "ok" for c in ok.data["stack"]["checks"]), ok.data["stack"]["checks"]
    assert ok.verdict == "ok", ok.data["problems"] + ok.data["warnings"]
    assert ok.data["time"]["scaling"]["kind"] == "measured"  # measured on an H100, planned for an H100


def test_bf16_campaign_marks_t4_in_the_fit_table(tmp_path):
    path = campaign(tmp_path, train__precision="bf16-mixed")
    home = tmp_path / "home"
    record_pilot(path, home, {})
    fit = {f["gpu"]: f for f in sheet_stage(load_campaign(path), home, options=False).data["fit"]}
    assert fit["t4"]["verdict"].startswith("does not fit: no bf16")


def test_time_plan_from_the_ledger_and_an_overflowing_3_day_plan(tmp_path):
    # 2 s per update measured on an H100, 40 training examples / (2 × 2) → 10 updates per epoch;
    # 3000 epochs make 30000 updates ≈ 16.7 h per run; 4 runs overflow 3 days less the 20% reserve.
    path = campaign(tmp_path, train__updates=None, train__epochs=3000, train__eval_every=1000,
                    train__save_every=10000)
    home = tmp_path / "home"
    run = record_pilot(path, home, {})
    r = sheet_stage(load_campaign(path), home, gpu="h100-sxm", options=False)
    tm = r.data["time"]
    assert tm["counts"]["updates"] == 30000 and tm["counts"]["evals"] == 31 and tm["counts"]["eval_batches"] == 2
    terms = {t["term"]: t for t in tm["terms"]}
    assert terms["updates"]["seconds"] == 60000.0 and terms["validations"]["seconds"] == 0.5 * 31 * 2
    # saves at 10000, 20000, 30000; final stands for the last (a reference), no fourth save
    assert terms["first update (optimizer state)"]["seconds"] == 1.0 and terms["checkpoints"]["count"] == 3
    # control predictions: 2 passes over 4 examples = one 8-example eval batch, 0.5 s
    assert terms["control predictions"]["count"] == 1.0 and terms["control predictions"]["seconds"] == 0.5
    assert tm["per_run_s"] == pytest.approx(3 + 1 + 60000 + 31 + 0.5 + 3 * 1 + 2 + 1.5)
    assert tm["measured"]["steady_step"]["source"].startswith(f"run {run} phase steady_step")
    assert [x["label"] for x in tm["runs"]] == ["control seed 0", "variant 1 seed 0", "control seed 1",
                                                "variant 1 seed 1"]
    plans = {p["days"]: p for p in tm["plans"]}
    assert plans[3]["reserve_s"] == pytest.approx(0.2 * 3 * 86400)
    assert len(plans[3]["placed"]) == 3 and plans[3]["not_fitting"] == ["variant 1 seed 1"]
    assert plans[7]["fits_all"] and plans[30]["fits_all"]
    assert r.verdict == "ok"
    assert any("variant 1 seed 1" in line for line in r.messages)


def test_cpu_pilot_is_labelled_as_rss_and_an_extrapolation(tmp_path, cli):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {"first_step": 1.5}, device="cpu")
    out = tmp_path / "sheet.md"
    res = cli("sheet", path, "--home", home, "--out", out, "--json")
    assert res.code == 0, res.err
    data = res.json["data"]
    assert data["time"]["scaling"]["kind"] == "extrapolated from CPU"
    md = out.read_text()
    assert data["memory"]["kind"] == "predicted" and "PREDICTED for CUDA: `pilotrun estimate`'s trace replayed" in md
    assert "RSS peak (CPU)" in md and "never the GPU figure" in md
    assert "EXTRAPOLATION from a CPU measurement" in md and "ratio to the CPU time" in md
    for section in ("## Memory per GPU", "## Settings", "## Software stack", "## Fit table", "## Time plan",
                    "## Costs", "## Launch", "## Expected result", "## Constants"):
        assert section in md
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".sheet.md") or p.endswith(".tmp")]


def test_a_pilot_phase_that_ran_out_of_memory_fails_the_sheet(tmp_path):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {}, verdicts={"eval_longest": "oom"})
    r = sheet_stage(load_campaign(path), home, options=False)
    assert r.verdict == "fail"
    assert any(p.startswith("pilot phase eval_longest rank 0 ended with oom") for p in r.data["problems"])
    assert "no time plan: the pilot lacks a measured duration of eval_longest" in r.data["problems"]
    assert all(not f["fits"] for f in r.data["fit"])


def test_bad_target_env_and_bad_gpu_are_bad_input(tmp_path, cli):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    bad = tmp_path / "bad.json"
    bad.write_text('{"torch": {}}')
    res = cli("sheet", path, "--home", home, "--target-env", bad)
    assert res.code == 2 and "not a `pilotrun env --json` output: missing cuda" in res.err
    res = cli("sheet", path, "--home", home, "--gpu", "v100")
    assert res.code == 2 and "no GPU 'v100' in the built-in catalogue" in res.err and "did you mean" not in res.err
    # a key in other case or a device's name: the keys it may mean, first in the fix
    for given, meant in (("H100", "h100-pcie or h100-sxm"), ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
                         ("rtx 4090", "rtx4090")):
        res = cli("sheet", path, "--home", home, "--gpu", given)
        assert res.code == 2 and f"fix: did you mean {meant}? choose one of: t4, " in res.err, res.err
    # a target env edited by hand: "80GB" was a TypeError (exit 3), -1 failed every phase, a list name exit 3
    good = json.loads(target_env(tmp_path, "NVIDIA H100 80GB HBM3", "9.0", 80, True).read_text())
    for key, value, said in (("memory_bytes", "80GB", "devices[0].memory_bytes is '80GB', not a positive number"),
                             ("memory_bytes", -1, "devices[0].memory_bytes is -1, not a positive number of bytes"),
                             ("name", ["H100"], "devices[0].name is ['H100'], not a GPU's name")):
        doc = json.loads(json.dumps(good))
        doc["data"]["devices"][0][key] = value
        bad.write_text(json.dumps(doc))
        res = cli("sheet", path, "--home", home, "--target-env", bad)
        assert res.code == 2 and f"not a `pilotrun env --json` output: {said}" in res.err, res.err


def test_a_renamed_copy_finds_the_pilot_by_what_it_measured(tmp_path):
    """Issue 43: a copy of the campaign under another name (``minilm-sweep``) lost its pilot ("time plan: not
    compared — no pilot"). The pilot is found by what it measured — model, data by content, shapes, precision —
    whatever the name, budget or learning rate; a copy that changes a measured setting gets the nearest pilot of
    the same model, said as another config's, and a pilot of another model is never taken."""
    import shutil

    path = campaign(tmp_path)
    home = tmp_path / "home"
    run = record_pilot(path, home, {})
    copy = tmp_path / "elsewhere"
    shutil.copytree(path.parent / "data", copy / "data")  # the same data in another folder: compared by content
    raw = yaml.safe_load(path.read_text())
    raw.update(name="tiny-sweep")
    raw["train"].update(lr=0.5, updates=999)
    renamed = write_campaign(copy, raw)
    pilot, stale = find_pilot(Journal(home), "tiny-sweep", load_campaign(renamed).config_sha256(),
                              load_campaign(renamed).resolved_dict())
    assert pilot["run_id"] == run and stale is None
    r = sheet_stage(load_campaign(renamed), home, options=False)
    assert r.data["pilot_run"] == run and not any("pilot" in w for w in r.data["warnings"]), r.data["warnings"]

    raw["train"]["precision"] = "bf16-mixed"
    other = write_campaign(copy, raw, "other.yaml")
    pilot, stale = find_pilot(Journal(home), "tiny-sweep", load_campaign(other).config_sha256(),
                              load_campaign(other).resolved_dict())
    assert pilot["run_id"] == run
    assert stale.startswith(f"no pilot of campaign 'tiny-sweep' measured this config; the nearest is pilot {run} of "
                            "campaign 'tiny', which measured another setting of train.precision")
    (copy / "data" / "train.jsonl").write_text((copy / "data" / "train.jsonl").read_text().replace("word", "ward"))
    raw["train"]["precision"] = "fp32"
    assert "data.train" in find_pilot(Journal(home), "tiny-sweep", "x", load_campaign(renamed).resolved_dict())[1]
    raw["model"]["config"] = dict(raw["model"]["config"], hidden_size=128)
    model = write_campaign(copy, raw, "model.yaml")
    assert find_pilot(Journal(home), "tiny-sweep", "x", load_campaign(model).resolved_dict()) == (None, None)


def test_a_pilot_of_data_since_replaced_at_the_same_path_is_said_as_other_data(tmp_path):
    """Issue 44: the same config (same paths) over a data file replaced since the pilot (same size and mtime: a
    restore, rsync -t) gave a sheet "From pilot run ..." of the old data without a word. The pilot's data is
    compared by content: the sheet says the pilot measured other data, naming the file and both hashes."""
    import os

    path = campaign(tmp_path)
    home = tmp_path / "home"
    run = record_pilot(path, home, {})
    loaded = load_campaign(path)
    assert find_pilot(Journal(home), "tiny", loaded.config_sha256(), loaded.resolved_dict()) == (
        Journal(home).get_run(run), None)  # the clean case: the data it measured
    valid = path.parent / "data" / "validation.jsonl"  # the was the train file
    st = valid.stat()
    valid.write_text(valid.read_text().replace("word", "ward"))  # same size, other bytes, the same mtime
    os.utime(valid, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert valid.stat().st_size == st.st_size
    pilot, stale = find_pilot(Journal(home), "tiny", loaded.config_sha256(), loaded.resolved_dict())
    assert pilot["run_id"] == run and f"the file {valid} holds other data now" in stale, stale
    r = sheet_stage(load_campaign(path), home, options=False)
    assert r.data["pilot_run"] == run and "holds other data now" in r.data["warnings"][0], r.data["warnings"]


def test_prefers_the_pilot_of_the_same_config(tmp_path):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    same = record_pilot(path, home, {})
    record_pilot(path, home, {}, overrides={"train.lr": 0.5})  # a later pilot of another version
    loaded = load_campaign(path)
    pilot, stale = find_pilot(Journal(home), "tiny", loaded.config_sha256())
    assert pilot["run_id"] == same and stale is None


def test_sheet_section_html(tmp_path):
    home = tmp_path / "home"
    assert "run <code>pilotrun pilot CAMPAIGN</code> first" in sheet_section_html(Journal(home))
    path = campaign(tmp_path)
    run = record_pilot(path, home, {})
    frag = sheet_section_html(Journal(home))
    assert frag.startswith("<div class='sheet'><h3>Selection sheet — tiny</h3>") and run in frag and "<table>" in frag
    assert "Time plan" in frag and "Fit table" in frag and "Expected result" in frag


def test_sheet_ends_all():
    from pilotrun.rehearsal.all import STAGES

    assert STAGES[-1][0] == "sheet"


def test_demo_pilot_then_sheet_is_complete(demo_campaign, tmp_path, cli):
    pytest.importorskip("pilotrun.rehearsal.memory.pilot", reason="the pilot stage (issue 3) has not landed yet")
    home = tmp_path / "home"
    p = cli("pilot", demo_campaign, "--home", home, "--json")
    assert p.code == 0, p.err[-2000:]
    out = tmp_path / "sheet.md"
    r = cli("sheet", demo_campaign, "--home", home, "--out", out, "--json")
    assert r.code == 0, r.out[-3000:] + r.err[-2000:]
    data = r.json["data"]
    run = data["pilot_run"]
    assert data["problems"] == [] and data["memory"]["source"].startswith("predicted: the caching allocator's replay")
    assert len(data["fit"]) == 15 and any(f["fits"] for f in data["fit"])
    tm = data["time"]
    assert set(tm["measured"]) == set(PHASES)
    assert all(m["source"].startswith(f"run {run} phase ") for m in tm["measured"].values())
    assert tm["scaling"]["kind"] == "extrapolated from CPU" and tm["per_run_s"] > 0
    assert len(tm["runs"]) == 3 and [p["days"] for p in tm["plans"]] == [3, 7, 30]  # fixture: 1 seed
    md = out.read_text()
    for section in ("## Memory per GPU", "## Settings", "## Software stack", "## Fit table", "## Time plan",
                    "## Expected result", "## Constants"):
        assert section in md
    assert "n/a" not in md.split("## Fit table")[0]


def test_sheet_from_real_pilot_phase_rows(demo_campaign, tmp_path):
    """The rows of the pilot's own phase runner (rehearsal/memory/pilot_phases.py), not hand-written ones."""
    from pilotrun.rehearsal.memory.pilot_phases import PilotJob, run_phases

    loaded = load_campaign(demo_campaign)
    home = tmp_path / "home"
    j = Journal(home)
    run = j.create_run(kind="pilot", name=loaded.c.name, **run_provenance(loaded))
    j.run_dir(run).mkdir(parents=True)
    j.add_phase_rows(run, run_phases(PilotJob(loaded, str(home), run, str(j.run_dir(run)), None)))
    j.finish_run(run, "completed")
    r = sheet_stage(loaded, home, options=False)
    assert r.verdict == "ok", r.data["problems"] + r.data["warnings"]
    assert r.data["counter"] == "tensors+rss" and r.data["time"]["work"]["params"] > 0
    assert r.data["target"]["key"] == "rtx4090"  # the demo's hardware.memory_per_gpu is 24GiB; fp32 → fastest
    assert r.data["time"]["counts"]["updates"] == 12


RATES = "currency: USD\nh100-sxm: 2.0\na100-80gb:\n  hour: 1.5\n  7: 150.0\nl40s: {30: 700}\n"


def long_campaign(tmp_path):
    """30000 updates of 2 s measured on an H100: ~16.7 h per run, 4 runs (see the time plan test)."""
    return campaign(tmp_path, train__updates=None, train__epochs=3000, train__eval_every=1000,
                    train__save_every=10000)


def test_costs_from_a_rates_file_and_the_cheapest_plan_that_places_every_run(tmp_path, cli):
    path = long_campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {}, params=7_000_000_000)
    rates = tmp_path / "rates.yaml"
    rates.write_text(RATES)
    r = sheet_stage(load_campaign(path), home, gpu="h100-sxm", rates_path=str(rates), options=False)
    co = r.data["costs"]
    rows = {(x["gpu"], x["days"]): x for x in co["rows"]}
    assert rows[("h100-sxm", 3)]["cost"] == 2.0 * 24 * 3 and not rows[("h100-sxm", 3)]["fits_all"]
    assert rows[("h100-sxm", 7)]["cost"] == 2.0 * 24 * 7 and rows[("h100-sxm", 7)]["fits_all"]
    assert rows[("a100-80gb", 7)]["cost"] == 150.0 and rows[("a100-80gb", 7)]["how"].startswith("7-day price 150")
    assert rows[("a100-80gb", 30)]["cost"] == 1.5 * 24 * 30
    assert rows[("l40s", 3)]["cost"] is None and rows[("l40s", 30)]["cost"] == 700.0
    plans = {p["days"]: p for p in r.data["time"]["plans"]}
    assert rows[("h100-sxm", 3)]["placed"] == len(plans[3]["placed"])
    placing = [x for x in co["rows"] if x["fits_all"] and x["cost"] is not None]
    best = min(placing, key=lambda x: (x["cost"], x["days"] or 0))
    assert {k: co["cheapest"][k] for k in ("gpu", "days", "cost")} == {k: best[k] for k in ("gpu", "days", "cost")}
    # 66.7 h of campaign: by the hour (133.39 on the H100) is cheaper than any 7-day plan
    assert co["cheapest"]["plan"] == "hourly" and co["cheapest"]["gpu"] == "h100-sxm"
    assert r.data["launch"]["gpu"] == co["cheapest"]["gpu"] and r.data["launch"]["days"] == 7  # the tier that holds it
    md = r.data["markdown"]
    assert "## Costs" in md and f"Cheapest plan that places every run: {co['cheapest']['gpu']}, the hourly plan" in md
    assert "USD" in md and "No costs" not in md
    assert f"cheapest hourly plan h100-sxm {co['cheapest']['cost']:,.2f} USD" in r.summary
    # a 7B model's update is compute, not the launch floor: no latency-bound sentence
    assert not [w for w in r.data["time"]["why"] if "latency-bound" in w]
    assert "latency-bound" not in md


@pytest.mark.parametrize("text, where, what", [
    ("h100-sxm: 2.0\nv100: 1.0\n", "rates.yaml:2: v100", "no GPU 'v100' in the built-in catalogue"),
    ("h100-sxm: -1\n", "rates.yaml:1: h100-sxm", "price -1 is not a number >= 0"),
    # a decimal comma is text to YAML: the fix gives the number as YAML reads one
    ("h100-sxm: 2,49\n", "rates.yaml:1: h100-sxm", "price '2,49' is not a number >= 0\n  fix: write 2.49 (a decimal "
                                                   "point: YAML reads 2,49 as text)"),
    ("a100-80gb: {hour: 1, week: 5}\n", "rates.yaml:1: a100-80gb", "unknown key(s) 'week'"),
    ("h100-sxm: [\n", "rates.yaml:2", "invalid YAML"),
    # a price YAML keeps the last of, one GPU under two names, a price that is not a finite number, a currency the
    # sheet's Markdown table would split: each read without a word before
    ("h100-sxm: 2\nh100-sxm: 3\n", "rates.yaml:2", "key 'h100-sxm' appears twice in one mapping (lines 1 and 2)"),
    ("H100: 2\nh100-sxm: 3\n", "rates.yaml:2: h100-sxm", "'h100-sxm' and 'H100' both name h100-sxm"),
    ("h100-sxm: .nan\n", "rates.yaml:1: h100-sxm", "price nan is not a number >= 0"),
    ("a100-80gb: {hour: 1, 7: .inf}\n", "rates.yaml:1: a100-80gb.7", "price inf is not a number >= 0"),
    ("currency: 'US|D'\nh100-sxm: 2\n", "rates.yaml:1: currency", "currency 'US|D' is not a short word or symbol"),
    ("h100-sxm: 2\ninterconnect: {inter_node_gbs: .nan}\n", "rates.yaml:2: interconnect.inter_node_gbs",
     "inter_node_gbs nan is not a bandwidth > 0"),
    # an exponent past a float: a price of 0, silently (the GPU would have been free)
    ("h100-sxm: 2\na100-80gb: {hour: 1e-400}\n", "rates.yaml:2", "1e-400 is smaller than any number a float holds"),
    # the campaign given as the rates: "name: no GPU 'name' in the built-in catalogue"
    ("name: x\ntask: causal-lm\nmodel: {path: m}\n", "rates.yaml", "none of its keys names a GPU (name, task, model): "
                                                                  "it is a campaign file, not a rates file"),
])
def test_a_bad_rates_file_is_bad_input_naming_line_and_key(tmp_path, cli, text, where, what):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    rates = tmp_path / "rates.yaml"
    rates.write_text(text)
    out = tmp_path / "sheet.md"
    res = cli("sheet", path, "--home", home, "--rates", rates, "--out", out)
    assert res.code == 2 and where in res.err and what in res.err, res.err
    assert not out.exists()  # nothing half-written


def test_a_price_in_yamls_exponent_form_is_a_number(tmp_path):
    """YAML 1.1 reads 2e0 and 1.5e2 (no dot or no exponent sign) as strings: they are prices as written."""
    from pilotrun.sheet.rates import read_rates

    rates = tmp_path / "rates.yaml"
    rates.write_text("currency: €\nh100-sxm: 2e0\na100-80gb: {hour: '1.5', 7: 1.5e2}\n")
    got = read_rates(rates)
    assert got["currency"] == "€" and got["gpus"]["h100-sxm"]["hour"] == 2.0
    assert got["gpus"]["a100-80gb"] == {"hour": 1.5, "plans": {7: 150.0}}


def test_one_written_to_line_naming_the_sheet_and_its_launch_files(tmp_path, cli):
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    out = tmp_path / "out" / "sheet.md"
    res = cli("sheet", path, "--home", home, "--out", out, "--gpu", "a100-80gb")
    assert res.code == 0, res.out + res.err
    text = " ".join((res.out + res.err).split())  # the terminal wraps long lines
    assert text.count("written to") == 1, text
    assert f"written to {out.parent}: sheet.md, sheet.commands.sh, sheet.sky.yaml, sheet.sbatch" in text
    sky = yaml.safe_load((out.parent / "sheet.sky.yaml").read_text())
    assert sky["resources"]["accelerators"] == "A100-80GB:1"


def test_a_sheet_never_replaces_the_campaign_or_a_launch_file_of_the_users(tmp_path, cli):
    # `sheet c.yaml --out c.yaml` replaced the campaign with the sheet, and `--out train.md` the user's own
    # train.sbatch with pilotrun's: exit 2 naming the file, before anything is written; a sheet and launch files of
    # pilotrun's are replaced as before (the clean case)
    from pilotrun.sheet.launch import LAUNCH_HEADS

    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    before = path.read_bytes()
    res = cli("sheet", path, "--home", home, "--out", path, "--gpu", "a100-80gb")
    assert res.code == 2 and path.read_bytes() == before, (res.code, res.err)
    assert "holds a file that is no selection sheet of pilotrun's (its first line:" in res.err, res.err
    out = tmp_path / "out" / "train.md"
    out.parent.mkdir()
    mine = out.parent / "train.sbatch"
    mine.write_text("#!/bin/bash\nsrun python my_train.py\n")
    res = cli("sheet", path, "--home", home, "--out", out, "--gpu", "a100-80gb")
    assert res.code == 2 and f"{mine}: holds a file that is no launch file of pilotrun's" in res.err, res.err
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.sbatch"] and "my_train" in mine.read_text()
    mine.unlink()
    for _ in range(2):  # written, then written again over its own files
        res = cli("sheet", path, "--home", home, "--out", out, "--gpu", "a100-80gb")
        assert res.code == 0, res.out + res.err
    for suffix, first in LAUNCH_HEADS.items():  # each launch file begins as the check expects
        assert (out.parent / f"train{suffix}").read_bytes().startswith(first), suffix


def test_the_campaign_time_is_the_busiest_lanes_and_gpus_beyond_the_runs_are_said_idle(tmp_path):
    # 4 runs on 3 lanes take two runs' time: the sheet said 4/3 of one; 64 GPUs said a 16th of a run's time, and
    # 2**70 GPUs were an OverflowError (exit 3) packing that many lanes
    path = campaign(tmp_path)  # control and one variant, seeds 0 and 1: 4 runs
    home = tmp_path / "home"
    record_pilot(path, home, {})
    for gpus, lanes, rounds in ((3, 3, 2), (2**70, 4, 1)):
        r = sheet_stage(load_campaign(path, {"hardware.gpus": gpus}), home, options=False)
        tm = r.data["time"]
        assert (tm["lanes"], len(tm["runs"])) == (lanes, 4)
        assert tm["campaign_s"] == pytest.approx(rounds * tm["per_run_s"])
        target = next(f for f in r.data["fit"] if f["name"] == r.data["target"]["name"])
        assert target["campaign_s"] == pytest.approx(tm["campaign_s"])
        idle = [w for w in r.data["warnings"] if "would stay idle" in w]
        assert idle == ([f"hardware.gpus={gpus}: 4 run(s) of 1 GPU(s) each keep 4 busy, and {gpus - 4} would stay "
                         "idle the whole rental (paid for); set hardware.gpus: 4, or give each run more ranks "
                         "(train.nproc)"] if gpus > 4 else []), idle


def test_a_sheet_sent_to_a_pipe_is_written_into_it_and_the_pipe_stays(tmp_path, cli):
    # --out /dev/null or /dev/stdout: the sheet used to be renamed over the device (as root, /dev/null became a
    # plain file) and its launch files and wheel were written into /dev
    import stat
    import threading

    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    out = tmp_path / "pipe" / "sheet.md"
    out.parent.mkdir()
    os.mkfifo(out)
    got = {}
    reader = threading.Thread(target=lambda: got.update(data=out.read_bytes()), daemon=True)
    reader.start()
    res = cli("sheet", path, "--home", home, "--out", out, "--gpu", "a100-80gb")
    reader.join(30)
    assert res.code == 0, res.out + res.err
    assert stat.S_ISFIFO(os.lstat(out).st_mode)
    assert got["data"].decode().startswith("# Selection sheet")
    assert sorted(p.name for p in out.parent.iterdir()) == ["sheet.md"]  # no launch files, no wheel beside a pipe
    text = " ".join((res.out + res.err).split())
    assert f"written to {out}; no launch files: it is not a file in a folder" in text, text


def test_a_sheet_to_a_link_replaces_the_file_it_names_and_keeps_the_link(tmp_path, cli):
    # the sheet was renamed over the link itself: a `latest.md -> runs/sheet.md` link became a plain file
    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {})
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "sheet.md"
    target.write_text("# Selection sheet — an earlier one\n")  # pilotrun's: replaced (a file of the user's is not)
    link = tmp_path / "latest.md"
    link.symlink_to(target)
    res = cli("sheet", path, "--home", home, "--out", link, "--gpu", "a100-80gb")
    assert res.code == 0, res.out + res.err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text().startswith("# Selection sheet")


def test_an_mi300x_target_needs_a_rocm_build_of_torch(tmp_path):
    path = campaign(tmp_path, train__precision="bf16-mixed")
    home = tmp_path / "home"
    record_pilot(path, home, {})
    mi = target_env(tmp_path, "AMD Instinct MI300X", "9.4", 192, True)
    r = sheet_stage(load_campaign(path), home, target_env_path=str(mi), options=False)
    rocm = next(c for c in r.data["stack"]["checks"] if c["check"] == "rocm")
    assert rocm["verdict"] == "fail" and "install torch from the ROCm wheel index" in rocm["message"]
    assert r.data["target"]["key"] == "mi300x" and r.verdict == "fail"
    env = json.loads(mi.read_text())
    env["data"]["cuda"]["hip"] = "6.4.43482"
    mi.write_text(json.dumps(env))
    ok = sheet_stage(load_campaign(path), home, target_env_path=str(mi), options=False)
    assert {c["check"]: c["verdict"] for c in ok.data["stack"]["checks"]}["rocm"] == "ok"
    assert "rocm" not in {c["check"] for c in sheet_stage(load_campaign(path), home, target_env_path=str(
        target_env(tmp_path, "NVIDIA H100 80GB HBM3", "9.0", 80, True)), options=False).data["stack"]["checks"]}


SHEET_IN_A_PROCESS = (
    "import json, sys\n"
    "from pilotrun.campaign.load import load_campaign\n"
    "from pilotrun.rehearsal.rental.sheet import sheet_stage\n"
    "r = sheet_stage(load_campaign(sys.argv[1]), sys.argv[2])\n"
    "print(json.dumps({'imported': sorted(m for m in ('torch', 'transformers') if m in sys.modules),\n"
    "                  'data': r.data}, default=str))\n")


def _without_walls(value):
    if isinstance(value, dict):
        return {k: _without_walls(v) for k, v in value.items() if k != "wall_s"}
    if isinstance(value, list):
        return [_without_walls(v) for v in value]
    return value


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_the_next_sheet_reads_its_estimates_from_the_home_without_importing_torch(tmp_path):
    """A CPU pilot's sheet estimates GPU memory, the largest sizes and the options table, and keeps them in the
    home: the next sheet of the same campaign, files and pilotrun, in a fresh process, reads them back without
    reading the data or importing torch or transformers, and is the same sheet; a changed data file (the planted
    change) is another key, estimated again."""
    import subprocess
    import sys

    path = campaign(tmp_path)
    home = tmp_path / "home"
    record_pilot(path, home, {"first_step": 1.5}, device="cpu")

    def sheet() -> dict:
        p = subprocess.run([sys.executable, "-c", SHEET_IN_A_PROCESS, str(path), str(home)], capture_output=True,
                           text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        return json.loads(p.stdout)

    first, second = sheet(), sheet()
    assert first["imported"] == ["torch", "transformers"]  # the first sheet traced the estimator
    assert first["data"]["options"] and first["data"]["largest"]["micro_batch"]["value"]
    assert second["imported"] == []
    assert _without_walls(second["data"]) == _without_walls(first["data"])
    assert len(list((home / "traces").glob("*.json.gz"))) >= 3  # the traces and the three results kept
    train = path.parent / "data" / "train.jsonl"
    train.write_text(train.read_text() + train.read_text().splitlines()[0] + "\n")
    assert sheet()["imported"] == ["torch", "transformers"]  # another data file: estimated again


def test_the_users_words_in_the_sheet_file_keep_their_line_and_show_their_controls():
    """A campaign name, a label or a path is the user's: written raw, "a\\nb" ended the sheet's heading and a table
    row early, and an escape sequence in it ran when the file was printed with cat (the terminal already escaped)."""
    from pilotrun.sheet.render import to_html, to_lines, to_markdown

    evil = "a\nb\t|c \x1b]0;PWNED\x07\u202eevil"
    sheet = {"blocks": [("h", "Selection sheet — " + evil), ("p", evil), ("list", [evil]),
                        ("table", ["campaign", "GiB"], [[evil, 1.5]])]}
    md = to_markdown(sheet)
    assert not any(ch in md for ch in "\x1b\x07\u202e\t")
    lines = md.splitlines()
    assert lines[0] == "# Selection sheet — a\\nb\\t|c \\x1b]0;PWNED\\x07\\u202eevil"
    row = next(x for x in lines if x.startswith("| a"))
    assert row.startswith("| a\\nb\\t\\|c \\x1b]0;PWNED\\x07\\u202eevil |") and row.rstrip().endswith("|")
    assert len([x for x in lines if x.startswith("|")]) == 3  # header, rule, the one row: nothing split
    assert lines[2].startswith("a b ") and lines[2].endswith("|c \\x1b]0;PWNED\\x07\\u202eevil")  # wrapped as before
    for text in (to_html(sheet), "\n".join(to_lines(sheet))):
        assert not any(ch in text for ch in "\x1b\x07\u202e") and "\\x1b]0;PWNED" in text
