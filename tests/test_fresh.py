"""engine/fresh.py: the fresh processes of resume and verify, a zygote's children or cold interpreters.

The zygote here preloads nothing (the children import pilotrun's CLI themselves), so these tests cost a few
tenths of a second each; what the zygote's preload saves is measured in bench/bench_real.py, not here.
"""

import os
import subprocess
import time
from pathlib import Path

import pytest

from pilotrun.engine import fresh


@pytest.fixture(autouse=True)
def _own_zygote(monkeypatch):
    """Each test here has the module's zygote to itself: one a session started (tests/zygote_plugin.py) is set
    aside and comes back after."""
    monkeypatch.setattr(fresh, "_ZYGOTE", None)
    monkeypatch.delenv(fresh.COLD_ENV, raising=False)
    yield
    fresh.stop()


@pytest.fixture
def zygote():
    fresh.start(preload=())
    return fresh._ZYGOTE


def _cmdline(pid: int) -> list[str]:
    """The process's command line (read again while the kernel has not yet filled it in, just after the exec)."""
    for _ in range(200):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().decode()
        if cmd:
            return cmd.split("\0")
        time.sleep(0.01)
    return [cmd]


def _ready(z, seconds: float = 120) -> None:
    """Wait (up to ``seconds``) for the zygote's ready message: its preload imported, or the zygote gone."""
    deadline = time.monotonic() + seconds
    while z.ready_env is None and z.proc.poll() is None and time.monotonic() < deadline:
        fresh._imported(z)
        time.sleep(0.05)


def test_the_zygote_is_a_new_program_not_a_fork_of_its_caller(zygote):
    """Nothing of the caller's memory can be in it: it is an interpreter exec'd for the purpose (a fork of
    the caller, the defect this guards against, would carry pytest's command line and every object in it)."""
    assert zygote.proc.pid != os.getpid()
    cmd = _cmdline(zygote.proc.pid)
    assert "pilotrun.engine.fresh import serve" in " ".join(cmd) and "pytest" not in " ".join(cmd), cmd
    assert fresh.started()


def test_a_child_answers_as_a_cold_process_does(zygote, tmp_path):
    """Exit status, stdout and stderr, the request's environment and folder: the same through the zygote as
    through a cold interpreter (the fallback), for a good command and a bad one."""
    home = tmp_path / "not-a-home"
    home.write_text("a file, not a folder")
    env = dict(os.environ, COLUMNS="80")
    for args in (["--version"], ["runs", "--home", str(home), "--json"]):
        forked = fresh.run(args, timeout=60, env=env)
        cold = subprocess.run([fresh.sys.executable, "-m", "pilotrun", *args], capture_output=True, text=True,
                              env=env, timeout=60)
        assert (forked.returncode, forked.stdout, forked.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    assert forked.returncode == 2 and str(home) in forked.stderr, forked.stderr
    assert fresh.started()  # both went through the zygote: it is still there


def test_the_childs_environment_is_the_requests(zygote, tmp_path):
    """$PILOTRUN_HOME set after the zygote started reaches the child (its environment is the request's)."""
    home = tmp_path / "home-from-env"
    home.write_text("a file")
    done = fresh.run(["runs", "--json"], timeout=60, env=dict(os.environ, PILOTRUN_HOME=str(home)))
    assert done.returncode == 2 and str(home) in done.stderr, done.stderr


def test_the_childs_folder_is_the_requests(zygote, tmp_path):
    """``cwd``: a relative path in the arguments is read from the request's folder, forked as cold (a campaign
    file named relative to it: valid there, missing from this process's folder)."""
    from conftest import simple_records, tiny_causal_campaign

    path = tiny_causal_campaign(tmp_path / "c", simple_records(8))
    for cold in (False, True):
        env = dict(os.environ, PILOTRUN_FRESH="cold") if cold else None
        there = fresh.run(["validate", path.name], timeout=60, cwd=path.parent, env=env)
        assert there.returncode == 0 and "is valid" in there.stdout, (cold, there.stdout + there.stderr)
        here = fresh.run(["validate", path.name], timeout=60, env=env)
        assert here.returncode == 2, (cold, here.stdout + here.stderr)
    assert fresh.started()


def test_requests_from_two_threads_at_once_each_get_their_own_answer(zygote, tmp_path):
    """The zygote's socket carries one request at a time: a second thread's request made meanwhile goes cold
    instead of mixing its messages with the first's; each gets its own exit status and output."""
    from concurrent.futures import ThreadPoolExecutor

    homes = []
    for i in range(2):
        homes.append(tmp_path / f"not-a-home-{i}")
        homes[-1].write_text("a file")
    with ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda h: fresh.run(["runs", "--home", str(h), "--json"], timeout=120), homes))
    for home, d in zip(homes, done):
        assert d.returncode == 2 and str(home) in d.stderr and str(homes[1 - homes.index(home)]) not in d.stderr
    assert fresh.started()


