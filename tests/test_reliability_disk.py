"""Atomic export and an honest full disk (issue 20): the artifact is written like a checkpoint (a temporary
folder renamed when complete), so a kill during export never leaves it under its final name; a full disk
at any write is exit 2 naming the path, the run ends "interrupted", and no temporary is left behind."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal import Journal


def _leftovers(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".tmp-" in p.name or ".extract-" in p.name)


def test_a_kill_during_export_leaves_no_artifact_under_its_name(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))
    home = tmp_path / "home"
    env = dict(os.environ, PILOTRUN_TEST_KILL_SAVE_AT="artifact")
    proc = subprocess.run([sys.executable, "-m", "pilotrun", "train", str(path), "--home", str(home)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == -9, (proc.returncode, proc.stderr[-2000:])
    (run,) = Journal(home).list_runs()  # opening the journal reaps the killed run
    assert run["status"] == "interrupted"
    run_dir = home / "runs" / run["run_id"]
    assert (run_dir / "checkpoints" / "final").is_dir()  # it got as far as the export
    assert not (run_dir / "artifact").exists(), "a half-written artifact under its final name"
    temps = [p for p in run_dir.iterdir() if p.name.startswith(".artifact.tmp-")]
    assert temps and (temps[0] / "model" / "config.json").exists()  # the export had begun in the temporary


def test_an_export_that_completes_leaves_only_the_artifact(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 0, r.err
    (run,) = Journal(tmp_path / "home").list_runs()
    run_dir = tmp_path / "home" / "runs" / run["run_id"]
    assert (run_dir / "artifact" / "model" / "model.safetensors").is_file()
    assert _leftovers(tmp_path / "home") == []


def _check_disk_full(r, home, path_words):
    assert r.code == 2, (r.code, r.err)
    assert "no space left on device while writing" in r.err and path_words in r.err, r.err
    assert "Traceback" not in r.err and "fix" in r.err
    (run,) = Journal(home).list_runs()
    assert run["status"] == "interrupted", run
    assert "no space left on device" in run["summary"]["reason"]
    assert _leftovers(home) == [], "a temporary was left behind"
    assert not (home / "runs" / run["run_id"] / "artifact").exists()


def test_injected_enospc_during_export(cli, tmp_path, monkeypatch):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))
    monkeypatch.setenv("PILOTRUN_TEST_ENOSPC_AT", "artifact")
    r = cli("train", path, "--home", tmp_path / "home")
    _check_disk_full(r, tmp_path / "home", "artifact")


@pytest.fixture
def small_fs(tmp_path):
    """A 1.5 MiB tmpfs: room for the journal and the run's small files, not for a checkpoint."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1536k", "tmpfs", str(mnt)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_a_full_disk_during_train(cli, tmp_path, small_fs):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100))
    home = small_fs / "home"
    r = cli("train", path, "--home", home)
    _check_disk_full(r, home, str(home / "runs"))
