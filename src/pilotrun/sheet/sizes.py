"""The largest micro_batch, eval_batch and seq_len a target GPU holds: the largest n such that every size up to n
fits, found by a search over the estimator and, where it is needed, a scan.

Each probe runs the loop's own ``run_update`` (or ``evaluate``) once on fake tensors at the probed
shape, under ``probe.estimate.Accountant`` with the model's parameters, gradients and optimizer state
already live (the steady state), and replays it through the caching allocator (probe/stream.py, both cuBLAS
workspaces already held); a size fits when the replay runs on the target's capacity (sheet/gpu_memory.py:
its memory less the context, NCCL's buffers and the headroom): its reserved peak is within it, or the
allocator's retry path (cached segments released) keeps it within it.

Reserved is not monotonic in a size (a block one size larger no longer fits a cached segment: the demo's
micro_batch at 34 tokens reserves 112 MiB at 20, 134 at 21 and 22, 118 at 23), so the answer is not the last size
that fits in probe order. The search finds a boundary (a size that fits, the next does not); below it, every size
is probed downwards until one fits with room for the most fragmentation (reserved − allocated) the probes up to the
boundary showed: allocated grows with the size, so every smaller size then fits too, unless it fragments more than
any size probed there did.

A size is also capped by what can exist, whatever the memory: the model's maximum positions, the
longest record the data holds (a longer seq_len only pads), the examples a rank gets from the split.
The answer names which bound it met.
"""

from __future__ import annotations

import dataclasses
import math

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.engine.loop import evaluate, make_state, run_update
from pilotrun.phases.worst import by_length
from pilotrun.probe.alloc_conf import DEFAULTS, Settings
from pilotrun.probe.allocator import OutOfMemory, replay
from pilotrun.probe.estimate import Accountant, fake_build, unsharded_block_bytes
from pilotrun.probe.stream import ALL_GATHER_STREAM, CUBLAS_WORKSPACE, events
from pilotrun.probe.trace import SHARDED
from pilotrun.tasks.loading import positions_of
from pilotrun.tasks.preference_loss import reference_of


def model_max_positions(model) -> int | None:
    found = positions_of(getattr(model, "config", None))
    return found[1] if found else None


def longest_record(prep) -> tuple[int, bool]:
    """Tokens of the longest record before truncation, and whether that count is exact (a record cut
    at data.max_length whose full length the encoding does not keep is known only to be at least that)."""
    limit = prep.c.data.max_length
    best, exact = 0, True
    for e in prep.train + prep.validation:
        full = e.length
        if "rejected_full" in e.meta:  # a preference pair: its longer half, before the cut
            full = max(full, e.meta["prompt_tokens"] + max(e.target_len_full, e.meta["rejected_full"]))
            exact = exact and e.meta["prompt_tokens"] < limit
        elif prep.c.task == "causal-lm" and len(e.labels) == len(e.input_ids):
            full = max(full, e.prompt_len + e.target_len_full)
            exact = exact and e.prompt_len < limit
        elif e.length >= limit:
            exact = False
        best = max(best, full)
    return best, exact


