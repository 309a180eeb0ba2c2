"""checkpoints/final stands for the last numbered checkpoint (a reference: its manifest alone) when the loop's last
act saved it, instead of a byte-identical second copy; every reader resolves it (journal/checkpoints.resolve), a
missing, swapped or damaged target is caught with its verdict and message, retention never removes it, the
archive carries it, and an old journal whose final is a full copy still loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import simple_records, tiny_causal_campaign

from pilotrun.engine.state import (is_complete, kept_checkpoints, latest_checkpoint, load_state, problems,
                                   retain_checkpoints)
from pilotrun.errors import BadInput
from pilotrun.journal.checkpoints import REF_KIND, reference, resolve
from pilotrun.journal.files import verify_manifest, write_manifest
from pilotrun.journal.store import Journal


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One tiny run (4 updates, saved at 2 and 4), trained once; each test works on its own copy."""
    from pilotrun.cli.main import run

    root = tmp_path_factory.mktemp("final-ref")
    path = tiny_causal_campaign(root / "c", simple_records(8), simple_records(4, 100), train__updates=4,
                                train__save_every=2, train__eval_every=2)
    assert run(["train", str(path), "--home", str(root / "home")]) == 0
    (row,) = Journal(root / "home").list_runs()
    return root, path, row["run_id"]


@pytest.fixture
def home(trained, tmp_path):
    root, path, run_id = trained
    shutil.copytree(root / "home", tmp_path / "home")
    return tmp_path / "home", path, run_id


def _state(path):
    from pilotrun.campaign import load_campaign
    from pilotrun.engine.loop import make_state
    from pilotrun.campaign.prepare import prepare

    prep = prepare(load_campaign(path))
    torch.manual_seed(123)  # other weights than any checkpoint's until one is loaded
    return make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=4)


def test_final_is_a_reference_and_the_run_folder_drops_one_checkpoint(home):
    from safetensors.torch import load_file

    home, path, run_id = home
    ckpts = home / "runs" / run_id / "checkpoints"
    final, last = ckpts / "final", ckpts / "update-000004"
    ref = reference(final)
    assert ref["kind"] == REF_KIND and ref["checkpoint"] == "update-000004" and ref["update"] == 4
    assert [p.name for p in final.iterdir()] == ["manifest.json"] and ref["files"] == {}
    assert resolve(final) == (last, []) and is_complete(final)
    # the disk: the numbered checkpoints and a reference of a few hundred bytes, not a third checkpoint
    one = _bytes(last)
    assert _bytes(ckpts) == _bytes(ckpts / "update-000002") + one + _bytes(final) and _bytes(final) < 1024
    assert one > 100 * _bytes(final)
    # final is the state the run ended in: its weights are the exported artifact's, tensor for tensor
    art = load_file(str(home / "runs" / run_id / "artifact" / "model" / "model.safetensors"))
    held = load_file(str(latest_checkpoint(ckpts) / "model.safetensors"))
    assert latest_checkpoint(ckpts) == last and held.keys() == art.keys()
    assert all(torch.equal(held[k], art[k]) for k in art)
    # loading final restores every component of update-000004, the same as loading that checkpoint
    a, b = _state(path), _state(path)
    assert load_state(a, final) == load_state(b, last)
    assert a.counters() == b.counters() and a.update == 4 and a.sampler.state_dict() == b.sampler.state_dict()
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    # the run's summary counts the saves the run made: two, final was no save
    run = Journal(home).get_run(run_id)
    assert run["summary"]["counts"]["checkpoints"] == 2


