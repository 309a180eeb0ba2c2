"""sweep --ray: the frozen plan's runs as Ray tasks on an existing cluster, one journal on the driver.

The driver (the process that ran ``sweep``) creates each run in its own journal when it dispatches it,
in the plan's order, keeping at most as many runs in flight as the cluster holds at once. A worker
trains the run through the same ``train_run`` as a local sweep, recording into a scratch journal on its
own disk (with a copy of the campaign's pilot, so the memory bound is judged there), and sends back the
rows and the run folder when the run ends; the driver takes the rows in one transaction and checks the
files against the worker's manifest. While the run goes, the worker reports its node and progress to a
small actor on the driver's node, so the journal shows how far each run is. A lost worker or node marks
its run ``interrupted`` with the node named; Ctrl-C cancels the remote tasks and records them interrupted;
``sweep --continue SWEEP_ID --ray …`` reruns what did not finish, as a local sweep does.

Every node needs pilotrun and the same torch as the driver, and the campaign's files (data, model) at
the same paths: the worker checks both before training and fails the run naming what differs.
"""

from __future__ import annotations

import shutil
import socket
import time
from typing import Any, Callable

import pilotrun
from pilotrun import signals
from pilotrun.campaign.arithmetic import data_parallel_ranks
from pilotrun.campaign.sweep_runs import arm_command, encoded_for
from pilotrun.engine.loop import Hooks
from pilotrun.errors import BadInput
from pilotrun.journal.runs import RunRecorder, data_fingerprints, find_pilot
from pilotrun.journal.store import Journal
from pilotrun.journal.transfer import check_arrived, export_run, import_run, pack_folder, unpack_folder
from pilotrun.rehearsal.training.train import train_run
from pilotrun.scratch import make_dir, remove_dead
from pilotrun.signals import interruption

PROGRESS_S = 1.0  # the shortest interval between a worker's progress reports


def require_ray():
    try:
        import ray
    except ImportError:
        raise BadInput("--ray needs Ray, which is not installed", where="--ray",
                       fix="pip install 'pilotrun[ray]' (on the driver and on every node of the cluster)") from None
    return ray


REACH_S = 10.0  # how long a head's address may take to accept a connection before it is said unreachable


def _head_answers(address: str) -> None:
    """Exit 2 where nothing accepts a connection at a HOST:PORT head address (given, or $RAY_ADDRESS behind "auto").
    ``ray.init`` tries an address where no head listens round after round, about 40 s each ("Failed to connect to
    GCS"), for minutes: measured, a sweep with --ray 127.0.0.1:1 was still trying after 2 minutes. "auto" with no
    $RAY_ADDRESS, "local" and ray:// (Ray Client has its own timeout) are left to ray.init."""
    import os
    import socket

    given = os.environ.get("RAY_ADDRESS", "") if address == "auto" else address
    host, _, port = given.rpartition(":")
    if not host or "://" in given or not port.isdigit():
        return  # "auto" without $RAY_ADDRESS, "local", ray://, or a form ray.init names itself ("Invalid address")
    host = host.strip("[]")  # [::1]:6379
    try:
        socket.create_connection((host, int(port)), timeout=REACH_S).close()
    except (OSError, OverflowError) as e:
        what = f"$RAY_ADDRESS={given}" if given != address else given
        raise BadInput(f"no Ray head answers at {what}: {getattr(e, 'strerror', None) or e}", where="--ray",
                       fix="start one there (`ray start --head --port PORT`) or pass the address `ray start` printed, "
                           "e.g. --ray 10.0.0.5:6379 (or ray://HOST:10001 through Ray Client)") from None


