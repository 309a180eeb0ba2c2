"""The bad-input corpus, round two (issue 20): archives and weights. An archive bomb, a truncated archive,
a name that is both a file and a folder are refused with nothing written; a safetensors error while
loading a checkpoint, an artifact or stored predictions (a pickle renamed .safetensors, a truncated file)
is BadInput (exit 2) naming the file."""

from __future__ import annotations

import io
import pickle
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import simple_records, tiny_causal_campaign

from pilotrun.errors import BadInput
from pilotrun.journal.archive import extract
from pilotrun.journal.files import write_manifest


def _tar(path: Path, *members: tuple[str, bytes | None]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _nothing_written(target: Path) -> None:
    assert not target.exists() or list(target.iterdir()) == [], sorted(target.rglob("*"))


def _truncated(path: Path) -> Path:
    _tar(path, ("run/a.bin", bytes(range(256)) * 2000), ("run/b.txt", b"b" * 1000))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


ARCHIVE_CASES = [
    ("truncated-archive", lambda p: _truncated(p), "the archive is damaged or truncated"),
    ("empty-file", lambda p: (p.write_bytes(b""), p)[1], "archive"),
    ("not-an-archive", lambda p: (p.write_bytes(b"hello, not a tarball\n" * 30), p)[1], "cannot read the archive"),
    ("file-then-folder", lambda p: _tar(p, ("run/x", b"1"), ("run/x/y", b"2")), "'run/x' is both a file and a folder"),
    ("folder-then-file", lambda p: _tar(p, ("run/x", None), ("run/x", b"2")), "'run/x' is both a file and a folder"),
    ("file-twice", lambda p: _tar(p, ("run/x", b"1"), ("run/x", b"2")), "'run/x' appears twice"),
]


@pytest.mark.parametrize("case, make, words", ARCHIVE_CASES, ids=[c[0] for c in ARCHIVE_CASES])
def test_archive_case(tmp_path, case, make, words):
    archive = make(tmp_path / "a.tar.gz")
    with pytest.raises(BadInput) as e:
        extract(archive, tmp_path / "out")
    assert words in str(e.value) and e.value.fix, str(e.value)
    _nothing_written(tmp_path / "out")


def test_a_clean_archive_unpacks(tmp_path):
    archive = _tar(tmp_path / "a.tar.gz", ("run", None), ("run/x", b"1"), ("run/sub/y", b"2"))
    extract(archive, tmp_path / "out")
    assert (tmp_path / "out" / "run" / "sub" / "y").read_bytes() == b"2"


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_an_archive_bomb_is_refused_before_writing(tmp_path, small_fs):
    """64 MiB of zeros compress to ~64 KiB; the 1 MiB file system would fill up halfway through."""
    archive = _tar(tmp_path / "bomb.tar.gz", ("run/ok.txt", b"ok"), ("run/zeros.bin", bytes(64 << 20)))
    assert archive.stat().st_size < (1 << 20)
    with pytest.raises(BadInput) as e:
        extract(archive, small_fs / "out")
    assert "the archive unpacks to 67,108,866 bytes (largest member 'run/zeros.bin'" in str(e.value), str(e.value)
    assert "archive bomb" in e.value.fix
    _nothing_written(small_fs / "out")


# --- safetensors errors ---------------------------------------------------------------------------------
PICKLE = pickle.dumps({"weights": [1, 2, 3]})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from pilotrun.cli.main import run
    from pilotrun.journal import Journal

    tmp = tmp_path_factory.mktemp("weights")
    path = tiny_causal_campaign(tmp, simple_records(8), simple_records(4, 100), train__save_every=2)
    assert run(["train", str(path), "--home", str(tmp / "home")]) == 0
    (r,) = Journal(tmp / "home").list_runs()
    return path, tmp / "home" / "runs" / r["run_id"]


def _copy(src: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(src, dest)
    return dest


@pytest.mark.parametrize("damage", ["pickle", "truncated"])
def test_artifact_that_is_not_safetensors(trained, tmp_path, damage):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.campaign.prepare import prepare

    path, run_dir = trained
    art = _copy(run_dir / "artifact" / "model", tmp_path / "model")
    weights = art / "model.safetensors"
    weights.write_bytes(PICKLE if damage == "pickle" else weights.read_bytes()[:300])
    task = prepare(load_campaign(path), splits=("train",)).task
    with pytest.raises(BadInput) as e:
        task.load_artifact(art)
    assert "cannot read the artifact: not a valid safetensors file" in str(e.value)
    assert e.value.where == str(weights)


@pytest.mark.parametrize("component", ["model.safetensors", "rng.safetensors"])
def test_checkpoint_file_that_is_not_safetensors(trained, tmp_path, component):
    import torch

    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.loop import make_state
    from pilotrun.engine.state import latest_checkpoint, load_state
    from pilotrun.campaign.prepare import prepare

    path, run_dir = trained
    ckpt = _copy(latest_checkpoint(run_dir / "checkpoints"), tmp_path / "ckpt")
    (ckpt / component).write_bytes(PICKLE)
    write_manifest(ckpt, {"kind": "pilotrun-checkpoint"})  # hashes rewritten to match: the format must refuse it
    prep = prepare(load_campaign(path), splits=("train",))
    state = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=4)
    torch.manual_seed(0)
    with pytest.raises(BadInput) as e:
        load_state(state, ckpt)
    assert "not a valid safetensors file" in str(e.value) and e.value.where == str(ckpt / component)


def test_stored_control_predictions_that_are_not_safetensors(trained, tmp_path):
    from pilotrun.engine.control import CONTROL_FILE, load_control

    bad = tmp_path / CONTROL_FILE
    bad.write_bytes(PICKLE)
    with pytest.raises(BadInput) as e:
        load_control(bad)
    assert "cannot read the stored control predictions" in str(e.value) and e.value.where == str(bad)
