"""The one rank launcher: how a run's ranks come to be, for the pilot, train (so sweep) and the tests
that start framework scripts as ranks.

A run of ``world`` ranks is either one process (``world`` 1), spawned from this process
(``engine.distributed.launch``: fresh processes with torchrun's environment), or joined: torchrun
(or an initialized process group) started this process as one of them. In the joined case rank 0
owns the run (creates it, finishes it) and hands the others the job with a broadcast; they are
followers. ``start_scripts`` starts a script as ``nproc`` ranks with the same environment.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pilotrun.engine.distributed import (broadcast_from_rank0, free_port, init_from_launcher, is_initialized, launch,
                                         rank_env, under_launcher, world_rank)
from pilotrun.errors import BadInput


class Ranks:
    """The ranks of one run of ``world`` ranks, as seen from this process."""

    def __init__(self, world: int):
        self.world = world
        self.joined = under_launcher() or (world > 1 and is_initialized())
        self.spawn = world > 1 and not self.joined
        if self.joined:
            init_from_launcher()
            here = world_rank()[0]
            if here != world:  # each process would otherwise make a run of its own, or join one of another size
                raise BadInput(f"train.nproc={world} but this process is one of {here} ranks", where="train.nproc",
                               fix=f"launch with torchrun --nproc_per_node {world}, or set train.nproc={here}")

    @property
    def rank(self) -> int:
        return world_rank()[1] if self.joined else 0

    @property
    def follower(self) -> bool:
        """A joined rank other than 0: it takes the job from rank 0 (``share``) and owns nothing."""
        return self.joined and self.rank != 0

    def share(self, obj=None):
        """Rank 0's ``obj`` on every joined rank (the job, then the verdict); ``obj`` itself otherwise."""
        return broadcast_from_rank0(obj) if self.joined else obj

    def run(self, fn, job, here) -> None:
        """The owner runs ``job`` on every rank: spawned (``fn(job)`` in each new process, as on the rental: the
        pilot measures their start), or shared with the joined followers and run here by ``here(job)`` (also the
        one-process case)."""
        if self.spawn:
            launch(fn, self.world, (job,), spawn=True)
        else:
            here(self.share(job))


def start_scripts(argv: list[str], nproc: int, log_dir: Path, *, timeout: float, env: dict | None = None) -> list:
    """Run ``python argv...`` as ``nproc`` ranks (torchrun's environment, CPU only); the exit status of each
    (``"timeout"`` for one that did not end in time), its output in ``log_dir/rank-R.log``."""
    port, procs = free_port(), []
    for rank in range(nproc):
        rank_vars = dict(os.environ, **(env or {}), **rank_env(rank, nproc, port), OMP_NUM_THREADS="1",
                         CUDA_VISIBLE_DEVICES="")
        log = open(Path(log_dir) / f"rank-{rank}.log", "w")
        procs.append((subprocess.Popen([sys.executable, *argv], env=rank_vars, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    codes = []
    try:
        for p, _ in procs:
            try:
                codes.append(p.wait(timeout=timeout))
            except subprocess.TimeoutExpired:
                codes.append("timeout")
    finally:
        for p, log in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            log.close()
    return codes
