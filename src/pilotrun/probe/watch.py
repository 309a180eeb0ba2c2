"""The campaign's own peaks, watched during every ``train``/``sweep`` run, against the pilot's.

The pilot promises that its worst-case inputs bound every batch the campaign will see. A run checks
that promise: the loop wraps each update, each validation and each save in ``PeakWatch`` (the same
probes as the pilot's phases), which keeps, per kind, the highest peak and the inputs that set it.
At the end, ``bound_rows`` compares each kind with the pilot's rows of the matching phases:

    observed kind   pilot phases
    train           first_step, steady_step
    evaluation      eval_longest
    save            save
    export          export

A ratio above 1 (beyond the probe's noise: exact for CUDA counters; for RSS on CPU the same margin
``fit`` leaves, see ``NOISE``) is a warning naming the update and the sequence length.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from pilotrun.phases import names
from pilotrun.probe.memory import make_probe
from pilotrun.probe.recorder import peak_of
from pilotrun.probe.sizes import fmt_bytes

PILOT_NAMES = {"train": names("train"), "evaluation": names("eval"), "save": names("save"),
                "export": names("export")}
# RSS counts the whole process (allocator caches, Python objects, the journal's buffers): over the
# demo's 200 updates of identical shapes the RSS at the start of an update wandered between 395 and
# 407 MiB, and the worst of 200 update peaks exceeded the pilot's single steady_step by 2-3%. With
# uneven lengths glibc keeps freed blocks of one shape in its heap while the next shape takes new
# pages: short batches then peaked up to 5% (a 32k-vocabulary model, tests/test_memory_bound.py) and
# 12% (bench_promises' Stack Exchange + Alpaca campaign) above the pilot's longest batch. A run's peak
# is the worst of hundreds of such readings, so RSS gets 10% (at least 16 MiB) before a warning; the
# sheet's margin (sheet/plan.py MARGIN_FRACTION) is the same 10%. CUDA's counters count tensors
# exactly: no allowance (its reserved pool can fragment too, which the sheet's margin covers).
NOISE = {"rss": (0.10, 16 * 2**20)}


def noise_bytes(counter: str | None, peak: int) -> int:
    share, floor = NOISE.get(counter or "", (0.0, 0))
    return max(floor, int(share * peak)) if share or floor else 0


class PeakWatch:
    """``with watch("train", {"update": 37, "seq_len": 912}): ...`` — keeps the worst block per kind."""

    def __init__(self, device=None, rank: int = 0):
        self.probe = make_probe(device)
        self.rank = rank
        self.worst: dict[str, dict] = {}
        self.count: dict[str, int] = {}

    @contextmanager
    def __call__(self, kind: str, inputs: dict):
        self.probe.start()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            row = self.probe.stop()
            row.update(phase=kind, rank=self.rank, inputs=dict(inputs), duration_s=time.perf_counter() - t0)
            self.count[kind] = self.count.get(kind, 0) + 1
            best = self.worst.get(kind)
            if best is None or (peak_of(row) or -1) > (peak_of(best) or -1):
                self.worst[kind] = row

    def rows(self) -> list[dict]:
        return [dict(r, inputs=dict(r["inputs"], blocks=self.count[k])) for k, r in self.worst.items()]


def _where(inputs: dict) -> str:
    keys = ("update", "seq_len", "micro_batch", "eval_batch", "targets")
    return ", ".join(f"{k} {inputs[k]}" for k in keys if inputs.get(k) is not None)


def bound_rows(observed: list[dict], pilot_rows: list[dict], pilot_run: str | None) -> tuple[list[dict], dict]:
    """Ledger rows of the run's observed peaks, each with its ratio to the pilot; and a summary.

    Summary: ``{"pilot_run", "max_ratio", "kinds": {kind: {...}}, "warnings": [...]}``.
    """
    out, kinds, warnings = [], {}, []
    for row in observed:
        kind = row["phase"]
        mine = [r for r in pilot_rows if r["phase"] in PILOT_NAMES.get(kind, ()) and r.get("rank", 0) == row["rank"]
                and r.get("counter") == row.get("counter") and peak_of(r) is not None]
        peak = peak_of(row)
        ref = max(mine, key=peak_of) if mine else None
        info = {"peak": peak, "counter": row.get("counter"), "inputs": row["inputs"], "pilot_peak": None,
                "pilot_phase": None, "ratio": None, "noise": None, "over": False}
        verdict, note = "ok", "no pilot row to compare with"
        if ref is not None and peak is not None:
            pp = peak_of(ref)
            ratio = peak / pp if pp else None
            noise = noise_bytes(row.get("counter"), pp)
            info.update(pilot_peak=pp, pilot_phase=ref["phase"], ratio=ratio, noise=noise)
            if ratio is not None and peak > pp + noise:
                verdict, info["over"] = "warn", True
                note = (f"the pilot did not see the worst case: {_where(row['inputs'])} peaked at {fmt_bytes(peak)}, "
                        f"{ratio:.3f} × the pilot's {ref['phase']} ({fmt_bytes(pp)}; noise allowance "
                        f"{fmt_bytes(noise)})")
                warnings.append(f"{kind}: {note}")
            else:
                note = (f"{ratio:.3f} × the pilot's {ref['phase']} peak ({fmt_bytes(peak)} vs {fmt_bytes(pp)}; "
                        f"noise allowance {fmt_bytes(noise)}); worst at {_where(row['inputs'])}")
        if kind not in kinds or (info["ratio"] or 0) > (kinds[kind]["ratio"] or 0):
            kinds[kind] = info | {"rank": row["rank"]}  # the worst rank's, when several ranks ran
        out.append(dict(row, phase=f"observed_{kind}", verdict=verdict, note=note))
    ratios = [k["ratio"] for k in kinds.values() if k["ratio"] is not None]
    return out, {"pilot_run": pilot_run, "max_ratio": max(ratios) if ratios else None, "kinds": kinds,
                 "warnings": warnings}
