"""sweep --ray on a real local Ray cluster (2 nodes on the loopback address): spread, one journal on the
driver, the same numbers as a local sweep, a lost node's run interrupted and rerun by --continue, Ctrl-C."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest
import yaml

from conftest import write_campaign

pytestmark = pytest.mark.distributed
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # the test cluster binds 127.0.0.1 only


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'pilotrun[ray]')")
    from ray.cluster_utils import Cluster

    # Ray's session folder (logs, sockets) in a folder of the test's, removed after: not TMPDIR/ray, which Ray
    # would leave behind (the path stays short: a unix socket's path is limited to 107 bytes)
    temp = tempfile.mkdtemp(prefix="ray-")
    try:
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "temp_dir": temp})
        worker = c.add_node(num_cpus=2)
        ray.init(address=c.address, log_to_driver=False, logging_level="WARNING")
        c.wait_for_nodes()
    except Exception as e:  # noqa: BLE001 - a machine where Ray cannot start a cluster
        shutil.rmtree(temp, ignore_errors=True)
        pytest.skip(f"a local Ray cluster could not start here: {type(e).__name__}: {e}")
    yield c, worker
    ray.shutdown()
    c.shutdown()
    shutil.rmtree(temp, ignore_errors=True)


def _campaign(demo_dir, seeds=(0, 1), updates=6, **train):
    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e-3}], seeds=list(seeds))
    c["train"].update(updates=updates, eval_every=3, save_every=None, **train)
    return write_campaign(demo_dir, c)


def _by_arm_seed(home, sweep_id):
    from pilotrun.journal.store import Journal

    j = Journal(home)
    out = {}
    for run in j.list_runs(sweep_id=sweep_id):
        out[(run["arm"], run["seed"])] = (run, [m["value"] for m in j.metrics(run["run_id"], "validation",
                                                                               "val_loss")])
    return out


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_a_sweep_spreads_over_both_nodes_and_matches_a_local_sweep(cluster, demo_dir):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.journal.files import verify_manifest
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.training.sweep import sweep

    c, worker = cluster
    campaign = _campaign(demo_dir)
    loaded = load_campaign(campaign)
    local = sweep(loaded, demo_dir / "local", progress=False)
    remote = sweep(loaded, demo_dir / "ray", progress=False, ray_address=c.address)
    assert local.verdict == remote.verdict, remote.messages
    assert remote.data["plan_sha256"] == local.data["plan_sha256"]
    a, b = _by_arm_seed(demo_dir / "local", local.data["sweep_id"]), _by_arm_seed(demo_dir / "ray",
                                                                                   remote.data["sweep_id"])
    assert set(a) == set(b) and len(b) == 4
    for key in a:
        assert b[key][0]["status"] == "completed"
        assert len(a[key][1]) == len(b[key][1]) >= 2
        assert b[key][1] == pytest.approx(a[key][1], abs=1e-5), key
    nodes = {run["summary"]["node"]["node_id"] for run, _ in b.values()}
    assert nodes == {n["NodeID"] for n in __import__("ray").nodes() if n["Alive"]}  # both nodes took runs
    j = Journal(demo_dir / "ray")
    for run, _ in b.values():  # one journal and one run folder on the driver, as a local run has them
        assert run["command"].startswith("pilotrun train") and f"--seed {run['seed']}" in run["command"]
        assert j.metrics(run["run_id"], "train", "loss") and j.predictions(run["run_id"], "validation")
        assert any(r["phase"].startswith("observed_") for r in j.phase_rows(run["run_id"]))
        folder = j.run_dir(run["run_id"])
        assert verify_manifest(folder) == [] and (folder / "checkpoints" / "final").is_dir()
        assert run["run_id"] in (folder / "README.md").read_text()
        assert run["updates_done"] == 6


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_a_lost_node_interrupts_its_run_and_continue_reruns_it(cluster, demo_dir):
    import ray

    from pilotrun.campaign.load import load_campaign
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.training.sweep import sweep

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    c, worker = cluster
    doomed = c.add_node(num_cpus=1, resources={"doomed": 1})
    c.wait_for_nodes()
    campaign = _campaign(demo_dir, seeds=(0,), updates=400)
    loaded = load_campaign(campaign)
    home = demo_dir / "home"
    seen: dict = {}

    def remove_when_busy():
        j = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            if (demo_dir / "home" / "journal.sqlite").exists():
                j = j or Journal(home)
                running = [r for r in j.list_runs() if r["status"] == "running" and r["updates_done"] >= 2]
                if running:
                    seen["removed"] = doomed.node_id
                    c.remove_node(doomed, allow_graceful=False)
                    for h in holds:  # the other nodes take the rest of the sweep
                        ray.kill(h)
                    return
            time.sleep(0.3)

    # the doomed node is the only one with room for a run until its run is lost: pin the head's and worker's
    # CPUs with idle actors so the first run lands there
    @ray.remote(num_cpus=1)
    class Hold:
        def ping(self):
            return 1

    holds = [Hold.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)).remote()
             for node in (c.head_node, worker) for _ in range(2)]
    ray.get([h.ping.remote() for h in holds])
    t = threading.Thread(target=remove_when_busy)
    t.start()
    try:
        first = sweep(loaded, home, progress=False, ray_address=c.address)
    finally:
        t.join()
    assert seen.get("removed")
    runs = Journal(home).list_runs(sweep_id=first.data["sweep_id"])
    assert not [r for r in runs if r["status"] == "running"]
    lost = [r for r in runs if r["status"] == "interrupted"]
    assert lost, [(r["status"], r["summary"]) for r in runs]
    assert all(r["summary"]["node"]["node_id"] == seen["removed"] for r in lost)
    assert all(seen["removed"][:12] in r["summary"]["reason"] and "--continue" in r["summary"]["reason"]
               for r in lost)
    assert first.verdict == "fail"
    again = sweep(loaded, home, progress=False, ray_address=c.address, continue_id=first.data["sweep_id"])
    runs = Journal(home).list_runs(sweep_id=first.data["sweep_id"])
    reruns = [r for r in runs if r["supersedes"] in {x["run_id"] for x in lost}]
    assert len(reruns) == len(lost) and all(r["status"] == "completed" for r in reruns)
    assert again.verdict in ("ok", "warn")


def _ray_view() -> str:
    """What the cluster says, for a failure message: free resources and the tasks' states."""
    import ray

    try:
        from ray.util.state import list_tasks

        tasks = [(t.name, t.state, (t.node_id or "")[:8]) for t in list_tasks(limit=50)]
    except Exception as e:  # noqa: BLE001 - the state API is optional; the message says what it could not read
        tasks = f"(tasks unavailable: {type(e).__name__})"
    busiest = subprocess.run(["ps", "-eo", "pid,pcpu,etimes,rss,args", "--sort=-pcpu"], capture_output=True,
                             text=True).stdout.splitlines()[:8]
    return (f"available {ray.available_resources()}; total {ray.cluster_resources()}; tasks {tasks}; busiest "
            f"processes: {' | '.join(line[:160] for line in busiest)}")


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_ctrl_c_on_the_driver_cancels_and_records_interrupted(cluster, demo_dir):
    from pilotrun.journal.store import Journal

    c, _ = cluster
    # long runs: the poll below must see one running with an update before the sweep ends
    campaign = _campaign(demo_dir, seeds=(0, 1), updates=20000)
    home = demo_dir / "home"
    # the console script's main, with every thread's stack on SIGUSR1: a driver that hangs says where
    boot = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
            "from pilotrun.cli.main import main; sys.argv[0] = 'pilotrun'; main()")
    proc = subprocess.Popen([sys.executable, "-c", boot, "sweep", str(campaign), "--home", str(home),
                             "--ray", c.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    busy, runs = False, []
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            if (home / "journal.sqlite").exists():
                runs = Journal(home).list_runs()
                if [r for r in runs if r["status"] == "running" and r["updates_done"] >= 1]:
                    busy = True
                    break
            time.sleep(0.3)
        view = _ray_view()
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"the driver did not exit within 120 s of Ctrl-C (seen running: {busy}); {view}; its "
                        f"output and stacks: {err[-6000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert busy, (f"no run was seen running with an update (driver rc {proc.returncode}); runs "
                  f"{[(r['status'], r['updates_done']) for r in runs]}; {view}; driver said: {err[-1500:]}")
    assert proc.returncode == 130, err[-2000:]
    runs = Journal(home).list_runs()
    assert runs and not [r for r in runs if r["status"] == "running"]
    stopped = [r for r in runs if r["status"] == "interrupted"]
    assert stopped and all("Ctrl-C" in r["summary"]["reason"] for r in stopped)


@pytest.mark.slow
def test_sigterm_on_the_driver_interrupts_releases_the_claims_and_continue_finishes(cluster, demo_dir):
    """A scheduler's SIGTERM to the driver of `sweep --ray`: exit 143, the runs in flight 'interrupted' naming
    SIGTERM, the sweep's claims released; `sweep --continue --ray` then finishes the plan and reruns only the
    cut cells, never a completed one."""
    from pilotrun.journal.store import Journal

    c, _ = cluster
    path = demo_dir / "campaign.yaml"
    campaign = yaml.safe_load(path.read_text())  # 8 cells, 4 at a time on the 2 × 2 CPUs: some end, some wait
    campaign["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e-3}], seeds=[0, 1, 2, 3])
    campaign["train"].update(updates=40, eval_every=20, save_every=None)
    campaign = write_campaign(demo_dir, campaign)
    home = demo_dir / "home-sigterm"
    argv = [sys.executable, "-m", "pilotrun", "sweep", str(campaign), "--home", str(home), "--ray", c.address]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            runs = Journal(home).list_runs() if (home / "journal.sqlite").exists() else []
            if any(r["status"] == "completed" for r in runs) and any(
                    r["status"] == "running" and r["updates_done"] >= 1 for r in runs):
                break
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 143, err[-2000:]
    journal = Journal(home)
    runs = journal.list_runs()
    done = {(r["arm"], r["seed"]): r["run_id"] for r in runs if r["status"] == "completed"}
    cut = [r for r in runs if r["status"] == "interrupted"]
    assert done and cut and not [r for r in runs if r["status"] == "running"], [(r["arm"], r["status"]) for r in runs]
    assert all("stopped by SIGTERM" in r["summary"]["reason"] and "on the sweep's driver" in r["summary"]["reason"]
               for r in cut), [r["summary"] for r in cut]
    sweep_id = runs[0]["sweep_id"]
    with journal.connect() as db:
        assert db.execute("SELECT COUNT(*) FROM claims WHERE sweep_id=?", (sweep_id,)).fetchone()[0] == 0
    again = subprocess.run([*argv, "--continue", sweep_id], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    after = journal.list_runs(sweep_id=sweep_id)
    finals = {}
    for r in after:  # the end of each cell's supersedes chain
        finals[(r["arm"], r["seed"])] = r
    assert all(r["status"] == "completed" for r in finals.values()) and len(finals) == 8
    for cell, run_id in done.items():  # a completed cell was not rerun
        assert finals[cell]["run_id"] == run_id
        assert not [r for r in after if r["supersedes"] == run_id]
    assert {r["supersedes"] for r in after if r["supersedes"]} == {r["run_id"] for r in cut}


def test_without_ray_the_flag_is_bad_input_naming_the_extra(demo_dir, tmp_path):
    campaign = _campaign(demo_dir)
    code = ("import sys; sys.modules['ray'] = None\n"  # as if Ray were not installed
            "from pilotrun.cli.main import run\n"
            f"sys.exit(run(['sweep', {str(campaign)!r}, '--home', {str(tmp_path / 'h')!r}, '--ray', 'auto']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "pilotrun[ray]" in r.stderr and "--ray" in r.stderr
    assert not (tmp_path / "h" / "journal.sqlite").exists() or not __import__("sqlite3").connect(
        tmp_path / "h" / "journal.sqlite").execute("SELECT count(*) FROM sweeps").fetchone()[0]


def test_a_cluster_that_cannot_hold_a_run_is_bad_input():
    from pilotrun.rehearsal.training.sweep_ray import capacity, run_demand

    demand = run_demand(2, {"CPU": 8, "GPU": 1})
    assert demand == {"num_cpus": 2, "num_gpus": 2} and capacity(demand, {"CPU": 8, "GPU": 1}) == 0
    assert capacity(run_demand(1, {"CPU": 3}), {"CPU": 3}) == 3
    assert capacity(run_demand(2, {"CPU": 16, "GPU": 8}), {"CPU": 16, "GPU": 8}) == 4


def test_an_address_where_no_head_listens_is_bad_input_at_once(demo_dir, tmp_path):
    # `--ray 127.0.0.1:1` (a typo'd port, a head since stopped) had ray.init try again and again, about 40 s a round:
    # still "starting" after 2 minutes. Nothing accepting there is exit 2 at once, given or behind --ray auto's
    # $RAY_ADDRESS; an address where something listens goes on to ray.init (the clean case)
    import socket

    from pilotrun.errors import BadInput
    from pilotrun.rehearsal.training.sweep_ray import _head_answers

    pytest.importorskip("ray", reason="Ray is not installed (pip install 'pilotrun[ray]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"  # free once closed: nothing listens there
    campaign = _campaign(demo_dir)
    for argv, env in (([closed], {}), (["auto"], {"RAY_ADDRESS": closed})):
        code = ("from pilotrun.cli.main import run; import sys\n"
                f"sys.exit(run(['sweep', {str(campaign)!r}, '--home', {str(tmp_path / 'h')!r}, '--ray', *{argv!r}]))")
        started = time.monotonic()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, **env})
        assert r.returncode == 2 and "no Ray head answers at " in r.stderr, r.stderr
        assert ("$RAY_ADDRESS=" in r.stderr) == bool(env) and time.monotonic() - started < 60
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert _head_answers(f"127.0.0.1:{s.getsockname()[1]}") is None
    with pytest.raises(BadInput, match="Connection refused"):
        _head_answers(closed)
