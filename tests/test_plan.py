"""The rental plan's pure functions: memory need, fit table, time arithmetic, scaling, packing."""

import math

import pytest

from pilotrun.phases.registry import KINDS, REGISTRY, Phase
from pilotrun.sheet import gpu_memory as GM
from pilotrun.sheet import plan as P
from pilotrun.sheet.catalogue import BY_KEY, CATALOGUE, match_gpu

GiB = 2**30
PHASES = ("load", "first_step", "steady_step", "eval_longest", "save", "export", "reload")


def cuda_rows(peaks_gib: dict, **extra) -> list[dict]:
    rows = []
    for i, ph in enumerate(PHASES):
        peak = int(peaks_gib.get(ph, 1.0) * GiB)
        rows.append({"id": i + 1, "run_id": "R1", "phase": ph, "rank": 0, "device": "cuda:0", "counter": "cuda",
                     "inputs": {"eval_batch": 64, "seq_len": 4096} if ph == "eval_longest" else {},
                     "baseline": GiB // 2, "peak_allocated": peak - GiB // 4, "peak_reserved": peak,
                     "end_allocated": GiB // 2, "end_reserved": GiB, "duration_s": 1.0, "verdict": "ok", **extra})
    return rows


def test_eval_over_24gib_does_not_fit_24gib_gpus_and_fits_80gib():
    rows = cuda_rows({"load": 6, "first_step": 14, "steady_step": 14, "eval_longest": 30})
    need = GM.memory_summary(rows, rows, "measured", ranks=1)
    assert need["phase"] == "eval_longest" and need["peak"] == 30 * GiB and need["kind"] == "measured"
    # measured reserved already holds cuBLAS's workspaces: only the CUDA context lives outside the allocator
    assert [o["what"] for o in need["overheads"]] == ["CUDA context"]
    assert need["need"] == math.ceil((30 * GiB + GM.CUDA_CONTEXT_BYTES) / (1 - GM.HEADROOM_FRACTION))
    assert need["inputs"] == {"eval_batch": 64, "seq_len": 4096} and "run R1 phase eval_longest" in need["source"]
    assert need["source"].startswith("measured: ") and "CUDA reserved counter" in need["source"]
    table = {f["gpu"]: f for f in GM.fit_table(rows, "measured", CATALOGUE, needs_bf16=False, ranks=1)}
    for key in ("rtx4090", "l4", "a10"):
        assert table[key]["verdict"] == "does not fit: eval_longest", table[key]
        assert table[key]["phases"]["steady_step"] == "fits" and not table[key]["fits"]
    for key in ("a100-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "mi300x"):
        assert table[key]["verdict"] == "fits" and table[key]["fits"]
    # a phase fits while its reserved peak is within the card's capacity: memory less headroom and context
    a100 = BY_KEY["a100-40gb"]
    cap = GM.capacity(a100, 1)
    assert cap == int(a100.memory_bytes * (1 - GM.HEADROOM_FRACTION)) - GM.CUDA_CONTEXT_BYTES
    at = cuda_rows({})
    for r in at:
        r["peak_reserved"] = cap if r["phase"] == "eval_longest" else GiB
    assert GM.fit_table(at, "measured", [a100], needs_bf16=False, ranks=1)[0]["fits"]
    at[3]["peak_reserved"] = cap + 2**20
    assert not GM.fit_table(at, "measured", [a100], needs_bf16=False, ranks=1)[0]["fits"]


def test_predicted_figures_hold_the_cublas_workspaces_and_add_nccl_for_ranks():
    """The replay allocates cuBLAS's workspaces (of each card's size: sheet/gpu_memory.on_cards, tests/test_replay.py):
    a predicted figure adds only what lives outside the caching allocator."""
    rows = cuda_rows({"steady_step": 2})
    h100 = GM.phase_needs(rows, "predicted", BY_KEY["h100-sxm"], ranks=1)
    steady = {p["phase"]: p for p in h100}["steady_step"]
    assert steady["need"] == math.ceil((2 * GiB + GM.CUDA_CONTEXT_BYTES) / (1 - GM.HEADROOM_FRACTION))
    assert steady["source"].startswith("predicted: the caching allocator's replay") and steady["tag"] == "predicted"
    two = {p["phase"]: p for p in GM.phase_needs(rows, "predicted", BY_KEY["h100-sxm"], ranks=2)}
    assert two["steady_step"]["need"] == math.ceil((2 * GiB + GM.CUDA_CONTEXT_BYTES + GM.NCCL_BYTES)
                                                   / (1 - GM.HEADROOM_FRACTION))
    assert GM.workspace_bytes(BY_KEY["h100-sxm"]) == 32 * 2**20 and GM.workspace_bytes(BY_KEY["a100-80gb"]) == 8_519_680
    # a card's own replay (its workspaces, its capacity) replaces the calibration card's reserved bytes
    card = {"steady_step": {"reserved": GiB, "how": "replay on this card"}}
    mine = {p["phase"]: p for p in GM.phase_needs(rows, "predicted", BY_KEY["a100-80gb"], 1, card=card)}
    assert mine["steady_step"]["reserved"] == GiB and mine["load"]["reserved"] == GiB


def test_reserved_counter_wins_over_allocated_and_rss_uses_allocated():
    row = {"phase": "steady_step", "peak_allocated": 5, "peak_reserved": 9}
    assert P.row_peak(row) == 9
    assert P.row_peak({"phase": "x", "peak_allocated": 5, "peak_reserved": None}) == 5


def test_bf16_campaign_does_not_fit_a_gpu_without_bf16():
    rows = cuda_rows({})
    t4 = next(f for f in GM.fit_table(rows, "measured", CATALOGUE, needs_bf16=True, ranks=1) if f["gpu"] == "t4")
    assert t4["verdict"] == "does not fit: no bf16 (compute capability 7.5 < 8.0)"
    t4_fp32 = next(f for f in GM.fit_table(rows, "measured", CATALOGUE, needs_bf16=False, ranks=1)
                   if f["gpu"] == "t4")
    assert t4_fp32["fits"]
    mi300x = next(f for f in GM.fit_table(rows, "measured", CATALOGUE, needs_bf16=True, ranks=1)
                  if f["gpu"] == "mi300x")
    assert mi300x["fits"]  # ROCm's bf16, not a CUDA compute capability


def test_an_oom_phase_is_not_measured_and_never_certified():
    rows = cuda_rows({})
    rows[3]["verdict"] = "oom"
    h200 = next(f for f in GM.fit_table(rows, "measured", CATALOGUE, needs_bf16=False, ranks=1) if f["gpu"] == "h200")
    assert h200["verdict"] == "unknown: eval_longest not measured" and not h200["fits"]
    assert GM.memory_summary(rows, rows, "measured", 1)["unmeasured"] == ["eval_longest"]
    # a CPU pilot whose memory could not be predicted has no GPU figure at all
    none = GM.fit_table([], "predicted", CATALOGUE, needs_bf16=False, ranks=1)
    assert all(f["verdict"] == "unknown: no GPU memory figure" and not f["fits"] for f in none)


def test_largest_by_growth_refuses_rss_and_noise():
    row = cuda_rows({"steady_step": 3})[2]
    row["inputs"] = {"micro_batch": 4}
    got = P.largest_by_growth(row, 20 * GiB)
    assert got["value"] == int((20 * GiB - GiB // 2) // ((3 * GiB - GiB // 2) / 4))
    assert got["source"].startswith("extrapolated from the measured growth (run R1 phase steady_step")
    flat = dict(row, peak_reserved=GiB // 2 + 2**20)
    assert P.largest_by_growth(flat, 20 * GiB)["value"] is None
    assert "inside the counter's noise" in P.largest_by_growth(flat, 20 * GiB)["source"]
    rss = dict(row, counter="rss", peak_reserved=None)
    assert "RSS, not GPU memory" in P.largest_by_growth(rss, 20 * GiB)["source"]


def test_run_list_control_first_then_variants_then_extra_seeds():
    runs = P.run_list({"train.lr": 1e-4}, [{"train.lr": 5e-5}, {"train.lr": 2e-4}], [0, 1])
    assert [r["label"] for r in runs] == ["control seed 0", "variant 1 seed 0", "variant 2 seed 0",
                                          "control seed 1", "variant 1 seed 1", "variant 2 seed 1"]
    assert [r["extra_seed"] for r in runs] == [False] * 3 + [True] * 3


MEASURED = {"load": 10.0, "first_step": 3.0, "steady_step": 2.0, "eval_longest": 0.5, "save": 4.0, "export": 6.0,
            "reload": 5.0}


def measured(values=MEASURED):
    return {k: {"seconds": v, "source": f"run R1 phase {k}"} for k, v in values.items()}


def test_time_plan_arithmetic_term_by_term():
    counts = P.run_counts(updates=100, eval_every=10, save_every=50, n_val=40, eval_batch=8)
    # saves at 50 and 100; final stands for update 100's checkpoint (a reference), no third save
    assert counts == {"updates": 100, "evals": 11, "eval_batches": 5, "checkpoints": 2, "exports": 1, "reloads": 1,
                      "final_refs": 1, "control_passes": 0}
    h100 = BY_KEY["h100-sxm"]
    u = P.unit_seconds(measured(), phases=REGISTRY, source_gpu=h100, target_gpu=h100, precision="bf16-mixed", work=None)
    assert u["scaling"]["ratio"] == 1.0
    terms = {t["term"]: t["seconds"] for t in P.run_terms(counts, u["units"])}
    assert terms == {"load": 10.0, "first update (optimizer state)": 1.0, "updates": 200.0, "validations": 27.5,
                     "checkpoints": 8.0, "export": 6.0, "reload check": 5.0}
    assert sum(terms.values()) == 257.5
    # a run's start (the pilot's own: memory handed back, journal entry) and 2 passes over 4 control examples
    counts = P.run_counts(updates=100, eval_every=10, save_every=50, n_val=40, eval_batch=8, control=4)
    assert counts["control_passes"] == 1.0
    more = {t["term"]: t["seconds"] for t in P.run_terms(counts, dict(u["units"], run_overhead=0.7))}
    assert more["run start (memory freed, journal entry)"] == 0.7
    assert more["control predictions"] == pytest.approx(27.5 / 55)  # one eval batch's seconds
    assert sum(more.values()) == pytest.approx(257.5 + 0.7 + 0.5)
    # the pilot timed the check of its checkpoint's files: final, a reference to update 100's, costs that check
    ref = {t["term"]: t for t in P.run_terms(counts, dict(u["units"], final_ref=0.4))}
    assert ref[P.FINAL_REF_TERM]["seconds"] == 0.4 and ref[P.FINAL_REF_TERM]["count"] == 1
    assert P.run_counts(105, 10, 50, 40, 8)["final_refs"] == 0  # update 105 did not save: final is a save
    # a partial last interval adds the final validation
    assert P.run_counts(105, 10, None, 40, 8)["evals"] == 12
    assert P.run_counts(105, 10, None, 40, 8)["checkpoints"] == 1
    # a last update no save falls on: final is a save of its own
    assert P.run_counts(105, 10, 50, 40, 8)["checkpoints"] == 3 and P.saves_per_run(100, 50) == 2



def _phase(name: str, kind: str) -> Phase:
    return Phase(name, kind, inputs=dict, run=lambda ctx, p: None, trace=lambda ctx: None, needs="load")


def test_time_plan_units_follow_the_registry_kinds():
    """A train, eval or host phase added to the registry is timed by its kind's unit, with no other change."""
    assert set(P.KIND_UNITS) == set(KINDS) and set(P.HOST_KINDS) <= set(KINDS)
    h100 = BY_KEY["h100-sxm"]
    extra = REGISTRY + (_phase("third_step", "train"), _phase("eval_shortest", "eval"), _phase("save_adapter", "save"))
    m = measured(dict(MEASURED, third_step=2.5, eval_shortest=0.75, save_adapter=1.0))
    units = P.unit_seconds(m, phases=extra, source_gpu=h100, target_gpu=h100, precision="bf16-mixed",
                           work=None)["units"]
    # the slowest update after the first, the slowest validation batch, a save of both checkpoints
    assert units["update"] == 2.5 and units["first_extra"] == 0.5
    assert units["eval_batch"] == 0.75 and units["save"] == 5.0
    plain = P.unit_seconds(measured(), phases=REGISTRY, source_gpu=h100, target_gpu=h100, precision="bf16-mixed",
                           work=None)["units"]
    assert plain == {"load": 10.0, "update": 2.0, "first_extra": 1.0, "eval_batch": 0.5, "save": 4.0, "export": 6.0,
                     "reload": 5.0}
    with pytest.raises(KeyError):  # a registered phase the pilot did not time is not silently left out
        P.unit_seconds(measured(), phases=extra, source_gpu=h100, target_gpu=h100, precision="bf16-mixed", work=None)

def test_packing_keeps_the_reserve_and_lists_what_overflows_the_3_day_plan():
    runs = [{"label": f"run {i}", "seconds": 1.0 * P.DAY_S} for i in range(5)]
    plans = {p["days"]: p for p in P.pack(runs, [7, 3, 30], reserve=0.2)}
    three = plans[3]
    assert three["reserve_s"] == pytest.approx(0.6 * P.DAY_S) and three["budget_s"] == pytest.approx(2.4 * P.DAY_S)
    assert [p["label"] for p in three["placed"]] == ["run 0", "run 1"]
    assert three["not_fitting"] == ["run 2", "run 3", "run 4"] and not three["fits_all"]
    assert plans[7]["fits_all"] and len(plans[7]["placed"]) == 5  # 5 days <= 7 × 0.8
    assert [p["days"] for p in P.pack(runs, [7, 3, 30], 0.2)] == [3, 7, 30]
    # two GPUs run two lanes side by side
    two = P.pack(runs, [3], reserve=0.2, lanes=2)[0]
    assert len(two["placed"]) == 4 and two["not_fitting"] == ["run 4"]
    assert {p["lane"] for p in two["placed"]} == {0, 1}


def test_gpu_to_gpu_scaling_takes_the_smaller_speed_up():
    a100, h100 = BY_KEY["a100-80gb"], BY_KEY["h100-sxm"]
    u = P.unit_seconds(measured(), phases=REGISTRY, source_gpu=a100, target_gpu=h100, precision="bf16-mixed", work=None)
    s = u["scaling"]
    assert s["compute_ratio"] == pytest.approx(312 / 989.5) and s["bandwidth_ratio"] == pytest.approx(2039 / 3350)
    assert s["ratio"] == pytest.approx(2039 / 3350) and s["kind"] == "estimate" and "ESTIMATE" in s["text"]
    assert u["units"]["update"] == pytest.approx(2.0 * 2039 / 3350)
    assert u["units"]["save"] == 4.0  # disk work is not scaled


def test_cpu_measurement_is_an_extrapolation_with_its_ratio():
    h100 = BY_KEY["h100-sxm"]
    work = {"params": 1_000_000_000, "trainable": 1_000_000_000, "tokens_update": 32 * 2048, "tokens_eval": 8 * 2048,
            "passes_update": 4, "checkpointing": False}
    m = measured(dict(MEASURED, steady_step=4000.0))
    u = P.unit_seconds(m, phases=REGISTRY, source_gpu="cpu", target_gpu=h100, precision="bf16-mixed", work=work)
    flops = 6 * 1e9 * 32 * 2048
    expect = flops / (989.5e12 * P.ASSUMED_MFU)
    assert u["units"]["update"] == pytest.approx(expect)
    assert u["scaling"]["ratio"] == pytest.approx(expect / 4000.0)
    assert u["scaling"]["text"].startswith("EXTRAPOLATION from a CPU measurement")
    # a tiny model is bound by the per-pass floor, not by FLOPs
    tiny = dict(work, params=1000, trainable=1000)
    assert P.unit_seconds(m, phases=REGISTRY, source_gpu="cpu", target_gpu=h100, precision="bf16-mixed",
                          work=tiny)["units"]["update"] == pytest.approx(4 * P.GPU_FLOOR_S_PER_PASS)
    # an unidentified CUDA device is not scaled, and says so
    plain = P.unit_seconds(m, phases=REGISTRY, source_gpu=None, target_gpu=h100, precision="bf16-mixed", work=work)
    assert plain["scaling"]["kind"] == "not scaled" and plain["units"]["update"] == 4000.0


def test_catalogue_matches_torch_device_names():
    assert match_gpu("NVIDIA H100 80GB HBM3").key == "h100-sxm"
    assert match_gpu("NVIDIA H100 PCIe").key == "h100-pcie"
    assert match_gpu("NVIDIA A100-SXM4-40GB").key == "a100-40gb"
    assert match_gpu("NVIDIA A100-SXM4-80GB").key == "a100-80gb"
    assert match_gpu("NVIDIA L40S").key == "l40s" and match_gpu("NVIDIA L4").key == "l4"
    assert match_gpu("NVIDIA A10").key == "a10" and match_gpu("Tesla T4").key == "t4"
    assert match_gpu("NVIDIA GeForce RTX 4090").key == "rtx4090"
    assert match_gpu("NVIDIA H200", 140 * GiB).key == "h200"
    assert match_gpu("NVIDIA H100 NVL", 94 * GiB) is None and match_gpu(None) is None
    for g in CATALOGUE:
        assert g.source and g.memory_bytes > 0 and g.bandwidth_gbs > 0
        assert (g.bf16_tflops is None) == (not g.bf16)


def test_new_catalogue_gpus_match_their_device_names_and_name_their_source():
    assert match_gpu("NVIDIA L40").key == "l40" and match_gpu("NVIDIA L40S").key == "l40s"
    assert match_gpu("NVIDIA A40").key == "a40" and match_gpu("NVIDIA RTX A6000").key == "rtxa6000"
    assert match_gpu("NVIDIA B200", 179 * GiB).key == "b200"
    assert match_gpu("AMD Instinct MI300X", 191 * GiB).key == "mi300x"
    assert BY_KEY["mi300x"].vendor == "amd" and BY_KEY["mi300x"].bf16
    for g in CATALOGUE:
        assert g.sky and g.source.split()[0] in ("NVIDIA", "AMD") and "datasheet" in g.source + " datasheet"
    assert BY_KEY["h100-sxm"].rate_label("bf16-mixed") == "bf16 tensor-core dense rate"
    assert BY_KEY["h100-sxm"].rate_label("fp32").startswith("fp32 non-tensor rate")


def test_gpu_pilot_calibrates_on_its_measured_seconds_and_keeps_the_launch_floor():
    a100, h100 = BY_KEY["a100-80gb"], BY_KEY["h100-sxm"]
    work = {"params": 1_000_000_000, "trainable": 1_000_000_000, "tokens_update": 32 * 2048, "tokens_eval": 8 * 2048,
            "passes_update": 4, "checkpointing": False}
    u = P.unit_seconds(measured(), phases=REGISTRY, source_gpu=a100, target_gpu=h100, precision="bf16-mixed", work=work)
    s = u["scaling"]
    fixed = 4 * P.GPU_FLOOR_S_PER_PASS
    assert s["fixed_s"] == fixed and u["units"]["update"] == pytest.approx(fixed + (2.0 - fixed) * s["ratio"])
    flops = 6 * 1e9 * 32 * 2048
    assert s["measured_efficiency"] == pytest.approx(flops / ((2.0 - fixed) * 312e12))
    assert "calibrated on the A100 80GB SXM's measured 2 s per update" in s["text"]
    assert "bf16 tensor-core dense rate" in s["text"] and not s["latency_bound"]
    # a pilot update at the launch floor is latency-bound: a faster card does not shorten it
    fast = P.unit_seconds(measured(dict(MEASURED, steady_step=fixed)), phases=REGISTRY, source_gpu=a100,
                          target_gpu=h100, precision="bf16-mixed", work=work)
    assert fast["scaling"]["latency_bound"] and fast["units"]["update"] == pytest.approx(fixed)


def test_time_reasons_name_the_floor_only_when_it_dominates():
    h100 = BY_KEY["h100-sxm"]
    counts = P.run_counts(updates=100, eval_every=10, save_every=50, n_val=40, eval_batch=8)
    tiny = {"params": 1000, "trainable": 1000, "tokens_update": 4 * 64, "tokens_eval": 64, "passes_update": 4,
            "checkpointing": False}
    u = P.unit_seconds(measured(dict(MEASURED, steady_step=4000.0)), phases=REGISTRY, source_gpu="cpu", target_gpu=h100,
                       precision="bf16-mixed", work=tiny)
    why = P.time_reasons(u["scaling"], P.run_terms(counts, u["units"]), [100.0, 100.0])
    assert why[0].startswith("This campaign is latency-bound: an update takes the launch floor (20 ms")
    assert why[0].endswith("every catalogue GPU gives the same time.")
    assert P.time_reasons(u["scaling"], P.run_terms(counts, u["units"]), [100.0, 150.0])[0].endswith(
        "a faster GPU shortens it little.")
    big = dict(tiny, params=7_000_000_000, trainable=7_000_000_000, tokens_update=64 * 4096)
    u = P.unit_seconds(measured(dict(MEASURED, steady_step=4000.0)), phases=REGISTRY, source_gpu="cpu", target_gpu=h100,
                       precision="bf16-mixed", work=big)
    assert not u["scaling"]["latency_bound"]
    assert not [w for w in P.time_reasons(u["scaling"], P.run_terms(counts, u["units"]), [1.0, 2.0])
                if "latency-bound" in w]
