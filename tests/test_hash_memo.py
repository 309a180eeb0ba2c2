"""provenance.file_sha256's memory: a hash read in this process is given again for a record (``reuse``) only while
the file's identity stands (device, inode, size, mtime, ctime), never for a file changed since, and never instead
of a check (verify_manifest reads the bytes again)."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

import pilotrun.provenance as PV
from pilotrun.journal.files import verify_manifest, write_manifest


@pytest.fixture
def reads(monkeypatch):
    """How many files file_sha256 read (a sha256 object per read), the real hashlib underneath."""
    made = []

    class Counting:
        @staticmethod
        def sha256(*a):
            made.append(1)
            return hashlib.sha256(*a)

    monkeypatch.setattr(PV, "hashlib", Counting)
    monkeypatch.setattr(PV, "_DIGESTS", {})
    return made


def _settled(path, data: bytes):
    path.write_bytes(data)
    time.sleep(2 * PV.RACY_NS / 1e9)  # older than a timestamp tick: a later write shows in ctime


def test_a_record_reuses_the_hash_of_an_unchanged_file_and_a_check_reads_it_again(tmp_path, reads):
    f = tmp_path / "w.bin"
    _settled(f, b"a" * 4096)
    want = hashlib.sha256(b"a" * 4096).hexdigest()
    assert PV.file_sha256(f) == want and len(reads) == 1
    assert PV.file_sha256(f, reuse=True) == want and len(reads) == 1  # remembered: not read again
    assert PV.file_sha256(f) == want and len(reads) == 2  # without reuse: read


@pytest.mark.parametrize("change", ["same size in place", "replaced by rename", "mtime set back (rsync -t)"])
def test_a_changed_file_is_read_again_whatever_its_size_and_mtime_say(tmp_path, reads, change):
    f = tmp_path / "w.bin"
    _settled(f, b"a" * 4096)
    PV.file_sha256(f)
    st = f.stat()
    if change == "replaced by rename":
        (tmp_path / "new").write_bytes(b"b" * 4096)
        os.replace(tmp_path / "new", f)
    else:
        with open(f, "r+b") as h:
            h.write(b"b")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))  # size and mtime as before in every case
    assert f.stat().st_size == st.st_size and f.stat().st_mtime_ns == st.st_mtime_ns
    got = PV.file_sha256(f, reuse=True)
    assert got == hashlib.sha256(f.read_bytes()).hexdigest() != hashlib.sha256(b"a" * 4096).hexdigest()
    assert len(reads) == 2


def test_a_file_hashed_just_after_its_write_is_not_remembered(tmp_path, reads):
    """Within a timestamp tick of its last write, a second write could leave mtime and ctime as they were."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"a" * 4096)
    PV.file_sha256(f)
    if time.time_ns() - f.stat().st_ctime_ns > PV.RACY_NS:
        pytest.skip("the machine took longer than RACY_NS between the write and the hash")
    PV.file_sha256(f, reuse=True)
    assert len(reads) == 2


def test_a_big_file_hashed_just_after_its_write_waits_out_its_tick_and_is_remembered(tmp_path, reads):
    """A checkpoint's optimizer state, hashed by its manifest the moment it is written: read once its timestamp
    tick is over, so that the run's seal does not read it again; a write after that is still seen."""
    f = tmp_path / "optimizer.pt"
    data = os.urandom(PV.WAIT_BYTES)
    f.write_bytes(data)
    assert PV.file_sha256(f, reuse=True) == hashlib.sha256(data).hexdigest() and len(reads) == 1
    assert PV.file_sha256(f, reuse=True) == hashlib.sha256(data).hexdigest() and len(reads) == 1
    with open(f, "r+b") as h:
        h.write(b"x")
    assert PV.file_sha256(f, reuse=True) == hashlib.sha256(b"x" + data[1:]).hexdigest() and len(reads) == 2


def test_a_run_manifest_reads_only_what_the_checkpoint_manifest_did_not(tmp_path, reads):
    """A run's seal (write_manifest over the run folder) after a checkpoint's own manifest: the checkpoint's
    weights are read once (every manifest.json is left out of a manifest); the run's manifest says their true
    sha256, and a check reads every file again."""
    ckpt = tmp_path / "run" / "checkpoints" / "update-000002"
    ckpt.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.pt"):
        _settled(ckpt / name, os.urandom(1 << 16))
    write_manifest(ckpt)
    assert len(reads) == 2
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    listed = write_manifest(tmp_path / "run")["files"]
    assert len(reads) == 2 + 1 and sorted(listed) == ["checkpoints/update-000002/model.safetensors",
                                                       "checkpoints/update-000002/optimizer.pt", "metrics.jsonl"]
    for rel, info in listed.items():
        assert info["sha256"] == hashlib.sha256((tmp_path / "run" / rel).read_bytes()).hexdigest()
    assert verify_manifest(tmp_path / "run") == [] and len(reads) == 3 + len(listed)


def test_fake_builds_share_one_tokenizer_per_folder_as_it_stands(tmp_path):
    """The estimator's fake builds take the process's one tokenizer of the folder (the options table loaded it once
    per trace); a tokenizer file written since is loaded again; a task that tokenizes loads its own."""
    from conftest import simple_records, write_campaign, write_jsonl
    from preference_data import BPE_LLAMA, bpe_tokenizer

    from pilotrun.campaign.load import load_campaign
    from pilotrun.tasks import make_task

    tok = bpe_tokenizer(tmp_path / "tok")
    write_jsonl(tmp_path / "data" / "train.jsonl", simple_records(4))
    path = write_campaign(tmp_path, {"name": "t", "task": "causal-lm",
                                     "model": {"config": BPE_LLAMA, "tokenizer": str(tok)},
                                     "data": {"train": "data/train.jsonl", "max_length": 32},
                                     "train": {"micro_batch": 1, "updates": 1}})
    loaded = load_campaign(path)
    a, b = make_task(loaded, shared_tokenizer=True), make_task(loaded, shared_tokenizer=True)
    assert a is not b and a.tokenizer is b.tokenizer
    assert make_task(loaded).tokenizer is not a.tokenizer  # its own
    time.sleep(2 * PV.RACY_NS / 1e9)
    config = next(f for f in sorted(tok.iterdir()) if f.name == "tokenizer_config.json")
    config.write_text(config.read_text())  # the same bytes, written again: another file as it stands
    assert make_task(loaded, shared_tokenizer=True).tokenizer is not a.tokenizer


def test_big_files_hashed_at_once_give_each_its_own_hash_in_order(tmp_path):
    """files_sha256 hashes big files in threads, the largest first: each path still gets its own hash, in the
    order given; a file that cannot be read raises as it would alone."""
    sizes = [48 << 20, 1000, 40 << 20, 0]
    paths = []
    for i, n in enumerate(sizes):
        paths.append(tmp_path / f"f{i}")
        paths[-1].write_bytes(os.urandom(n))
    assert PV.files_sha256(paths) == [hashlib.sha256(p.read_bytes()).hexdigest() for p in paths]
    with pytest.raises(FileNotFoundError):
        PV.files_sha256(paths[:1] + [tmp_path / "gone"] + paths[2:])
