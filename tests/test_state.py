"""The full training state round-trips: model, optimizer, scheduler, scaler, RNG, sampler, counters."""

import random

import numpy as np
import torch
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.engine.loop import make_state, run_update
from pilotrun.engine.state import COMPONENTS, is_complete, latest_checkpoint, load_state, save_state
from pilotrun.campaign.prepare import prepare


def _state(path, seed=0):
    prep = prepare(load_campaign(path))
    torch.manual_seed(seed)
    model = prep.task.build_model()
    return prep, make_state(model, prep.c.train, n_train=len(prep.train), seed=0, total_updates=10)


def _step(prep, state):
    mbs = [[prep.train[i] for i in mb] for mb in state.sampler.next_update()]
    return run_update(state, prep.task, mbs, max_grad_norm=1.0)


def test_every_component_round_trips(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(12), train__precision="fp16-mixed", train__schedule="cosine",
                                train__warmup=2)
    prep, a = _state(path)
    for _ in range(3):
        _step(prep, a)
    random.seed(7)
    np.random.seed(7)
    ckpt = save_state(a, tmp_path / "ckpt")
    assert is_complete(ckpt) and latest_checkpoint(tmp_path) == ckpt
    expected_rng = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    prep2, b = _state(path, seed=123)  # different weights until loaded
    restored = load_state(b, ckpt)
    assert set(restored) == set(COMPONENTS)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == expected_rng
    for (n, p), (_, q) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(p, q), n
    assert b.scheduler.state_dict() == a.scheduler.state_dict() and b.lr == a.lr
    assert b.scaler.state_dict() == a.scaler.state_dict()
    assert b.sampler.state_dict() == a.sampler.state_dict()
    assert b.counters() == a.counters() and b.update == 3
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    for k in sa["state"]:
        for name, t in sa["state"][k].items():
            assert torch.equal(t, sb["state"][k][name]), (k, name)
    # both continue identically
    torch.manual_seed(0)
    la = _step(prep, a)["loss"]
    torch.manual_seed(0)
    lb = _step(prep2, b)["loss"]
    assert la == lb


def test_partial_checkpoint_is_never_taken(tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    prep, s = _state(path)
    good = save_state(s, tmp_path / "ckpts" / "update-000001")
    partial = tmp_path / "ckpts" / "update-000002"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    hidden = tmp_path / "ckpts" / ".update-000003.tmp-1"
    hidden.mkdir()
    assert latest_checkpoint(tmp_path / "ckpts") == good
    data = bytearray((good / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF
    (good / "model.safetensors").write_bytes(bytes(data))
    assert latest_checkpoint(tmp_path / "ckpts") is None


def test_a_save_removes_what_killed_saves_on_this_host_left(tmp_path):
    """A killed save leaves a hidden temp folder; the next save beside it removes it when its writer is
    gone, and keeps a live writer's, another host's and any name it does not know."""
    import subprocess
    import sys

    from pilotrun.journal.files import temp_path

    path = tiny_causal_campaign(tmp_path, simple_records(8))
    _, s = _state(path)
    root = tmp_path / "ckpts"
    root.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mine = temp_path(root / "update-000002")
        stale = mine.with_name(mine.name.rsplit("-", 1)[0] + f"-{dead_pid}")
        running = mine.with_name(mine.name.rsplit("-", 1)[0] + f"-{live.pid}")
        elsewhere = root / f".update-000002.tmp-otherhost-{dead_pid}"
        old_style = root / ".update-000003.tmp-1"
        for p in (stale, running, elsewhere, old_style):
            p.mkdir()
            (p / "model.safetensors").write_bytes(b"half")
        save_state(s, root / "update-000004")
        assert not stale.exists()
        assert running.exists() and elsewhere.exists() and old_style.exists()
    finally:
        live.kill()
        live.wait()


def test_the_optimizer_state_is_saved_without_crc32_and_the_manifest_checks_it(tmp_path):
    """engine/optim.save_optimizer_state: optimizer.pt's zip records carry no CRC32 (most of torch.save's time on a
    1 GB state), torch's own setting is as it was after the save, and the manifest's sha256 does the check CRC32
    did: a byte flipped in the state's tensor data (planted) is refused before anything is loaded."""
    import zipfile

    import pytest
    from torch.serialization import get_crc32_options

    from pilotrun.errors import BadInput

    path = tiny_causal_campaign(tmp_path, simple_records(8))
    prep, s = _state(path)
    _step(prep, s)
    assert get_crc32_options()
    ckpt = save_state(s, tmp_path / "ckpt")
    assert get_crc32_options()  # a user's torch.save in this process keeps its CRC32
    records = zipfile.ZipFile(ckpt / "optimizer.pt").infolist()
    assert len(records) > 2 and all(r.CRC == 0 for r in records)
    prep2, b = _state(path, seed=1)
    load_state(b, ckpt)  # read back as it was written
    for k, st in s.optimizer.state_dict()["state"].items():
        assert all(torch.equal(v, b.optimizer.state_dict()["state"][k][n]) for n, v in st.items())
    data = bytearray((ckpt / "optimizer.pt").read_bytes())
    where = max(records, key=lambda r: r.file_size)
    data[where.header_offset + 200] ^= 0x01  # inside the largest tensor's bytes
    (ckpt / "optimizer.pt").write_bytes(bytes(data))
    with pytest.raises(BadInput, match="does not match its manifest"):
        load_state(b, ckpt)
