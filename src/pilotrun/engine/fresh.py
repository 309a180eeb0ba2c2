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
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
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


def read_at_import(name: str) -> bool:
    return name != "PYTHONPATH" and name.upper().startswith(READ_AT_IMPORT)


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
        request = json.dumps({"args": list(args), "env": env, "cwd": cwd}).encode() + b"\n"
        try:  # the files go with the first bytes; a request longer than one message follows them
            sent = socket.send_fds(z.sock, [request], [out.fileno(), err.fileno()])
            z.sock.sendall(request[sent:])
        except OSError:
            stop()
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

    for name in preload:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a module that does not import is imported (and fails) in the child
            pass
    sock = socket.socket(fileno=fd)
    try:  # ready: the environment the imports left (``_imported``), before any answer to a request
        sock.sendall(json.dumps({"ready": True, "env": {k: v for k, v in os.environ.items() if read_at_import(k)}})
                     .encode() + b"\n")
    except OSError:
        return
    while True:
        try:
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 20, 2)
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


def _child(request: dict, fds: list[int]) -> None:
    """In the forked child: the request's output files, environment, folder and arguments, then the console
    script as ``python -m pilotrun`` runs it; its exit status, after the exit handlers a cold process runs."""
    code = 1
    try:
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
        code = 0
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
