"""preference.reference: precomputed — the starting model's log-probabilities of every pair, computed once before
training and stored with each checkpoint under the pairs' fingerprint; no reference model resident afterwards.
Each on the Stack Exchange pairs of ../shared/data: the values equal the frozen copy's, overfit and the resume
worker read them, a stored set whose pairs changed is refused (exit 2), the estimator traces the precomputation
phase and the options table knows no reference is resident."""

from __future__ import annotations

import json

import pytest
from conftest import write_jsonl
from preference_data import by_question, preference_campaign, short_pairs

from pilotrun.campaign.load import load_campaign
from pilotrun.campaign.prepare import prepare

PRE = {"preference__reference": "precomputed"}


def _campaign(tmp_path, records=None, **over):
    return preference_campaign(tmp_path, records or short_pairs(chars=48)[:8], data__max_length=96, **PRE, **over)


def _started(prep, n: int = 8, stop_at: int = 2, total: int = 4):
    """The starting model of ``prep``, trained to ``stop_at`` of ``total`` updates on its first ``n`` pairs."""
    import torch

    from pilotrun.engine.loop import Hooks, make_state, train

    torch.manual_seed(0)
    state = make_state(prep.task.build_model(), prep.c.train, n_train=n, seed=0, total_updates=total)
    result = train(state, prep.task, prep.train[:n], [], prep.c.train, hooks=Hooks(stop_at=stop_at))
    assert result.status == "completed", result.reason
    return state


def test_precomputed_reference_is_the_frozen_copys_and_no_model_is_resident(tmp_path):
    import torch

    from pilotrun.engine.loop import make_state, precompute_reference, to_device
    from pilotrun.tasks.preference_loss import reference_of
    from pilotrun.tasks.preference_ref import table_of

    for loss in ("dpo", "ipo"):  # summed, and the mean per token
        folder = tmp_path / loss
        copy = prepare(load_campaign(_campaign(folder), {"preference.reference": "copy", "preference.loss": loss}),
                       splits=("train",))
        pre = prepare(load_campaign(_campaign(folder), {"preference.loss": loss}), splits=("train",))
        torch.manual_seed(0)
        with_copy = copy.task.build_model()
        torch.manual_seed(0)
        model = pre.task.build_model()
        assert reference_of(model) is None and reference_of(with_copy) is not None  # nothing beside the policy
        pairs = pre.train[:4]
        state = make_state(model, pre.c.train, n_train=4, seed=0, total_updates=1)
        assert precompute_reference(model, pre.task, pairs, device=state.device, precision="fp32", batch_size=3) == 4
        assert len(table_of(model)) == 4
        batch = to_device(pre.task.collate(pairs), state.device)
        want = copy.task.reference_logps(with_copy, batch)
        got = pre.task.reference_logps(model, batch)
        for a, b in zip(got, want):
            assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (loss, a, b)
        # the pairs already stored are not computed again
        assert precompute_reference(model, pre.task, pairs, device=state.device, precision="fp32", batch_size=3) == 0


