"""fit: variants measured through the loop's functions, checked against the control's losses."""

from __future__ import annotations

import math

import pytest
import yaml

from conftest import TINY_LLAMA, tiny_causal_campaign

# The logits (micro_batch × seq_len × vocab floats, several copies in forward and backward) dominate
# this model's activations, so halving the micro-batch moves the RSS peak by ~100 MiB — well
# above the probe's CPU margin (fit_probe.margin) and RSS noise.
LOGITS_HEAVY = dict(TINY_LLAMA, vocab_size=32768)


def _in_fresh_process(body, tmp_path) -> None:
    """Run ``body(tmp_path)`` in a new interpreter, as ``pilotrun fit`` runs from the command line.

    RSS peaks are process-wide: inside a long pytest process the heap left by earlier tests absorbs
    new allocations without raising the high-water mark, and the gap between two variants collapses.
    """
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(body, tmp_path, child))
    p.start()
    child.close()
    err = parent.recv() if parent.poll(300) else "timed out"
    p.join(60)
    assert err is None, err


def _child(body, tmp_path, conn) -> None:
    import traceback

    try:
        body(tmp_path)
        conn.send(None)
    except BaseException:  # noqa: BLE001 - sent to the parent as the failure's text
        conn.send(traceback.format_exc())


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"instruction": "reverse " + "w" * (20 + (i * 7) % 20), "output": "x" * (20 + (i * 5) % 20)}
            for i in range(start, start + n)]


def _loaded(tmp_path, name="c", n_val=8, **overrides):
    from pilotrun.campaign.load import load_campaign

    kw = dict(model__config=dict(LOGITS_HEAVY), data__max_length=64, train__micro_batch=8, train__accumulation=2,
              train__eval_batch=2)
    kw.update(overrides)
    return load_campaign(tiny_causal_campaign(tmp_path / name, _records(32), _records(n_val, 100), **kw))


def _measure(loaded, kind, **overrides):
    from pilotrun.rehearsal.memory.fit_probe import probe, variant_prep
    from pilotrun.campaign.prepare import prepare

    prep = prepare(loaded, splits=("train", "validation"))
    return probe(variant_prep(prep, loaded.with_overrides(overrides)) if overrides else prep, kind)


def _between(big: dict, small: dict) -> int:
    """A limit halfway between two measured peaks; the gap must leave room for the CPU margin."""
    from pilotrun.probe.recorder import peak_of
    from pilotrun.rehearsal.memory.fit_probe import margin

    hi, lo = peak_of(big), peak_of(small)
    limit = (hi + lo) // 2
    assert hi - limit > 2**20 and limit - margin(limit, "cpu") - lo > 2**20, (hi, lo)
    return limit


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_halved_micro_batch_with_doubled_accumulation_fits_and_matches(tmp_path):
    _in_fresh_process(_halved_micro_batch, tmp_path)


def _halved_micro_batch(tmp_path):
    from pilotrun.rehearsal.memory.fit import fit
    from pilotrun.rehearsal.memory.fit_rules import FP32_RTOL

    loaded = _loaded(tmp_path)
    control = _measure(loaded, "train")
    half = _measure(loaded, "train", **{"train.micro_batch": 4, "train.accumulation": 4})
    limit = _between(control, half)
    out = tmp_path / "fitted" / "campaign.yaml"
    out.parent.mkdir()
    r = fit(loaded, tmp_path / "home", limit, write=str(out), pilot_rows=[dict(control, verdict="over-budget")])

    assert r.verdict == "ok", r.messages
    assert "exceeds" in r.messages[0] and f"at phase {control['phase']} (micro_batch 8" in r.messages[0]
    a = r.data["variants"][0]
    assert r.data["chosen"] == a["variant"] == "a: micro-batch"
    assert a["overrides"] == {"train.micro_batch": 4, "train.accumulation": 4}
    assert r.data["control_batch"] == "8 × 2 × 1 = 16 per update; 4 updates; 64 examples"
    assert a["batch"] == "4 × 4 × 1 = 16 per update; 4 updates; 64 examples"
    assert a["loss_gap"] <= FP32_RTOL and len(a["losses"]) == 3
    assert a["same_experiment"].startswith("yes")
    assert len(a["tried"]) <= math.ceil(math.log2(3)) + 1  # candidates 1, 2, 4
    written = out.read_text()
    assert "# changed: train.micro_batch: 8 -> 4; train.accumulation: 2 -> 4" in written
    assert "# why: the control exceeded the memory limit" in written
    new = yaml.safe_load(written)
    assert new["train"]["micro_batch"] == 4 and new["train"]["accumulation"] == 4
    assert (out.parent / new["data"]["train"]).is_file() or new["data"]["train"].startswith("/")


