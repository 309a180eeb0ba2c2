"""The sheet's time plan against the sweep's clock (rehearsal/training/timecheck.py), and in the report."""

from __future__ import annotations

import pytest
import yaml

from conftest import write_campaign, write_demo_dir
from pilotrun.sheet import plan as P
from pilotrun.sheet import shape


@pytest.fixture(scope="module")
def piloted_sweep(tmp_path_factory):
    """(home, sweep result): one pilot and its two-run sweep of the demo, shared by the tests that only read
    them (the campaign is ``home.parent / "campaign.yaml"``)."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.pilot import pilot
    from pilotrun.rehearsal.training.sweep import sweep

    demo_dir = write_demo_dir(tmp_path_factory.mktemp("timecheck"))
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e-3}], seeds=[0])
    write_campaign(demo_dir, c)
    home = demo_dir / "home"
    assert pilot(load_campaign(path), home).verdict == "ok"
    return home, sweep(load_campaign(path), home, progress=False)


def test_each_run_is_predicted_from_the_pilots_units_for_the_work_it_did(piloted_sweep, cli, tmp_path):
    from pilotrun.journal.store import Journal

    home, result = piloted_sweep
    check = result.data["time_check"]
    assert check["pilot_run"] and len(check["runs"]) == 2
    u = check["units"]
    j = Journal(home)
    pilot = j.get_run(check["pilot_run"])["summary"]
    assert pilot["prepare_s"] > 0 and shape.TYPICAL_UPDATES <= len(pilot["time_model"]["typical"]) <= shape.TYPICAL_MAX
    # and the validation's batches shorter than its worst: the one of median tokens and the shortest, timed bare
    tm = pilot["time_model"]
    shorter = [tok for tok in tm["eval_batch_tokens"] if tok < tm["worst_eval_tokens"]]
    timed = [p["tokens"] for p in tm["typical_eval"]]
    assert shorter and 1 <= len(timed) <= 2 and min(shorter) in timed and set(timed) <= set(shorter)
    assert sorted(shorter)[len(shorter) // 2] in timed
    assert all(p["seconds"] > 0 for p in tm["typical_eval"])
    for i, r in enumerate(check["runs"]):
        s = j.get_run(r["run_id"])["summary"]
        n = s["counts"]
        # validations 0, 6, 12; saves 6, 12 (final stands for update 12's checkpoint: a reference, no save)
        assert n == {"updates": 12, "evals": 3, "checkpoints": 2, "exports": 0}
        terms = {t["term"]: t for t in r["terms"]}
        assert terms["updates"]["seconds"] == pytest.approx(12 * u["update"])
        assert terms["checkpoints"]["count"] == 2 and "export" not in terms and "reload check" not in terms
        batches = terms["validation predictions"]["count"]
        assert terms["validations"]["count"] == 3 * batches
        # the first run reads the data and builds cold; the second reuses the encoded data and builds warm
        # (the demo's model is built from a config: the pilot timed a second, warm build for the later runs)
        assert u["warm_load"] == pilot["time_model"]["warm_load_s"] > 0
        start = pilot["prepare_s"] + u["load"] if i == 0 else u["warm_load"]
        assert ("read and encode the data" in terms) == (i == 0)
        assert s["timing"]["prepare_s"] > 0 if i == 0 else s["timing"]["prepare_s"] < 1e-3
        # every run starts (memory handed back, journal entry) and stores its control predictions, both timed
        # by the pilot as a run does them
        assert u["run_overhead"] == pilot["run_overhead_s"] > 0
        # a later run hands memory back in a process that built models: the pilot's release after its phases
        assert u["warm_run_overhead"] == pilot["warm_run_overhead_s"] >= pilot["run_overhead_s"]
        overhead = u["run_overhead"] if i == 0 else u["warm_run_overhead"]
        assert terms["control predictions"]["count"] == 1
        assert u["control"] == pilot["time_model"]["control_s"] > 0
        # update 12 saved: final stands for that checkpoint once its files are checked, as the pilot checked its own
        assert u["final_ref"] == pilot["final_ref_s"] > 0 and s["timing"]["final_ref_s"] > 0
        assert terms[P.FINAL_REF_TERM]["count"] == 1
        # on CPU the run's watch counted its first updates (and each new record of length) exactly: each costs what
        # the pilot's counted steady_step took over the same inputs timed bare
        probed = {row["phase"]: row["inputs"]["probed"] for row in j.phase_rows(r["run_id"])}
        assert 2 <= probed["observed_train"] < 12
        rows = {row["phase"]: row for row in j.phase_rows(check["pilot_run"])}
        assert u["exact_update"] == pytest.approx(max(0.0, rows["steady_step"]["duration_s"]
                                                      - pilot["time_model"]["worst_update_s"]))
        assert terms[P.EXACT_UPDATES_TERM]["count"] == probed["observed_train"]
        exact = probed["observed_train"] * u["exact_update"]
        assert r["predicted_s"] == pytest.approx(overhead + start + u["first_extra"] + 12 * u["update"]
                                                 + 4 * batches * u["eval_batch"] + u["control"] + 2 * u["save"]
                                                 + u["final_ref"] + exact)
        assert s["timing"]["run_overhead_s"] > 0 and s["timing"]["control_s"] > 0
        # no pilotrun process was started here (the library was called): no start-up on either side
        assert pilot["startup_s"] is None and s["timing"]["startup_s"] is None
        assert r["actual_s"] == s["timing"]["total_s"] > s["timing"]["loop_s"] > 0
        groups = {b["term"]: b for b in r["breakdown"]}
        assert groups["control predictions"]["actual_s"] == pytest.approx(s["timing"]["control_s"])
        assert groups["run start (memory freed, journal entry)"]["predicted_s"] == pytest.approx(overhead)
        assert groups["checkpoints"]["predicted_s"] == pytest.approx(2 * u["save"] + u["final_ref"])
        assert groups["checkpoints"]["actual_s"] == pytest.approx(s["timing"]["blocks_s"]["save"]
                                                                   + s["timing"]["final_ref_s"])
    assert check["predicted_s"] == pytest.approx(sum(r["predicted_s"] for r in check["runs"]))
    assert check["ratio"] == pytest.approx(check["predicted_s"] / check["actual_s"])
    text = "\n".join(result.messages)
    assert f"predicted ÷ actual {check['ratio']:.2f}" in text
    assert "memory bound: the largest observed ÷ pilot peak over 2 run(s)" in text
    outside = not 0.9 <= check["ratio"] <= 1.1
    assert ("WARNING time plan out of range" in text) == outside  # and then the sweep is not OK
    if outside:
        assert result.verdict != "ok", (result.verdict, check["ratio"])

    out = tmp_path / "r.html"
    assert cli("report", "--home", home, "--out", out).code == 0
    html = out.read_text()
    assert "Campaign against the pilot: memory bound and time plan" in html
    assert "<th>predicted ÷ actual</th>" in html and f"<td>{check['ratio']:.2f}</td>" in html
    for r in check["runs"]:
        assert html.count(r["run_id"]) >= 2  # in the memory table and the time table


def test_the_first_run_of_a_process_is_planned_from_the_process_start():
    """Start-up (Python, imports, the command's checks) is a term: the pilot's own against the sweep's first
    run, one group with the data and the cold load, since where an import happens only moves time between them."""
    from pilotrun.rehearsal.training.timecheck import actual_seconds, breakdown, run_prediction

    units = {"load": 2.0, "reload": 0.1, "first_extra": 0.5, "update": 1.0, "eval_batch": 0.2, "save": 0.3,
             "export": 0.4, "run_overhead": 0.25, "warm_run_overhead": 0.35, "final_ref": 0.15}
    counts = {"updates": 10, "evals": 2, "checkpoints": 1, "exports": 0}
    first = run_prediction(units, counts, 3, True, first=True, prepare_s=1.5, startup_s=4.0, control_passes=0.5,
                           final_ref=True)
    names = [t["term"] for t in first]
    assert names[:3] == ["start-up (process start, imports, the command's checks)", "read and encode the data",
                         "run start (memory freed, journal entry)"]
    assert "load (cold: the pilot's load)" in names
    assert sum(t["seconds"] for t in first) == pytest.approx(4.0 + 1.5 + 0.25 + 2.0 + 0.5 + 10 + (6 + 0.5 + 3) * 0.2
                                                               + 0.3 + 0.15)
    later = run_prediction(units, counts, 3, True, first=False, prepare_s=1.5, startup_s=None, control_passes=0.5)
    assert "load (warm: the pilot's reload)" in [t["term"] for t in later]
    # its memory handed back in a process that built a model: the pilot's release after its phases
    assert [t["seconds"] for t in later if t["term"] == "run start (memory freed, journal entry)"] == [0.35]
    assert not {"start-up (process start, imports, the command's checks)", "read and encode the data"} & \
        {t["term"] for t in later}
    # the sweep imported the model's code in its checks: its first load is quick, its start-up long
    timing = {"startup_s": 5.2, "prepare_s": 0.1, "load_s": 0.05, "run_overhead_s": 0.3, "control_s": 0.1,
              "predictions_s": 0.6, "blocks_s": {"train": 10.4, "evaluation": 1.3, "save": 0.3}, "total_s": 13.9,
              "final_ref_s": 0.2}
    assert actual_seconds(timing) == pytest.approx(13.9 + 5.2)
    rows = {r["term"]: r for r in breakdown(first, timing)}
    start = rows["start-up, data and cold load (1st run)"]
    assert start["predicted_s"] == pytest.approx(4.0 + 1.5 + 2.0) and start["actual_s"] == pytest.approx(5.35)
    assert rows["run start (memory freed, journal entry)"]["actual_s"] == pytest.approx(0.3)
    # the final reference (its checkpoint's files checked) is a checkpoint's time, not left unplanned
    assert rows["checkpoints"]["predicted_s"] == pytest.approx(0.3 + 0.15)
    assert rows["checkpoints"]["actual_s"] == pytest.approx(0.3 + 0.2)
    rest = rows["not planned (records, between blocks)"]
    assert rest["actual_s"] == pytest.approx(19.1 - (5.35 + 0.3 + 10.4 + 1.3 + 0.3 + 0.2 + 0.1 + 0.6))


def test_start_up_is_taken_once_per_process_and_only_in_a_pilotrun_process(monkeypatch):
    from pilotrun import startup

    monkeypatch.setattr(startup, "_STATE", startup._Start())
    assert startup.take() is None  # a library call: nothing marked, the host process's start is not ours
    monkeypatch.setattr(startup, "_STATE", startup._Start())
    startup.mark()
    first = startup.take()
    assert first is not None and first > 0  # this test process started before now
    assert startup.take() is None  # the next run of the same process builds warm and pays no start-up


def test_a_plan_off_by_half_is_reported_outside_the_goal():
    from pilotrun.rehearsal.training.timecheck import time_lines

    run = {"run_id": "r1", "arm": "control", "seed": 0, "predicted_s": 5.0, "actual_s": 10.0, "ratio": 0.5,
           "updates": 12, "status": "completed"}
    lines = time_lines({"pilot_run": "p", "runs": [run], "predicted_s": 5.0, "actual_s": 10.0, "ratio": 0.5,
                        "goal": (0.9, 1.1)})
    assert "predicted ÷ actual 0.50 (OUTSIDE 0.9–1.1)" in lines[0]
    assert lines[1].strip().startswith("r1") and "(0.50; 12 updates, completed)" in lines[1]
    ok = time_lines({"pilot_run": "p", "runs": [dict(run, ratio=1.02)], "predicted_s": 10.2, "actual_s": 10.0,
                     "ratio": 1.02, "goal": (0.9, 1.1)})
    assert "(within 0.9–1.1)" in ok[0]


def test_a_time_plan_out_of_range_makes_the_sweep_warn():
    from pilotrun.rehearsal.training.timecheck import time_plan_warning

    run = {"run_id": "r1", "arm": "control", "seed": 0, "predicted_s": 5.0, "actual_s": 10.0, "ratio": 0.5,
           "updates": 12, "status": "completed"}
    check = {"pilot_run": "p", "runs": [run], "predicted_s": 5.0, "actual_s": 10.0, "ratio": 0.5, "goal": (0.9, 1.1)}
    assert time_plan_warning(check).startswith("WARNING time plan out of range: predicted ÷ actual 0.50 is outside")
    assert time_plan_warning(dict(check, ratio=1.02)) is None
    assert time_plan_warning({"pilot_run": None, "runs": [], "why": "no pilot"}) is None


def test_sweep_without_pilot_is_not_compared(demo_dir):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.training.sweep import sweep

    r = sweep(load_campaign(demo_dir / "campaign.yaml"), demo_dir / "home", progress=False)
    assert r.data["time_check"]["pilot_run"] is None
    assert any(m.startswith("time plan: not compared — no pilot of campaign") for m in r.messages)


def test_updates_are_costed_at_the_budgets_mean_shape_not_the_worst_case():
    from pilotrun.sheet.shape import fit_line, scaled_units

    a, b = fit_line([(1000, 1.1), (100, 0.2), (500, 0.6)])
    assert a == pytest.approx(0.1) and b == pytest.approx(0.001)
    assert fit_line([(1000, 1.0), (100, 0.5), (200, 0.2)])[0] >= 0  # a negative intercept falls back to the origin
    model = {"worst_update_tokens": 1000, "typical": [{"tokens": 100, "seconds": 0.2}, {"tokens": 500, "seconds": 0.6}],
             "budget_update_tokens": [100, 300, 200], "worst_eval_tokens": 400, "eval_batch_tokens": [400, 200]}
    u = scaled_units(model, steady_s=1.1, eval_s=0.8)
    assert u["update"] == pytest.approx(0.1 + 0.001 * 200)  # the mean of 100, 300, 200 tokens
    share = 0.1 / 1.1
    assert u["eval_batch"] == pytest.approx(0.8 * ((share + (1 - share)) + (share + (1 - share) * 0.5)) / 2)
    # even lengths: the worst case is the mean, nothing changes
    even = dict(model, budget_update_tokens=[1000, 1000], eval_batch_tokens=[400])
    assert scaled_units(even, 1.1, 0.8)["update"] == pytest.approx(1.1)
    assert scaled_units(even, 1.1, 0.8)["eval_batch"] == pytest.approx(0.8)
    assert scaled_units({"worst_update_tokens": 0}, 1.0, 1.0) is None


def test_validation_batches_are_costed_on_the_validations_own_timed_line():
    """A forward pass's fixed share is not the update's: the update's line (fixed 0.1 s of 1.1 s) reads a validation
    batch of a quarter of the worst's tokens at 0.32 of it, where the pilot timed 0.5 (a validation with a larger
    fixed cost per pass). With the batches the pilot timed, the validation's own line prices each batch."""
    from pilotrun.sheet.shape import scaled_units

    def ev(tokens):  # the validation's own cost: fixed 0.2 s + 0.6 ms per padded token
        return 0.2 + 6e-4 * tokens

    model = {"worst_update_tokens": 1000, "typical": [{"tokens": 100, "seconds": 0.2}, {"tokens": 500, "seconds": 0.6}],
             "budget_update_tokens": [1000], "worst_eval_tokens": 1000, "eval_batch_tokens": [1000, 1000, 250, 500]}
    true = sum(map(ev, model["eval_batch_tokens"])) / 4
    share_only = scaled_units(model, steady_s=1.1, eval_s=ev(1000))["eval_batch"]
    assert share_only < 0.95 * true  # the planted defect: the update's share under-reads the short batches
    timed = dict(model, typical_eval=[{"tokens": 500, "seconds": ev(500)}, {"tokens": 250, "seconds": ev(250)}])
    u = scaled_units(timed, steady_s=1.1, eval_s=ev(1000))
    assert u["eval_batch"] == pytest.approx(true)
    assert "validation batches costed on the line through the worst and 2 timed batches" in u["text"]


