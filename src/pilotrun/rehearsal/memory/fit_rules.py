"""The rules every fit variant keeps: the same examples per update, losses within a tolerance of the
control's, and how many probes a bisection may take. Shared by ``fit`` and ``fit_variants``."""

from __future__ import annotations

import math

from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.errors import BadInput
from pilotrun.phases import names

FP32_RTOL = 1e-5   # same math in another order: fp32 rounding only (observed ~1e-8 on the tiny models)
MIXED_RTOL = 2e-2  # bf16 keeps 8 mantissa bits (~0.4 % per rounding); the first losses stay within ~1e-3
LOSS_UPDATES = 3   # updates compared with the control
TRAIN_BOUND, EVAL_BOUND = names("train"), names("eval")


def accumulation_for(t, micro_batch: int, effective: int) -> int:
    """The accumulation that keeps ``effective`` examples per update; an error naming the keys when none does."""
    ranks = data_parallel_ranks(t)
    if effective % (micro_batch * ranks):
        raise BadInput(f"an effective batch of {effective} examples per update cannot be reached with "
                       f"train.micro_batch={micro_batch} on {ranks} ranks: {effective} is not a multiple of "
                       f"{micro_batch} × {ranks}", where="train.micro_batch, train.accumulation, train.nproc",
                       fix=f"choose train.micro_batch × train.accumulation × train.nproc = {effective} "
                           f"(e.g. train.nproc dividing {effective}), or pass --effective-batch")
    return effective // (micro_batch * ranks)


def micro_batch_candidates(t, effective: int) -> list[int]:
    """Micro-batches below the control's that keep ``effective`` examples per update, ascending."""
    per_rank = effective // data_parallel_ranks(t)
    return [d for d in range(1, t.micro_batch) if per_rank % d == 0]


def probe_bound(n: int) -> int:
    return math.ceil(math.log2(n)) + 1 if n > 1 else 1
