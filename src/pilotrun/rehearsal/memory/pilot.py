"""pilot: every phase once, on the worst-case inputs, one ledger row per phase per rank.

The phases themselves are in ``pilot_phases``; this module prepares (so bad input fails before a
run exists), records the run, launches the ranks when ``train.nproc > 1``, gathers every rank's
rows into the journal and turns them into a verdict with messages a user can act on.
"""

from __future__ import annotations

import os
import time

from pilotrun import startup
from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.prepare import prepare, require_weights
from pilotrun.engine.distributed import check_strategy, gather_to_rank0
from pilotrun.engine.launcher import Ranks
from pilotrun.journal.runs import RunRecorder
from pilotrun.journal.store import Journal
from pilotrun import jsonsafe
from pilotrun.phases import phases_of
from pilotrun.phases.registry import BY_NAME
from pilotrun.probe.alloc_conf import settings_from_env
from pilotrun.probe.memory import release_free_memory
from pilotrun.probe.recorder import figure, host_peak, peak_of
from pilotrun.sizes import fmt_bytes, parse_size
from pilotrun.rehearsal.memory.pilot_phases import INJECT_ENV, PilotJob, parse_inject, run_phases
from pilotrun.sheet.gpu_memory import fragmentation
from pilotrun.verdicts import StageResult

COLUMNS = ["phase", "rank", "counter", "baseline", "peak_allocated", "peak_reserved", "end_allocated",
           "end_reserved", "duration_s", "verdict", "inputs"]
FAILING = ("over-budget", "oom", "nan", "error")


def _rank_main(job: PilotJob, prep=None) -> None:
    """One rank of a distributed pilot: run the phases, gather the rows, rank 0 writes them."""
    rows = run_phases(job, prep)
    gathered = gather_to_rank0(rows)
    if gathered is not None:
        Journal(job.home).add_phase_rows(job.run_id, [r for rank_rows in gathered for r in rank_rows])


def _read_json(path) -> dict | None:
    try:
        return jsonsafe.loads(path.read_text())
    except (OSError, ValueError):
        return None  # a pilot whose train phases failed times no typical update


def _fix_for(row: dict, c) -> str:
    t, kind = c.train, BY_NAME[row["phase"]].kind
    if kind == "eval":
        return (f"try train.eval_batch={max(1, t.eval_batch // 2)}, or `pilotrun fit` to find the largest that fits")
    if kind == "train":
        return (f"try train.micro_batch={max(1, t.micro_batch // 2)} with train.accumulation={t.accumulation * 2} "
                "(same effective batch), or model.gradient_checkpointing=true; `pilotrun fit` measures them")
    if kind == "load":
        return "the weights alone do not fit: a lower-precision model.dtype, an adapter, or fsdp over more GPUs"
    return "see the note; `pilotrun fit` tries the variants that keep the experiment"


def _show_inputs(inputs: dict) -> str:
    keep = ("micro_batch", "accumulation", "ranks", "seq_len", "eval_batch", "precision", "targets", "bytes")
    shown = [f"{k} {v}" for k, v in inputs.items() if k in keep]
    if inputs.get("reference") not in (None, "none"):  # preference: the second model the phase holds
        held = inputs.get("reference_bytes")
        shown.append(f"reference {inputs['reference']}" + (
            f" ({fmt_bytes(held)}, {inputs['reference_params']:,} params, beside the policy's {inputs['params']:,})"
            if held else ""))
    return ", ".join(shown)


# Up to this many bytes the pilot checks its whole checkpoint for the final-reference term; above, it hashes this
# many bytes of it and scales to the checkpoint's size (a 7B model's checkpoint with AdamW is ~110 GB)
FINAL_REF_SAMPLE = 256 * 2**20


def _final_reference_s(ckpt: Path) -> float | None:
    """Seconds to check the pilot's checkpoint file by file against its manifest: what a run pays when its last
    update saved and ``checkpoints/final`` is written as a reference to that checkpoint (journal/checkpoints.py
    ``write_reference`` verifies it first; MiniLM's 270 MB: 0.18 s a run). A checkpoint over ``FINAL_REF_SAMPLE``
    bytes: that many bytes hashed, scaled by its size. None without a checkpoint."""
    import hashlib

    from pilotrun.journal.checkpoints import resolve

    if not (ckpt / "manifest.json").is_file():
        return None
    files = sorted((f for f in ckpt.iterdir() if f.is_file()), key=lambda f: f.stat().st_size)
    total = sum(f.stat().st_size for f in files)
    t0 = time.perf_counter()
    if total <= FINAL_REF_SAMPLE:
        resolve(ckpt)
        return time.perf_counter() - t0
    h, left = hashlib.sha256(), FINAL_REF_SAMPLE
    with open(files[-1], "rb") as f:  # the largest file: the read and the hash at the checkpoint's own pace
        while left > 0:
            chunk = f.read(min(1 << 20, left))
            if not chunk:
                break
            h.update(chunk)
            left -= len(chunk)
    done = FINAL_REF_SAMPLE - left
    return (time.perf_counter() - t0) * total / max(done, 1)


