"""The rental plan from ledger rows, as pure functions: memory need, fit table, time plan, packing.

Every number these return carries where it came from: a ledger row (run id, phase, rank, row id)
or one of the constants below, so the sheet can name it.
"""

from __future__ import annotations

import math

from pilotrun.campaign.arithmetic import final_is_reference, saves_per_run
from pilotrun.console.units import fmt_duration

GiB = 2**30
DAY_S = 86400.0

# CPU → GPU time extrapolation. A CPU's peak rate cannot be known from here (cores, AVX-512/AMX, a
# machine shared with others), so no fixed "CPU reference rate" is defensible; instead the measured
# step's work is counted exactly (parameters × tokens) and divided by the target's datasheet rate at
# an assumed utilisation. The sheet prints the resulting ratio to the CPU time and the CPU's implied
# rate, so a reader can judge the extrapolation.
ASSUMED_MFU = 0.30  # Hugging Face fine-tuning of >=1B-parameter models reaches ~30-45% of dense peak
# A pass (forward+backward of one micro-batch, or one eval batch) of a small model on a GPU is bound
# by kernel launches, not FLOPs: a few milliseconds whatever the card.
GPU_FLOOR_S_PER_PASS = 0.005

NOT_MEASURED = ("oom", "error")

# The time plan's units by phase kind (phases/registry.py ``KINDS``): a train phase times an update (the first train
# phase's extra over the others is the optimizer state it allocates), an eval phase one validation batch; the host
# kinds are disk and host work, each its own unit, kept as measured on any GPU. A phase added to the registry with
# one of these kinds is timed without a change here.
KIND_UNITS = {"load": ("load",), "train": ("first_extra", "update"), "eval": ("eval_batch",), "save": ("save",),
              "export": ("export",), "reload": ("reload",)}
HOST_KINDS = ("load", "save", "export", "reload")


def row_peak(row: dict) -> int | None:
    """The peak a GPU must hold: reserved when the counter has it (CUDA), else allocated (RSS on CPU)."""
    if row.get("peak_reserved") is not None:
        return int(row["peak_reserved"])
    return None if row.get("peak_allocated") is None else int(row["peak_allocated"])


def source(row: dict) -> str:
    return f"run {row.get('run_id')} phase {row['phase']} rank {row.get('rank', 0)} (row {row.get('id')})"


def phase_peaks(rows: list[dict]) -> dict[str, dict]:
    """Per phase, the row with the highest peak over all ranks (rows without a peak only if nothing else)."""
    out: dict[str, dict] = {}
    for r in rows:
        best = out.get(r["phase"])
        if best is None or (row_peak(r) or -1) > (row_peak(best) or -1):
            out[r["phase"]] = r
    return out


# The growth of a phase over its baseline smaller than this is inside the counter's noise: RSS moves by
# pages the allocator keeps or returns (tens of MiB); CUDA's counters by the allocator's 2 MiB segments.
NOISE_BYTES = {"rss": 64 * 2**20, "cuda": 2 * 2**20}