def test_a_resumed_run_reads_the_stored_log_probabilities_and_refuses_them_once_the_pairs_changed(tmp_path, cli):
    from pilotrun.engine.loop import make_state, precompute_reference
    from pilotrun.engine.state import load_state, save_state
    from pilotrun.tasks.preference_ref import FILE, table_of

    path = _campaign(tmp_path)
    prep = prepare(load_campaign(path), splits=("train",))
    state = _started(prep)
    stored = {k: v[1] for k, v in table_of(state.model).entries.items()}
    ckpt = save_state(state, tmp_path / "ckpt")
    assert FILE in json.loads((ckpt / "manifest.json").read_text())["files"]

    # clean: a fresh build of the starting model, the checkpoint loaded: the stored values, nothing recomputed
    fresh = prep.task.build_model()
    resumed = make_state(fresh, prep.c.train, n_train=8, seed=0, total_updates=4)
    assert "reference_logps" in load_state(resumed, ckpt)
    assert {k: v[1] for k, v in table_of(fresh).entries.items()}.keys() == stored.keys()
    assert all(table_of(fresh).entries[k][1] == v for k, v in stored.items())  # each float32 value exactly
    assert precompute_reference(fresh, prep.task, prep.train[:8], device=resumed.device, precision="fp32",
                                batch_size=4, update=resumed.update) == 0
    spec = {"config": str(path), "state": str(ckpt), "n_train": 8, "total": 4, "out": str(tmp_path / "out.json")}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = cli("_resume-worker", tmp_path / "spec.json")
    assert r.code == 0, r.err
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["status"] == "completed" and "reference_logps" in out["restored"]
    assert [h["update"] for h in out["history"]] == [3, 4]

    # planted: the data changed after the run started (one rejected answer rewritten): refused, exit 2
    records = short_pairs(chars=48)[:8]
    records[5]["response_k"] = "An answer written after the run started."
    write_jsonl(tmp_path / "data" / "train.jsonl", records)
    r = cli("_resume-worker", tmp_path / "spec.json")
    assert r.code == 2, r.err
    assert f"{ckpt / FILE}" in r.err
    assert "1 pair(s) changed since they were computed (first: " in r.err and "train.jsonl:6" in r.err
    assert "recomputing them now would take the trained policy as the reference" in r.err
    assert "start a new run" in r.err

    # planted: a checkpoint without the stored set (written by a build that lost it): refused, not recomputed
    from pilotrun.tasks.preference_ref import TABLE_ATTR

    write_jsonl(tmp_path / "data" / "train.jsonl", short_pairs(chars=48)[:8])
    del state.model.__dict__[TABLE_ATTR]
    save_state(state, tmp_path / "bare")
    spec["state"] = str(tmp_path / "bare")
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    r = cli("_resume-worker", tmp_path / "spec.json")
    assert r.code == 2 and "8 pair(s) have none stored" in r.err, r.err


