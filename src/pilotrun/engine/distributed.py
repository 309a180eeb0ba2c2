"""Rank and world of the current process; helpers that are no-ops without torch.distributed."""

from __future__ import annotations

from typing import NoReturn

from pilotrun import signals
from pilotrun.errors import BadInput


def world_rank() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def all_reduce_sum(value, device) -> float:
    """Sum a number over ranks (returns it unchanged on one process)."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return float(value)
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item())


def agree_max(value: int, device) -> int:
    """The largest of every rank's ``value`` (one int64 all-reduce; ``value`` itself on one process): how the
    ranks agree on a stop, so every one of them stops after the same update."""
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return int(value)
    t = torch.tensor([int(value)], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def default_device():
    import os

    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    return torch.device("cpu")


# --- launching and wrapping (pilot, train) -----------------------------------------------------------

def is_initialized() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


NOT_TORCHRUN = ("unset them to run in this process alone (env -u WORLD_SIZE -u RANK pilotrun ...), or start pilotrun "
               "with torchrun --nproc_per_node N -m pilotrun ...")


def _launcher_int(name: str, default: int | None = None) -> int:
    """A launcher's variable as the integer it must be; another value is exit 2 naming it (was a ValueError)."""
    import os

    text = os.environ.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(text)
    except (TypeError, ValueError):
        raise BadInput(f"${name}={text!r} is not a whole number, as torchrun sets it for each rank it starts",
                       where=name, fix=NOT_TORCHRUN) from None


def under_launcher() -> bool:
    """True when torchrun (or a launcher like it) started this process as one rank of several."""
    import os

    return _launcher_int("WORLD_SIZE", 1) > 1 and "RANK" in os.environ


def check_launcher_env() -> None:
    """What env:// rendezvous reads, checked before it does: a shell where WORLD_SIZE and RANK were exported by hand
    or left from a job script, with no MASTER_ADDR, was exit 3 inside torch ("MASTER_ADDR expected, but not set")."""
    import os

    world, rank = _launcher_int("WORLD_SIZE"), _launcher_int("RANK")
    if not 0 <= rank < world:
        raise BadInput(f"$RANK={rank} is not a rank of $WORLD_SIZE={world} (0 to {world - 1})", where="RANK",
                       fix=NOT_TORCHRUN)
    missing = [v for v in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(v)]
    if missing:
        raise BadInput(f"$WORLD_SIZE={world} and $RANK={rank} are set, as torchrun sets them for each rank, but "
                       f"{' and '.join('$' + v for v in missing)} not: no launcher started this process, so it has "
                       "no rank 0 to meet", where="WORLD_SIZE", fix=NOT_TORCHRUN)
    for name in ("MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        if name in os.environ:
            _launcher_int(name)


def node_name() -> str:
    """This rank's machine: its host name and, under torchrun, its node's rank (GROUP_RANK), which tells
    apart nodes that share a host name (two agents on one machine, containers)."""
    import os
    import socket

    group = os.environ.get("GROUP_RANK")
    return f"{socket.gethostname()} node {group}" if under_launcher() and group is not None else socket.gethostname()


def backend_for_device() -> str:
    import torch

    return "nccl" if torch.cuda.is_available() else "gloo"


def check_strategy(t) -> None:
    """Refuse what cannot run here before any process starts, with the key to change."""
    import torch

    if t.strategy == "fsdp" and t.nproc < 2:
        raise BadInput(f"train.strategy=fsdp with train.nproc={t.nproc}: FSDP shards the parameters, gradients and "
                       "optimizer state over the ranks, and one rank has nothing to share them with",
                       where="train.nproc",
                       fix="set train.nproc: 2 or more (FSDP runs on CPU over gloo too), or train.strategy: single")
    if t.strategy not in ("ddp", "fsdp") or under_launcher():  # under torchrun the world is torchrun's (Ranks)
        return
    if torch.cuda.is_available() and t.nproc > torch.cuda.device_count():
        raise BadInput(f"train.nproc={t.nproc} but this machine has {torch.cuda.device_count()} CUDA devices",
                       where="train.nproc", fix=f"set train.nproc={torch.cuda.device_count()} or fewer")
    cores = usable_cores()
    if not torch.cuda.is_available() and t.nproc > cores:
        raise BadInput(f"train.nproc={t.nproc} but this machine has {cores} CPU cores: each rank is a process "
                       "that needs one at least; no process was started", where="train.nproc",
                       fix=f"set train.nproc={cores} or fewer (on a GPU machine the bound is its number of GPUs)")


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, as a container or a SLURM allocation sets it)."""
    import os

    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """torchrun's environment for one rank on this host (spawned ranks and ranks started as scripts)."""
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "GROUP_RANK": "0"}


def init_process_group(rank: int, world: int, port: int | None = None) -> None:
    """torchrun-style environment, then the process group: gloo on CPU, nccl on CUDA (one device per rank)."""
    import os

    import torch
    import torch.distributed as dist

    if port is not None:
        os.environ.update(rank_env(rank, world, port))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        # ranks share the cores: without this each would start one thread per core
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # the ranks on this node share its cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))
    dist.init_process_group(backend_for_device(), rank=rank, world_size=world)


def init_from_launcher() -> None:
    """The process group of a process torchrun started (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the env)."""
    import os

    if not is_initialized():
        check_launcher_env()
        init_process_group(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))


