"""A pytest plugin: the suite leaves nothing in the system's temp directory (issue 50).

At configure time the session gets a temp folder of its own (``pr-XXXXXXXX`` in the system's temp directory)
as ``TMPDIR`` and ``tempfile.tempdir``, for this process and every process it starts; pytest's own folders
(``tmp_path``, under ``pytest-of-$USER``) go in it too (``PYTEST_DEBUG_TEMPROOT``): left in the system temp
directory, they were a new entry there on every fresh machine, and pytest keeps its last three sessions' (pass
``--basetemp DIR`` to keep a failed test's files: pytest then uses DIR, which this plugin leaves alone). After
each test the folder is listed (one ``os.listdir``): what appeared is charged to that test. At the end of the
session the folder must hold nothing but pytest's own, and the system temp directory must hold no entry it did not hold at the start
(for what writes to a fixed ``/tmp`` path whatever TMPDIR says, Ray's ``/tmp/ray`` for one); otherwise the
session fails naming each entry and the test that left it. The folder is removed either way, with torch's
compile cache, which the session puts in it (``TORCHINDUCTOR_CACHE_DIR``).

On a machine that other programs share, they too create entries in the system temp directory while the suite
runs: ``PILOTRUN_TEST_SHARED_TMP=1`` reports those as a warning instead (the private folder stays strict).
Register it with ``pytest_plugins = ["tmp_guard"]`` in conftest.py, or ``-p tmp_guard`` with tests/ on the path.

Under pytest-xdist (``make test`` runs one worker per core) the session's process runs no test: it makes the private
folder and judges the system temp directory and that folder at its end; each worker makes a folder of its own inside
it (its ``TMPDIR``), charges each of its tests with what appeared there, and hands what its tests left to the session
(``workeroutput``), which fails on it as on its own."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest

_STATE: dict = {}
INDUCTOR = "torchinductor-of-the-suite"
LEFT_BY_WORKER = "pilotrun_temp_left"  # a worker's findings, sent in its workeroutput


def _worker() -> bool:
    """This process is a pytest-xdist worker (its config, not the environment, says so: a test's own inner
    session inherits the worker's PYTEST_XDIST_WORKER and is a session of its own)."""
    return _STATE.get("worker", False)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    if _STATE:
        return
    system = tempfile.gettempdir()
    private = tempfile.mkdtemp(prefix="pr-", dir=system)
    os.chmod(private, 0o1777)  # as the system temp directory is: tests run processes as another user (nobody)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", private)  # pytest's basetemp: removed with the folder
    _STATE.update(system=system, private=private, before=set(os.listdir(system)) | {os.path.basename(private)},
                  seen=set(), left={}, environ=os.environ.get("TMPDIR"), from_workers=[],
                  worker=hasattr(config, "workerinput"))
    os.environ["TMPDIR"] = private
    tempfile.tempdir = private
    # torch makes its compile cache (torchinductor_$USER) in the temp directory when peft or transformers'
    # modeling_utils is imported, as in every user's run: torch's cache, not a leak; here the suite's own, removed
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(private, INDUCTOR))


def _ours(name: str) -> bool:
    """The suite's own entries in the folder: torch's compile cache and pytest's basetemp root."""
    return name == INDUCTOR or name.startswith("pytest-of-")


def _charge(nodeid: str) -> None:
    new = {n for n in set(os.listdir(_STATE["private"])) - _STATE["seen"] if not _ours(n)}
    for name in new:
        _STATE["left"].setdefault(name, nodeid)
    _STATE["seen"] = (_STATE["seen"] | new) & set(os.listdir(_STATE["private"]))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield
    if _STATE:
        _charge(item.nodeid)


def _finalize_temporary_directories(private: str) -> None:
    """A ``tempfile.TemporaryDirectory`` still alive in this process is removed by its finalizer when the process
    exits (libraries make some at import: W&B's media and artifact folders); the session is over, so they are
    finalized now, before the folder is judged. What any other process or file handle left stays to be judged."""
    import gc
    import warnings

    frozen = gc.get_freeze_count()  # pilotrun freezes what is alive before a run (probe/memory.py): those too
    gc.unfreeze()
    try:
        with warnings.catch_warnings():  # looking at every object touches deprecated module attributes (torch's)
            warnings.simplefilter("ignore")
            alive = [o for o in gc.get_objects() if isinstance(o, tempfile.TemporaryDirectory)]
    finally:
        if frozen:
            gc.freeze()
    for obj in alive:
        if str(obj.name).startswith(private + os.sep):
            obj.cleanup()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """pytest-xdist, in the session's process: a worker is done; what its tests left is judged with the rest."""
    if _STATE:
        _STATE["from_workers"].extend(getattr(node, "workeroutput", {}).get(LEFT_BY_WORKER, []))


def pytest_sessionfinish(session, exitstatus):
    if not _STATE:
        return
    _finalize_temporary_directories(_STATE["private"])
    _charge("the session's own fixtures (torn down at its end)")
    private, system = _STATE["private"], _STATE["system"]
    left = [(name, _STATE["left"].get(name, "?")) for name in sorted(os.listdir(private)) if not _ours(name)]
    # a worker's "system" is the session's folder, which holds the other worker's: the session judges it
    outside = [] if _worker() else sorted(set(os.listdir(system)) - _STATE["before"] - {os.path.basename(private)})
    shutil.rmtree(private, ignore_errors=True)
    tempfile.tempdir = None
    if _STATE["environ"] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = _STATE["environ"]
    lines = [f"  {os.path.join('$TMPDIR', name)}  (left by {who})" for name, who in left]
    if _worker():
        session.config.workeroutput[LEFT_BY_WORKER] = lines
        return
    lines += _STATE["from_workers"]
    shared = os.environ.get("PILOTRUN_TEST_SHARED_TMP") == "1"
    outside_lines = [f"  {os.path.join(system, name)}  (written to the system temp directory, not $TMPDIR)"
                     for name in outside]
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if outside_lines and shared:
        if reporter:
            reporter.write_line("temp directory: new entries while the suite ran (PILOTRUN_TEST_SHARED_TMP=1: "
                                "another program's or the suite's):\n" + "\n".join(outside_lines), yellow=True)
        outside_lines = []
    if lines or outside_lines:
        if reporter:
            reporter.write_line("temp directory: the suite left these behind (issue 50: it must leave nothing):\n"
                                + "\n".join(lines + outside_lines), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
