"""The trace replayed through the caching allocator (probe/stream.py) and what the sheet decides from it: cuBLAS's
workspaces where the run allocates them, each card's own replay (its workspaces, its capacity: the retry path can
hold on a card what the calibration card reserved more than), and the largest size defined as the largest n such that
every size up to n fits, which is not the last size that fits in probe order."""

from __future__ import annotations

import dataclasses

import pytest

from pilotrun.sheet.sizes import boundary, largest

MiB = 2**20

# The demo's micro_batch at 34 tokens, replayed (sheet/sizes.Prober.update: reserved, allocated MiB): reserved is
# not monotonic — 112 at 20, 134 at 21 and 22, 118 at 23, 138 at 24 (tests/test_replay.py's slow test probes it).
DEMO_UPDATE = {17: (108, 104.8), 18: (108, 106.3), 19: (112, 108.0), 20: (112, 109.5), 21: (134, 111.1),
               22: (134, 112.7), 23: (118, 114.5), 24: (138, 116.4), 25: (142, 118.4)}


def _card(mib: int):
    from pilotrun.sheet.catalogue import BY_KEY

    return dataclasses.replace(BY_KEY["h100-sxm"], key=f"card{mib}", name=f"a {mib} MiB card", memory_gib=mib / 1024)


def test_the_largest_size_is_every_size_up_to_it_fitting_not_the_last_that_fit():
    """With 126 MiB the demo's 23 fits (118) and 21-22 do not (134): probing from 23 the search's boundary is 23, the
    answer 20; sizes below are scanned until one fits with room for the fragmentation seen (22 MiB at 21-22)."""
    limit, probes = 126, []

    def measure(n):
        probes.append(n)
        reserved, allocated = DEMO_UPDATE.get(n, (n * 1.6 + 80, n * 1.6 + 80))
        return reserved, allocated, reserved <= limit

    assert boundary(measure, limit, start=23, cap=25) == 23  # fitting in probe order: 23 (25 and 24 do not)
    probes.clear()
    scan: dict = {}
    assert largest(measure, limit, start=23, cap=25, scan=scan) == 20
    assert 23 in probes and {21, 22} <= set(probes) and scan["checked"] >= 3
    # the scan stops where a size fits with room for the fragmentation seen: 17 (108 + 22 > 126) was probed, then
    # lower sizes are inferred
    assert scan["assumed"] < 20


@pytest.fixture(scope="module")
def demo_trace(tmp_path_factory):
    from pilotrun.campaign import load_campaign
    from pilotrun.demo.synth import write_demo
    from pilotrun.probe.trace import rows_for, traced

    folder = tmp_path_factory.mktemp("demo")
    write_demo(folder)
    tr = traced(load_campaign(folder / "campaign.yaml"), device="cuda")
    return tr, rows_for(tr)


def test_cublas_workspaces_are_allocated_where_each_thread_first_calls_cublas(demo_trace):
    """The forward's first matmul (the main thread) and the backward's (autograd's device thread) each allocate a
    32 MiB workspace, kept: none at load, both from first_step on (the H200's 64 MiB above the trace)."""
    tr, rows = demo_trace
    by = {r["phase"]: r for r in rows}
    traced_peak = {name: tr["summarize"](name, None)["peak_allocated"] for name in by}
    assert by["load"]["peak_allocated"] == traced_peak["load"]
    for name in ("first_step", "steady_step", "eval_longest", "reload"):
        assert by[name]["peak_allocated"] - traced_peak[name] == 64 * MiB, name
    assert all(r["peak_reserved"] >= r["peak_allocated"] for r in rows)


def test_each_card_is_replayed_with_its_own_workspaces_and_capacity(demo_trace):
    from pilotrun.sheet.catalogue import BY_KEY
    from pilotrun.sheet.gpu_memory import capacity, fit_table, on_cards

    tr, rows = demo_trace
    by = {r["phase"]: r for r in rows}
    assert by["eval_longest"]["peak_reserved"] == 112 * MiB  # on a card that never fills
    cards = [BY_KEY["h100-sxm"], BY_KEY["a100-80gb"], _card(920), _card(918), _card(880)]
    got = on_cards(tr, rows, cards, ranks=1, strategy="single")
    # compute capability 8.0: 8.125 MiB workspaces, which share a 20 MiB segment
    assert got["a100-80gb"]["eval_longest"]["reserved"] < got["h100-sxm"]["eval_longest"]["reserved"] == 112 * MiB
    # a card of 106 MiB capacity: the calibration card's 112 MiB do not fit it, the retry path (cached segments
    # released, the allocation retried) holds eval_longest in 106 MiB
    assert capacity(_card(920), 1) < 112 * MiB
    assert got["card920"]["eval_longest"] == {"reserved": 106 * MiB, "oom": None, "how": "replay on this card"}
    # 2 MiB less and it runs out at eval_longest: that phase and those after it do not fit
    assert got["card918"]["eval_longest"]["oom"] == "eval_longest" and got["card918"]["steady_step"]["oom"] is None
    table = {f["gpu"]: f for f in fit_table(rows, "predicted", cards, needs_bf16=False, ranks=1, cards=got)}
    assert table["card920"]["fits"] and table["card920"]["reserved"] == 106 * MiB
    assert table["card918"]["verdict"].startswith("does not fit: eval_longest")
    assert "runs out of memory at eval_longest" in table["card918"]["phases"]["reload"]
    assert not table["card880"]["fits"]  # under the allocated peak itself: no replay can hold it
    assert table["h100-sxm"]["fits"]


