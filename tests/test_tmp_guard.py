"""The suite-wide temp check (tests/tmp_guard.py) fails a session that leaves something in the temp directory,
names the entry and the test that left it, and passes one that cleans up (issue 50)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LEAKY = '''
import gc, os, tempfile

KEPT = tempfile.TemporaryDirectory("-made-at-import")  # as W&B makes its media folder: removed at exit
gc.freeze()  # as pilotrun's release_free_memory does before a run: gc.get_objects() no longer lists KEPT

def test_cleans_up():
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "x"), "w").close()

def test_leaks():
    fd, path = tempfile.mkstemp(prefix="leaky-")
    os.close(fd)
'''


def _session(tmp_path: Path, body: str, *options: str) -> subprocess.CompletedProcess:
    """The inner session on a machine of its own: its system temp directory is a new, empty folder (as a fresh
    CI machine's /tmp holds no pytest-of-$USER yet). ``options``: e.g. pytest-xdist's ``-n 2``."""
    (tmp_path / "test_inner.py").write_text(body)
    (tmp_path / "system-tmp").mkdir()
    env = dict(os.environ, PYTHONPATH=str(TESTS), COLUMNS="80", TMPDIR=str(tmp_path / "system-tmp"))
    env.pop("PILOTRUN_TEST_SHARED_TMP", None)
    env.pop("PYTEST_DEBUG_TEMPROOT", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tmp_guard", "-p", "no:cacheprovider",
                           *options, "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def test_a_session_that_leaves_a_file_in_the_temp_directory_fails_naming_it_and_its_test(tmp_path):
    r = _session(tmp_path, LEAKY)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 passed" in r.stdout  # the tests themselves passed: the session fails on what they left
    line = next(x for x in r.stdout.splitlines() if "leaky-" in x)
    assert "test_inner.py::test_leaks" in line and "$TMPDIR" in line
    assert "test_cleans_up" not in r.stdout.split("left these behind")[1] and "made-at-import" not in r.stdout


def test_a_session_that_cleans_up_passes(tmp_path):
    """... and leaves its machine's temp directory as it found it: pytest's own tmp_path folders included
    (pytest-of-$USER, which a first session on a fresh machine used to add)."""
    r = _session(tmp_path, LEAKY.split("def test_leaks")[0] + "\ndef test_uses_tmp_path(tmp_path):\n"
                 "    (tmp_path / 'f').write_text('x')\n")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "left these behind" not in r.stdout
    assert list((tmp_path / "system-tmp").iterdir()) == []


def test_under_two_xdist_workers_what_a_worker_left_fails_the_session_naming_it_and_its_test(tmp_path):
    """``make test`` runs pytest-xdist workers (two on two cores): the test that leaks runs in one of them, whose own
    folder the session's process never sees; the worker hands the entry over and the session fails on it."""
    pytest.importorskip("xdist")
    r = _session(tmp_path, LEAKY, "-n", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 passed" in r.stdout
    line = next(x for x in r.stdout.splitlines() if "leaky-" in x)
    assert "test_inner.py::test_leaks" in line and "$TMPDIR" in line
    assert list((tmp_path / "system-tmp").iterdir()) == []


def test_under_two_xdist_workers_a_clean_session_passes_and_leaves_nothing(tmp_path):
    pytest.importorskip("xdist")
    clean = (LEAKY.split("def test_leaks")[0]
             + "\ndef test_uses_tmp_path(tmp_path):\n    (tmp_path / 'f').write_text('x')\n")
    r = _session(tmp_path, clean, "-n", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2 passed" in r.stdout and "left these behind" not in r.stdout
    assert list((tmp_path / "system-tmp").iterdir()) == []