def pilot(loaded, home, *, memory_limit=None, inject=None) -> StageResult:
    """Run the pilot; ``inject`` plants faults for tests ({"oom": "eval_longest"}; see pilot_phases)."""
    require_weights(loaded)
    t0 = time.perf_counter()
    startup_s = startup.take(t0)  # the process's start, imports and checks: a term of the time plan
    # ranks this machine cannot run: before reading anything, as a sweep's run does (training/train.py). It imports
    # torch, which a sweep pays in its start-up and the pilot here in ``prepare_s``: the same group of the time
    # plan's terms (training/timecheck.GROUPS), where after the data it was in none
    check_strategy(loaded.campaign.train)
    prep = prepare(loaded, splits=("train", "validation"))
    prepare_s = time.perf_counter() - t0
    c = prep.c

    limit = (parse_size(memory_limit) if isinstance(memory_limit, str) else memory_limit) \
        or parse_size(c.hardware.memory_per_gpu, where="hardware.memory_per_gpu")
    inject = parse_inject(inject)
    arith = prep.arithmetic()
    ranks = Ranks(data_parallel_ranks(c.train))
    if ranks.follower:  # torchrun started this process as one rank: rank 0 owns the run
        return _follower(prep, ranks)

    t_run = time.perf_counter()
    release_free_memory()  # as every run does before its model is built (rehearsal/training/train.py)
    release_s = time.perf_counter() - t_run
    journal = Journal(home)
    with RunRecorder(journal, loaded, kind="pilot") as rec:
        run_overhead_s = time.perf_counter() - t_run  # a run's start: memory handed back, its journal entry
        job = PilotJob(loaded, str(journal.home), rec.run_id, str(rec.dir), limit, inject)
        ranks.run(_rank_main, job, lambda job: _rank_main(job, prep))
        # a sweep's later runs start in a process that built models and imported their modules: handing memory back
        # walks more objects than before the pilot's first build (the demo: 0.21 s against 0.11)
        t_warm = time.perf_counter()
        release_free_memory()
        warm_run_overhead_s = run_overhead_s + max(0.0, time.perf_counter() - t_warm - release_s)
        final_ref_s = _final_reference_s(rec.dir / "checkpoints" / "pilot")
        rows = journal.phase_rows(rec.run_id)
        bad = [r for r in rows if r["verdict"] in FAILING]
        rec.finish("failed" if any(r["verdict"] in ("oom", "nan", "error") for r in bad) else "completed",
                   {"memory_limit": limit, "arithmetic": arith, "phases": len(rows),
                    "failing": [f"{r['phase']}/{r['rank']}: {r['verdict']}" for r in bad],
                    "time_model": _read_json(rec.dir / "time_model.json"), "prepare_s": prepare_s,
                    "startup_s": startup_s, "run_overhead_s": run_overhead_s,
                    "warm_run_overhead_s": warm_run_overhead_s, "final_ref_s": final_ref_s,
                    # the rows a validation goes over (data.packing packs them: fewer than the file's records)
                    "validation_rows": len(prep.validation) if c.data.validation else None,
                    **({"test_switch": inject} if inject else {})})
    n = len(phases_of(c))
    messages = [f"run {rec.run_id}: {len(rows)} rows ({n} phases × {len(rows) // n or 1} ranks); "
                f"memory limit {fmt_bytes(limit)}",
                f"examples per update = {arith['examples_per_update']} (micro_batch {arith['micro_batch']} × "
                f"accumulation {arith['accumulation']} × ranks {arith['ranks']})"]
    if inject:
        messages.append(f"TEST SWITCH {INJECT_ENV} active: {inject}")
    routed = routing_said(_read_json(rec.dir / "time_model.json") or {}, rows)
    if routed:
        messages.append(routed)
    if rows and rows[0].get("counter") == "rss":
        messages.append("CPU counters are process RSS (peak within the phase), shown in the allocated columns")
    if rows and rows[0].get("counter") == "tensors+rss":
        messages.append("CPU counters: allocated = bytes held by live tensors (exact, true peak: a GPU's allocated "
                        "bytes, what the limit is judged on), reserved = process RSS (this host's memory, not a GPU's)")
    host = max(rows, key=lambda r: host_peak(r) or 0, default=None)
    if host is not None and host_peak(host) is not None:
        messages.append(f"host memory: the process RSS peaked at {fmt_bytes(host_peak(host))} at {host['phase']} (the "
                        "interpreter and libraries too: this machine's, never a GPU figure; `pilotrun sheet` sizes "
                        "the GPU: its need adds the allocator's reserve and the CUDA context to the tensors)")
    for r in bad:
        messages.append(f"{r['verdict']} at {r['phase']} (rank {r['rank']}; {_show_inputs(r['inputs'])}): "
                        f"{r.get('note') or ''}".rstrip())
        if r["verdict"] in ("over-budget", "oom"):
            messages.append(f"  fix: {_fix_for(r, c)}")
    table = [{**{k: r.get(k) for k in COLUMNS}, "inputs": _show_inputs(r["inputs"]),
              **{k: fmt_bytes(r[k]) if r.get(k) is not None else "—" for k in
                 ("baseline", "peak_allocated", "peak_reserved", "end_allocated", "end_reserved")},
              "duration_s": round(r["duration_s"] or 0.0, 3)} for r in rows]
    beside = _replay_beside(loaded, prep, rows) if rows and rows[0].get("counter") == "cuda" else None
    if beside:
        by = {f["phase"]: f for f in beside}
        for row, r in zip(table, rows):
            f = by.get(r["phase"])
            row["fragmentation"] = fmt_bytes(r["peak_reserved"] - r["peak_allocated"]) if f else "—"
            row["replay fragmentation"] = fmt_bytes(f["replay"]) if f else "—"
        messages.append("fragmentation = reserved − allocated at the phase's peaks, measured on this GPU, beside the "
                        "caching allocator's replay of `pilotrun estimate`'s trace for CUDA (bench/RESULTS.md: the "
                        "replay's calibration)")
    peak = max(rows, key=lambda r: peak_of(r) or 0, default=None)
    summary = (f"{len(bad)} of {len(rows)} phase rows failing" if bad else
               f"every phase ran within {fmt_bytes(limit)}; the peak is {peak['phase']} "
               f"({fmt_bytes(peak_of(peak) or 0)} {figure(peak)})" if peak else "no rows")
    ranks.share("fail" if bad else "ok")
    return StageResult("pilot", "fail" if bad else "ok", summary, messages,
                       {"run_id": rec.run_id, "memory_limit": limit, "rows": rows, "fragmentation": beside},
                       columns=_columns(rows) + (["fragmentation", "replay fragmentation"] if beside else []),
                       rows=table)