@pytest.mark.slow
def test_the_sheet_answers_the_defined_largest_on_a_card_where_23_fits_and_21_does_not(tmp_path):
    """The sheet's largest sizes (sheet/estimates.largest: the estimator's probes replayed on the target's capacity)
    on a card of 126 MiB capacity: micro_batch 20, although 23 fits."""
    from pilotrun.campaign import load_campaign
    from pilotrun.campaign.prepare import prepare
    from pilotrun.demo.synth import write_demo
    from pilotrun.sheet import estimates as E
    from pilotrun.sheet.gpu_memory import capacity
    from pilotrun.sheet.sizes import Prober

    write_demo(tmp_path)
    loaded = load_campaign(tmp_path / "campaign.yaml")
    card = _card(941)
    assert 118 * MiB <= capacity(card, 1) < 134 * MiB
    prep = E._Prepared(loaded)
    rows = [{"phase": p, "rank": 0, "inputs": {"seq_len": 34}, "peak_reserved": 1} for p in ("steady_step",
                                                                                            "eval_longest")]
    c = loaded.campaign
    got = E.largest(loaded, prep, rows, card, "predicted", 1, c.train, c)["micro_batch"]
    assert got["value"] == 20 and got["bound"] == "GPU memory"
    p = Prober(loaded, prepare(loaded, splits=("train", "validation")))
    assert p.fits(p.update(23, 34), capacity(card, 1)) and not p.fits(p.update(21, 34), capacity(card, 1))
    assert [round(p.update(n, 34)["reserved"] / MiB) for n in (20, 21, 22, 23)] == [112, 134, 134, 118]


def test_a_cuda_pilots_fragmentation_is_shown_beside_the_replays(demo_trace):
    """sheet/gpu_memory.fragmentation (the sheet's memory section and the pilot's CUDA table): per phase, the
    measured reserved − allocated of the worst rank beside the replay's; a phase the pilot did not measure is left out."""
    from pilotrun.sheet.gpu_memory import fragmentation

    _, rows = demo_trace
    measured = [{"phase": "eval_longest", "rank": r, "peak_allocated": 85 * MiB, "peak_reserved": (114 + r) * MiB}
                for r in (0, 1)] + [{"phase": "load", "rank": 0, "peak_allocated": 3 * MiB, "peak_reserved": None}]
    got = fragmentation(measured, rows)
    assert got == [{"phase": "eval_longest", "rank": 1, "measured_reserved": 115 * MiB, "measured": 30 * MiB,
                    "replay_reserved": 112 * MiB, "replay": 112 * MiB - rows[3]["peak_allocated"]}]


def test_the_launch_files_export_the_allocator_setting_the_sheet_was_replayed_with():
    from pilotrun.probe.alloc_conf import DEFAULTS, parse_settings
    from pilotrun.sheet.build import _launch_env
    from pilotrun.sheet.launch import _body

    card = _card(5000)
    sheet = {"warnings": [], "advice": [{"gpu": card.key, "name": card.name, "variable": "PYTORCH_CUDA_ALLOC_CONF",
                                         "setting": "expandable_segments:True", "reserved": 3886 * MiB,
                                         "default_reserved": 4790 * MiB}]}
    _launch_env(sheet, card, None, DEFAULTS)
    assert sheet["launch_env"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert "holds this campaign only with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in sheet["warnings"][0]
    launch = {"campaign_dir": "/c", "nodes": 1, "lanes": [["control"]], "sets": (), "campaign_file": "campaign.yaml",
              "sweep_id": "s1", "env": sheet["launch_env"]}
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in "\n".join(_body(launch, "$H"))
    # the user's own setting, which the replay used, is what the files export on any other card
    mine = {"warnings": []}
    _launch_env(mine, _card(6000), "PYTORCH_ALLOC_CONF", parse_settings("max_split_size_mb:256"))
    assert mine["launch_env"] == {"PYTORCH_ALLOC_CONF": "max_split_size_mb:256"} and not mine["warnings"]
    plain = {"warnings": []}
    _launch_env(plain, _card(6000), None, DEFAULTS)
    assert plain["launch_env"] == {} and "export" not in "\n".join(_body(dict(launch, env={}), "$H"))


@pytest.mark.slow
def test_expandable_segments_advice_names_the_cards_it_makes_fit_with_both_figures(tmp_path):
    """wider1024 (bf16): its evaluation's larger blocks miss the training's cached segments (4790 MiB reserved on a card
    that never fills); with expandable segments the replay reserves 3886. A card of ~3982 MiB capacity holds it only
    with them: the advice names it with both figures; one of ~4362 MiB holds it either way (the retry path)."""
    import importlib.util
    from pathlib import Path

    from pilotrun.campaign import load_campaign
    from pilotrun.campaign.prepare import prepare
    from pilotrun.sheet import estimates as E
    from pilotrun.sheet.gpu_memory import capacity, fit_table, on_cards, predict_rows

    spec = importlib.util.spec_from_file_location("calibration", Path(__file__).parents[1] / "bench" / "calibration.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    loaded = load_campaign(bench.write_campaigns(tmp_path)["wider1024"], {"train.precision": "bf16-mixed"})
    rows, tr = predict_rows(loaded, prepare(loaded, splits=("train", "validation"), shapes=True))
    cards = [_card(5000), _card(5400)]
    fits = fit_table(rows, "predicted", cards, needs_bf16=True, ranks=1,
                     cards=on_cards(tr, rows, cards, ranks=1, strategy="single"))
    assert [f["fits"] for f in fits] == [False, True]
    sheet = {"_trace": tr, "warnings": []}
    E.expandable_advice(sheet, loaded, fits, rows, 1, loaded.campaign.train, True, gpus=cards)
    assert [a["gpu"] for a in sheet["advice"]] == ["card5000"] and not sheet["warnings"]
    a = sheet["advice"][0]
    assert a["reserved"] <= capacity(cards[0], 1) < a["default_reserved"] and a["setting"] == "expandable_segments:True"
