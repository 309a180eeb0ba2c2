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


def _ended_run(tmp_path, size: int):
    """A run folder as a finished run leaves it: the journal row ended, an incompressible weights file of ``size``."""
    from pilotrun.journal.files import write_manifest
    from pilotrun.journal.runs import create_run

    j = Journal(tmp_path / "home")
    run_id = create_run(j, kind="train", name="c", config={"name": "c"})
    (j.run_dir(run_id) / "artifact").mkdir(parents=True)
    (j.run_dir(run_id) / "artifact" / "model.safetensors").write_bytes(os.urandom(size))
    write_manifest(j.run_dir(run_id))
    j.finish_run(run_id, "completed")
    return run_id


def test_archive_out_on_a_full_disk_is_exit_2_and_leaves_nothing(cli, tmp_path, small_fs):
    """Issue 44, item 5: `archive --out` on a full disk was exit 3 ("No space left on device"): now exit 2 naming
    --out, the partial copy removed. The clean case: the same run archived where there is room."""
    run_id = _ended_run(tmp_path, 3 * 2**20)  # more than the 1.5 MiB tmpfs holds
    out = small_fs / "backup" / "run.tar.gz"
    r = cli("archive", run_id, "--home", tmp_path / "home", "--out", out)
    assert r.code == 2 and f"no space left on device while writing {out}" in r.err, (r.code, r.err)
    assert "Traceback" not in r.err and list(small_fs.rglob("*.tar.gz*")) == []
    assert cli("archive", run_id, "--home", tmp_path / "home", "--out", tmp_path / "run.tar.gz").code == 0


@pytest.mark.parametrize("home_of", [
    lambda t: t / "/".join(["d" * 200] * 3),  # the issue's: every name legal, the path past SQLite's 512 bytes
    lambda t: t / ("e" * 300),  # one name past the file system's 255 bytes
], ids=["past-sqlite-path-limit", "name-past-255-bytes"])
def test_a_home_past_the_path_limits_is_exit_2(cli, tmp_path, home_of):
    home = home_of(tmp_path)
    r = cli("note", "hello", "--home", home)
    assert r.code == 2 and "Traceback" not in r.err and "internal error" not in r.err, (r.code, r.err)
    assert ("SQLite opens paths of at most 512 bytes" in r.err or "longer than the file system allows" in r.err), r.err
    assert "fix: " in r.err
    assert cli("note", "hello", "--home", tmp_path / "h").code == 0  # the clean case


def test_restoring_over_a_link_or_a_name_past_255_bytes_is_refused_before_writing(tmp_path):
    """Issue 44, item 5: restoring over a dangling symlink (and a member name over the file-name limit) was a raw
    OSError midway; both are refused, exit 2 naming them, nothing written. A second instance: a link to a folder."""
    import io
    import tarfile

    from pilotrun.errors import BadInput
    from pilotrun.journal.archive import extract

    def tar_of(name):
        path = tmp_path / f"{len(name)}.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            info = tarfile.TarInfo(name)
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))
        return path

    target = tmp_path / "restore"
    target.mkdir()
    (target / "run1").symlink_to(tmp_path / "gone")  # the issue's: dangling
    (target / "run2").symlink_to(tmp_path)  # a link to a folder that exists
    for run in ("run1", "run2"):
        with pytest.raises(BadInput, match=f"{target / run} already exists: a symlink"):
            extract(tar_of(f"{run}/ok.txt"), target)
    with pytest.raises(BadInput, match="has a name of 300 bytes; file systems take at most 255"):
        extract(tar_of("run3/" + "n" * 300), target)
    assert sorted(p.name for p in target.iterdir()) == ["run1", "run2"]
    assert [p.name for p in extract(tar_of("run4/ok.txt"), target)] == ["ok.txt"]  # the clean case


@pytest.mark.parametrize("json_out", [False, True], ids=["text", "json"])
def test_a_relative_name_past_255_bytes_is_exit_2_in_text_and_in_the_envelope(cli, tmp_path, monkeypatch, json_out):
    """`split --out eee…` (300 bytes, no '/') was a traceback and exit 1: the refusal was said, then telling whether
    the path it named exists raised the same 'File name too long' again. It is exit 2 naming the path as the file."""
    import json

    from conftest import write_jsonl

    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "d.jsonl", simple_records(8))
    r = cli("split", data, "--out", "e" * 300, *(["--json"] if json_out else []))
    assert r.code == 2 and "Traceback" not in r.err and "longer than the file system allows" in r.err, (r.code, r.err)
    if json_out:
        error = json.loads(r.out)["error"]
        assert error["file"] == "e" * 300 and error["key"] is None, error
    assert cli("split", data, "--out", "e" * 20).code == 0  # the clean case