def test_eval_bound_campaign_gets_a_smaller_eval_batch(tmp_path):
    _in_fresh_process(_eval_bound, tmp_path)


def _eval_bound(tmp_path):
    from pilotrun.rehearsal.memory.fit import fit

    loaded = _loaded(tmp_path, n_val=16, train__micro_batch=1, train__accumulation=4, train__eval_batch=16)
    control = _measure(loaded, "eval")
    smaller = _measure(loaded, "eval", **{"train.eval_batch": 6})
    limit = _between(control, smaller)
    train_row = _measure(loaded, "train")
    assert train_row["fits"] is True or train_row["peak_allocated"] < limit  # only the evaluation is over
    r = fit(loaded, tmp_path / "home", limit, pilot_rows=[dict(train_row, verdict="ok"),
                                                          dict(control, verdict="over-budget")])
    b = r.data["variants"][0]
    assert r.verdict == "ok" and r.data["chosen"] == b["variant"] == "b: eval batch"
    assert 6 <= b["overrides"]["train.eval_batch"] < 16
    assert b["same_experiment"] == "yes: training is unchanged"
    assert len(b["tried"]) <= math.ceil(math.log2(15)) + 1
    assert not any(v["variant"].startswith("a") for v in r.data["variants"])  # no micro-batch for an eval peak


@pytest.mark.slow  # RSS gap between two lengths is noisy when the 2 cores are shared
def test_shorter_max_length_is_flagged_when_it_cuts_targets(tmp_path):
    from pilotrun.rehearsal.memory.fit import fit
    from pilotrun.campaign.prepare import prepare

    # micro_batch 1: no smaller micro-batch; a wider vocabulary so that the length moves the peak
    loaded = _loaded(tmp_path, train__micro_batch=1, train__accumulation=2, data__max_length=96,
                     model__config=dict(LOGITS_HEAVY, vocab_size=65536))
    control = _measure(loaded, "train")
    short = _measure(loaded.with_overrides({"data.max_length": 40}), "train")
    limit = _between(control, short)
    r = fit(loaded, tmp_path / "home", limit, pilot_rows=[dict(control, verdict="over-budget")])
    e = next(v for v in r.data["variants"] if v["variant"] == "e: max_length")
    length = e["overrides"]["data.max_length"]
    full = prepare(loaded, splits=("train", "validation"))
    cut = prepare(loaded.with_overrides({"data.max_length": length}), splits=("train", "validation"))
    expected = sum(b.n_targets < a.n_targets for s in ("train", "validation")
                   for a, b in zip(full.examples[s], cut.examples[s]))
    assert expected > 0 and e["targets_cut"] == expected
    assert e["same_experiment"] == (f"changes the experiment: data.max_length={length} cuts the target tokens of "
                                    f"{expected} of 40 examples")
    assert r.data["chosen"] is None and r.verdict in ("warn", "fail")


def test_targets_cut_is_zero_for_a_length_that_cuts_nothing(tmp_path):
    from pilotrun.rehearsal.memory.fit import _Fit
    from pilotrun.rehearsal.memory.fit_variants import _targets_cut
    from pilotrun.campaign.prepare import prepare

    loaded = _loaded(tmp_path, data__max_length=96)
    job = _Fit(loaded, prepare(loaded, splits=("train", "validation")), 2**30, 16, None)
    assert _targets_cut(job, job.variant({"data.max_length": 90})) == (0, 40)
    assert _targets_cut(job, job.variant({"data.max_length": 30}))[0] > 0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 100])
