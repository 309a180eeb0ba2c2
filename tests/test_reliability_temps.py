"""Every writer of a temporary removes its own kind's dead ones when it starts: a killed archive's hidden partial
copy beside the target, a killed stage's progress file and a killed train's rank folder in TMPDIR. Only dead
ones: a live owner's (its PID exists) and another host's stay."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import pytest

from pilotrun.journal.files import temp_path
from pilotrun.journal.store import Journal
from pilotrun.scratch import host_tag, make_dir


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def live_pid():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p.pid
    p.kill()
    p.wait()


@pytest.fixture
def tmpdir_env(tmp_path, monkeypatch):
    scratch = tmp_path / "TMPDIR"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    return scratch


def _plant(folder, names):
    for n in names:
        (folder / n).write_text("left behind")
    return [folder / n for n in names]


def test_archive_removes_a_killed_archives_temporary(cli, tmp_path, live_pid):
    home = tmp_path / "home"
    j = Journal(home)
    run_id = j.create_run(kind="train", name="x", config={}, config_sha256="0", campaign_path=None, seed=0,
                          git_rev=None, packages={}, data={}, trust_remote_code=False)
    j.finish_run(run_id, "completed")
    (j.run_dir(run_id)).mkdir(parents=True)
    (j.run_dir(run_id) / "config.yaml").write_text("name: x\n")
    out = tmp_path / "out" / "a.tar.gz"
    out.parent.mkdir()
    dead = temp_path(out).with_name(f".a.tar.gz.tmp-{host_tag()}-{_dead_pid()}")
    live = temp_path(out).with_name(f".a.tar.gz.tmp-{host_tag()}-{live_pid}")
    other = temp_path(out).with_name(".a.tar.gz.tmp-another_host-12345")
    _plant(out.parent, [dead.name, live.name, other.name])
    r = cli("archive", run_id, "--out", out, "--home", home)
    assert r.code == 0, r.err
    assert out.is_file()
    assert not dead.exists() and live.exists() and other.exists()


def test_a_stage_removes_dead_progress_files(tmpdir_env, live_pid):
    import io

    from pilotrun.console.progress import FILE_ENV, stage_progress

    dead_pid = _dead_pid()
    dead = _plant(tmpdir_env, [f"pilotrun-progress-{host_tag()}-{dead_pid}-ab12cd34",
                               f"pilotrun-progress-{host_tag()}-{dead_pid}-ab12cd34.4242.tmp"])
    kept = _plant(tmpdir_env, [f"pilotrun-progress-{host_tag()}-{live_pid}-ab12cd34",
                               f"pilotrun-progress-elsewhere-{dead_pid}-ab12cd34", "pilotrun-progress-odd"])
    with stage_progress("train", stream=io.StringIO()):
        mine = os.environ[FILE_ENV]
        assert os.path.basename(mine).startswith(f"pilotrun-progress-{host_tag()}-{os.getpid()}-")
    assert not any(p.exists() for p in dead)
    assert all(p.exists() for p in kept)


def test_a_new_rank_folder_removes_the_dead_ones(tmpdir_env, live_pid):
    dead = tmpdir_env / f"pilotrun-ranks-{host_tag()}-{_dead_pid()}-0011aabb"
    live = tmpdir_env / f"pilotrun-ranks-{host_tag()}-{live_pid}-0011aabb"
    for d in (dead, live):
        d.mkdir()
        (d / "rank0.json").write_text("{}")
    fresh = make_dir("pilotrun-ranks-")
    assert fresh.is_dir() and fresh.name.startswith(f"pilotrun-ranks-{host_tag()}-{os.getpid()}-")
    assert not dead.exists() and live.exists()