def test_without_a_zygote_the_process_is_cold(tmp_path):
    """Never started, or gone: run() starts a cold interpreter with the same arguments and result."""
    fresh.start(preload=())
    fresh._ZYGOTE.proc.kill()
    fresh._ZYGOTE.proc.wait()
    assert not fresh.started()
    done = fresh.run(["--version"], timeout=60)
    assert done.returncode == 0 and "pilotrun" in done.stdout
    fresh.stop()
    assert fresh.run(["--version"], timeout=60).stdout == done.stdout


def test_pilotrun_fresh_cold_is_never_forked(zygote):
    """PILOTRUN_FRESH=cold in the request's environment: a cold interpreter though a zygote runs (the
    checks' tests that must take the cold path set it). The zygote is frozen (SIGSTOP): a request sent to it
    would wait past the timeout; the cold one answers."""
    import signal

    os.kill(zygote.proc.pid, signal.SIGSTOP)
    try:
        done = fresh.run(["--version"], timeout=20, env=dict(os.environ, PILOTRUN_FRESH="cold"))
    finally:
        os.kill(zygote.proc.pid, signal.SIGCONT)
    assert done.returncode == 0 and "pilotrun" in done.stdout
    assert fresh.started()  # not asked, so not given up on


def test_a_child_past_its_time_is_killed(zygote, tmp_path):
    """As subprocess.run: TimeoutExpired, the child killed (here before or after it was forked); the zygote
    is ended with it, so a later request goes cold."""
    with pytest.raises(subprocess.TimeoutExpired):
        fresh.run(["--version"], timeout=0.001)
    assert not fresh.started()