def exit_rank(code: int) -> NoReturn:
    """End this rank's process with ``code``: destroy the process group, flush, and leave without the
    interpreter's finalisation.

    Gloo's C++ worker threads can still be alive while the interpreter tears itself down after
    ``destroy_process_group``; the process then aborts ("terminate called without an active exception",
    SIGABRT or SIGSEGV) although its work is done, and the launcher reports a failed rank. Measured with
    two DDP ranks on this machine: 5 of 40 launches aborted at exit, 0 of 40 with ``os._exit`` after the
    flush. Everything pilotrun writes is already committed (SQLite transactions, fsynced renames) when
    a rank gets here, so skipping finalisation loses nothing.
    """
    import logging
    import os
    import sys

    if is_initialized():
        import torch.distributed as dist

        dist.destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing left to save there
            pass
    os._exit(code)


def _entry(rank: int, fn, world: int, port: int, args: tuple) -> None:
    import signal

    import torch.distributed as dist

    # no grace: a signal ends a rank at once, even inside a collective (a Python handler would wait for it):
    # the parent sees which signal and ends the run 'interrupted' (``launch``). With a grace the rank notes
    # a SIGTERM as the console script does; the ranks agree on the update to stop after (engine/loop).
    if signals.grace_s() > 0:
        signals.install()
    else:
        for s in signals.SIGNALS:
            signal.signal(s, signal.SIG_DFL)
    init_process_group(rank, world, port)
    try:
        fn(*args)
    except BaseException as e:
        stopped = signals.interruption(e)
        if stopped is not None:  # interrupted: the exit status says by what (torch's spawn would exit 0)
            exit_rank(signals.exit_code_of(stopped))
        # torch.multiprocessing writes the traceback to the parent's error file, which wins over the
        # exit status however this process then ends
        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    exit_rank(0)


def launch(fn, nproc: int, args: tuple = (), *, spawn: bool = False) -> None:
    """Run ``fn(*args)`` in ``nproc`` fresh processes, each one rank of a process group on 127.0.0.1.

    The processes are children of the zygote when one runs (``engine/fresh.start_processes``: torch and
    transformers imported once, ~1.5 s a launch on 2 cores), spawned otherwise, and always on CUDA (a fork must
    not meet a CUDA context) or with ``spawn``: the ranks of a run the time plan measures or predicts (the pilot's,
    train's) start as they will on the rental, where the rank's imports are part of its load (2.0 s spawned,
    0.11 s forked, in the demo's load term).

    ``fn`` must be a module-level function (it is pickled into spawned processes); it talks to the
    parent through the journal. A rank that raises makes this raise, with that rank's traceback. A rank
    ended by a signal (a preempted node, a scheduler's SIGTERM) ends the others and raises
    ``signals.Preempted``: the run is interrupted, not failed; so does a signal to this process, and every
    rank is then stopped (SIGTERM, SIGKILL after ``STOP_S``). Under a grace (``$PILOTRUN_TERM_GRACE_S``) a
    SIGTERM noted here is passed on to the ranks, which checkpoint after the same update and end 143.
    """
    import contextlib
    import os

    import torch
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException

    from pilotrun.engine import fresh

    port = free_port()  # JSON carries the arguments to the zygote's ranks as a list: fn(*args) alike
    ctx = None if spawn or torch.cuda.is_available() else \
        fresh.start_processes(_entry, (fn, nproc, port, list(args)), nproc)
    if ctx is None:
        ctx = mp.start_processes(_entry, args=(fn, nproc, port, args), nprocs=nproc, join=False, start_method="spawn")
    passed_on = False
    try:
        while not ctx.join(timeout=0.2, grace_period=STOP_S):
            if signals.pending() is not None and not passed_on:
                passed_on = True
                for p in ctx.processes:
                    if p.is_alive():
                        os.kill(p.pid, signals.pending())
    except ProcessExitedException as e:
        signum = signals.signal_of_exit(e.exit_code)
        if signum is None:
            raise
        signals.raise_now(signum)
    finally:
        stop_processes(ctx.processes)
        for path in ctx.error_files:  # a rank that raised wrote its traceback there; torch leaves the file
            with contextlib.suppress(OSError):
                os.unlink(path)


STOP_S = 10.0
"""How long a rank may take to end after SIGTERM before it is killed (ranks die at once on SIGTERM: see _entry)."""


def stop_processes(processes) -> None:
    """End every process still alive: SIGTERM, then SIGKILL after ``STOP_S``."""
    import time

    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.terminate()
    deadline = time.monotonic() + STOP_S
    for p in alive:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def wrap_model(model, strategy: str, device):
    """DDP or FSDP2 ``fully_shard`` (CPU over gloo, or CUDA) around a model already on its device."""
    if not is_initialized() or strategy == "single":
        return model
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    from torch.distributed.fsdp import fully_shard

    # shard each transformer block, then the root: the layer classes HF marks as not to be split
    names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if type(module).__name__ in names:
            fully_shard(module)
    fully_shard(model)
    return model


def barrier() -> None:
    if is_initialized():
        import torch.distributed as dist

        dist.barrier()


def broadcast_from_rank0(obj):
    """Rank 0's ``obj`` on every rank (any picklable object); ``obj`` itself without torch.distributed."""
    if not is_initialized():
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_to_rank0(obj) -> list | None:
    """Every rank's ``obj``, in rank order, on rank 0 (None elsewhere); ``[obj]`` without torch.distributed."""
    if not is_initialized():
        return [obj]
    import torch.distributed as dist

    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out
