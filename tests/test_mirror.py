"""The home on the instance's disk, mirrored to a bucket mount (a folder here; and a real rclone VFS mount
where rclone and fuse3 are installed) and restored from it: the journal as a consistent SQLite snapshot, a
checkpoint copied in part never taken, and the SkyPilot file's own run script, run twice as a first and a
recovered job, continuing the sweep."""

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import simple_records, tiny_causal_campaign

from pilotrun.journal.files import write_manifest
from pilotrun.journal.mirror import mirror
from pilotrun.journal.store import Journal


RUN = dict(kind="train", name="m", config={}, config_sha256="0", campaign_path=None, seed=0, git_rev=None,
           packages={}, data={}, trust_remote_code=False)


def _journal_with_a_run(home: Path) -> tuple[Journal, str]:
    j = Journal(home)
    run_id = j.create_run(**RUN)
    j.finish_run(run_id, "completed", {"examples_seen": 8})
    return j, run_id


def test_the_journal_is_copied_as_a_snapshot_with_its_wal_not_as_a_file(tmp_path):
    """While a reader keeps the journal open, its last commits sit in the WAL: a plain copy of journal.sqlite
    lacks them (the planted defect); the mirror's snapshot holds them, and an open write is not in it."""
    local, bucket = tmp_path / "local", tmp_path / "bucket"
    j, first = _journal_with_a_run(local)
    reader = sqlite3.connect(local / "journal.sqlite")
    reader.execute("BEGIN")
    reader.execute("SELECT count(*) FROM runs").fetchone()  # holds a read snapshot: no checkpoint past it
    second = j.create_run(**RUN)
    j.finish_run(second, "completed", {})
    writer = sqlite3.connect(local / "journal.sqlite", isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("CREATE TABLE uncommitted (x)")  # a write in progress
    plain = tmp_path / "plain"
    plain.mkdir()
    shutil.copy(local / "journal.sqlite", plain / "journal.sqlite")
    ids = [r[0] for r in sqlite3.connect(plain / "journal.sqlite").execute("SELECT run_id FROM runs")]
    assert second not in ids  # the file alone, without its WAL, lost the last commit

    done = mirror(local, bucket)
    writer.execute("ROLLBACK")
    reader.execute("ROLLBACK")
    assert done["journal"] and not (bucket / "journal.sqlite-wal").exists()
    copied = Journal(bucket, create=False)
    assert [r["run_id"] for r in copied.list_runs()] == [first, second]
    with copied.connect() as db:  # the write in progress is not in the snapshot
        assert not db.execute("SELECT name FROM sqlite_master WHERE name='uncommitted'").fetchall()
    assert not [p for p in bucket.iterdir() if p.name.startswith(".")]  # no temp left behind


def test_a_checkpoint_cut_mid_copy_is_never_taken_and_restore_keeps_what_is_here(tmp_path, monkeypatch):
    """The manifest is copied after a folder's files, so a copy cut before it leaves an incomplete checkpoint,
    which latest_checkpoint skips (the previous one is taken); restore copies only what the local home lacks,
    never the journal over one."""
    from pilotrun.engine.state import latest_checkpoint
    from pilotrun.journal import mirror as M

    local, bucket, fresh = tmp_path / "local", tmp_path / "bucket", tmp_path / "fresh"
    j, run_id = _journal_with_a_run(local)
    ckpts = j.run_dir(run_id) / "checkpoints"

    def checkpoint(u):
        d = ckpts / f"update-{u:06d}"
        d.mkdir(parents=True)
        (d / "counters.json").write_text(f'{{"update": {u}}}')
        (d / "model.safetensors").write_bytes(bytes(64 * u))
        write_manifest(d, {"kind": "pilotrun-checkpoint"})

    checkpoint(2)
    mirror(local, bucket)
    checkpoint(4)
    order, real_copy = [], M._copy

    def cut_after_weights(src, dst):  # the instance vanishes once update-4's weights are in the bucket
        order.append(Path(src).relative_to(local).as_posix())
        real_copy(src, dst)
        if order[-1].endswith("update-000004/model.safetensors"):
            raise KeyboardInterrupt

    monkeypatch.setattr(M, "_copy", cut_after_weights)
    try:
        mirror(local, bucket)
    except KeyboardInterrupt:
        pass
    monkeypatch.setattr(M, "_copy", real_copy)
    assert order[-2:] == [f"runs/{run_id}/checkpoints/update-000004/counters.json",
                          f"runs/{run_id}/checkpoints/update-000004/model.safetensors"]
    assert (bucket / "runs" / run_id / "checkpoints" / "update-000004" / "model.safetensors").is_file()
    assert latest_checkpoint(bucket / "runs" / run_id / "checkpoints").name == "update-000002"
    done = mirror(local, bucket)  # the next copy completes it; the journal comes last
    assert done["files"] == [f"runs/{run_id}/checkpoints/update-000004/manifest.json"] and done["journal"]
    assert latest_checkpoint(bucket / "runs" / run_id / "checkpoints").name == "update-000004"

    Journal(fresh)  # a home that already has a journal: restore keeps it, and adds the files it lacks
    done = mirror(bucket, fresh, restore=True)
    assert not done["journal"] and Journal(fresh).list_runs() == []
    assert latest_checkpoint(fresh / "runs" / run_id / "checkpoints").name == "update-000004"
    (bucket / "runs" / run_id / "README.md").write_text("newer")
    (fresh / "runs" / run_id / "README.md").write_text("here")
    assert mirror(bucket, fresh, restore=True)["files"] == []  # restore never overwrites
    assert (fresh / "runs" / run_id / "README.md").read_text() == "here"
    assert not mirror(local, tmp_path / "node1", journal=False)["journal"]  # another node: its files only


def test_final_standing_for_a_checkpoint_is_copied_after_it(tmp_path, monkeypatch):
    """``final`` as a reference is copied after the checkpoint it names: a copy cut just before the last
    manifest leaves the bucket without ``final`` (the previous checkpoint is taken), never with a ``final``
    that names a checkpoint the bucket holds only in part."""
    from pilotrun.engine.state import latest_checkpoint
    from pilotrun.journal import mirror as M
    from pilotrun.journal.checkpoints import reference, write_reference

    local, bucket = tmp_path / "local", tmp_path / "bucket"
    j, run_id = _journal_with_a_run(local)
    ckpts = j.run_dir(run_id) / "checkpoints"
    for u in (2, 4):
        d = ckpts / f"update-{u:06d}"
        d.mkdir(parents=True)
        (d / "counters.json").write_text(f'{{"update": {u}}}')
        (d / "model.safetensors").write_bytes(bytes(64 * u))
        write_manifest(d, {"kind": "pilotrun-checkpoint"})
    write_reference(ckpts / "final", ckpts / "update-000004")  # "final" sorts before "update-…" in a walk
    mirror(local, bucket, journal=False)
    assert reference(bucket / "runs" / run_id / "checkpoints" / "final")["checkpoint"] == "update-000004"
    shutil.rmtree(bucket)

    order, real_copy = [], M._copy

    def cut_before_the_last_file(src, dst):
        order.append(Path(src).relative_to(local).as_posix())
        if len(order) == len(M._files(local)):
            raise KeyboardInterrupt
        real_copy(src, dst)

    monkeypatch.setattr(M, "_copy", cut_before_the_last_file)
    with pytest.raises(KeyboardInterrupt):
        mirror(local, bucket, journal=False)
    assert order[-1] == f"runs/{run_id}/checkpoints/final/manifest.json"
    assert not (bucket / "runs" / run_id / "checkpoints" / "final").exists()
    assert latest_checkpoint(bucket / "runs" / run_id / "checkpoints").name == "update-000004"


def test_the_skypilot_run_script_restores_the_home_and_continues_the_sweep(tmp_path):
    """The SkyPilot file's `run`, run by bash with the bucket mount a folder: the first job sweeps on the local
    home and leaves it in the bucket; a recovered job on a new instance (an empty home) restores it and
    continues the same sweep id, redoing no run."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.sheet.catalogue import BY_KEY
    from pilotrun.sheet.launch import SKY_HOME, launch_plan, write_launch

    camp = tmp_path / "camp"
    path = tiny_causal_campaign(camp, simple_records(8), simple_records(4, 50), train__updates=2,
                                train__eval_every=2)
    c = yaml.safe_load(path.read_text())
    c["plan"] = {"metric": "val_loss", "goal": "minimize", "control": {"train.lr": 1e-3},
                 "variants": [{"train.lr": 3e-4}], "seeds": [0]}
    path.write_text(yaml.safe_dump(c, sort_keys=False))
    loaded = load_campaign(path)
    s = {"campaign": "tiny", "hardware": {"gpus": 1, "rental_days": [3], "reserve": 0.2}, "settings": {"ranks": 1},
         "stack": {"piloted": {}}}
    launch = launch_plan(s, loaded, BY_KEY["h100-sxm"], None)
    launch["pilotrun"] = {"kind": "vcs", "requirement": "pilotrun", "why": "test"}  # no wheel: nothing installed
    files = write_launch(s, loaded, tmp_path / "out" / "sheet.md", launch)
    run = yaml.safe_load(files[1].read_text())["run"]
    assert subprocess.run(["bash", "-n"], input=run, text=True).returncode == 0
    lines = run.splitlines()
    sweep = next(i for i, x in enumerate(lines) if "pilotrun sweep" in x)
    restore = next(i for i, x in enumerate(lines) if "--restore" in x)
    final = max(i for i, x in enumerate(lines) if "_mirror-home" in x)
    assert restore < sweep < final and '--home "$PILOTRUN_LOCAL_HOME"' in lines[sweep]
    assert "/pilotrun-home" not in lines[sweep]  # SQLite never on the bucket mount

    bucket = tmp_path / "bucket"
    bucket.mkdir()
    script = run.replace(SKY_HOME, str(bucket))
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def job(instance: str):
        e = dict(env, HOME=str(tmp_path / instance))
        os.makedirs(e["HOME"])
        return subprocess.run(["bash", "-c", script], cwd=camp, env=e, capture_output=True, text=True, timeout=600)

    first = job("instance-1")
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-2000:]
    runs = Journal(bucket, create=False).list_runs(sweep_id=launch["sweep_id"])
    assert [(r["arm"], r["status"]) for r in runs] == [("control", "completed"), ("variant-1", "completed")]
    def tree(root):
        return sorted(p.relative_to(root).as_posix() for p in (root / "runs").rglob("*") if p.is_file())

    assert tree(bucket) == tree(tmp_path / "instance-1" / "pilotrun-local")  # every run file, checkpoints too
    assert any("/checkpoints/" in f for f in tree(bucket))
    before = Journal(bucket, create=False).list_runs()
    again = job("instance-2")  # recovered on a new instance: nothing on its disk
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    local = tmp_path / "instance-2" / "pilotrun-local"
    swept = Journal(local, create=False).list_runs(sweep_id=launch["sweep_id"])
    assert [(r["run_id"], r["status"]) for r in swept] == [(r["run_id"], r["status"]) for r in runs]  # none redone
    assert len(Journal(local, create=False).list_runs()) == len(before)  # no run created by the second job
    assert [r["run_id"] for r in Journal(bucket, create=False).list_runs()] == \
        [r["run_id"] for r in Journal(local, create=False).list_runs()]  # the end's copy reached the bucket


@pytest.mark.slow
def test_on_an_rclone_vfs_mount_only_the_mirrors_snapshot_reaches_the_bucket(tmp_path):
    """SkyPilot's MOUNT_CACHED is rclone's VFS cache over the bucket; here over a local folder (the "bucket").
    The planted defect: the journal written on the mount while a connection stays open (as a sweep's lease
    thread keeps one) — its commits sit in the WAL, which rclone does not upload while the file is open, so
    a new instance restoring the bucket finds none of the runs. The mirror's snapshot, written onto the mount,
    reaches the bucket whole: all of them."""
    import time

    rclone = shutil.which("rclone")
    if rclone is None or not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
        pytest.skip("needs rclone, fuse3 and /dev/fuse (Debian: apt-get install rclone fuse3)")
    bucket, mnt, cache = tmp_path / "bucket", tmp_path / "mnt", tmp_path / "cache"
    for d in (bucket, mnt, cache):
        d.mkdir()
    started = subprocess.run([rclone, "mount", str(bucket), str(mnt), "--vfs-cache-mode", "full", "--cache-dir",
                              str(cache), "--vfs-write-back", "1s", "--daemon"], capture_output=True, text=True,
                             timeout=60)
    deadline = time.monotonic() + 15
    while started.returncode == 0 and not os.path.ismount(mnt) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not os.path.ismount(mnt):
        pytest.skip(f"rclone could not mount here (FUSE not permitted?): {started.stderr[-300:]}")

    def restored(name: str, want: int) -> int:
        """How many runs a new instance finds in the bucket's copy (polled past rclone's write-back)."""
        deadline, found = time.monotonic() + 30, -1
        while time.monotonic() < deadline:
            time.sleep(1)
            copy = tmp_path / f"restored-{name}"
            shutil.rmtree(copy, ignore_errors=True)
            if (bucket / name / "journal.sqlite").is_file():
                shutil.copytree(bucket / name, copy)
                try:
                    found = sqlite3.connect(copy / "journal.sqlite").execute("SELECT count(*) FROM runs").fetchone()[0]
                except sqlite3.DatabaseError:
                    found = -1
                if found == want:
                    break
        return found

    try:
        on_mount = Journal(mnt / "on-mount")
        hold = sqlite3.connect(mnt / "on-mount" / "journal.sqlite")
        hold.execute("SELECT count(*) FROM runs").fetchone()
        for _ in range(3):
            on_mount.finish_run(on_mount.create_run(**RUN), "completed", {})
        assert restored("on-mount", 3) in (0, -1)  # the WAL never left the instance while the journal was open
        local = Journal(tmp_path / "local")
        for _ in range(3):
            local.finish_run(local.create_run(**RUN), "completed", {})
        mirror(tmp_path / "local", mnt / "mirrored")
        assert restored("mirrored", 3) == 3
        hold.close()
    finally:
        subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, timeout=60)