def test_the_train_run_stores_the_set_with_its_data_fingerprint_in_the_journal_and_its_checkpoint(tmp_path, cli):
    from pilotrun.journal.store import Journal
    from pilotrun.tasks.preference_ref import FILE, ReferenceLogps

    r = cli("train", _campaign(tmp_path), "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    run = Journal(tmp_path / "home").get_run(r.json["data"]["run_id"])
    said = run["summary"]["reference_logps"]
    stored = ReferenceLogps.load(tmp_path / "home" / "runs" / run["run_id"] / "checkpoints" / "final" / FILE)
    assert said == {"pairs": 8, "fingerprint": stored.fingerprint()} and len(stored) == 8
    assert run["summary"]["timing"]["reference_s"] > 0  # the pass the time plan's reference term predicts


def test_the_run_holds_no_more_than_its_pilot_however_many_pairs_it_stores(tmp_path, cli):
    """A run stores every pair's reference log-probabilities, its pilot only its worst case's. The table is host
    memory, which a GPU never holds, so the exact tensor counter (a GPU's allocated bytes, on the CPU) must not count
    it. Held as tensors it did, in every phase, and stacked again at each save: the run's save read 1.0000348 × the
    pilot's on 25 pairs, and 1.000112 × on 115, more as the data grows."""
    from pilotrun.journal.store import Journal

    train, validation = by_question(short_pairs(chars=48))
    train = [dict(r, question=f"{r['question']} ({k})") for k in range(3) for r in train]  # 54 distinct pairs
    path = preference_campaign(tmp_path, train, validation, data__max_length=96, train__updates=4,
                               train__save_every=2, **PRE)
    home = tmp_path / "home"
    pilot = cli("pilot", path, "--home", home, "--json")
    assert pilot.code == 0, pilot.err
    r = cli("train", path, "--home", home, "--json")
    assert r.code == 0, r.err
    run = Journal(home).get_run(r.json["data"]["run_id"])
    assert run["summary"]["reference_logps"]["pairs"] == len(train) + len(validation)  # the pilot: its phases' few
    kinds = run["summary"]["memory_bound"]["kinds"]
    assert {"train", "save"} <= set(kinds)
    for kind, k in kinds.items():
        assert k["counter"] == "tensors+rss" and k["ratio"] <= 1.0, (kind, k)


def test_a_stored_set_edited_by_hand_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    from pilotrun.errors import BadInput
    from pilotrun.tasks.preference_ref import FILE, ReferenceLogps

    prep = prepare(load_campaign(_campaign(tmp_path)), splits=("train",))
    from pilotrun.tasks.preference_ref import table_of

    table_of(_started(prep, stop_at=1).model).save(tmp_path)
    assert len(ReferenceLogps.load(tmp_path / FILE)) == 8  # clean: read back whole
    from safetensors import safe_open

    with safe_open(str(tmp_path / FILE), framework="pt") as f:
        meta = f.metadata()
    rids = json.loads(meta["rids"])
    save_file(load_file(str(tmp_path / FILE)), str(tmp_path / FILE),
              metadata=dict(meta, rids=json.dumps(rids[::-1])))  # the values now belong to other pairs
    with pytest.raises(BadInput, match="do not match their own fingerprint"):
        ReferenceLogps.load(tmp_path / FILE)


def test_overfit_memorises_pairs_against_the_precomputed_reference(tmp_path):
    from pilotrun.rehearsal.mechanics.overfit import overfit

    r = overfit(load_campaign(_campaign(tmp_path)), tmp_path / "home", examples=4, max_updates=40, sized=False)
    assert r.verdict == "ok", r.messages
    text = "\n".join(r.messages)
    assert "preference accuracy 4/4 (1.00)" in text and "the reference did not move" in text


def test_the_estimate_traces_the_precomputation_and_the_options_table_knows_no_reference_is_resident(tmp_path):
    from pilotrun.probe.trace import trace
    from pilotrun.sheet.options import options_table
    from pilotrun.sheet.options_view import params_said

    path = _campaign(tmp_path)
    pre = trace(load_campaign(path), device="cpu")["rows"]
    copy = trace(load_campaign(path, {"preference.reference": "copy"}), device="cpu")["rows"]
    assert [r["phase"] for r in pre] == ["load", "precompute_reference", "first_step", "steady_step", "eval_longest",
                                         "save", "export", "reload"]
    assert "precompute_reference" not in [r["phase"] for r in copy]  # a phase of the precomputed reference only
    row = {r["phase"]: r for r in pre}
    assert row["load"]["inputs"]["reference"] == "precomputed"
    assert row["precompute_reference"]["inputs"]["eval_batch"] == 4
    assert row["load"]["parameters"] * 2 == pytest.approx({r["phase"]: r for r in copy}["load"]["parameters"],
                                                          rel=1e-3)  # the policy alone: no copy beside it
    assert row["precompute_reference"]["peak_allocated"] > row["load"]["peak_allocated"]  # the no-grad forward
    table = options_table(load_campaign(path), gpus=[])
    assert table["reference"] == {"kind": "precomputed", "bytes": 0}
    said = params_said(table)
    assert "precomputed once before training" in said and "no reference model is resident" in said
    assert "no longer resident" not in table["meanings"]["lora"]  # LoRA drops no copy: there is none


def test_the_pilot_measures_the_precomputation_phase_and_the_estimate_matches_it_per_phase(tmp_path):
    from pilotrun.rehearsal.memory.estimate import estimate
    from pilotrun.rehearsal.memory.pilot import pilot

    train, validation = by_question(short_pairs(chars=96))
    loaded = load_campaign(preference_campaign(tmp_path, train, validation, data__max_length=128, **PRE))
    result = pilot(loaded, tmp_path / "home")
    assert result.verdict == "ok", result.messages
    rows = {r["phase"]: r for r in result.data["rows"]}
    assert "precompute_reference" in rows and "reference_bytes" not in rows["load"]["inputs"]
    assert rows["precompute_reference"]["inputs"]["pairs"] >= 4
    measured = {k: r["peak_allocated"] for k, r in rows.items()}
    predicted = {r["phase"]: r["peak_allocated"] for r in estimate(loaded, device="cpu").data["phases"]}
    assert predicted.keys() == measured.keys()
    off = {k: (predicted[k], v) for k, v in measured.items() if abs(predicted[k] - v) > 0.05 * v}
    assert not off, off
    # the time plan counts every run's pass over all its pairs, in validation batches (before: no term at all)
    from pilotrun.journal.store import Journal
    from pilotrun.sheet.build import build_sheet
    from pilotrun.sheet.plan import REFERENCE_TERM

    journal = Journal(tmp_path / "home")
    sheet = build_sheet(loaded.resolved_dict(), journal, journal.get_run(result.data["run_id"]), predict=False)
    terms = {t["term"]: t for t in sheet["time"]["here"]["terms"]}
    batch = loaded.campaign.train.eval_batch
    assert terms[REFERENCE_TERM]["count"] == -(-(len(train) + len(validation)) // batch)
    assert terms[REFERENCE_TERM]["each_s"] == terms["validations"]["each_s"] > 0


def _precompute_on_rank(campaign_path: str, out: str) -> None:
    """One DDP rank (module level: pickled into the spawned processes): the precomputation over every pair, which
    pairs this rank ran through the model itself, and its whole table."""
    import torch

    from pilotrun.engine.distributed import gather_to_rank0, world_rank, wrap_model
    from pilotrun.engine.loop import precompute_reference

    world, rank = world_rank()
    prep = prepare(load_campaign(campaign_path), splits=("train", "validation"))
    torch.manual_seed(0)
    model = wrap_model(prep.task.build_model(), "ddp", torch.device("cpu"))
    ran, store = [], prep.task.store_reference
    prep.task.store_reference = lambda m, b, ex: (ran.extend(e.rid for e in ex), store(m, b, ex))[1]
    n = precompute_reference(model, prep.task, prep.train + prep.validation, device=torch.device("cpu"),
                             precision="fp32", batch_size=2, shared=True)
    table = prep.task.reference_table(model)
    got = gather_to_rank0({"rank": rank, "world": world, "n": n, "ran": ran,
                           "entries": {rid: [fp, list(v)] for rid, (fp, v) in table.entries.items()}})
    if rank == 0:
        from pathlib import Path

        Path(out).write_text(json.dumps(got))


@pytest.mark.distributed
def test_ddp_ranks_each_precompute_their_share_and_hold_the_whole_table(tmp_path):
    """Under DDP each rank ran every pair through the model (a run on 8 GPUs paid 8 × the pass); now each runs its
    share and the values are gathered: every rank's table holds every pair, equal to one process's values."""
    import torch

    from pilotrun.engine.distributed import launch
    from pilotrun.engine.loop import precompute_reference

    train, validation = by_question(short_pairs(chars=48))
    path = preference_campaign(tmp_path, train[:7], validation[:2], data__max_length=96, train__strategy="ddp",
                               train__nproc=2, **PRE)
    launch(_precompute_on_rank, 2, (str(path), str(tmp_path / "ranks.json")))
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    prep = prepare(load_campaign(path), splits=("train", "validation"))
    torch.manual_seed(0)
    model = prep.task.build_model()
    everything = prep.train + prep.validation
    assert precompute_reference(model, prep.task, everything, device=torch.device("cpu"), precision="fp32",
                                batch_size=2) == len(everything) == 9
    single = prep.task.reference_table(model).entries
    ran = [set(r["ran"]) for r in ranks]
    assert [len(s) for s in ran] == [5, 4] and not ran[0] & ran[1], ran  # each its share, none twice
    for r in ranks:
        assert r["world"] == 2 and r["n"] == 9 and r["entries"].keys() == single.keys()
        for rid, (fp, values) in r["entries"].items():
            assert fp == single[rid][0] and values == pytest.approx(list(single[rid][1]), rel=1e-5, abs=1e-5)