def _frozen(zygote):
    """The zygote stopped (SIGSTOP) for the block: a request sent to it waits past its timeout, a cold one answers."""
    import contextlib
    import signal

    @contextlib.contextmanager
    def frozen():
        os.kill(zygote.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(zygote.proc.pid, signal.SIGCONT)
    return frozen()


@pytest.mark.parametrize("name, value", [("HF_HUB_OFFLINE", "0"), ("HF_HUB_CACHE", "/elsewhere"),
                                         ("OMP_NUM_THREADS", "1"), ("PILOTRUN_VERBOSE", "1")])
def test_a_request_under_other_import_time_settings_goes_cold(zygote, name, value):
    """The libraries read these once, at import, in the zygote: a child given other values would run under the
    zygote's (a hub looked up when the request said offline). Such a request starts a cold interpreter."""
    env = fresh.import_env(zygote.env)
    env[name] = value if zygote.env.get(name) != value else value + "0"
    with _frozen(zygote):
        done = fresh.run(["--version"], timeout=20, env=env)
    assert done.returncode == 0 and "pilotrun" in done.stdout
    assert fresh.started()


def test_variables_read_when_used_still_fork(zygote, tmp_path):
    """The module search path (rebuilt in the child), pilotrun's run-time variables, the terminal's width and
    torch's NVML switch (read at each ``torch.cuda.is_available()``; Lightning sets it when imported, and every
    request of the suite after the first test that imported Lightning went cold) do not send a request cold; the
    defaults pilotrun sets before loading a model are the zygote's too."""
    from pilotrun.startup import LIBRARY_ENV_DEFAULTS

    env = {k: v for k, v in zygote.env.items() if k not in LIBRARY_ENV_DEFAULTS}
    env.update(PYTHONPATH=str(tmp_path), PILOTRUN_HOME=str(tmp_path / "home"), COLUMNS="37",
               PYTORCH_NVML_BASED_CUDA_CHECK="1")  # torch reads it at each is_available(); Lightning sets it
    assert fresh.same_imports(zygote.env, env)
    assert not fresh.same_imports(zygote.env, dict(env, HF_HUB_OFFLINE="0"))
    z = fresh._ZYGOTE
    done = fresh.run(["--version"], timeout=60, env=env)
    assert done.returncode == 0 and fresh._ZYGOTE is z and fresh.started()


def test_variables_the_zygotes_own_imports_set_still_fork(monkeypatch, tmp_path):
    """torch sets TORCHINDUCTOR_CACHE_DIR to its default when imported, in the caller as in the zygote: compared
    with the environment the zygote started under, every request of a verb that had imported torch differed and
    went cold (`all` on MiniLM took as long with the zygote as without, 1.67 against 1.65 × its work). Compared
    with the environment the zygote's own imports left (its ready message), the request is the zygote's."""
    import signal

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # torch makes its default cache folder in the temp folder: here
    fresh.start(preload=("torch._inductor.config",))  # what sets it (transformers' modeling imports it too)
    z = fresh._ZYGOTE
    _ready(z)
    assert "TORCHINDUCTOR_CACHE_DIR" not in z.env and "TORCHINDUCTOR_CACHE_DIR" in z.ready_env
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=z.ready_env["TORCHINDUCTOR_CACHE_DIR"])  # as the caller's torch set
    assert not fresh.same_imports(z.env, env) and fresh.same_imports(fresh._imported(z), env)
    os.kill(z.proc.pid, signal.SIGSTOP)  # frozen: a request sent to it waits past its timeout, a cold one answers
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            fresh.run(["--version"], timeout=2, env=env)
    finally:
        try:
            os.kill(z.proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def test_the_zygotes_imports_ask_for_cuda_through_nvml(monkeypatch, tmp_path):
    """An import in the zygote that asks torch.cuda.is_available() must not initialise CUDA there (torch's default
    check does, and every fork of it then fails its GPU run: "Cannot re-initialize CUDA in forked subprocess"), so
    the preload runs under PYTORCH_NVML_BASED_CUDA_CHECK=1 whatever the caller set. A planted preload module writes
    what it saw (planted defect: the zygote importing under the caller's environment, here without the variable:
    caught, it saw nothing). The children still run under the request's environment."""
    (tmp_path / "saw_nvml_check.py").write_text(
        "import os, pathlib\n"
        f"pathlib.Path({str(tmp_path / 'seen.txt')!r}).write_text(os.environ.get('PYTORCH_NVML_BASED_CUDA_CHECK', '-'))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    fresh.start(preload=("saw_nvml_check",))
    _ready(fresh._ZYGOTE)
    assert (tmp_path / "seen.txt").read_text() == "1"
    assert "PYTORCH_NVML_BASED_CUDA_CHECK" not in fresh._ZYGOTE.ready_env  # never a reason to go cold
    home = tmp_path / "home-from-env"
    home.write_text("a file")
    done = fresh.run(["runs", "--json"], timeout=60, env=dict(os.environ, PILOTRUN_HOME=str(home)))
    assert done.returncode == 2 and str(home) in done.stderr and fresh.started()  # forked, the request's env


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device: a CPU build of torch "
                    "never initialises CUDA, so no fork of the zygote can be a bad one")
def test_a_zygote_whose_imports_initialised_cuda_serves_no_request(monkeypatch, tmp_path):
    """A preload that initialises CUDA (planted: torch.cuda.init()) makes every fork of the zygote a bad one: the
    zygote ends after its imports instead of answering, and requests go cold with the same answer."""
    (tmp_path / "inits_cuda.py").write_text("import torch\ntorch.cuda.init()\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    fresh.start(preload=("inits_cuda",))
    _ready(fresh._ZYGOTE)
    fresh._ZYGOTE.proc.wait(timeout=60)
    assert not fresh.started()
    done = fresh.run(["--version"], timeout=60)
    assert done.returncode == 0 and "pilotrun" in done.stdout


def test_a_long_request_reaches_the_zygote_whole(zygote):
    """A request longer than one socket message (a large environment): the rest follows the files, and the
    zygote reads to the end of the line (before, it parsed the first piece and died)."""
    env = dict(os.environ, PILOTRUN_LONG="x" * (4 << 20))
    z = fresh._ZYGOTE
    done = fresh.run(["--version"], timeout=60, env=env)
    assert done.returncode == 0 and "pilotrun" in done.stdout
    assert fresh._ZYGOTE is z and fresh.started()  # served by the zygote, which is still there


def _children(pid: int) -> list[int]:
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return kids


def test_a_zygote_dying_under_its_child_reruns_the_request_cold(zygote):
    """The zygote killed while its child runs (the OOM killer's pick): the child is killed with it and the request
    runs again in a cold interpreter, whose answer is returned (before: an OSError, exit 3 of the verb). The child
    is held (SIGSTOP) the moment it exists, so the zygote dies under it whatever the machine's speed."""
    import signal
    import threading

    held = []

    def sockets(pid: int) -> bool:  # the child's copy of the zygote's connection, until its first line closes it
        try:
            return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                       for fd in os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            return False

    def hold_then_kill():
        deadline = time.monotonic() + 30
        while not held and time.monotonic() < deadline:
            for kid in _children(zygote.proc.pid):
                os.kill(kid, signal.SIGSTOP)
                if sockets(kid):  # held before it closed the connection: the zygote's death would never reach the
                    os.kill(kid, signal.SIGCONT)  # caller (no EOF while a copy is open), which no real kill does
                    continue
                held.append(kid)
            time.sleep(0.005)
        time.sleep(0.3)  # the zygote answers the child's pid as it forks: that answer is sent by now
        os.kill(zygote.proc.pid, signal.SIGKILL)

    killer = threading.Thread(target=hold_then_kill)
    killer.start()
    try:
        done = fresh.run(["--version"], timeout=60)
    finally:
        killer.join()
        for kid in held:
            try:
                os.kill(kid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert held, "the zygote forked no child"
    assert done.returncode == 0 and "pilotrun" in done.stdout, done.stderr
    assert not fresh.started()
    stat = Path(f"/proc/{held[0]}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"  # the held child is gone


def test_the_zygote_ends_without_the_interpreters_exit(monkeypatch, tmp_path):
    """At the end of its caller the zygote leaves with ``os._exit``: nothing of a run is in it, and a normal exit
    with torch and transformers imported (their exit handlers, their objects freed one by one) took 0.5–1 s that
    `all` waited for in its own exit. Planted: a preloaded module whose exit handler would write a file."""
    (tmp_path / "exit_marker.py").write_text(
        "import atexit, pathlib\n"
        f"atexit.register(lambda: pathlib.Path({str(tmp_path / 'ran')!r}).write_text('exit handlers ran'))\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    fresh.start(preload=("exit_marker",))
    z = fresh._ZYGOTE
    _ready(z, 60)  # its preload imported
    assert z.ready_env is not None
    fresh.stop()
    assert z.proc.returncode == 0 and not (tmp_path / "ran").exists()


def test_meanwhile_work_runs_once_while_the_first_child_runs(zygote):
    """``fresh.meanwhile``: the task runs in this process once the zygote has forked the block's first child and
    before its answer is read, never again, never outside the block; a task that raises is dropped and the child's
    answer is the same; without a zygote (a cold process, whose pipes must be read while it runs) it does not run."""
    ran = []

    def task():
        ran.append(time.monotonic())

    def broken():
        ran.append("broken")
        raise RuntimeError("planted")

    plain = fresh.run(["--version"], timeout=60)
    with fresh.meanwhile(task), fresh.meanwhile(broken):
        asked = time.monotonic()
        first = fresh.run(["--version"], timeout=60)
        answered = time.monotonic()
        second = fresh.run(["--version"], timeout=60)
    fresh.run(["--version"], timeout=60)
    assert len(ran) == 2 and asked < ran[0] < answered and ran[1] == "broken"
    assert (first.returncode, first.stdout) == (second.returncode, second.stdout) == (plain.returncode, plain.stdout)
    fresh.stop()
    with fresh.meanwhile(task):
        assert fresh.run(["--version"], timeout=60).stdout == plain.stdout  # cold
    assert len(ran) == 2 and not fresh._MEANWHILE