def test_the_pilot_times_more_typical_updates_while_cheap_and_the_minimum_across_ranks():
    from pilotrun.sheet.shape import TYPICAL_MAX, TYPICAL_UPDATES, more_typical

    def timed(*seconds):
        return [{"tokens": 500, "seconds": s} for s in seconds]

    assert more_typical([]) and more_typical(timed(*[5.0] * (TYPICAL_UPDATES - 1)))  # the minimum, whatever they take
    assert not more_typical(timed(*[5.0] * TYPICAL_UPDATES))
    assert more_typical(timed(*[0.05] * TYPICAL_UPDATES)) and not more_typical(timed(*[0.05] * TYPICAL_MAX))
    assert not more_typical(timed(*[0.05] * TYPICAL_UPDATES), world=2)  # ranks must time the same count
    # past the budget, more while a sample was slowed by other work (and the samples stay under TYPICAL_BUSY_S)
    busy = timed(0.4, 3.9, 0.42)
    assert more_typical(busy, worst=(500, 0.41))
    assert not more_typical(timed(0.4, 0.45, 0.42) * 1 + timed(0.41), worst=(500, 0.41))  # over 1 s, none slowed
    assert not more_typical(timed(0.4, 4.9, 0.42), worst=(500, 0.41))  # over TYPICAL_BUSY_S: what was timed stands
    assert not more_typical(busy, world=2, worst=(500, 0.41))