def test_bisection_finds_the_largest_fit_within_the_probe_bound(n):
    from pilotrun.rehearsal.memory.fit_rules import probe_bound
    from pilotrun.rehearsal.memory.fit_probe import largest_fitting

    cands = list(range(1, n + 1))
    for threshold in range(0, n + 1):  # candidates up to threshold fit
        best, tried = largest_fitting(cands, lambda x: x <= threshold)
        assert best == (threshold or None)
        assert len(tried) <= probe_bound(n) == (math.ceil(math.log2(n)) + 1 if n > 1 else 1)


def test_unreachable_effective_batch_names_the_keys(tmp_path, cli):
    from pilotrun.errors import BadInput
    from pilotrun.rehearsal.memory.fit_rules import accumulation_for, micro_batch_candidates

    loaded = _loaded(tmp_path, train__strategy="ddp", train__nproc=3, train__micro_batch=2, train__accumulation=2)
    with pytest.raises(BadInput) as e:
        accumulation_for(loaded.c.train, 1, 16)
    assert "16 examples per update cannot be reached" in str(e.value) and "on 3 ranks" in str(e.value)
    assert e.value.where == "train.micro_batch, train.accumulation, train.nproc"
    assert accumulation_for(loaded.c.train, 1, 12) == 4
    assert micro_batch_candidates(loaded.c.train, 12) == [1]
    res = cli("fit", loaded.source, "--memory-limit", "1GiB", "--effective-batch", "16")
    assert res.code == 2 and "cannot be reached" in res.err


def test_weights_bound_phase_never_gets_accumulation(tmp_path):
    from pilotrun.rehearsal.memory.fit import fit

    loaded = _loaded(tmp_path)
    load_row = {"phase": "load", "inputs": {"dtype": "float32"}, "verdict": "over-budget", "counter": "rss",
                "peak_allocated": 2**31, "peak_reserved": None}
    r = fit(loaded, tmp_path / "home", 2**30, pilot_rows=[load_row])
    names = [v["variant"] for v in r.data["variants"]]
    assert not any(n.startswith(("a", "b", "c")) for n in names), names
    assert any("cannot fix it" in m and "optimizer state" in m for m in r.messages)
    d = r.data["variants"][0]
    assert d["overrides"] == {"train.precision": "bf16-true"} and d["changes_experiment"]


def test_control_that_fits_needs_nothing(tmp_path):
    from pilotrun.rehearsal.memory.fit import fit

    loaded = _loaded(tmp_path)
    row = {"phase": "steady_step", "inputs": {}, "verdict": "ok", "counter": "rss", "peak_allocated": 2**28,
           "peak_reserved": None}
    r = fit(loaded, tmp_path / "home", 2**30, pilot_rows=[row])
    assert r.verdict == "ok" and "nothing to change" in r.summary and not r.rows


def test_cli_fit_runs_or_reuses_the_control_and_reports(tmp_path, cli):
    loaded = _loaded(tmp_path, model__config=dict(TINY_LLAMA))
    res = cli("fit", loaded.source, "--memory-limit", "64GiB", "--json", "--home", tmp_path / "home")
    assert res.code == 0, res.err
    assert res.json["verdict"] == "ok" and "nothing to change" in res.json["summary"]
    assert res.json["data"]["limit"] == 64 * 2**30


@pytest.mark.parametrize("value", ["0", "-1"])
def test_an_effective_batch_below_one_is_refused(cli, demo_campaign, tmp_path, value):
    # it was taken: "variants keep -1 examples per update instead of the control's 16"
    r = cli("fit", demo_campaign, "--memory-limit", "1GiB", "--effective-batch", value, "--home", tmp_path / "h")
    assert r.code == 2 and "Invalid value for '--effective-batch'" in r.err and "x>=1" in r.err, r.err
    assert not (tmp_path / "h").exists()
