"""Fresh processes for the checks that need one (``resume``'s continued run, ``verify``'s reload), without
paying the libraries' import (~4 s of torch and transformers on 2 cores) at each.

``start()`` launches a *zygote*: a new interpreter (``exec``'d, not a fork of the caller) that imports the
preload list and then waits. ``run(args)`` asks it to ``fork`` a child that runs ``python -m pilotrun
args...`` exactly as a cold ``subprocess.run`` would (the request's environment, working folder and output
files), and answers that child's exit status. Without a zygote (never started, or gone), or with
``PILOTRUN_FRESH=cold`` in the request's environment, ``run`` starts the cold process itself: the same
arguments, the same result.

Why the child proves what a cold process proves (docs/ARCHITECTURE.md, "Fresh processes"): the zygote is
started before the verb loads its campaign, from the executable and never from the caller's memory; all it
ever did is import modules and read requests. So the child holds no object of the run (no model, optimizer,
sampler, RNG state, data); all it knows of the run comes from its arguments: paths to the journal and the run's
files on disk. It is the same idea as ``multiprocessing``'s forkserver with ``set_forkserver_preload``, written
out here so that the child's output comes back through files passed with the request (SCM_RIGHTS), the
environment is the request's, and nothing is left in the system's temp folder.

``start_processes(fn, args, n)`` asks it for ``n`` children at once, each running ``fn(i, *args)``: the ranks
``engine.distributed.launch`` would otherwise spawn, each paying the imports again. The answer is a
``Ranks``, which behaves as torch's ``ProcessContext`` (``join``, ``processes``, the same exceptions).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

# What the checks' fresh processes import anyway: the libraries, then pilotrun's own modules of those checks.
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "pilotrun.cli.main",
           "pilotrun.rehearsal.mechanics.resume", "pilotrun.rehearsal.mechanics.verify")


COLD_ENV = "PILOTRUN_FRESH"  # "cold": no zygote is started, and a running one is not asked
_ONE_REQUEST = threading.Lock()

# What the interpreter and the preloaded libraries read once, at start or import, in the zygote: a child given
# other values would run under the zygote's (a hub looked up where the request said HF_HUB_OFFLINE, another hub
# cache, torch's thread counts, glibc's malloc settings, the hash seed, the temp folder tempfile keeps), so such a
# request goes cold. PILOTRUN_VERBOSE is read at import by tasks/quantized.py. PYTHONPATH is not among them: the
# child rebuilds its module path from it. Anything else (COLUMNS, pilotrun's run-time variables) is read when used.
READ_AT_IMPORT = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_", "ACCELERATE_", "PEFT_",
                  "BNB_", "TORCH", "PYTORCH_", "CUDA_", "NCCL_", "OMP_", "MKL_", "KMP_", "OPENBLAS_", "PYTHON", "LD_",
                  "MALLOC_", "GLIBC_", "XDG_", "HOME", "TEMP", "TMP", "PILOTRUN_VERBOSE")


# Read when used, though their prefix is above: torch reads PYTORCH_NVML_BASED_CUDA_CHECK at each
# torch.cuda.is_available() (Lightning sets it when imported: every request after a test imported Lightning went cold)
READ_WHEN_USED = ("PYTHONPATH", "PYTORCH_NVML_BASED_CUDA_CHECK")


def read_at_import(name: str) -> bool:
    return name not in READ_WHEN_USED and name.upper().startswith(READ_AT_IMPORT)


class _Zygote:
    def __init__(self, proc: subprocess.Popen, sock: socket.socket, env: dict):
        self.proc, self.sock, self.env = proc, sock, env  # env: what its preload was imported under
        self.ready_env: dict | None = None  # its read-at-import variables once its preload is done (``_imported``)


_ZYGOTE: _Zygote | None = None
_MEANWHILE: list = []  # what this process does while its next fresh process runs (``meanwhile``)


def start(preload: tuple[str, ...] = PRELOAD) -> None:
    """Start the zygote in the background (it imports ``preload`` while the caller goes on); once per process."""
    global _ZYGOTE
    if _ZYGOTE is not None and _ZYGOTE.proc.poll() is None:
        return
    here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    env = import_env(os.environ)
    try:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; from pilotrun.engine.fresh import serve; "
                                 "serve(int(sys.argv[1]), sys.argv[2:])", str(there.fileno()), *preload],
                                pass_fds=(there.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, close_fds=True, env=env)
    except OSError:
        here.close()
        return  # no zygote: run() starts cold processes
    finally:
        there.close()
    _ZYGOTE = _Zygote(proc, here, env)
    atexit.register(stop)


def stop() -> None:
    """End the zygote (closing its socket is enough: it exits when it reads the end)."""
    global _ZYGOTE
    z, _ZYGOTE = _ZYGOTE, None
    if z is None:
        return
    try:
        z.sock.shutdown(socket.SHUT_RDWR)  # the end, even while a reader of the socket is still open
    except OSError:
        pass
    z.sock.close()
    try:
        z.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        z.proc.kill()
        z.proc.wait()


def started() -> bool:
    return _ZYGOTE is not None and _ZYGOTE.proc.poll() is None


def import_env(env) -> dict:
    """The environment a cold ``python -m pilotrun`` imports its libraries under: ``env`` with the defaults
    pilotrun sets before loading a model (tasks/loading.py)."""
    from pilotrun.startup import LIBRARY_ENV_DEFAULTS

    return {**LIBRARY_ENV_DEFAULTS, **env}


def same_imports(zygote_env: dict, env: dict) -> bool:
    """Whether a child of a zygote started under ``zygote_env`` imports what a cold process given ``env`` would:
    every variable read at start or import the same."""
    a, b = (import_env(e) for e in (zygote_env, env))
    return all(a.get(k) == b.get(k) for k in a.keys() | b.keys() if read_at_import(k))


def _imported(z: _Zygote) -> dict:
    """The zygote's environment as its libraries left it: once its preload is done it sends its read-at-import
    variables, with those its imports set themselves (torch sets TORCHINDUCTOR_CACHE_DIR to its default, as it
    does in the caller: compared with the zygote's starting environment every request differed and went cold).
    Before that message has come, the environment it started under."""
    if z.ready_env is None:
        import select

        try:
            if select.select([z.sock], [], [], 0)[0]:
                data = z.sock.recv(1 << 20, socket.MSG_PEEK)
                if b"\n" in data:  # the first line the zygote sends, before any request: its ready message
                    _ready(z, z.sock.recv(data.index(b"\n") + 1))
        except (OSError, ValueError):
            pass
    return z.env if z.ready_env is None else z.ready_env


def _ready(z: _Zygote, line: bytes) -> bool:
    """Whether ``line`` is the zygote's ready message (its environment then kept)."""
    msg = json.loads(line)
    if "ready" not in msg:
        return False
    z.ready_env = msg["env"]
    return True


@contextlib.contextmanager
def meanwhile(task: Callable[[], None]):
    """Inside the block, ``task()`` runs once in this process, in its main thread, while the first zygote's child
    the block asks for (``run``) runs: work a later step of this process does anyway, done while this process
    would only wait. `all` imports the sheet's libraries so (rehearsal/all.py) during resume's fresh process, whose
    own start (fork, reading the checkpoint, building the model) is one core's work on two. The child is a fork of
    the zygote and shares nothing with this process: what the task does here cannot reach it. A task that raises is
    dropped (the later step meets the same error itself); one left at the block's end never runs. A cold fresh
    process (no zygote) waits as before: its output comes through pipes that must be read while it runs."""
    _MEANWHILE.append(task)
    try:
        yield
    finally:
        if task in _MEANWHILE:
            _MEANWHILE.remove(task)


def _meanwhile() -> None:
    from pilotrun.signals import unless_stopping

    while _MEANWHILE:
        task = _MEANWHILE.pop(0)
        try:
            task()
        except Exception as e:  # noqa: BLE001 - the later step that needs it meets it again and says it
            unless_stopping(e)


def run(args: list[str], *, timeout: float, env: dict | None = None,
        cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """``python -m pilotrun args...`` in a fresh process, its output captured as text: a child of the zygote if
    one runs and the request's environment is the one its libraries were imported under, a cold interpreter
    otherwise; in ``cwd`` (default: this process's folder). Raises ``subprocess.TimeoutExpired`` (the child
    killed) as ``subprocess.run`` does."""
    env = dict(os.environ if env is None else env)
    folder = str(cwd) if cwd is not None else os.getcwd()
    # one request at a time on the zygote's socket: a request made while another thread's is answered goes cold
    if started() and env.get(COLD_ENV) != "cold" and same_imports(_imported(_ZYGOTE), env) \
            and _ONE_REQUEST.acquire(blocking=False):
        try:
            done = _forked(args, timeout, env, folder)
        finally:
            _ONE_REQUEST.release()
        if done is not None:
            return done
    return subprocess.run([sys.executable, "-m", "pilotrun", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=folder)


def _forked(args: list[str], timeout: float, env: dict, cwd: str) -> subprocess.CompletedProcess | None:
    """The zygote's child; None when the zygote cannot take the request (gone): the caller goes cold."""
    z = _ZYGOTE
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        if not _send(z, {"args": list(args), "env": env, "cwd": cwd}, [out.fileno(), err.fileno()]):
            return None
        reader = z.sock.makefile("rb")
        pid = None
        deadline = time.monotonic() + timeout
        try:  # the timeout counts from the request, the zygote's imports included (as a cold process's do)
            z.sock.settimeout(max(1e-3, deadline - time.monotonic()))
            line = reader.readline()  # {"pid": N} once forked: after the zygote's imports are done
            if line and _ready(z, line):  # its ready message, not read before this request
                line = reader.readline()
            if not line:
                stop()
                return None
            pid = json.loads(line)["pid"]
            _meanwhile()  # the child runs: this process's own waiting work
            z.sock.settimeout(max(1e-3, deadline - time.monotonic()))
            line = reader.readline()  # {"code": C} when the child has ended
            if not line:
                raise ConnectionResetError("the zygote ended before its child")
            code = json.loads(line)["code"]
        except (socket.timeout, TimeoutError):
            _kill(pid)
            stop()
            out.seek(0)
            err.seek(0)
            raise subprocess.TimeoutExpired([sys.executable, "-m", "pilotrun", *args], timeout,
                                            output=out.read().decode(errors="replace"),
                                            stderr=err.read().decode(errors="replace")) from None
        except OSError:  # the zygote died under its child (killed, out of memory): the child goes too, and the
            _kill(pid)  # request is run again cold, from the start, as if no zygote had been there
            _gone(pid)
            stop()
            return None
        except BaseException:  # Ctrl-C or a signal while waiting: the child ends with us, as subprocess.run's
            _kill(pid)
            stop()
            raise
        finally:
            reader.close()
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess([sys.executable, "-m", "pilotrun", *args], code,
                                           out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def _send(z: _Zygote, request: dict, fds: list[int]) -> bool:
    """Send ``request`` with ``fds`` (SCM_RIGHTS); False (the zygote stopped) when it cannot take it."""
    data = json.dumps(request).encode() + b"\n"
    try:  # the files go with the first bytes; a request longer than one message follows them
        sent = socket.send_fds(z.sock, [data], fds)
        z.sock.sendall(data[sent:])
    except OSError:
        stop()
        return False
    return True


# --- ranks: several children at once -----------------------------------------------------------------------------

MAX_RANKS = 64  # a request carries the output files and one error file per rank: more ranks than this spawn cold


def start_processes(fn, args: tuple, nprocs: int) -> "Ranks | None":
    """``fn(i, *args)`` for i in 0..nprocs-1, each in a child of the zygote, started at once: what
    ``torch.multiprocessing.start_processes(fn, args, nprocs, start_method="spawn")`` does (this process's
    environment, folder, module path and standard output and error), without each child importing torch and
    transformers again. None when the zygote cannot take it (none runs, it is busy, ``PILOTRUN_FRESH=cold``, an
    environment its imports did not see, ``fn`` in ``__main__``, which a child of the zygote cannot import, an
    argument JSON does not carry whole: ``_call``): the caller spawns, the same processes cold."""
    env = dict(os.environ)
    if not (started() and env.get(COLD_ENV) != "cold" and 0 < nprocs <= MAX_RANKS
            and same_imports(_imported(_ZYGOTE), env)):
        return None
    call = _call(fn, args)
    if call is None:
        return None
    if not _ONE_REQUEST.acquire(blocking=False):
        return None
    z, errors = _ZYGOTE, []
    try:
        errors = [tempfile.TemporaryFile() for _ in range(nprocs)]
        request = {"ranks": nprocs, "call": call, "env": env, "cwd": os.getcwd(), "path": list(sys.path),
                   "argv": list(sys.argv)}
        for stream in (sys.stdout, sys.stderr):  # what this process printed comes before what the ranks print
            with contextlib.suppress(OSError, ValueError, AttributeError):
                stream.flush()
        if not _send(z, request, [1, 2, *(f.fileno() for f in errors)]):
            raise OSError("the zygote is gone")
        pids, rest = _read_pids(z)
    except BaseException as e:
        for f in errors:
            f.close()
        _ONE_REQUEST.release()
        if isinstance(e, (OSError, ValueError)):
            return None
        stop()  # Ctrl-C before the answer: the zygote, reading the end, ends any rank it forked (_serve_ranks)
        raise
    return Ranks(z, pids, errors, rest)


def _call(fn, args: tuple) -> dict | None:
    """``fn`` and ``args`` as JSON: a module-level function by its module and name, any other argument as a value
    JSON gives back equal (no tuple, no object); None for anything else, which spawn pickles instead. Nothing is
    unpickled in the zygote's child: it imports the functions by name and reads the values."""
    encoded = []
    for x in (fn, *args):
        if callable(x):
            where = _function_name(x)
            if where is None:
                return None
            encoded.append({"function": where})
            continue
        try:
            if json.loads(json.dumps(x)) != x:
                return None
        except (TypeError, ValueError):
            return None
        encoded.append({"value": x})
    return {"fn": encoded[0], "args": encoded[1:]}


def _function_name(fn) -> list[str] | None:
    """[module, qualified name] of a module-level function found again by them (as pickle records it), else None."""
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not module or module == "__main__" or not name or "<" in name:
        return None
    try:
        return [module, name] if _find(module, name) is fn else None
    except (ImportError, AttributeError):
        return None


def _find(module: str, name: str):
    """The object named ``name`` (dotted) in ``module``, imported."""
    import importlib

    found = importlib.import_module(module)
    for part in name.split("."):
        found = getattr(found, part)
    return found


def _decoded(item: dict):
    return _find(*item["function"]) if "function" in item else item["value"]


def _read_pids(z: _Zygote) -> tuple[list[int], bytes]:
    """The zygote's answer to a ranks request (its ready message read first if it comes before), and what came
    after it in the same read: a rank that ended at once has its status there."""
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not _ready(z, line):
                return list(json.loads(line)["pids"]), buf
        r = select.select([z.sock], [], [], None)[0]
        data = z.sock.recv(1 << 16) if r else b""
        if not data:
            stop()
            raise OSError("the zygote ended before forking the ranks")
        buf += data


class Ranks:
    """The ranks a request forked: torch's ``ProcessContext`` for processes that are the zygote's children, not
    this process's. The zygote reports each exit status as it comes (negative: killed by that signal, as
    ``multiprocessing`` says it); ``join`` reads them and does what torch's does: on the first failure the others
    get ``grace_period`` to end, then SIGTERM, then SIGKILL, and it raises ``ProcessRaisedException`` with the
    failed rank's traceback or ``ProcessExitedException`` with its status. A zygote that dies under its ranks
    takes them along (their parent-death signal) and they read as killed."""

    error_files: tuple = ()  # tracebacks come through files with no name: nothing to remove afterwards

    def __init__(self, z: _Zygote, pids: list[int], errors: list, reported: bytes = b""):
        self._z, self._errors, self._buf = z, errors, reported
        self.codes: dict[int, int] = {}
        self._ended: list[int] = []  # rank indices in the order their ends were reported
        self._looked = 0  # how many of them join() has judged
        self.processes = [_Rank(self, i, pid) for i, pid in enumerate(pids)]

    def _pump(self, timeout: float | None) -> None:
        """Read the zygote's reports: what has come, else wait up to ``timeout`` s (None: forever) for one."""
        deadline = None if timeout is None else time.monotonic() + timeout
        seen = len(self._ended)
        while len(self.codes) < len(self.processes):
            while b"\n" in self._buf:
                line, self._buf = self._buf.split(b"\n", 1)
                msg = json.loads(line)
                i = [p.pid for p in self.processes].index(msg["pid"])
                self.codes[i] = int(msg["code"])
                self._ended.append(i)
            if len(self._ended) > seen or len(self.codes) == len(self.processes):
                break
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                ready = select.select([self._z.sock], [], [], left)[0]
                data = self._z.sock.recv(1 << 16) if ready else None
            except OSError:
                data = b""
            if data is None:
                break
            if not data:  # the zygote is gone, and its ranks with it
                for i in range(len(self.processes)):
                    if i not in self.codes:
                        self.codes[i] = -signal.SIGKILL
                        self._ended.append(i)
                stop()
            self._buf += data
        if len(self.codes) == len(self.processes) and self._errors is not None:
            self._release()

    def _release(self) -> None:
        for i, f in enumerate(self._errors):
            self.processes[i].traceback = _read_text(f)
            f.close()
        self._errors = None
        _ONE_REQUEST.release()

    def _join_all(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for p in self.processes:
            p.join(max(0.0, deadline - time.monotonic()))

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """As ``ProcessContext.join``: True once every rank ended with 0, False while some run; raises on a
        failure (the first reported), after the others have ended."""
        if self._looked == len(self.processes):
            return True
        self._pump(timeout)
        failed = None
        while self._looked < len(self._ended):
            i = self._ended[self._looked]
            self._looked += 1
            if self.codes[i] != 0:
                failed = i
                break
        if failed is None:
            return self._looked == len(self.processes)
        if grace_period is not None:
            self._join_all(grace_period)
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        self._join_all(30 if grace_period is None else grace_period)
        for p in self.processes:
            if p.is_alive():
                p.kill()
            p.join()
        from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

        self._looked = len(self.processes)
        rank, code = self.processes[failed], self.codes[failed]
        if rank.traceback:
            raise ProcessRaisedException(f"\n\n-- Process {failed:d} terminated with the following error:\n"
                                         + rank.traceback, failed, rank.pid)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"<Unknown signal {-code}>"
            raise ProcessExitedException(f"process {failed:d} terminated with signal {name}", error_index=failed,
                                         error_pid=rank.pid, exit_code=code, signal_name=name)
        raise ProcessExitedException(f"process {failed:d} terminated with exit code {code:d}", error_index=failed,
                                     error_pid=rank.pid, exit_code=code)


class _Rank:
    """One of ``Ranks``' processes, as much of ``multiprocessing.Process`` as ``launch`` and ``join`` use."""

    def __init__(self, ranks: Ranks, index: int, pid: int):
        self._ranks, self._index, self.pid = ranks, index, pid
        self.traceback = ""

    @property
    def exitcode(self) -> int | None:
        return self._ranks.codes.get(self._index)

    def is_alive(self) -> bool:
        if self.exitcode is None:
            self._ranks._pump(0)
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.exitcode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return
            self._ranks._pump(left)

    def _signal(self, signum: int) -> None:
        if self.is_alive():  # not reported ended: its pid is still the zygote's unreaped child or running
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)


def _read_text(f) -> str:
    try:
        f.seek(0)
        return f.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""


def _kill(pid: int | None) -> None:
    if pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _gone(pid: int | None, wait_s: float = 10.0) -> None:
    """Wait until process ``pid`` (killed; no longer a child to wait for once its zygote died) has left."""
    deadline = time.monotonic() + wait_s
    while pid is not None and time.monotonic() < deadline:
        try:
            if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return  # a zombie: ended, its parent has not reaped it yet
        except (OSError, IndexError):
            return
        time.sleep(0.01)


def serve(fd: int, preload: list[str]) -> None:
    """The zygote: import ``preload``, then one request at a time: fork, wait, answer the child's status. It ends
    with ``os._exit`` when its caller is gone: it holds no file nor anything of a run, and the interpreter's own exit
    with torch and transformers imported (their ~10⁶ objects freed one by one, their exit handlers) took 0.5–1 s
    that the caller's ``stop`` waited for at the end of every `all`."""
    try:
        _serve(fd, preload)
    finally:
        os._exit(0)


def _serve(fd: int, preload: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the children and the caller; it ends us
    import importlib

    # An import that asks torch.cuda.is_available() must not initialise CUDA here: torch's default check does
    # (cudaGetDeviceCount), and every fork of a process that did is a "bad fork" whose GPU run fails ("Cannot
    # re-initialize CUDA in forked subprocess"). NVML answers without it. The children run under the request's
    # environment (``_child``), so what they do on the GPU is the caller's choice, not this one.
    os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that does not import is imported (and fails) in the child
            pass
    if "torch" in sys.modules:  # the imports are the zygote's for good: frozen once, its children's collections
        # never walk them again (nor write to their pages, which a fork then shares instead of copying)
        from pilotrun.engine.tensors import freeze_process

        freeze_process()
    if _forks_poisoned():
        return  # no zygote: every request goes cold (the caller reads the socket's end), as without one
    sock = socket.socket(fileno=fd)
    try:  # ready: the environment the imports left (``_imported``), before any answer to a request
        sock.sendall(json.dumps({"ready": True, "env": {k: v for k, v in os.environ.items() if read_at_import(k)}})
                     .encode() + b"\n")
    except OSError:
        return
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2 + MAX_RANKS)
        except OSError:
            return
        while msg and not msg.endswith(b"\n"):  # a request longer than one message: the rest follows
            more = sock.recv(1 << 20)
            if not more:
                return
            msg += more
        if not msg:
            return
        request = json.loads(msg)
        if "ranks" in request:
            if not _serve_ranks(sock, request, fds):
                return
            continue
        pid = os.fork()
        if pid == 0:
            sock.close()
            _child(request, fds)  # never returns
        for f in fds:
            os.close(f)
        try:
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        except OSError:  # the caller is gone (or gave up on this request): the child goes with it
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        try:
            sock.sendall(json.dumps({"code": code}).encode() + b"\n")
        except OSError:
            return


def _forks_poisoned() -> bool:
    """Whether CUDA was initialised in this process anyway (an import initialised it, or NVML failed and torch fell
    back on the CUDA runtime): torch then marks every fork of it bad, which a forked test child reports. Never on a
    CPU build."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda._is_compiled():
        return False
    pid = os.fork()
    if pid == 0:
        os._exit(3 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: the request's output files, environment, folder and arguments, then the console
    script as ``python -m pilotrun`` runs it; its exit status, after the exit handlers a cold process runs."""
    def body() -> int:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        for f in fds:
            os.close(f)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        # the module search path a cold ``python -m pilotrun`` starts with: its folder first, then the request's
        # PYTHONPATH (read once, at a cold interpreter's start; the server started with another) - a campaign's
        # task module beside its file is found through them (tasks.resolve)
        import importlib

        start = [request["cwd"]] + [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [p for p in dict.fromkeys(start) if p not in sys.path]
        importlib.invalidate_caches()
        sys.argv = [sys.executable, *request["args"]]
        sys.orig_argv = [sys.executable, "-m", "pilotrun", *request["args"]]
        import runpy

        runpy.run_module("pilotrun", run_name="__main__", alter_sys=True)
        return 0

    _exit_as_an_interpreter(body)


def _exit_as_an_interpreter(body: Callable[[], int]) -> None:
    """``os._exit`` with ``body()``'s status, or what a cold interpreter's would be: a SystemExit's code (its
    message printed), 1 with the traceback for any other exception; after the exit handlers a cold one runs."""
    code = 1
    try:
        code = body()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - as an uncaught exception in a cold interpreter: traceback, exit 1
        import traceback

        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _serve_ranks(sock: socket.socket, request: dict, fds: list[int]) -> bool:
    """Fork the request's ranks, answer their ids, then each one's exit status as it ends. False when the caller
    is gone (the zygote then ends): its ranks get SIGINT, as spawned ranks do when their parent dies (torch's
    spawn sets that parent-death signal), and SIGKILL if they outlive ``GONE_S``."""
    pids = []
    request["zygote"] = os.getpid()
    for i in range(request["ranks"]):
        pid = os.fork()
        if pid == 0:
            sock.close()
            _rank(request, i, fds)  # never returns
        pids.append(pid)
    for f in fds:
        os.close(f)
    live = set(pids)
    try:
        sock.sendall(json.dumps({"pids": pids}).encode() + b"\n")
        while live:
            for pid in sorted(live):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    live.discard(pid)
                    sock.sendall(json.dumps({"pid": pid, "code": os.waitstatus_to_exitcode(status)}).encode()
                                 + b"\n")
            if live and select.select([sock], [], [], 0.02)[0] and not sock.recv(1 << 16):
                raise ConnectionResetError("the caller is gone")  # it sends nothing while its ranks run
    except OSError:
        _end_ranks(live)
        return False
    return True


GONE_S = 10.0


def _end_ranks(live: set[int]) -> None:
    for sig in (signal.SIGINT, signal.SIGKILL):
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + GONE_S
        while live and time.monotonic() < deadline:
            for pid in sorted(live):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    live.discard(pid)
            time.sleep(0.02)


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with_parent(signum: int, parent: int) -> None:
    """``signum`` to this process when its parent (the zygote) ends, as torch's spawn asks for its ranks (Linux's
    prctl; elsewhere nothing); a parent already gone before that ends this process now, as that signal would."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signum), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(128 + int(signum))


def _rank(request: dict, index: int, fds: list[int]) -> None:
    """In a forked rank: the caller's output, environment, folder, module path and arguments, then
    ``fn(index, *args)`` as torch's spawn runs it (its ``_wrap``): an exception's traceback goes to this rank's
    error file and the status is 1; a KeyboardInterrupt (SIGINT from a parent that died) ends it quietly."""
    def body() -> int:
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _die_with_parent(signal.SIGINT, request["zygote"])
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        error = fds[2 + index]
        for k, f in enumerate(fds):
            if k != 2 + index:
                os.close(f)
        if os.isatty(1):  # a cold interpreter's stdout on a terminal is line-buffered; the zygote's was not
            with contextlib.suppress(AttributeError, ValueError):
                sys.stdout.reconfigure(line_buffering=True)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.path[:] = request["path"]
        sys.argv = list(request["argv"])
        import importlib

        importlib.invalidate_caches()
        fn = _decoded(request["call"]["fn"])
        args = [_decoded(a) for a in request["call"]["args"]]
        try:
            fn(index, *args)
        except KeyboardInterrupt:
            pass
        except Exception:  # noqa: BLE001 - the caller raises it, with this traceback, as torch's join does
            import traceback

            with os.fdopen(error, "w") as fh:
                fh.write(traceback.format_exc())
            return 1
        return 0

    _exit_as_an_interpreter(body)
