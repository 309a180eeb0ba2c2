"""What ``fit`` measures: one phase of a variant through the loop's own functions, inside the probes.

A training probe is the pilot's first_step (optimizer state is allocated in it) followed by its
steady_step (gradients, activations and optimizer state all live at once), the larger of the two
counting; an evaluation probe reaches eval_longest the way the pilot does, after an update, so the
optimizer state is there. Both go through the one driver (``phases.driver``) on ``phases.worst``.

The first updates' losses (``first_losses``) go through ``train`` itself, stopped after k updates.
"""

from __future__ import annotations

import statistics

from pilotrun.campaign.prepare import Prepared
from pilotrun.engine.distributed import default_device
from pilotrun.engine.loop import Hooks, NoTargets, make_state, train
from pilotrun.phases import names
from pilotrun.phases.driver import PhaseContext, drive, quiet
from pilotrun.phases.worst import worst_case
from pilotrun.probe.memory import release_free_memory
from pilotrun.probe.recorder import peak_of, phase
from pilotrun.tasks import make_task

# On CPU the counter is the process's RSS, which a limit is checked against as a whole. glibc keeps
# freed memory for reuse, so RSS after one probe would carry into the next; with a fixed mmap
# threshold each tensor above 64 KiB is its own mapping, returned to the system when freed, and a
# trim before each probe hands back the rest. What remains is noise of a few MiB (code pages,
# allocator bookkeeping), which the margin covers.
MMAP_THRESHOLD = 64 * 2**10
CPU_MARGIN_MIN, CPU_MARGIN_SHARE = 8 * 2**20, 0.02


def margin(limit: int, device_kind: str) -> int:
    """Headroom a CPU measurement must leave under the limit (RSS noise); CUDA counters are exact."""
    return max(CPU_MARGIN_MIN, int(CPU_MARGIN_SHARE * limit)) if device_kind == "cpu" else 0


def quiet_allocator() -> None:
    """Large blocks straight from mmap (so RSS follows what is held), then ``release_free_memory``."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, MMAP_THRESHOLD)  # M_MMAP_THRESHOLD; also stops glibc raising it
    except (OSError, AttributeError):
        pass  # not glibc: the margin has to absorb the allocator's cache
    release_free_memory()


def variant_prep(prep: Prepared, loaded) -> Prepared:
    """The variant's task on the control's encoded examples (train.* and model.* keys do not change encoding)."""
    return Prepared(loaded, make_task(loaded), prep.examples)


def _fresh_state(prep: Prepared, device):
    import torch

    torch.manual_seed(prep.c.seed)
    model = prep.task.build_model().to(device)
    return make_state(model, prep.c.train, n_train=len(prep.train), seed=prep.c.seed,
                      total_updates=prep.arithmetic()["updates"], device=device)


def probe(prep: Prepared, kind: str, *, limit: int | None = None, device=None) -> dict:
    """Measure a variant: ``kind`` "train" (first_step + steady_step) or "eval" (eval_longest).

    Returns the row of the largest phase (ledger row shape), with ``fits`` against ``limit`` minus margin.
    """
    device = device or default_device()
    measured = names("train") if kind == "train" else names("eval")
    ctx = PhaseContext(prep, worst_case(prep, 1), device=device, done={"load"})
    rows = ctx.rows

    def measure(name: str, inputs: dict):
        if name not in measured:  # the update an evaluation probe runs first, so the optimizer state is there
            return quiet(name, inputs)
        return phase(name, inputs, rows=rows, device=device, memory_limit=limit, catch_errors=True, barrier=False)

    quiet_allocator()
    ctx.state = _fresh_state(prep, device)
    # a train probe runs a precomputed reference's phase first, unmeasured (a campaign has it only then)
    driven = ("precompute_reference",) + measured if kind == "train" else names("eval") + names("train")[:1]
    try:
        drive(ctx, measure, driven, stop=lambda ctx: bool(rows) and rows[-1]["verdict"] in ("oom", "error"))
    except NoTargets:  # a variant (a shorter data.max_length) that leaves the worst update no target: its phase's
        pass  # row (verdict error, the message) says so, and it does not fit; the campaign itself is not at fault
    finally:
        ctx.state = None
        quiet_allocator()
    failed = next((r for r in rows if r["verdict"] in ("oom", "error")), None)
    row = dict(failed or max(rows, key=lambda r: peak_of(r) or 0))
    peak = peak_of(row)
    row["fits"] = failed is None and (limit is None or peak <= limit - margin(limit, device.type))
    return row


def largest_fitting(candidates: list, fits) -> tuple:
    """The largest candidate (ascending list, ``fits`` true up to some point and false after) that fits,
    by bisection: at most floor(log2(n)) + 1 probes. Returns (best or None, [(candidate, fits), ...])."""
    lo, hi = 0, len(candidates) - 1
    best, tried = None, []
    while lo <= hi:
        mid = (lo + hi + 1) // 2
        ok = bool(fits(candidates[mid]))
        tried.append((candidates[mid], ok))
        if ok:
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return best, tried


def first_losses(prep: Prepared, k: int, device=None) -> dict:
    """The first k updates through ``train``: their losses and the median seconds of an update after the first."""
    device = device or default_device()
    quiet_allocator()
    state = _fresh_state(prep, device)
    result = train(state, prep.task, prep.train, [], prep.c.train, hooks=Hooks(stop_at=k))
    seconds = result.seconds[1:] or result.seconds
    out = {"losses": [h["loss"] for h in result.history], "step_s": statistics.median(seconds) if seconds else None}
    del state
    quiet_allocator()
    return out


def losses_match(control: list[float], variant: list[float], rtol: float) -> tuple[bool, float]:
    """Whether every loss is within ``rtol`` (relative) of the control's; also the largest relative gap."""
    if len(control) != len(variant) or not control:
        return False, float("inf")
    gap = max(abs(a - b) / max(abs(a), 1e-12) for a, b in zip(control, variant))
    return gap <= rtol, gap
