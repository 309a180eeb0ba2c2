"""The sheet's sbatch script under a real SLURM on this machine: munged, slurmctld and slurmd on localhost
with a generated slurm.conf in a temporary folder, stopped by the test. A tiny campaign's sweep runs end to
end; `scontrol requeue` in the middle of it kills the job and queues it again, and the second start
continues the same sweep (the id fixed in the script) without redoing the finished run.

Skipped, with the reason, where Debian's slurm-wlm and munge are not installed (.ci/run installs them as
root, best effort) or the daemons cannot start here."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LLAMA, run_cli_process, tiny_causal_campaign

pytestmark = pytest.mark.slow

TOOLS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _which(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin")


class Slurm:
    """munged + slurmctld + slurmd of one node (this host at 127.0.0.1), all state under ``root``."""

    def __init__(self, root: Path):
        self.root = root
        self.procs: list[subprocess.Popen] = []
        self.node = socket.gethostname().split(".")[0]
        self.conf = root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    def start(self) -> None:
        r = self.root
        for d in ("munge", "state", "spool", "log"):
            (r / d).mkdir(mode=0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = r / "munge" / "munge.socket"
        self._spawn([_which("munged"), "--foreground", "--force", f"--key-file={key}", f"--socket={sock}",
                     f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
                     f"--seed-file={r / 'munge' / 'seed'}"], "munged")
        self._wait(lambda: sock.exists(), 20, "munged did not create its socket")
        cpus = os.cpu_count() or 1
        self.conf.write_text("\n".join([
            "ClusterName=pilotrun-test", f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
            "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}", f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}", f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
            "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU",
            "JobCompType=jobcomp/none", "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2", "JobRequeue=1", "KillWait=30", "MinJobAge=600", "InactiveLimit=0",
            "SlurmctldTimeout=30", "SlurmdTimeout=30",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory=2000 State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        self._spawn([_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self.run("scontrol", "ping").returncode == 0
                   and "UP" in self.run("scontrol", "ping").stdout, 30, "slurmctld did not answer")
        self._spawn([_which("slurmd"), "-D", "-f", str(self.conf), "-N", self.node], "slurmd")
        self._wait(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T").stdout, 60, "the node did not come up idle")

    def _spawn(self, argv, name) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                           start_new_session=True))
        time.sleep(0.5)
        if self.procs[-1].poll() is not None:
            raise RuntimeError(f"{name} exited at once: {self.logs()}")

    def _wait(self, ok, timeout, what) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if ok():
                return
            if any(p.poll() is not None for p in self.procs):
                break
            time.sleep(0.5)
        raise RuntimeError(f"{what}: {self.logs()}")

    def logs(self) -> str:
        out = []
        for f in sorted((self.root / "log").glob("*")):
            out.append(f"--- {f.name}\n" + f.read_text(errors="replace")[-1500:])
        return "\n".join(out)

    def run(self, *argv, **kw) -> subprocess.CompletedProcess:
        return subprocess.run([_which(argv[0]) or argv[0], *argv[1:]], capture_output=True, text=True,
                              env=self.env, timeout=60, **kw)

    def stop(self) -> None:
        self.run("scancel", "--full", "-u", "root") if self.procs else None
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


@pytest.fixture
def slurm(tmp_path):
    missing = [t for t in TOOLS if _which(t) is None]
    if missing:
        pytest.skip(f"SLURM is not installed here (no {', '.join(missing)}): `apt-get install slurm-wlm munge` "
                    f"as root (.ci/run does, best effort)")
    if os.geteuid() != 0:
        pytest.skip("the local slurmctld and slurmd run as root (SlurmUser=root); this test is not root")
    s = Slurm(tmp_path / "slurm")
    (tmp_path / "slurm").mkdir()
    try:
        s.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        s.stop()
        pytest.skip(f"the SLURM daemons could not start here: {e}"[:3000])
    yield s
    s.stop()


def _campaign(folder: Path) -> Path:
    rec = [{"instruction": f"say {i % 7}", "output": "w" * (3 + i % 5)} for i in range(40)]
    path = tiny_causal_campaign(folder, rec, rec[:8], model__config=dict(TINY_LLAMA),
                                train__updates=30, train__eval_every=10, train__save_every=5)
    c = yaml.safe_load(path.read_text())
    c["plan"] = {"metric": "val_loss", "goal": "minimize", "control": {"train.lr": 1e-3},
                 "variants": [{"train.lr": 3e-4}], "seeds": [0]}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    return path


def _state(s: Slurm, job: str) -> str:
    out = s.run("scontrol", "show", "job", job, "-o").stdout
    return next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "GONE")


def test_the_sbatch_script_runs_the_sweep_and_survives_a_requeue(slurm, tmp_path):
    from pilotrun.journal.store import Journal

    path = _campaign(tmp_path / "camp")
    home = tmp_path / "camp" / ".pilotrun"
    p = run_cli_process("pilot", path, "--home", home, "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    out = tmp_path / "camp" / "launch" / "sheet.md"
    p = run_cli_process("sheet", path, "--home", home, "--out", out, "--json")
    assert out.with_suffix(".sbatch").is_file(), p.stderr[-2000:]
    script = out.with_suffix(".sbatch").read_text()
    sid = next(w for line in script.splitlines() if " sweep " in line for w in line.split()
               if w.startswith("sweep-"))
    # this machine has no GPU: the GRES line goes, one CPU per task; everything else runs as written
    local = "\n".join(line for line in script.splitlines() if not line.startswith("#SBATCH --gres")
                      ).replace(f"#SBATCH --cpus-per-task={8}", "#SBATCH --cpus-per-task=1")
    local_path = out.with_suffix(".local.sbatch")
    local_path.write_text(local + "\n")
    venv = Path(sys.executable).parent.parent  # the set-up is skipped: this venv already has the stack
    env = f"ALL,PILOTRUN_VENV={venv},OMP_NUM_THREADS=1,CUDA_VISIBLE_DEVICES="
    sub = slurm.run("sbatch", "--parsable", f"--export={env}", str(local_path), cwd=str(out.parent))
    assert sub.returncode == 0, sub.stderr + slurm.logs()
    job = sub.stdout.strip().split(";")[0]
    journal = Journal(home)

    def runs():
        return journal.list_runs(sweep_id=sid) if journal.get_sweep(sid) else []

    end = time.monotonic() + 600
    while time.monotonic() < end and not any(r["status"] == "completed" for r in runs()):
        assert _state(slurm, job) in ("PENDING", "RUNNING", "CONFIGURING"), slurm.logs()
        time.sleep(1)
    first = [r for r in runs() if r["status"] == "completed"]
    assert first, f"no run completed: {_state(slurm, job)}\n{slurm.logs()}"
    while time.monotonic() < end and not any(r["status"] == "running" for r in runs()) \
            and _state(slurm, job) == "RUNNING":
        time.sleep(0.3)
    cut = [r for r in runs() if r["status"] == "running"]
    rq = slurm.run("scontrol", "requeue", job)
    assert rq.returncode == 0, rq.stderr
    while time.monotonic() < end and _state(slurm, job) not in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
        time.sleep(1)
    log = "".join(f.read_text(errors="replace") for f in out.parent.glob("pilotrun-*.out"))
    assert _state(slurm, job) == "COMPLETED", f"{_state(slurm, job)}\n{log[-4000:]}\n{slurm.logs()}"
    final = runs()
    latest = {}
    for r in final:
        latest[(r["arm"], r["seed"])] = r
    assert sorted(latest) == [("control", 0), ("variant-1", 0)]
    assert all(r["status"] == "completed" for r in latest.values()), [(r["arm"], r["status"]) for r in final]
    assert latest[("control", 0)]["run_id"] == first[0]["run_id"]  # the finished run was not redone
    assert len([r for r in final if r["status"] == "completed"]) == 2
    # the run the requeue cut ends 'interrupted' (SIGTERM) and a new run supersedes it
    assert cut, "the requeue came between runs"
    assert journal.get_run(cut[0]["run_id"])["status"] == "interrupted"
    assert latest[(cut[0]["arm"], 0)]["supersedes"] == cut[0]["run_id"]
    # the job started twice: the requeue ended the first start, the second continued the same sweep
    restarts = slurm.run("scontrol", "show", "job", job, "-o").stdout
    assert "Restarts=1" in restarts, restarts