def _stretched(ids: list, labels: list, length: int) -> tuple[list, list]:
    out = (ids * (length // max(1, len(ids)) + 1))[:length]
    if len(labels) == len(ids):  # one label per position (causal-lm)
        labels = (labels * (length // max(1, len(labels)) + 1))[:length]
        labels = [out[i] if v < 0 else v for i, v in enumerate(labels)]  # every position a target
    return out, labels


def _synth(example, length: int, n: int) -> list:
    """``n`` copies of ``example`` stretched or cut to ``length`` tokens: memory depends on shapes only. A preference
    pair's two sequences both."""
    ids, labels = _stretched(example.input_ids, example.labels, length)
    meta = example.meta
    if "rejected_ids" in meta:
        r_ids, r_labels = _stretched(meta["rejected_ids"], meta["rejected_labels"], length)
        meta = dict(meta, rejected_ids=r_ids, rejected_labels=r_labels)
    if "segments" in meta:  # a packed row (data.packing): its examples repeat or are cut with the tokens
        meta = dict(meta, segments=_stretched_segments(meta["segments"], length))
    return [dataclasses.replace(example, input_ids=ids, labels=labels, meta=meta)] * n


def _stretched_segments(segments: list[int], length: int) -> list[int]:
    """A packed row's example lengths as ``_stretched`` repeats or cuts its tokens to ``length``."""
    out, used = [], 0
    while used < length:
        for n in segments:
            take = min(n, length - used)
            if take <= 0:
                break
            out.append(take)
            used += take
    return out


class _Collated:
    """The task with ``collate`` answered by one batch built beforehand: ``pad_batch`` writes each row
    with its own ops, which under fake tensors costs time in proportion to the batch; n equal rows are
    one row expanded, built outside the fake mode."""

    def __init__(self, task, batch: dict):
        self._task, self._batch = task, batch

    def collate(self, examples):
        return self._batch

    def __getattr__(self, name):
        return getattr(self._task, name)


class Prober:
    """The campaign's model and optimizer on fake tensors, probed at any shape and replayed through the caching
    allocator under ``settings`` with cuBLAS workspaces of ``workspace`` bytes."""

    def __init__(self, loaded, prep, *, settings: Settings = DEFAULTS, workspace: int = CUBLAS_WORKSPACE):
        import torch
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.t, self.task = prep.c.train, prep.task
        self.settings, self.workspace = settings, workspace
        self.ranks = data_parallel_ranks(self.t)
        self.fake = FakeTensorMode(allow_non_fake_inputs=True)
        self.model = fake_build(loaded, self.fake)
        self.max_positions = model_max_positions(self.model)
        self.state = make_state(self.model, self.t, n_train=len(prep.train), seed=prep.c.seed,
                                total_updates=prep.arithmetic()["updates"], device=torch.device("cpu"),
                                kernel_device="cuda")  # the CUDA default (foreach), as in estimate
        self.sharded = self.t.strategy == "fsdp" and self.ranks > 1
        self.block = unsharded_block_bytes(self.model) if self.sharded else 0
        self.train_example = by_length(prep.train)[0]
        self.eval_example = by_length(prep.validation or prep.train)[0]
        self.probes = 0
        self._update(1, min(8, self.train_example.length))  # the optimizer state exists from here on
        # the steady probes by (kind, size, seq_len): a shape probed again is read here, not traced again
        # (the update above allocated the optimizer state: no steady probe, not kept)
        self.seen: dict[tuple, dict] = {}

    def _batch(self, example, length: int, n: int) -> dict:
        import torch

        if "rejected_ids" in example.meta:  # a pair collates to two rows, chosen then rejected: n pairs, built whole
            return self.task.collate(_synth(example, length, n))
        one = self.task.collate(_synth(example, length, 1))
        return {k: v.expand(n, *v.shape[1:]) if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == 1
                else (v * n if isinstance(v, list) else v) for k, v in one.items()}

    def _measure(self, work, batch: dict, grads_live: bool = False) -> dict:
        """One probe: its replay's peaks on a card that never fills, and its events (``fits`` replays them again
        on a capacity)."""
        import torch

        self.probes += 1
        acc = Accountant("cuda")
        acc.cublas = {"forward": 0, "backward": 0}  # a steady step's threads hold their workspaces already
        params = list(self.model.parameters())
        reference = reference_of(self.model)  # preference: the frozen copy, resident beside the policy
        held = list(reference.parameters()) + list(reference.buffers()) if reference is not None else []
        with self.fake, acc.tracking(self.model):
            with acc.mark("probe"):
                for p in params + list(self.model.buffers()) + held:
                    acc.book(p, "parameters")
                for p in params:
                    if grads_live and p.requires_grad:
                        p.grad = torch.zeros_like(p)
                    if p.grad is not None:
                        acc.book(p.grad, "gradients", retag=True)
                for st in self.state.optimizer.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            acc.book(v, "optimizer_state")
                if self.t.strategy == "ddp" and self.ranks > 1:
                    acc.allocate(sum(p.numel() * p.element_size() for p in params if p.requires_grad), "gradients")
                for v in batch.values():  # the inputs on the device (expanded views hold one row)
                    if isinstance(v, torch.Tensor):
                        acc.allocate(v.numel() * v.element_size(), "activations")
                work(_Collated(self.task, batch))
        scale = {k: 1 / self.ranks for k in SHARDED} if self.sharded else None
        gathered = [("probe", self.block, ALL_GATHER_STREAM, False)] * 2 if self.sharded else []
        ev = events(acc, scale, workspace=self.workspace, extras=gathered)
        (peaks,), _ = replay(ev, self.settings)
        return {"reserved": peaks.peak_reserved, "allocated": peaks.peak_allocated, "events": ev}

    def fits(self, probe: dict, capacity: int, total: int | None = None) -> bool:
        """Whether the probe runs on a card whose allocator may take ``capacity`` bytes: its replay's reserved
        peak is within it, or, above it, the replay on that capacity (the retry path) does not run out."""
        if probe["reserved"] <= capacity:
            return True
        if probe["allocated"] > capacity:
            return False
        try:
            replay(probe["events"], self.settings, capacity, total)
        except OutOfMemory:
            return False
        return True

    def _kept(self, key: tuple, measure) -> dict:
        """A steady probe, measured once per shape: each starts from the same state (the parameters, the
        optimizer state, a fresh ledger), so the same shape books the same events. Counted as a probe either way."""
        if key in self.seen:
            self.probes += 1
        else:
            self.seen[key] = measure()
        return self.seen[key]

    def update(self, micro_batch: int, seq_len: int) -> dict:
        """One steady update at this shape: its replay's reserved and allocated peaks."""
        return self._kept(("update", micro_batch, seq_len), lambda: self._update(micro_batch, seq_len))

    def _update(self, micro_batch: int, seq_len: int) -> dict:
        batch = self._batch(self.train_example, seq_len, micro_batch)
        # accumulating, a pass after the first runs with every gradient already held: one such pass
        # has the update's peak, at half the probe's cost of running two
        return self._measure(lambda task: run_update(self.state, task, [[None]], max_grad_norm=self.t.max_grad_norm),
                             batch, grads_live=self.t.accumulation > 1)

    def evaluation(self, eval_batch: int, seq_len: int) -> dict:
        batch = lambda: self._batch(self.eval_example, seq_len, eval_batch)  # noqa: E731
        return self._kept(("evaluation", eval_batch, seq_len), lambda: self._measure(
            lambda task: evaluate(self.state, task, [None] * eval_batch, eval_batch), batch()))


MAX_SCAN = 32  # sizes probed below the boundary at most; beyond, the answer says how far it checked


def _probe(measure, n: int, limit: int) -> tuple[int, int, bool]:
    """(reserved, allocated, fits) of a size; ``measure`` may answer a number (its reserved = allocated)."""
    got = measure(n)
    if isinstance(got, tuple):
        return got
    return got, got, got <= limit


def boundary(measure, limit: int, start: int, cap: int, seen: dict | None = None) -> int:
    """A size in [1, cap] that fits whose next size does not (or the cap), 0 when 1 does not fit: exact where
    fitting is monotonic. Probes the cap first: a pilot's data is small, so the cap (the examples a rank gets,
    the longest record) often fits and one probe answers. Then the piloted size ``start``; then secant guesses
    (memory is close to linear in a batch size) each checked from the other side, alternating with bisection,
    so a curved growth (attention in seq_len) still converges in about twice bisection's probes at worst."""
    if cap < 1:
        return 0
    seen = {} if seen is None else seen
    lo, hi = 0, cap + 1  # n = lo fits, n = hi does not (sentinels, never probed)
    n, last_guess = cap, False
    while True:
        seen[n] = _probe(measure, n, limit)
        fits = seen[n][2]
        lo, hi = (n, hi) if fits else (lo, n)
        if hi - lo <= 1:
            return lo
        if last_guess:  # check the guess from its other side: linear growth ends here
            n, last_guess = (lo + 1 if fits else hi - 1), False
            continue
        if lo < start < hi and start not in seen:
            n = start
            continue
        pts = [(lo, seen.get(lo, (None,))[0]), (hi, seen.get(hi, (None,))[0])]
        guess = None
        if None not in (pts[0][1], pts[1][1]) and pts[1][1] > pts[0][1]:
            (n1, r1), (n2, r2) = pts
            guess = int(n1 + (limit - r1) * (n2 - n1) / (r2 - r1))
        if guess is not None and len(seen) % 2 == 0:
            n, last_guess = min(hi - 1, max(lo + 1, guess)), True
        else:
            n = min(hi - 1, max(lo + 1, (lo + hi) // 2))


def largest(measure, limit: int, start: int, cap: int, scan: dict | None = None) -> int:
    """The largest n in [1, cap] such that every size from 1 to n fits (0 when 1 does not): ``boundary``, then
    downwards from it every size until one fits with room for the most fragmentation seen at sizes up to the
    boundary's next (its reserved plus the largest reserved − allocated of those probes within ``limit``), each
    one that does not fit lowering the answer below it. ``scan`` (a dict) receives how it ended: "checked" (the sizes probed below the boundary)
    and "assumed" (the size below which fitting is inferred, not probed; 0 when every size was)."""
    seen: dict[int, tuple] = {}
    best = boundary(measure, limit, start, cap, seen)
    n, checked, assumed = best, 0, 0
    while n >= 1:
        if n not in seen:
            seen[n] = _probe(measure, n, limit)
            checked += 1
        reserved, allocated, fits = seen[n]
        if not fits:
            best = n - 1
        elif reserved + max(r - a for k, (r, a, _) in seen.items() if k <= best + 1) <= limit or checked >= MAX_SCAN:
            assumed = n - 1
            break
        n -= 1
    if scan is not None:
        scan.update(checked=checked, assumed=assumed)
    return best


DEFINITION = "the largest n such that every size from 1 to n fits (reserved is not monotonic in a size)"


def largest_sizes(loaded, prep, limit: int, *, micro_batch: int, eval_batch: int, seq_len: int,
                  eval_seq_len: int, prober: Prober | None = None, total: int | None = None) -> dict:
    """Per size: its largest value on the target (``DEFINITION``), the bound it met and how it was found.

    ``limit``: the bytes the target's caching allocator may take (its memory less the context, NCCL's buffers
    and the headroom: sheet/gpu_memory.capacity); ``total``: the card's memory."""
    p = prober or Prober(loaded, prep)

    def on_card(probe: dict) -> tuple[int, int, bool]:
        return probe["reserved"], probe["allocated"], p.fits(probe, limit, total)

    longest, exact = longest_record(prep)
    n_train = math.ceil(len(prep.train) / p.ranks)
    n_val = math.ceil(len(prep.validation or prep.train) / p.ranks)
    seq_caps = [(longest, f"longest record: {'' if exact else '≥ '}{longest:,} tokens")]
    if p.max_positions:
        seq_caps.append((p.max_positions, f"model max positions: {p.max_positions:,}"))
    seq_cap, seq_bound = min(seq_caps)
    if not exact and p.max_positions:
        seq_cap, seq_bound = p.max_positions, f"model max positions: {p.max_positions:,}"
    split = "validation" if prep.validation else "train"
    specs = {
        "micro_batch": (lambda n: on_card(p.update(n, seq_len)), micro_batch, n_train,
                        f"train split: {n_train:,} examples per rank", f"at seq_len {seq_len}"),
        "eval_batch": (lambda n: on_card(p.evaluation(n, eval_seq_len)), eval_batch, n_val,
                       f"{split} split: {n_val:,} examples per rank", f"at seq_len {eval_seq_len}"),
        "seq_len": (lambda n: on_card(p.update(micro_batch, n)), seq_len, seq_cap, seq_bound,
                    f"at micro_batch {micro_batch}"),
    }
    out = {}
    for name, (measure, start, cap, cap_text, at) in specs.items():
        before = p.probes
        scan: dict = {}
        value = largest(measure, limit, start, cap, scan)
        out[name] = {"value": value, "cap": cap, "capped": value == cap,
                     "bound": cap_text if value == cap else "GPU memory", "at": at,
                     "source": "predicted: the caching allocator's replay of the estimator's probes",
                     "probes": p.probes - before, "scan": scan}
    return out