def connect(address: str):
    """Attach to the cluster at ``address`` ("auto": the one this machine belongs to, or $RAY_ADDRESS)."""
    ray = require_ray()
    if ray.is_initialized():
        return ray
    _head_answers(address)
    try:
        ray.init(address=address, log_to_driver=False, logging_level="WARNING")

        signals.reclaim()  # ray.init made SIGTERM a sys.exit on the driver: it is an interruption (143)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise BadInput(f"cannot attach to a Ray cluster at {address!r}: {e}", where="--ray",
                       fix="start one (`ray start --head`) or pass its address, e.g. --ray 10.0.0.5:6379 "
                           "(or ray://HOST:10001 through Ray Client)") from None
    return ray


def run_demand(world: int, cluster: dict) -> dict:
    """What one run asks of the cluster: a CPU per rank, and a GPU per rank on a cluster that has GPUs."""
    gpus = world if cluster.get("GPU", 0) > 0 else 0
    return {"num_cpus": world, "num_gpus": gpus}


def capacity(demand: dict, cluster: dict) -> int:
    """How many runs the cluster holds at once (0 when not even one fits)."""
    fits = [int(cluster.get("CPU", 0) // demand["num_cpus"])]
    if demand["num_gpus"]:
        fits.append(int(cluster.get("GPU", 0) // demand["num_gpus"]))
    return min(fits)


_TRACKER = None


def _tracker_class(ray):
    global _TRACKER
    if _TRACKER is None:
        @ray.remote(num_cpus=0)
        class Tracker:
            """Where workers report their node and progress; the driver drains it between waits."""

            def __init__(self):
                self.events: list[tuple] = []

            def report(self, event: tuple) -> None:
                self.events.append(event)

            def drain(self) -> list[tuple]:
                out, self.events = self.events, []
                return out

        _TRACKER = Tracker
    return _TRACKER


def run_remote(todo: list, *, journal, sweep_id: str, plan: dict, sets: tuple, address: str, progress: bool,
               on_run: Callable[[dict], None] | None, total: int) -> None:
    """Run ``todo`` ((arm, seed, supersedes) in the plan's order) on the cluster; every run ends with a final
    status in ``journal``."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray = connect(address)
    cluster = ray.cluster_resources()
    here = ray.get_runtime_context().get_node_id()
    tracker = _tracker_class(ray).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False)).remote()
    remote = ray.remote(max_retries=0)(train_remote)
    pending = list(todo)
    in_flight: dict[Any, dict] = {}
    done = 0
    try:
        while pending or in_flight:
            while pending:
                arm, seed, supersedes = pending[0]
                run_loaded = arm.loaded.with_overrides({"seed": seed})
                demand = run_demand(data_parallel_ranks(run_loaded.c.train), cluster)
                room = capacity(demand, cluster)
                if room == 0:
                    raise BadInput(f"the cluster at {address!r} cannot hold one run: it has {cluster.get('CPU', 0):g} "
                                   f"CPU and {cluster.get('GPU', 0):g} GPU, a run asks {demand['num_cpus']} CPU and "
                                   f"{demand['num_gpus']} GPU", where="--ray",
                                   fix="add nodes, or lower train.nproc")
                if len(in_flight) >= room:
                    break
                pending.pop(0)
                rec = RunRecorder(journal, run_loaded, kind="sweep", supersedes=supersedes, sweep_id=sweep_id,
                                  arm=arm.name, command=arm_command(plan["campaign_path"], arm, seed, sets))
                pilot, _ = find_pilot(journal, run_loaded.c.name, run_loaded.config_sha256(),
                                      run_loaded.resolved_dict())
                spec = {"loaded": run_loaded, "run_id": rec.run_id, "sweep_id": sweep_id, "arm": arm.name,
                        "command": rec.journal.get_run(rec.run_id)["command"], "tracker": tracker,
                        "pilot": _pilot_bundle(journal, pilot), "expect": _expectations(rec.journal, rec.run_id)}
                ref = remote.options(scheduling_strategy="SPREAD", **demand).remote(spec)
                in_flight[ref] = {"rec": rec, "arm": arm, "seed": seed, "supersedes": supersedes, "node": None}
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
            _apply_events(ray.get(tracker.drain.remote()), in_flight, journal)
            for ref in ready:
                job = in_flight.pop(ref)
                status = _land(ray, ref, job, journal)
                done += 1
                if on_run is not None:
                    run = journal.get_run(job["rec"].run_id)
                    on_run({"index": done, "of": len(todo), "total": total, "arm": job["arm"].name,
                            "label": job["arm"].label, "seed": job["seed"], "run_id": job["rec"].run_id,
                            "status": status, "reason": (run.get("summary") or {}).get("reason"),
                            "supersedes": job["supersedes"], "node": (run.get("summary") or {}).get("node")})
    except BaseException as exc:  # Ctrl-C, or the driver's own failure: no run stays "running"
        exc = interruption(exc) or exc  # ray.wait raises a bare KeyboardInterrupt for our SIGTERM
        for ref, job in in_flight.items():
            ray.cancel(ref, force=True)
            why = (f"{getattr(exc, 'reason', None) or 'interrupted by the user (Ctrl-C)'} on the sweep's driver; "
                   "the remote task was cancelled" if isinstance(exc, KeyboardInterrupt) else
                   f"the sweep's driver stopped ({type(exc).__name__}: {exc}); the remote task was cancelled")
            job["rec"].finish("interrupted", {"reason": why, "node": job["node"]})
        if in_flight:  # the cancelled workers end: their scratch journals are removed below
            ray.wait(list(in_flight), num_returns=len(in_flight), timeout=CANCEL_WAIT_S)
        raise
    finally:
        ray.kill(tracker, no_restart=True)
        remove_dead(SCRATCH_PREFIX)  # scratch of workers on this host that were killed (lost, cancelled)


SCRATCH_PREFIX = "pilotrun-ray-"
CANCEL_WAIT_S = 5.0


def _pilot_bundle(journal, pilot: dict | None) -> dict | None:
    return export_run(journal, pilot["run_id"], with_run_row=True) if pilot else None


def _expectations(journal, run_id: str) -> dict:
    """What the worker must match: the driver's torch and pilotrun versions and its data files' sha256."""
    import torch

    run = journal.get_run(run_id)
    return {"torch": torch.__version__, "pilotrun": pilotrun.__version__, "data": run.get("data") or {}}


def _apply_events(events: list[tuple], in_flight: dict, journal) -> None:
    by_run = {job["rec"].run_id: job for job in in_flight.values()}
    for kind, run_id, *rest in events:
        job = by_run.get(run_id)
        if job is None:
            continue
        if kind == "started":
            job["node"] = rest[0]
        elif kind == "progress":
            journal.update_progress(run_id, updates_done=rest[0], examples_seen=rest[1])


def _land(ray, ref, job: dict, journal) -> str:
    """Take a finished task's outcome into the journal; returns the run's final status."""
    from ray.exceptions import RayTaskError, TaskCancelledError

    rec = job["rec"]
    try:
        out = ray.get(ref)
    except RayTaskError as e:  # the run raised on the worker: its own failure, named
        cause = e.cause if getattr(e, "cause", None) is not None else e
        rec.finish("failed", {"reason": f"{type(cause).__name__}: {cause}", "node": job["node"]})
        return "failed"
    except TaskCancelledError:
        rec.finish("interrupted", {"reason": "the remote task was cancelled", "node": job["node"]})
        return "interrupted"
    except Exception as e:  # noqa: BLE001 - a worker process or node lost: the run did not finish, it was not wrong
        where = _node_words(job["node"])
        rec.finish("interrupted", {"reason": f"lost the worker{where} ({type(e).__name__}); "
                                             "rerun it with `pilotrun sweep --continue`", "node": job["node"]})
        return "interrupted"
    land_outcome(journal, rec, out)
    return out["status"]


def _node_words(node: dict | None) -> str:
    if not node:
        return " before it reported its node"
    return f" on node {node['node_id'][:12]} ({node['host']}, {node['ip']})"


def land_outcome(journal, rec, out: dict) -> None:
    """A worker's rows and files into the driver's journal and run folder, then the run's final status."""
    import_run(journal, out["rows"], as_run_id=rec.run_id)
    journal.update_progress(rec.run_id, updates_done=out["progress"][0], examples_seen=out["progress"][1])
    written = unpack_folder(out["files"], rec.dir)
    summary = {**out["summary"], "node": out["node"]}
    damaged = check_arrived(rec.dir, written)
    status = out["status"]
    if damaged:
        status, summary["reason"] = "failed", f"the run folder arrived damaged from the worker: {damaged[:3]}"
    rec.finish(status, summary)
    rec.seal()


# --- on the worker --------------------------------------------------------------------------------------

_ENCODED: dict = {}  # a worker process is reused for later runs: the data is encoded once per setting


def node_facts() -> dict:
    import ray

    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "ip": ray.util.get_node_ip_address()}


def check_node(expect: dict, loaded) -> None:
    """The run's inputs on this node are the driver's: same torch and pilotrun, same data files."""
    import torch

    node = socket.gethostname()
    for name, mine in (("torch", torch.__version__), ("pilotrun", pilotrun.__version__)):
        if expect.get(name) and expect[name] != mine:
            raise BadInput(f"node {node} has {name} {mine}, the sweep's driver {expect[name]}: its numbers would "
                           "not compare", where=f"node {node}", fix=f"install {name}=={expect[name]} on every node")
    try:
        here = data_fingerprints(loaded.c)
    except (OSError, BadInput) as e:
        raise BadInput(f"node {node} cannot read the campaign's data: {e}", where=f"node {node}",
                       fix="put the campaign folder at the same path on every node (SkyPilot workdir or "
                           "file_mounts, a shared volume on KubeRay)") from None
    for split, want in (expect.get("data") or {}).items():
        got = here.get(split, {})
        if got.get("sha256") != want.get("sha256"):
            raise BadInput(f"node {node} holds another {split} file at {want.get('path')} than the sweep's driver "
                           f"(sha256 {str(got.get('sha256'))[:12]} vs {str(want.get('sha256'))[:12]})",
                           where=f"node {node}", fix="sync the campaign folder to every node before the sweep")


def train_remote(spec: dict) -> dict:
    """One run on a worker: train into a scratch journal, send back its rows and folder."""
    tracker, run_id, loaded = spec["tracker"], spec["run_id"], spec["loaded"]
    node = node_facts()
    tracker.report.remote(("started", run_id, node))
    check_node(spec["expect"], loaded)
    last = [0.0]

    def on_update(st, out):
        if time.monotonic() - last[0] >= PROGRESS_S:
            last[0] = time.monotonic()
            tracker.report.remote(("progress", run_id, st.update, st.examples_seen))

    single = data_parallel_ranks(loaded.c.train) == 1  # hooks cannot follow a run into spawned ranks
    scratch = make_dir(SCRATCH_PREFIX)  # named for this worker: a killed one's is removed by the next or the driver
    try:
        journal = Journal(scratch)
        if spec["pilot"]:
            import_run(journal, spec["pilot"])
        r = train_run(loaded, scratch, kind="sweep", sweep_id=spec["sweep_id"], arm=spec["arm"],
                      hooks=Hooks(on_update=on_update) if single else None, progress=False, save_artifact=False,
                      validation_predictions=True, command=spec["command"], **encoded_for(loaded, _ENCODED))
        local_id = r.data["run_id"]
        run = journal.get_run(local_id)
        rows = export_run(journal, local_id)
        files = pack_folder(journal.run_dir(local_id), skip=("config.yaml", "revisions.json", "README.md"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"status": run["status"], "summary": run["summary"] or {}, "rows": rows, "files": files, "node": node,
            "progress": (run["updates_done"], run["examples_seen"])}