def _replay_beside(loaded, prep, rows: list[dict]) -> list[dict] | None:
    """A CUDA pilot's fragmentation per phase beside the replay's (sheet/gpu_memory.fragmentation), from the estimator's
    trace of the same campaign under the launch's allocator settings; None (said nowhere, the ledger stands) when the
    estimator cannot trace it."""
    from pilotrun.probe.trace import trace  # lazy: the estimator's trace, only for a CUDA pilot

    try:
        settings, _ = settings_from_env(os.environ)
        predicted = trace(loaded, device="cuda", prep=prep, settings=settings)["rows"]
    except Exception:  # noqa: BLE001 - the comparison is a view beside the measurement, never its verdict
        return None
    return fragmentation(rows, predicted)


def routing_said(model: dict, rows: list[dict]) -> str | None:
    """A mixture of experts' steady update under forced routing against the routing its router chose (the ledger's
    steady_step): the rise in tensor bytes and the seconds, balanced and skewed; None for a dense model."""
    routing = model.get("routing")
    steady = next((r for r in rows if r["phase"] == "steady_step" and r["rank"] == 0), None)
    if not routing or steady is None:
        return None
    own = steady["peak_allocated"] - steady["baseline"]
    parts = [f"{mode} {fmt_bytes(v['peak_allocated'])} in {v['seconds']:.3g} s" for mode, v in routing.items()]
    said = (f"routing (a mixture of experts): the worst-case update rose {fmt_bytes(own)} above its start in "
            f"{steady['duration_s']:.3g} s as the router chose; forced {', '.join(parts)} (skewed: every token to "
            "the same top-k experts, the worst dropless routing allows)")
    ev = next((r for r in rows if r["phase"] == "eval_longest" and r["rank"] == 0), None)
    forced = [f"{mode} {fmt_bytes(v['eval_peak_allocated'])}" for mode, v in routing.items() if "eval_peak_allocated" in v]
    if ev is not None and forced:
        said += (f"; the worst validation batches rose {fmt_bytes(ev['peak_allocated'] - ev['baseline'])} as the "
                 f"router chose, forced {', '.join(forced)}")
    return said + ("; the sheet's memory and the runs' memory bound take the highest, the time plan the router's "
                   "own")


def _columns(rows: list[dict]) -> list[str]:
    """RSS has no reserved counter: its empty columns are left out of the table (the JSON keeps them)."""
    if rows and all(r.get("peak_reserved") is None and r.get("end_reserved") is None for r in rows):
        return [c for c in COLUMNS if c not in ("peak_reserved", "end_reserved")]
    return COLUMNS


def _follower(prep, ranks) -> StageResult:
    """A rank other than 0 under torchrun: run the phases with rank 0's job; rank 0 reports."""
    job = ranks.share()
    _rank_main(job, prep)
    verdict = ranks.share()
    rank = ranks.rank
    return StageResult("pilot", verdict, f"rank {rank}: rows gathered into run {job.run_id} by rank 0",
                       data={"run_id": job.run_id, "rank": rank})
