"""The comparison arithmetic on known numbers: t intervals, pairing by seed, verdicts, failures counted."""

import math

import pytest

from pilotrun.rehearsal.training import compare as cmp


def _runs(arm, values, statuses=None):
    statuses = statuses or ["completed"] * len(values)
    return [{"run_id": f"{arm}-{s}", "arm": arm, "seed": s, "status": st, "at_budget": v,
             "best": None if v is None else v - 0.1} for s, (v, st) in enumerate(zip(values, statuses))]


def test_t_quantiles_match_the_t_table():
    assert cmp.t975(1) == pytest.approx(12.706)
    assert cmp.t975(2) == pytest.approx(4.303)
    assert cmp.t975(9) == pytest.approx(2.262)
    assert cmp.t975(30) == pytest.approx(2.042)
    assert cmp.t975(40) == pytest.approx(2.021, abs=1e-3)
    assert cmp.t975(120) == pytest.approx(1.980, abs=1e-3)
    with pytest.raises(ValueError):
        cmp.t975(0)


def test_summary_of_known_numbers():
    s = cmp.summarize([1.0, 2.0, 3.0])
    assert s["n"] == 3 and s["mean"] == pytest.approx(2.0) and s["std"] == pytest.approx(1.0)
    half = 4.303 / math.sqrt(3)
    assert s["lo"] == pytest.approx(2.0 - half) and s["hi"] == pytest.approx(2.0 + half)
    one = cmp.summarize([5.0])
    assert one["mean"] == 5.0 and one["std"] is None and one["lo"] is None  # one seed: no interval
    assert cmp.summarize([float("nan"), None])["n"] == 0


def test_pairing_by_seed_detects_what_unpaired_intervals_cannot():
    control = {0: 1.0, 1: 2.0, 2: 3.0}
    variant = {0: 0.8, 1: 1.78, 2: 2.82}  # 0.2, 0.22, 0.18 lower on every seed
    d = cmp.paired_difference(control, variant)
    assert d["seeds"] == [0, 1, 2] and d["diffs"] == pytest.approx([-0.2, -0.22, -0.18])
    assert d["mean"] == pytest.approx(-0.2) and d["std"] == pytest.approx(0.02)
    half = 4.303 * 0.02 / math.sqrt(3)
    assert d["lo"] == pytest.approx(-0.2 - half) and d["hi"] == pytest.approx(-0.2 + half)
    assert cmp.decide(d, "minimize") == cmp.BETTER
    assert cmp.decide(d, "maximize") == cmp.WORSE
    # the arms' own intervals overlap completely: only the pairing shows the difference
    a, b = cmp.summarize(control.values()), cmp.summarize(variant.values())
    assert a["lo"] < b["hi"] and b["lo"] < a["hi"]


def test_noisy_difference_is_no_detectable_difference():
    d = cmp.paired_difference({0: 1.0, 1: 2.0, 2: 3.0}, {0: 0.8, 1: 1.7, 2: 2.9})  # -0.2, -0.3, -0.1
    assert d["mean"] == pytest.approx(-0.2) and d["std"] == pytest.approx(0.1)
    assert d["lo"] < 0 < d["hi"]
    assert cmp.decide(d, "minimize") == cmp.NO_DIFF


def test_pairs_only_seeds_both_arms_have():
    d = cmp.paired_difference({0: 1.0, 1: 2.0, 3: 9.0}, {0: 1.5, 1: 2.5, 2: 7.0})
    assert d["seeds"] == [0, 1] and d["diffs"] == pytest.approx([0.5, 0.5])


def test_one_seed_gives_no_verdict_but_no_difference():
    rows = cmp.compare(_runs("control", [1.0]) + _runs("v", [0.5]), ["control", "v"])
    v = rows[1]
    assert v["verdict"] == cmp.NO_DIFF and "too few" in v["why"]


def test_diverged_runs_are_failures_of_their_arm_and_stay_in_the_table():
    runs = (_runs("control", [2.0, 2.1, 2.2]) + _runs("good", [1.8, 1.9, 2.0])
            + _runs("absurd", [5.9, 5.8, 1.0], ["diverged", "diverged", "completed"]))
    rows = {r["arm"]: r for r in cmp.compare(runs, ["control", "good", "absurd"])}
    bad = rows["absurd"]
    assert bad["diverged"] == 2 and bad["n"] == 3
    assert bad["verdict"] == cmp.WORSE and "2 of 3 seeds diverged" in bad["why"]
    # the one finished seed is the only one in the mean: diverged values never enter it
    assert bad["at_budget"]["n"] == 1 and bad["at_budget"]["mean"] == pytest.approx(1.0)
    # every seed is listed, diverged ones too — never only the best seed
    assert [p["status"] for p in bad["per_seed"]] == ["diverged", "diverged", "completed"]
    table = {r["arm"]: r for r in cmp.table_rows(list(rows.values()), {"absurd": "train.lr=1000"})}
    assert table["absurd"]["diverged"] == "2 of 3"
    assert "s0 diverged" in table["absurd"]["seeds"] and "s2 1" in table["absurd"]["seeds"]
    assert table["absurd"]["overrides"] == "train.lr=1000"
    assert rows["good"]["verdict"] == cmp.BETTER
    assert rows["control"]["verdict"] == "control"


def test_missing_runs_are_shown_not_counted():
    runs = _runs("control", [2.0, 2.1]) + _runs("v", [1.0, None], ["completed", "interrupted"])
    v = cmp.compare(runs, ["control", "v"])[1]
    assert v["missing"] == [1] and v["diverged"] == 0 and v["at_budget"]["n"] == 1
    assert "s1 interrupted" in cmp.table_rows([v])[0]["seeds"]


def test_best_so_far_is_summarised_too():
    rows = cmp.compare(_runs("control", [2.0, 3.0]) + _runs("v", [1.0, 2.0]), ["control", "v"])
    assert rows[0]["best"]["mean"] == pytest.approx(2.4)
    assert rows[1]["diff_best"]["diffs"] == pytest.approx([-1.0, -1.0])