def test_a_sample_slowed_by_other_work_is_left_out_of_the_updates_line():
    """MiniLM's pilot on a shared 2-core machine timed updates of 0.2 s as 2.6-4.5 s when another process took a
    core (torch's two threads then wait on each other): the least-squares line carried that to every update of
    the budget (the plan read 4.17 × the sweep). A sample far above the line through the others is left out."""
    from pilotrun.sheet.shape import scaled_units, slowed

    def secs(tokens):  # the quiet machine's cost of an update: fixed 0.05 s + 0.3 ms per padded token
        return 0.05 + 3e-4 * tokens

    typical = [{"tokens": t, "seconds": secs(t)} for t in (480, 512, 448, 500, 470)]
    model = {"worst_update_tokens": 1024, "typical": typical, "budget_update_tokens": [480, 500, 470, 520]}
    clean = scaled_units(model, steady_s=secs(1024), eval_s=0.1)
    assert clean["slowed"] == 0 and clean["update"] == pytest.approx(secs(492.5))
    # planted: the worst case and one typical sample slowed 10x by another process
    busy = dict(model, typical=[dict(typical[1], seconds=10 * secs(512))] + [typical[0]] + typical[2:])
    u = scaled_units(busy, steady_s=10 * secs(1024), eval_s=0.1)
    assert u["slowed"] == 2 and u["update"] == pytest.approx(secs(492.5), rel=0.02)
    assert "2 of these 6 samples left out" in u["text"] and "slowed by other work" in u["text"]
    # uneven lengths with a large fixed cost are not slowed samples: a short update above a line through the origin
    assert slowed([(1000, 1.1), (1000, 1.1), (1000, 1.12), (100, 0.2)]) == []
    assert slowed([(1000, 1.1), (100, 0.2), (500, 0.6), (300, 0.4)]) == []
    # never half of the samples or more: of four, two slowed, one leaves (the pilot then times more: see above)
    assert slowed([(500, 0.4), (500, 4.0), (500, 4.1), (500, 0.41)]) == [2]