def test_a_last_update_no_save_falls_on_gets_a_final_of_its_own(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), train__updates=4, train__save_every=3)
    r = cli("train", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    run_id = r.json["data"]["run_id"]
    ckpts = tmp_path / "home" / "runs" / run_id / "checkpoints"
    assert reference(ckpts / "final") is None and (ckpts / "final" / "model.safetensors").is_file()
    assert latest_checkpoint(ckpts) == ckpts / "final" and is_complete(ckpts / "final")
    assert json.loads((ckpts / "final" / "counters.json").read_text())["update"] == 4
    assert Journal(tmp_path / "home").get_run(run_id)["summary"]["counts"]["checkpoints"] == 2


def test_a_missing_target_is_caught_by_every_reader(cli, home, tmp_path):
    home, path, run_id = home
    run_dir = home / "runs" / run_id
    final, last = run_dir / "checkpoints" / "final", run_dir / "checkpoints" / "update-000004"
    shutil.rmtree(last)
    (found,) = problems(final)
    assert found == (f"{final}/manifest.json: stands for checkpoint update-000004, which is missing ({last}); "
                     "restore the run folder from an archive of the run (`pilotrun archive` carries the checkpoint "
                     "final names)")
    st = _state(path)
    before = {k: v.clone() for k, v in st.model.state_dict().items()}
    with pytest.raises(BadInput) as e:
        load_state(st, final)
    assert "stands for checkpoint update-000004, which is missing" in str(e.value) and e.value.where == str(final)
    assert "nothing was loaded" in str(e.value)
    assert all(torch.equal(before[k], v) for k, v in st.model.state_dict().items())
    # the newest checkpoint left is taken, never the dangling final
    assert latest_checkpoint(run_dir / "checkpoints") == run_dir / "checkpoints" / "update-000002"
    r = cli("verify", run_id, "--home", home)
    assert r.code == 1
    assert "stands for checkpoint update-000004, which is missing" in r.out + r.err
    r = cli("archive", run_id, "--home", home, "--out", tmp_path / "a.tar.gz")
    assert r.code == 2 and not (tmp_path / "a.tar.gz").exists()
    assert "stands for checkpoint update-000004, which is missing" in r.err
    assert "the archive would not hold the state final stands for" in r.err


def test_a_swapped_or_damaged_target_is_caught(home):
    home, path, run_id = home
    ckpts = home / "runs" / run_id / "checkpoints"
    final, last = ckpts / "final", ckpts / "update-000004"
    # swapped: update-000004 replaced by another complete checkpoint (update 2's, renamed)
    shutil.move(last, ckpts / "aside")
    shutil.copytree(ckpts / "update-000002", last)
    assert is_complete(last)  # complete on its own: only the recorded manifest checksum tells
    (found,) = problems(final)
    assert found.startswith(f"{final}/manifest.json: stands for checkpoint update-000004, but "
                            "update-000004/manifest.json differs from the one recorded when final was written "
                            "(the checkpoint was swapped or rewritten)")
    with pytest.raises(BadInput, match="swapped or rewritten"):
        load_state(_state(path), final)
    # damaged: one file of the right checkpoint changed on disk
    shutil.rmtree(last)
    shutil.move(ckpts / "aside", last)
    assert problems(final) == []
    opt = last / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    opt.write_bytes(bytes(data))
    assert problems(final) == ["update-000004/optimizer.pt: sha256 differs from manifest.json"]
    with pytest.raises(BadInput, match="update-000004/optimizer.pt: sha256 differs"):
        load_state(_state(path), final)
    # a hand-edited reference naming something outside the checkpoints folder is refused, nothing is followed
    m = json.loads((final / "manifest.json").read_text())
    (final / "manifest.json").write_text(json.dumps(dict(m, checkpoint="../../artifact")))
    assert problems(final) == [f"{final}/manifest.json: names '../../artifact', not a numbered checkpoint "
                               "(update-NNNNNN) beside it"]


def test_verify_hashes_the_checkpoint_final_stands_for_once_and_still_refuses_it_damaged(home, monkeypatch):
    """Issue 50: verify's check before loading (preflight) hashed the files of the checkpoint final stands for twice,
    as files of the run and again through the reference, whose findings about them it then dropped. Once now; a damaged or swapped target is still refused."""
    from collections import Counter

    import pilotrun.journal.checkpoints as checkpoints
    import pilotrun.provenance as provenance
    from pilotrun.rehearsal.mechanics.verify import preflight

    home, path, run_id = home
    run_dir = home / "runs" / run_id
    ckpts, real, hashed = run_dir / "checkpoints", provenance.file_sha256, Counter()

    def counting(p, *a, **k):  # the real sha256, each path counted
        hashed[Path(p).relative_to(run_dir).as_posix()] += 1
        return real(p, *a, **k)

    monkeypatch.setattr(provenance, "file_sha256", counting)  # journal.files hashes through it
    monkeypatch.setattr(checkpoints, "file_sha256", counting)
    assert preflight(run_dir) == []
    listed = set(json.loads((run_dir / "manifest.json").read_text())["files"])
    assert "checkpoints/update-000004/optimizer.pt" in listed  # with the reference's own check of the target:
    assert set(hashed) == listed | {"checkpoints/update-000004/manifest.json"}  # the checksum it recorded
    assert set(hashed.values()) == {1}
    opt = ckpts / "update-000004" / "optimizer.pt"
    data = bytearray(opt.read_bytes())
    data[len(data) // 2] ^= 0xFF
    opt.write_bytes(bytes(data))
    assert preflight(run_dir) == ["checkpoints/update-000004/optimizer.pt: sha256 differs from manifest.json — "
                                  "refused, nothing was loaded"]
    shutil.rmtree(ckpts / "update-000004")  # swapped: another complete checkpoint under its name
    shutil.copytree(ckpts / "update-000002", ckpts / "update-000004")
    assert (f"{ckpts / 'final'}/manifest.json: stands for checkpoint update-000004, but update-000004/manifest.json "
            "differs from the one recorded when final was written (the checkpoint was swapped or rewritten); restore "
            "the run folder from an archive of the run (`pilotrun archive` carries the checkpoint final names) — "
            "refused, nothing was loaded") in preflight(run_dir)


def test_retention_never_removes_the_checkpoint_final_stands_for(home):
    from pilotrun.journal.checkpoints import write_reference

    home, path, run_id = home
    ckpts = home / "runs" / run_id / "checkpoints"
    for n in (6, 8):  # two later numbered checkpoints, complete (copies with their own counters)
        shutil.copytree(ckpts / "update-000004", ckpts / f"update-{n:06d}")
    write_reference(ckpts / "final", ckpts / "update-000002")  # final stands for an older one
    assert [p.name for p in kept_checkpoints(ckpts, 1)] == ["update-000002", "update-000008"]
    removed = retain_checkpoints(ckpts, 1)
    assert [p.name for p in removed] == ["update-000004", "update-000006"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["final", "update-000002", "update-000008"]
    assert resolve(ckpts / "final") == (ckpts / "update-000002", [])


def test_the_archive_carries_the_checkpoint_final_stands_for(cli, home, tmp_path):
    from pilotrun.journal.archive import extract

    home, path, run_id = home
    r = cli("archive", run_id, "--home", home, "--out", tmp_path / "a.tar.gz")
    assert r.code == 0, r.err
    extract(tmp_path / "a.tar.gz", tmp_path / "restored")
    restored = tmp_path / "restored" / run_id / "checkpoints"
    assert verify_manifest(tmp_path / "restored" / run_id) == []
    assert resolve(restored / "final") == (restored / "update-000004", [])
    a, b = _state(path), _state(path)
    load_state(a, restored / "final")
    load_state(b, home / "runs" / run_id / "checkpoints" / "final")
    assert a.counters() == b.counters()
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))


def test_an_old_journal_whose_final_is_a_full_copy_still_loads(cli, home, tmp_path):
    """The layout before references: final a byte-identical copy of the last checkpoint, the run's manifest
    listing its files. It resolves to itself, wins the tie with update-000004, loads, verifies and archives."""
    home, path, run_id = home
    run_dir = home / "runs" / run_id
    ckpts = run_dir / "checkpoints"
    shutil.rmtree(ckpts / "final")
    shutil.copytree(ckpts / "update-000004", ckpts / "final")
    m = json.loads((run_dir / "manifest.json").read_text())
    write_manifest(run_dir, {k: v for k, v in m.items() if k != "files"})  # as the old run wrote it
    assert reference(ckpts / "final") is None and resolve(ckpts / "final") == (ckpts / "final", [])
    assert latest_checkpoint(ckpts) == ckpts / "final"
    a, b = _state(path), _state(path)
    assert load_state(a, ckpts / "final") == load_state(b, ckpts / "update-000004")
    assert a.counters() == b.counters()
    assert all(torch.equal(p, q) for p, q in zip(a.model.state_dict().values(), b.model.state_dict().values()))
    assert retain_checkpoints(ckpts, 1) == [ckpts / "update-000002"] and (ckpts / "final").is_dir()
    # a damaged old copy is still caught as before
    (ckpts / "final" / "sampler.json").write_text("{}")
    assert problems(ckpts / "final") == ["sampler.json: sha256 differs from manifest.json"]
    assert latest_checkpoint(ckpts) == ckpts / "update-000004"
    shutil.copy(ckpts / "update-000004" / "sampler.json", ckpts / "final" / "sampler.json")
    r = cli("archive", run_id, "--home", home, "--out", tmp_path / "old.tar.gz")
    assert r.code == 0, r.err


@pytest.mark.slow  # a fresh process reloads the artifact (verify's own tests keep it in the default selection)
def test_verify_passes_on_a_run_whose_final_is_a_reference(cli, home):
    home, path, run_id = home
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 0, r.err
    assert r.json["verdict"] == "ok"