def largest_by_growth(row: dict, limit: int, batch_key: str = "micro_batch") -> dict:
    """The fallback when the estimator cannot run: the measured growth over the phase's baseline taken
    as proportional to the batch. Only CUDA counters qualify (RSS is not GPU memory), and only when
    the growth is above the counter's noise; otherwise the answer says why there is no number."""
    counter = row.get("counter") or "rss"
    peak, base, batch = row_peak(row), row.get("baseline"), (row.get("inputs") or {}).get(batch_key)
    src = f"extrapolated from the measured growth ({source(row)})"
    if counter != "cuda":
        return {"value": None, "source": "cannot be extrapolated: the pilot measured CPU RSS, not GPU memory, "
                                         "and the estimator could not run"}
    if peak is None or base is None or not batch or peak - base < NOISE_BYTES["cuda"]:
        return {"value": None, "source": f"cannot be extrapolated: the growth over the baseline is inside the "
                                         f"counter's noise ({NOISE_BYTES['cuda'] // 2**20} MiB)"}
    return {"value": max(0, int((limit - base) // ((peak - base) / batch))), "source": src,
            "bound": "GPU memory", "at": ""}


# --- the runs and their time --------------------------------------------------------------------
def run_list(control: dict, variants: list[dict], seeds: list[int]) -> list[dict]:
    """Control first, then the variants, on the first seed; then the extra seeds in the same order."""
    arms = [("control", dict(control))] + [(f"variant {i + 1}", dict(v)) for i, v in enumerate(variants)]
    runs = []
    for k, seed in enumerate(seeds or [0]):
        for arm, overrides in arms:
            runs.append({"label": f"{arm} seed {seed}", "arm": arm, "seed": seed, "overrides": overrides,
                         "extra_seed": k > 0})
    return runs


def run_counts(updates: int, eval_every: int, save_every: int | None, n_val: int, eval_batch: int,
               ranks: int = 1, has_validation: bool = True, control: int = 0) -> dict:
    """How often each timed phase happens in one run of the training loop (engine/loop.py ``train``):
    a validation before the first update, every ``eval_every`` updates and after the last; a checkpoint
    every ``save_every`` updates and a final one unless the last update saved one (``final`` then stands for
    it, ``journal/checkpoints.py``, after checking that checkpoint's files: ``final_refs``); one artifact export and
    one reload check; and the two forward passes over the ``control`` examples whose predictions every run stores,
    counted in eval batches."""
    evals = (1 + updates // eval_every + (1 if updates % eval_every else 0)) if has_validation else 0
    return {"updates": updates, "evals": evals,
            "eval_batches": math.ceil(n_val / (eval_batch * ranks)) if has_validation else 0,
            "checkpoints": saves_per_run(updates, save_every), "exports": 1, "reloads": 1,
            "final_refs": int(final_is_reference(updates, save_every)),
            "control_passes": 2 * min(control, eval_batch) / eval_batch if control else 0}


def flops_per_update(params: int, trainable: int, tokens: int, checkpointing: bool, reference: bool = False) -> float:
    """Forward 2·N·T, gradients of the activations 2·N·T, of the trainable weights 2·N_train·T;
    recomputation adds one forward; a preference reference model's no-grad forward (``reference``) one more.
    Attention's own FLOPs are left out (small while seq_len ≪ 6·width)."""
    return (2 * params * (3 if checkpointing else 2) + 2 * trainable + (2 * params if reference else 0)) * tokens


def kind_seconds(measured: dict[str, dict], phases) -> dict[str, list[float]]:
    """The measured seconds of each kind's phases, in the registry's order. ``phases``: the phase registry
    (``phases.registry.REGISTRY``, anything with ``name`` and ``kind``). A phase only some campaigns have
    (``only``: a preference campaign's precompute_reference, over the worst case's pairs) is no unit: a run's pass
    over all its pairs is counted in validation batches (``REFERENCE_TERM``)."""
    out: dict[str, list[float]] = {}
    for p in phases:
        if getattr(p, "only", None) is not None:
            continue
        out.setdefault(p.kind, []).append(measured[p.name]["seconds"])
    return out


def unit_seconds(measured: dict[str, dict], *, phases, source_gpu, target_gpu, precision: str, work: dict | None,
                 shape: dict | None = None) -> dict:
    """Seconds per occurrence of each unit of the time plan on the target, from the measured phases.

    ``measured``: phase -> {"seconds", "source"} (slowest rank). ``phases``: the phase registry, whose kinds say
    which unit a phase times (``KIND_UNITS``): the first train phase pays the optimizer state, the slowest of the
    others is an update, the slowest eval phase a validation batch, a host kind's phases add up.
    ``source_gpu``: the catalogue GPU it was measured on, "cpu", or None (a CUDA device not in the catalogue).
    ``work``: params, trainable, tokens_update, tokens_eval, passes_update, checkpointing (needed for a CPU
    extrapolation). Only compute phases are scaled; load/save/export/reload are disk and host work, kept as measured.
    ``shape`` (sheet/shape.py ``scaled_units``): seconds per update and per validation batch at the
    campaign's mean batch shapes instead of the worst case's.
    """
    s = kind_seconds(measured, phases)
    first, steady = s["train"][0], max(s["train"][1:] or s["train"])
    units = {"load": sum(s["load"]), "update": steady, "first_extra": max(0.0, first - steady),
             "eval_batch": max(s["eval"]), "save": sum(s["save"]), "export": sum(s["export"]),
             "reload": sum(s["reload"])}
    if shape:
        units.update(update=shape["update"], eval_batch=shape["eval_batch"])
        steady = shape["update"]
    passes = (work or {}).get("passes_update") or 1
    floor_up = GPU_FLOOR_S_PER_PASS * passes
    scaling = {"kind": "measured", "ratio": 1.0, "text": "measured on the target GPU: not scaled",
               "latency_bound": bool(work) and steady <= 1.5 * floor_up}
    if target_gpu is None or source_gpu is None:
        what = "no target GPU" if target_gpu is None else "a CUDA device that is not in the catalogue"
        scaling = {"kind": "not scaled", "ratio": 1.0, "text": f"measured on {what}: times shown as measured",
                   "latency_bound": False}
    elif source_gpu == "cpu":
        rate = target_gpu.rate_tflops(precision) * 1e12 * ASSUMED_MFU
        if rate <= 0 or not work or not work.get("params"):
            scaling = {"kind": "not scaled", "ratio": 1.0, "latency_bound": False,
                       "text": "measured on CPU; no parameter count or target rate: CPU times shown as measured"}
        else:
            f_up = flops_per_update(work["params"], work["trainable"], work["tokens_update"], work["checkpointing"],
                                    work.get("reference", False))
            f_ev = 2 * work["params"] * work["tokens_eval"] * (2 if work.get("reference") else 1)
            t_up = max(f_up / rate, floor_up)
            t_ev = max(f_ev / rate, GPU_FLOOR_S_PER_PASS)
            ratio = t_up / steady if steady else 0.0
            units.update(update=t_up, first_extra=units["first_extra"] * ratio, eval_batch=t_ev)
            scaling = {"kind": "extrapolated from CPU", "ratio": ratio, "flops_update": f_up, "flops_eval": f_ev,
                       "cpu_tflops": f_up / steady / 1e12 if steady else None,
                       "target_tflops": target_gpu.rate_tflops(precision), "mfu": ASSUMED_MFU,
                       "rate": target_gpu.rate_label(precision), "latency_bound": f_up / rate <= floor_up,
                       "floor_s": floor_up, "compute_s": f_up / rate,
                       "text": (f"EXTRAPOLATION from a CPU measurement: {f_up:.3g} FLOPs per update (parameters × "
                                f"tokens) at an assumed {ASSUMED_MFU:.0%} efficiency of the {target_gpu.name}'s "
                                f"{target_gpu.rate_tflops(precision):g} TFLOPS ({target_gpu.rate_label(precision)}), "
                                f"at least {GPU_FLOOR_S_PER_PASS * 1e3:g} ms per pass; ratio to the CPU time "
                                f"{ratio:.3g} (the CPU ran at {f_up / steady / 1e12:.3g} TFLOPS)")}
    elif source_gpu.key != target_gpu.key:
        compute = source_gpu.rate_tflops(precision) / max(target_gpu.rate_tflops(precision), 1e-9)
        memory = source_gpu.bandwidth_gbs / target_gpu.bandwidth_gbs
        ratio = max(compute, memory)  # the smaller speed-up: a step is bound by one of the two
        # calibrated on the measured seconds: the per-pass launch floor does not shrink on a faster card
        fixed = min(steady, floor_up) if work else 0.0
        scaled = {k: units[k] for k in ("update", "first_extra", "eval_batch")}
        units["update"] = fixed + (steady - fixed) * ratio
        units["first_extra"] = scaled["first_extra"] * ratio
        ev_fixed = min(scaled["eval_batch"], GPU_FLOOR_S_PER_PASS) if work else 0.0
        units["eval_batch"] = ev_fixed + (scaled["eval_batch"] - ev_fixed) * ratio
        eff = None
        if work and work.get("params") and steady > fixed:
            f_up = flops_per_update(work["params"], work["trainable"], work["tokens_update"], work["checkpointing"],
                                    work.get("reference", False))
            eff = f_up / ((steady - fixed) * source_gpu.rate_tflops(precision) * 1e12)
        scaling = {"kind": "estimate", "ratio": ratio, "compute_ratio": compute, "bandwidth_ratio": memory,
                   "calibrated_on": source_gpu.key, "measured_efficiency": eff, "fixed_s": fixed,
                   "latency_bound": bool(work) and steady <= 1.5 * floor_up,
                   "text": (f"ESTIMATE calibrated on the {source_gpu.name}'s measured {steady:.3g} s per update"
                            + (f" (its measured efficiency: {eff:.1%} of the {source_gpu.rate_tflops(precision):g} "
                               f"TFLOPS {source_gpu.rate_label(precision)})" if eff is not None else "")
                            + f": scaled to the {target_gpu.name} by {ratio:.3g} (the larger of the rate ratio "
                            f"{compute:.3g} and the bandwidth ratio {memory:.3g})"
                            + (f", the {fixed * 1e3:.3g} ms launch floor per update kept as is" if fixed else ""))}
    return {"units": units, "scaling": scaling}


# preference.reference: precomputed: before its first update every run takes the starting model's no-grad forward
# over every training and validation pair, ``train.eval_batch`` pairs a batch, each rank its share
# (engine/loop.precompute_reference): the forward of a validation batch on the same pairs, so it is counted in the
# plan's validation batches
REFERENCE_TERM = "reference log-probabilities (precomputed)"
# a run whose last update saved writes checkpoints/final as a reference to that checkpoint, once its files are checked
# against their manifest (hashed): the pilot times that check on its own checkpoint
FINAL_REF_TERM = "final checkpoint (a checked reference)"
# on CPU a run's watch applies the exact tensor counter (~30 µs per operator) to its first two updates, each new record
# of length and one in 100 (probe/watch.py); the pilot's update unit is timed bare. Its first two validations too: on
# the demo that cost ~0.005 s a batch, under the noise of the pilot's one counted and one bare timing of its worst batch
# (their difference read 0.004-0.018 s in three pilots), so no term counts it
EXACT_UPDATES_TERM = "updates under the memory counter (CPU)"


def reference_batches(n_pairs: int, eval_batch: int, ranks: int = 1) -> int:
    """The batches each rank takes in a run's precomputation of the reference over ``n_pairs``: its share of the
    pairs (the values are then gathered, engine/loop._share_reference), ``eval_batch`` a batch."""
    return math.ceil(math.ceil(n_pairs / ranks) / eval_batch) if n_pairs and eval_batch else 0


def run_terms(counts: dict, units: dict) -> list[dict]:
    """The time of one run, term by term. ``run_overhead`` (a run's start: memory handed back, its journal
    entry; the pilot measures its own) is a term when the units have it; the control predictions are the
    pilot's measured ``control`` seconds when it has them, else two passes counted in eval batches; a precomputed
    preference reference (``counts["reference_batches"]``) is counted in validation batches."""
    u = units
    terms = [("run start (memory freed, journal entry)", "run_overhead", u.get("run_overhead", 0.0),
              1 if "run_overhead" in u else 0),
             ("load", "load", u["load"], 1),
             ("first update (optimizer state)", "first_extra", u["first_extra"], 1),
             ("updates", "update", u["update"], counts["updates"]),
             ("validations", "eval_batch", u["eval_batch"], counts["evals"] * counts["eval_batches"]),
             (EXACT_UPDATES_TERM, "exact_update", u.get("exact_update", 0.0),
              counts.get("exact_updates", 0) if "exact_update" in u else 0),
             (REFERENCE_TERM, "eval_batch", u["eval_batch"], counts.get("reference_batches", 0)),
             ("control predictions", "control", u["control"], 1) if "control" in u else
             ("control predictions", "eval_batch", u["eval_batch"], counts.get("control_passes", 0)),
             ("checkpoints", "save", u["save"], counts["checkpoints"]),
             (FINAL_REF_TERM, "final_ref", u.get("final_ref", 0.0),
              counts.get("final_refs", 0) if "final_ref" in u else 0),
             ("export", "export", u["export"], counts["exports"]),
             ("reload check", "reload", u["reload"], counts["reloads"])]
    out = []
    for label, key, each, n in terms:
        if not n and label in ("run start (memory freed, journal entry)", "control predictions", REFERENCE_TERM,
                               FINAL_REF_TERM, EXACT_UPDATES_TERM):
            continue  # a pilot recorded before these were measured, no control examples, no precomputed reference
        how = {"validations": f"{counts['evals']} validations × {counts['eval_batches']} batches",
               REFERENCE_TERM: f"{n} batches of train.eval_batch pairs, every pair once (each rank its share)",
               "control predictions": "1" if key == "control" else f"2 passes = {n:.2g} eval batches"}.get(label, str(n))
        out.append({"term": label, "unit": key, "each_s": each, "count": n, "count_text": how, "seconds": each * n})
    return out


def pack(runs: list[dict], days: list[int], reserve: float, lanes: int = 1) -> list[dict]:
    """Each rental plan: ``days`` less the ``reserve`` share on each of ``lanes`` GPUs (or GPU groups);
    runs are placed in order (control first) on the lane free soonest; a run that does not fit is
    listed under ``not_fitting`` — never dropped."""
    plans = []
    for d in sorted(days):
        total = d * DAY_S
        budget = total * (1 - reserve)
        load = [0.0] * max(1, lanes)
        placed, left = [], []
        for r in runs:
            lane = min(range(len(load)), key=load.__getitem__)
            if load[lane] + r["seconds"] <= budget:
                placed.append({"label": r["label"], "lane": lane, "start_s": load[lane],
                               "end_s": load[lane] + r["seconds"]})
                load[lane] += r["seconds"]
            else:
                left.append(r["label"])
        plans.append({"days": d, "lanes": len(load), "total_s": total, "reserve_s": total * reserve,
                      "budget_s": budget, "used_s": max(load), "placed": placed, "not_fitting": left,
                      "fits_all": not left})
    return plans


def size(n) -> str:
    """One precision for every size on the sheet: MiB with one decimal below 1 GiB, GiB with two above."""
    if n is None:
        return "n/a"
    return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 2**20:.1f} MiB"


HOST_TERMS = ("load", "checkpoints", FINAL_REF_TERM, "export", "reload check")


def time_reasons(scaling: dict, terms: list[dict], campaign_s: list[float]) -> list[str]:
    """Why the time is what it is, when a floor sets it: latency per pass, or host work a GPU does not speed up.
    ``campaign_s``: the campaign's time on every catalogue GPU that fits."""
    out = []
    per_run = sum(t["seconds"] for t in terms) or 1.0
    if scaling.get("latency_bound"):
        same = bool(campaign_s) and max(campaign_s) <= 1.01 * min(campaign_s)
        floor = scaling.get("floor_s")
        out.append("This campaign is latency-bound: "
                   + (f"an update takes the launch floor ({fmt_duration(floor)}: "
                      f"{GPU_FLOOR_S_PER_PASS * 1e3:g} ms per pass), more than its arithmetic "
                      f"({fmt_duration(scaling.get('compute_s'))} at the stated efficiency), so "
                      if floor else "its measured update is at the per-pass launch floor, so ")
                   + ("every catalogue GPU gives the same time." if same
                      else "a faster GPU shortens it little."))
    host = sum(t["seconds"] for t in terms if t["term"] in HOST_TERMS)
    if host > 0.5 * per_run:
        out.append(f"{host / per_run:.0%} of a run is loading, checkpoints, export and the reload check: host and "
                   f"disk work, kept as measured, which a faster GPU does not shorten.")
    return out