def test_the_sweeps_eta_reads_the_time_plan_without_tracing(piloted_sweep, monkeypatch):
    """The sweep's progress ETA comes from the pilot's time plan alone: the estimator's traces (GPU memory,
    largest sizes) once took ~10 s of every sweep's start-up, seconds no term of the plan holds."""
    import pilotrun.sheet.gpu_memory as GM
    import pilotrun.sheet.sizes as SZ
    from pilotrun.campaign.load import load_campaign
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.training.sweep import _planned_run_s

    home, result = piloted_sweep
    demo_dir = home.parent
    calls = []
    monkeypatch.setattr(GM, "predict_rows", lambda *a, **k: calls.append("predict_rows"))
    monkeypatch.setattr(SZ, "largest_sizes", lambda *a, **k: calls.append("largest_sizes"))
    per_run = _planned_run_s(Journal(home), load_campaign(demo_dir / "campaign.yaml"))
    assert calls == []
    from pilotrun.rehearsal.training.timecheck import exact_blocks
    from pilotrun.sheet.build import build_sheet

    j = Journal(home)
    sheet = build_sheet(load_campaign(demo_dir / "campaign.yaml").resolved_dict(), j,
                        j.get_run(result.data["time_check"]["pilot_run"]), predict=False)
    here = sheet["time"]["here"]
    assert per_run == pytest.approx(here["per_run_s"]) == pytest.approx(sum(t["seconds"] for t in here["terms"]))
    # a run of the plan loads its model cold, as each run on a rented GPU does: the pilot's load, where the sweep's
    # later run builds warm, and neither starts a process nor reads the data, as the sweep's first run does (the
    # terms, not their totals: a cold and a warm load of the demo's small model differ by less than the machine's
    # noise in the other terms, and `later < per_run` failed on a slow machine)
    plan = {t["unit"]: t for t in here["terms"]}
    first, later = ({t["unit"]: t for t in r["terms"]} for r in result.data["time_check"]["runs"])
    assert plan["load"]["each_s"] == here["units"]["load"] and later["load"]["each_s"] == here["units"]["warm_load"]
    assert "prepare" in first and "prepare" not in later and "prepare" not in plan
    # the plan's count of updates under the memory counter is the one its runs' watch made (the same seed's draws)
    counts = sheet["time"]["counts"]
    for r in result.data["time_check"]["runs"]:
        assert exact_blocks(j, r["run_id"]) == {"exact_updates": counts["exact_updates"]}


