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

For a mixture of experts the pilot's steady_step and eval_longest rows are first raised to the worst routing the
pilot measured (``routing_worst``: the router's choice moves with the data and the weights; the sheet sizes with the
same rows). A ratio above 1 is a warning naming the update and the sequence length. On CPU the bound is judged
on the exact tensor counter (engine/tensors.py, counter "tensors+rss"), on CUDA on the allocator's
allocated counter (the bytes of live tensors' blocks): both count tensors, so there is no noise
allowance. Reserved is not judged: the caching allocator keeps every segment an earlier block reserved,
so a run's training update peaks at the reserved pool its validations left (an H200 run of the demo:
114 MiB against the pilot's steady_step 92 MiB, same inputs, same allocated bytes); its ratio is
shown, informative, as RSS's is on CPU. Only rows of the old RSS-only counter ("rss") keep the 10%
allowance below.

The exact CPU counter costs ~30 µs per operator (the dispatch mode), so on CPU the watch applies it to
a chosen subset of blocks (``exact_block``): the first two updates (the optimizer state's allocation,
then the first steady update), every update whose widest micro-batch is longer or holds more padded
tokens than every update before it (a tensor counter gives the same peak for the same shapes, and a
larger shape cannot need less, so only a new record can set a new peak), one update in
``SPOT_EVERY`` as a spot check, the first two validations (before and after the optimizer state
exists: later ones repeat the same batches) and the first save and export. The others run unprobed.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

from pilotrun.engine.distributed import node_name
from pilotrun.phases import names
from pilotrun.probe.memory import TensorProbe, make_probe
from pilotrun.probe.recorder import peak_of
from pilotrun.sizes import fmt_bytes

PILOT_NAMES = {"train": names("train"), "evaluation": names("eval"), "save": names("save"),
                "export": names("export")}
# RSS counts the whole process (allocator caches, Python objects, the journal's buffers): over the
# demo's 200 updates of identical shapes the RSS at the start of an update wandered between 395 and
# 407 MiB, and the worst of 200 update peaks exceeded the pilot's single steady_step by 2-3%. With
# uneven lengths glibc keeps freed blocks of one shape in its heap while the next shape takes new
# pages: short batches then peaked up to 5% (a 32k-vocabulary model, tests/test_memory_bound.py) and
# 12% (bench_promises' Stack Exchange + Alpaca campaign) above the pilot's longest batch. A run's peak
# is the worst of hundreds of such readings, so RSS gets 10% (at least 16 MiB) before a warning. CUDA's
# counters count tensors exactly: no allowance (its reserved pool fragments too, which the sheet's replay of
# the caching allocator predicts).
NOISE = {"rss": (0.10, 16 * 2**20)}
EXACT = "tensors+rss"
TENSOR_COUNTERS = (EXACT, "cuda")  # counters whose peak_allocated is the bytes of live tensors
SPOT_EVERY = 100
EXACT_FIRST = {"train": 2, "evaluation": 2}  # the first blocks of a kind always probed (the others': 1)


def _exact_update(n: int, record: bool) -> bool:
    """Whether the ``n``-th update (from 0) runs under the exact counter on CPU: one of the first two, a new record
    of length or padded tokens, or a spot check."""
    return n < EXACT_FIRST["train"] or record or (n + 1) % SPOT_EVERY == 0


def _beyond(top: tuple[int, int], key: tuple[int, int]) -> tuple[bool, tuple[int, int]]:
    """Whether ``key`` (an update's longest example, its most padded tokens: engine/sampler.update_key) sets a new
    record over ``top``, and the records after it."""
    return key[0] > top[0] or key[1] > top[1], (max(key[0], top[0]), max(key[1], top[1]))


def exact_updates(keys: list) -> int:
    """How many of the updates whose keys (engine/sampler.update_key) are ``keys``, in order, the watch runs under
    the exact counter on CPU (``PeakWatch.exact_block``'s rule): the time plan's count of slower updates
    (sheet/time_plan.py)."""
    top, n_exact = (0, 0), 0
    for n, key in enumerate(keys):
        record, top = _beyond(top, key)
        n_exact += _exact_update(n, record)
    return n_exact


def bound_peak(row: dict) -> int | None:
    """The number the bound compares: the live tensor bytes on CPU and CUDA (allocated), else the probe's
    peak (``peak_of``)."""
    return row.get("peak_allocated") if row.get("counter") in TENSOR_COUNTERS else peak_of(row)


def noise_bytes(counter: str | None, peak: int) -> int:
    share, floor = NOISE.get(counter or "", (0.0, 0))
    return max(floor, int(share * peak)) if share or floor else 0


class PeakWatch:
    """``with watch("train", {"update": 37, "seq_len": 912}): ...`` — keeps the worst block per kind."""

    def __init__(self, device=None, rank: int = 0, *, every_block: bool = False):
        self.probe = make_probe(device)
        self.rank = rank
        self.sampled = isinstance(self.probe, TensorProbe) and not every_block
        self.worst: dict[str, dict] = {}
        self.count: dict[str, int] = {}
        self.probed: dict[str, int] = {}
        self.seconds: dict[str, float] = {}  # wall time of every block per kind, probed or not (the time plan's terms)
        self._top = (0, 0)  # the longest widest micro-batch and the most padded tokens of one so far

    def track(self, *objs) -> None:
        """Count the model and optimizer built before the loop (engine/tensors.py ``track``); CPU only."""
        if isinstance(self.probe, TensorProbe):
            from pilotrun.engine.tensors import track  # lazy: pulls in torch

            track(*objs)

    def exact_block(self, kind: str, inputs: dict) -> bool:
        """Whether this block runs under the probe (always on CUDA/MPS and with ``every_block``)."""
        n = self.count.get(kind, 0)
        if kind == "train":
            record, self._top = _beyond(self._top, (inputs.get("seq_len") or 0, inputs.get("tokens") or 0))
            return not self.sampled or _exact_update(n, record)
        if not self.sampled:
            return True
        return n < EXACT_FIRST.get(kind, 1)

    @contextmanager
    def __call__(self, kind: str, inputs: dict):
        if not self.exact_block(kind, inputs):
            self.count[kind] = self.count.get(kind, 0) + 1
            t0 = time.perf_counter()
            try:
                yield
            finally:
                self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t0
            return
        t_all = time.perf_counter()
        self.probe.start()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            row = self.probe.stop()
            row.update(phase=kind, rank=self.rank, inputs=dict(inputs), duration_s=time.perf_counter() - t0)
            self.seconds[kind] = self.seconds.get(kind, 0.0) + time.perf_counter() - t_all
            self.count[kind] = self.count.get(kind, 0) + 1
            self.probed[kind] = self.probed.get(kind, 0) + 1
            best = self.worst.get(kind)
            if best is None or (bound_peak(row) or -1) > (bound_peak(best) or -1):
                self.worst[kind] = row

    def rows(self) -> list[dict]:
        node = node_name()  # ranks on several machines: which one each rank's row came from
        return [dict(r, inputs=dict(r["inputs"], blocks=self.count[k], probed=self.probed[k], node=node))
                for k, r in self.worst.items()]


def _where(inputs: dict) -> str:
    keys = ("update", "seq_len", "micro_batch", "tokens", "eval_batch", "targets")
    return ", ".join(f"{k} {inputs[k]}" for k in keys if inputs.get(k) is not None)


def _allowance(row: dict, noise: int) -> str:
    if row.get("counter") == EXACT:
        return f"live tensor bytes, exact: no allowance; {row['inputs'].get('probed', 1)} block(s) probed"
    if row.get("counter") == "cuda":
        return "CUDA allocated bytes: no allowance"
    return f"noise allowance {fmt_bytes(noise)}"


ROUTED = {"steady_step": "peak_allocated", "eval_longest": "eval_peak_allocated"}  # phase: its key in ``routing``


def pilot_routing(pilot: dict | None) -> dict | None:
    """The forced routings a pilot run measured (its summary's time model), None for a dense model or no pilot."""
    return (((pilot or {}).get("summary") or {}).get("time_model") or {}).get("routing")


def routing_worst(rows: list[dict], routing: dict | None) -> list[dict]:
    """A mixture of experts' pilot rows sized for the worst routing it measured: where the worst-case update, or the
    worst validation batches, under forced routing (the pilot's time model: balanced, every token to the same
    experts) rose higher above its start than the steady_step (eval_longest) row's as the router chose, that row's
    peaks take the difference (``routing`` in its inputs says which). The sheet sizes with these rows, and a run's
    peaks are judged against them (rehearsal/training/train.record_memory_bound). Unchanged for a dense model, when
    the router's own was the highest, or for a pilot that measured no forced validation (before this key existed)."""
    if not routing:
        return rows
    out = []
    for r in rows:
        key = ROUTED.get(r["phase"])
        forced = [(mode, v[key]) for mode, v in routing.items() if v.get(key) is not None] if key else []
        if forced and r.get("peak_allocated") is not None and r.get("baseline") is not None:
            mode, worst = max(forced, key=lambda kv: kv[1])
            extra = worst - (r["peak_allocated"] - r["baseline"])
            if extra > 0:
                r = dict(r, inputs=dict(r["inputs"], routing=f"{mode} (forced; +{extra} bytes)"),
                         **{k: r[k] + extra for k in ("peak_allocated", "peak_reserved") if r.get(k) is not None})
        out.append(r)
    return out


def bound_rows(observed: list[dict], pilot_rows: list[dict], pilot_run: str | None) -> tuple[list[dict], dict]:
    """Ledger rows of the run's observed peaks, each with its ratio to the pilot; and a summary.

    Summary: ``{"pilot_run", "max_ratio", "kinds": {kind: {...}}, "warnings": [...]}``.
    """
    out, kinds, warnings = [], {}, []
    for row in observed:
        kind = row["phase"]
        same_kind = [r for r in pilot_rows if r["phase"] in PILOT_NAMES.get(kind, ())
                     and r.get("rank", 0) == row["rank"]]
        mine = [r for r in same_kind if r.get("counter") == row.get("counter") and bound_peak(r) is not None]
        peak = bound_peak(row)
        ref = max(mine, key=bound_peak) if mine else None
        info = {"peak": peak, "counter": row.get("counter"), "inputs": row["inputs"], "pilot_peak": None,
                "pilot_phase": None, "ratio": None, "noise": None, "over": False, "rss_ratio": None,
                "reserved_ratio": None}
        verdict, note = "ok", "no pilot row to compare with"
        if ref is None and same_kind:
            note = (f"the pilot measured with the {same_kind[0].get('counter')!r} counter, this run with "
                    f"{row.get('counter')!r}: rerun `pilotrun pilot` to compare")
        if ref is not None and peak is not None:
            pp = bound_peak(ref)
            ratio = peak / pp if pp else None
            noise = noise_bytes(row.get("counter"), pp)
            info.update(pilot_peak=pp, pilot_phase=ref["phase"], ratio=ratio, noise=noise)
            if row.get("counter") in TENSOR_COUNTERS and row.get("peak_reserved") and ref.get("peak_reserved"):
                # informative: RSS keeps heap, CUDA's reserved keeps the cache's segments
                info["rss_ratio" if row.get("counter") == EXACT else "reserved_ratio"] = \
                    row["peak_reserved"] / ref["peak_reserved"]
            if ratio is not None and peak > pp + noise:
                verdict, info["over"] = "warn", True
                note = (f"the pilot did not see the worst case: {_where(row['inputs'])} peaked at {fmt_bytes(peak)}, "
                        f"{ratio:.3f} × the pilot's {ref['phase']} ({fmt_bytes(pp)}; {_allowance(row, noise)})")
                warnings.append(f"{kind}: {note}")
            else:
                note = (f"{ratio:.3f} × the pilot's {ref['phase']} peak ({fmt_bytes(peak)} vs {fmt_bytes(pp)}; "
                        f"{_allowance(row, noise)}); worst at {_where(row['inputs'])}")
            if info["rss_ratio"] is not None:
                note += f"; RSS {info['rss_ratio']:.3f} × the pilot's (informative)"
            if info["reserved_ratio"] is not None:
                note += f"; reserved {info['reserved_ratio']:.3f} × the pilot's (informative: the allocator's cache)"
        if kind not in kinds or (info["ratio"] or 0) > (kinds[kind]["ratio"] or 0):
            kinds[kind] = info | {"rank": row["rank"]}  # the worst rank's, when several ranks ran
        out.append(dict(row, phase=f"observed_{kind}", verdict=verdict, note=note))
    ratios = [k["ratio"] for k in kinds.values() if k["ratio"] is not None]
    return out, {"pilot_run": pilot_run, "max_ratio": max(ratios) if ratios else None, "kinds": kinds,
                 "warnings": warnings}