def test_the_sweeps_eta_counts_the_sweeps_own_budget_not_the_pilots(piloted_sweep):
    """A sweep run with another budget than its pilot's (``--set train.updates=…``) is timed by the pilot's
    units for its own updates: the ETA of a 12-update sweep once said
    the minutes of the pilot's 200 updates."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.training.sweep import _planned_run_s

    home, result = piloted_sweep
    demo_dir = home.parent
    as_piloted = load_campaign(demo_dir / "campaign.yaml")
    updates = as_piloted.campaign.train.updates
    longer = load_campaign(demo_dir / "campaign.yaml", {"train.updates": updates * 4})
    base, four = _planned_run_s(Journal(home), as_piloted), _planned_run_s(Journal(home), longer)
    # at least the 3 × updates more updates at the pilot's seconds each (more validations and checkpoints too)
    assert base and four and four - base >= 3 * updates * result.data["time_check"]["units"]["update"] * 0.999


def test_every_term_of_a_runs_prediction_has_its_group():
    """The breakdown's groups take the plan's units per phase kind (``plan.KIND_UNITS``): every term a run's
    prediction can hold lands in one group, so a phase added to the registry is compared, never dropped."""
    from pilotrun.phases.registry import KINDS
    from pilotrun.rehearsal.training.timecheck import GROUPS, run_prediction
    from pilotrun.sheet import plan as P

    units = {u: 1.0 for k in KINDS for u in P.KIND_UNITS[k]}
    counts = {"updates": 3, "evals": 2, "checkpoints": 1, "exports": 1}
    for first in (True, False):
        for extra in ({}, {"run_overhead": 0.5, "control": 0.25, "warm_run_overhead": 0.6, "final_ref": 0.1}):
            terms = run_prediction(dict(units, **extra), counts, 2, True, first=first, prepare_s=1.0,
                                   startup_s=1.0, control_passes=1.0, final_ref=bool(extra))
            for t in terms:
                homes = [g for g, us, _ in GROUPS if t["unit"] in us or f"{t['unit']}:{t['term']}" in us]
                assert len(homes) == 1, (t, homes)
    grouped = {u.split(":")[0] for _, us, _ in GROUPS for u in us}
    assert {u for k in KINDS if k != "reload" for u in P.KIND_UNITS[k]} <= grouped  # a sweep run reloads nothing


def test_the_final_references_check_is_timed_whole_or_scaled_from_a_sample(tmp_path, monkeypatch):
    """The pilot times the check of its checkpoint's files (the final reference's cost in a run): whole up to
    ``FINAL_REF_SAMPLE`` bytes, else that many bytes hashed and scaled by the checkpoint's size (a large model's
    checkpoint is not hashed whole by the pilot)."""
    import json

    from pilotrun.provenance import file_sha256
    from pilotrun.rehearsal.memory import pilot as pilot_mod

    ckpt = tmp_path / "pilot"
    ckpt.mkdir()
    (ckpt / "model.safetensors").write_bytes(b"x" * (3 << 20))
    (ckpt / "optimizer.pt").write_bytes(b"y" * (1 << 20))
    files = {f.name: {"sha256": file_sha256(f), "bytes": f.stat().st_size} for f in ckpt.iterdir()}
    (ckpt / "manifest.json").write_text(json.dumps({"files": files}))
    assert pilot_mod._final_reference_s(tmp_path / "none") is None
    whole = pilot_mod._final_reference_s(ckpt)
    assert whole is not None and whole > 0
    monkeypatch.setattr(pilot_mod, "FINAL_REF_SAMPLE", 1 << 20)  # a quarter of the 4 MiB: scaled by 4
    hashed = []
    real = __import__("hashlib").sha256

    class Counting:
        def __init__(self):
            self.h = real()

        def update(self, b):
            hashed.append(len(b))
            self.h.update(b)

    monkeypatch.setattr("hashlib.sha256", Counting)
    scaled = pilot_mod._final_reference_s(ckpt)
    assert sum(hashed) == 1 << 20 and scaled > 0


def test_the_typical_updates_are_chosen_at_the_budgets_quantiles_of_tokens():
    """The uneven campaign's sampler drew the worst case's 8192 tokens in all its first updates: the line through
    them went through the origin and, as an update's cost grows faster than its tokens (attention), read 1.075 × the
    sweep's updates. Samples at the budget's quantiles of tokens make the line's value at the budget's mean their
    mean cost."""
    import random

    from pilotrun.sheet.shape import TYPICAL_QUANTILES, scaled_units, typical_order

    assert typical_order([544] * 40)[:4] == [0, 1, 2, 3]  # even lengths: the sampler's first updates
    assert sorted(typical_order([500, 100])) == [0, 1] and typical_order([]) == []
    rng = random.Random(0)
    budget = [8192] * 6 + [rng.choice([8192, 8192, 6144, 4096, 2560, 1820]) for _ in range(300)]
    order = typical_order(budget)
    assert len(order) == len(TYPICAL_QUANTILES) == len(set(order))
    ranked = sorted(budget)
    assert budget[order[0]] == ranked[len(ranked) // 2] and budget[order[1]] == ranked[round(0.1 * 299)]

    def cost(tokens):  # linear layers plus attention's square
        return 0.02 + 6e-5 * tokens + 4e-9 * tokens ** 2

    true = sum(cost(x) for x in budget) / len(budget)
    model = {"worst_update_tokens": 8192, "budget_update_tokens": budget}
    first = scaled_units(dict(model, typical=[{"tokens": x, "seconds": cost(x)} for x in budget[:3]]),
                         steady_s=cost(8192), eval_s=0.1)
    assert first["update"] / true > 1.05  # the old choice: every sample at the worst case's shape
    for n in (3, 5, len(order)):
        picked = [{"tokens": budget[i], "seconds": cost(budget[i])} for i in order[:n]]
        assert abs(scaled_units(dict(model, typical=picked), steady_s=cost(8192), eval_s=0.1)["update"] / true - 1) \
            < 0.03, n
