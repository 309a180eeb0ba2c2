"""What `all`'s stages reuse in its process, and what the sheet reuses across processes (issue 34): the encoded
splits and a model's pristine weights keyed by the campaign's identity (config hash, files' path, size,
content hash), a changed file read again; the estimator's traces kept in the journal's home, a
changed config traced again."""

from __future__ import annotations

import json
import os

import pytest
from conftest import simple_records, stamp_journal, tiny_causal_campaign

from pilotrun.campaign.load import load_campaign
from pilotrun.campaign import reuse
from pilotrun.campaign.prepare import prepare


@pytest.fixture(autouse=True)
def _fresh():
    reuse.forget()
    yield
    reuse.forget()


def _counts():
    return dict(reuse.COUNTS)


def test_a_second_stage_gets_the_encoded_splits_without_encoding_again(tmp_path):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    loaded = load_campaign(path)
    before = _counts()
    with reuse.sharing():
        first = prepare(loaded, splits=("train", "validation"))
        second = prepare(load_campaign(path), splits=("train", "validation"))  # the same campaign, loaded again
    assert reuse.COUNTS["encoded_builds"] - before["encoded_builds"] == 2  # each split once
    assert reuse.COUNTS["encoded_hits"] - before["encoded_hits"] == 2
    assert second.task is first.task
    assert [e.input_ids for e in second.train] == [e.input_ids for e in first.train]
    second.examples["train"].reverse()  # a stage's own list: the cache's stays whole
    with reuse.sharing():
        third = prepare(loaded, splits=("train", "validation"))
    assert [e.input_ids for e in third.train] == [e.input_ids for e in first.train]
    with reuse.sharing():
        only = prepare(loaded, splits=("train",))  # a stage that needs fewer splits is served too
    assert list(only.examples) == ["train"] and reuse.COUNTS["encoded_hits"] - before["encoded_hits"] == 5


def test_outside_all_and_in_the_stages_that_time_themselves_nothing_is_served(tmp_path):
    """The pilot's prepare and load times are terms of the sheet's plan (a train run's, of the time check):
    inside ``unshared`` they read, encode and build for themselves."""
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    before = _counts()
    prepare(load_campaign(path), splits=("train",))
    prepare(load_campaign(path), splits=("train",))
    assert reuse.COUNTS["encoded_hits"] == before["encoded_hits"]
    with reuse.sharing():
        kept = prepare(load_campaign(path), splits=("train",))
        with reuse.unshared():
            own = prepare(load_campaign(path), splits=("train",))
    assert reuse.COUNTS["encoded_hits"] == before["encoded_hits"] and own.task is not kept.task
    assert not hasattr(own.task.build_model, "__wrapped__") and own.task.build_model.__func__  # the task's own


@pytest.mark.parametrize("change", ["same size and mtime, other bytes", "appended record"])
def test_a_file_changed_between_two_uses_is_read_again(tmp_path, change):
    """The planted staleness: the train file changes between two stages; the second sees the new records."""
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    train = tmp_path / "c" / "data" / "train.jsonl"
    before = _counts()
    with reuse.sharing():
        first = prepare(load_campaign(path), splits=("train",))
        text = train.read_text()
        st = os.stat(train)
        if change == "appended record":
            train.write_text(text + json.dumps(simple_records(1, start=90)[0]) + "\n")
        else:  # a same-length edit restored to the same mtime: only the content hash tells it apart
            lines = text.splitlines(keepends=True)
            lines[0], lines[1] = lines[1], lines[0]
            train.write_text("".join(lines))
            os.utime(train, ns=(st.st_atime_ns, st.st_mtime_ns))
        second = prepare(load_campaign(path), splits=("train",))
    assert reuse.COUNTS["encoded_builds"] - before["encoded_builds"] == 2
    assert reuse.COUNTS["encoded_hits"] == before["encoded_hits"]
    ids = lambda p: [e.input_ids for e in p.train]  # noqa: E731
    assert ids(second) != ids(first), change


def test_a_built_model_is_a_fresh_copy_of_the_pristine_weights_never_the_trained_one(tmp_path):
    import torch

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    before = _counts()
    with reuse.sharing():
        prep = prepare(load_campaign(path), splits=("train",))
        a = prep.task.build_model()
        after_a = torch.get_rng_state()
        pristine = {k: v.clone() for k, v in a.state_dict().items()}
        with torch.no_grad():  # a stage trains its model
            for p in a.parameters():
                p.add_(1.0)
        b = prepare(load_campaign(path), splits=("train",)).task.build_model()
        after_b = torch.get_rng_state()
    assert reuse.COUNTS["pristine_builds"] - before["pristine_builds"] == 1
    assert reuse.COUNTS["pristine_hits"] - before["pristine_hits"] == 1
    assert b is not a
    for k, v in b.state_dict().items():
        assert torch.equal(v, pristine[k]), k
    assert torch.equal(after_a, after_b)  # the generator continues as after a build: later draws are the same


def test_a_trace_is_read_back_from_the_home_and_a_changed_config_traces_again(tmp_path):
    """The estimator's trace of a campaign kept in the journal's home: read back the same (rows equal), counted
    as a hit; another config (the planted change: a micro-batch) or pilotrun's code digest is another key."""
    from pilotrun.probe.trace import rows_for, traced

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    loaded = load_campaign(path)
    prep = prepare(loaded, splits=("train", "validation"))
    home = tmp_path / "home"
    before = _counts()
    with reuse.keeping_traces(home):
        fresh = rows_for(traced(loaded, prep=prep, counted=False))
        again = rows_for(traced(loaded, prep=prep, counted=False))
    assert reuse.COUNTS["trace_builds"] - before["trace_builds"] == 1
    assert reuse.COUNTS["trace_hits"] - before["trace_hits"] == 1
    assert again == fresh
    assert len(list((home / "traces").glob("*.json.gz"))) == 1
    other = loaded.with_overrides({"train.micro_batch": loaded.campaign.train.micro_batch + 1})
    with reuse.keeping_traces(home):
        changed = rows_for(traced(other, prep=prepare(other, splits=("train", "validation")), counted=False))
    assert reuse.COUNTS["trace_builds"] - before["trace_builds"] == 2 and changed != fresh
    assert reuse.trace_key(loaded, {}) is None  # outside keeping_traces nothing is kept
    (home / "traces").joinpath("junk.json.gz").write_bytes(b"not gzip")
    with reuse.keeping_traces(home):  # a damaged file is traced again, never an error
        assert reuse.stored_trace("junk") is None


def test_the_wheel_is_keyed_by_the_source_identity(tmp_path):
    from pilotrun.sheet import ship

    root = tmp_path / "checkout"
    (root / "src" / "pilotrun").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "pilotrun"\n')
    (root / "src" / "pilotrun" / "a.py").write_text("x = 1\n")
    key = ship.source_identity(root)
    (root / "src" / "pilotrun" / "__pycache__").mkdir()
    (root / "src" / "pilotrun" / "__pycache__" / "a.pyc").write_bytes(b"cache")
    assert ship.source_identity(root) == key  # caches are no source
    (root / "src" / "pilotrun" / "a.py").write_text("x = 2\n")  # the planted change: same size, other bytes
    assert ship.source_identity(root) != key
    out = tmp_path / "out"
    out.mkdir()
    wheel = out / "pilotrun-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"PK wheel")
    (out / ship.WHEEL_KEY).write_text(json.dumps({"key": key, "wheel": wheel.name, "size": wheel.stat().st_size}))
    assert ship._kept_wheel(out, key) == wheel
    assert ship._kept_wheel(out, ship.source_identity(root)) is None  # the source changed: built again
    wheel.write_bytes(b"PK a truncated")
    assert ship._kept_wheel(out, key) is None  # not the file that was built


@pytest.mark.slow
def test_a_second_sheet_builds_no_wheel(tmp_path):
    from pilotrun.sheet.ship import build_wheel, source_root

    src = {"kind": "wheel", "root": str(source_root())}
    first = build_wheel(src, tmp_path / "w")
    st = first.stat()
    again = build_wheel(src, tmp_path / "w")
    assert again == first and again.stat().st_mtime_ns == st.st_mtime_ns


def test_weights_changed_in_the_model_folder_between_two_builds_are_read_again(tmp_path):
    """The planted staleness, a second instance: the folder's weights are saved anew (other values) between two
    stages' builds; the second build reads them, never the copy of the first."""
    import torch
    from architectures import campaign as arch_campaign, save_model
    from transformers import AutoModelForCausalLM

    model_dir = save_model(tmp_path / "m", "qwen2")
    path = arch_campaign(tmp_path / "c", model_dir, seq_cls=False)
    before = _counts()
    with reuse.sharing():
        first = prepare(load_campaign(path), splits=("train",)).task.build_model()
        saved = AutoModelForCausalLM.from_pretrained(model_dir)
        with torch.no_grad():
            for p in saved.parameters():
                p.mul_(0.5)
        saved.save_pretrained(model_dir, safe_serialization=True)
        second = prepare(load_campaign(path), splits=("train",)).task.build_model()
    assert reuse.COUNTS["pristine_builds"] - before["pristine_builds"] == 2
    assert reuse.COUNTS["pristine_hits"] == before["pristine_hits"]
    name, value = next(iter(second.state_dict().items()))
    assert torch.allclose(value, first.state_dict()[name] * 0.5), name


def _reseed():
    """The tensor counter counts what is alive at a process's first phase: seen again here, as a fresh ``all``'s
    first measured phase sees it (an earlier test of this process seeded it before the cache existed)."""
    import gc

    from pilotrun.engine.tensors import LIVE

    gc.collect()
    LIVE.seeded = False
    LIVE.seed()
    return LIVE.bytes


def _keep(path, what: str):
    """What an earlier stage of `all` leaves in the process (overfit: the encoded splits, then the pristine model)."""
    with reuse.sharing():
        prep = prepare(load_campaign(path), splits=("train", "validation"))
        if what == "pristine":
            prep.task.build_model()
    return prep


def test_a_stage_that_measures_memory_holds_nothing_all_kept(tmp_path):
    """Issue 43: `all`'s pilot counted the deep copy of the model `all` kept between stages (a baseline of one
    model). Each kept thing — the task with its encoded splits, the pristine model, its generator state — is no
    longer alive once a measured stage (the pilot, a train run: ``unshared``) starts, and a later stage that shares
    builds it again."""
    import gc
    import weakref

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    _keep(path, "pristine")
    (kept,), (pristine,) = reuse._ENCODED.values(), reuse._PRISTINE.values()
    refs = {"task": weakref.ref(kept["task"]), "model": weakref.ref(pristine[0]), "rng": weakref.ref(pristine[1])}
    del kept, pristine
    with reuse.sharing():
        with reuse.unshared():
            gc.collect()
            assert {k: r() is None for k, r in refs.items()} == {"task": True, "model": True, "rng": True}
            assert not reuse._ENCODED and not reuse._PRISTINE
        prepare(load_campaign(path), splits=("train",))
    assert reuse._ENCODED


def _tensor_columns(result) -> list[tuple]:
    return [(r["phase"], r["rank"], r["baseline"], r["peak_allocated"], r["end_allocated"])
            for r in result.data["rows"]]


def _inside_all_and_alone(tmp_path, inside_all, alone):
    """One stage run as `all` runs it (what overfit leaves kept and shared, home ``home``), then the same stage alone
    in a process that forgot it all (home ``home2``), each from the same seed."""
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    _keep(path, "pristine")
    with reuse.sharing():
        _reseed()
        inside = inside_all(load_campaign(path), tmp_path / "home")
    reuse.forget()
    _reseed()
    return inside, alone(load_campaign(path), tmp_path / "home2")


@pytest.mark.slow
def test_the_pilot_inside_all_measures_the_ledger_of_the_pilot_alone(tmp_path):
    """The same through the stage itself: with what overfit leaves kept, `all`'s pilot gives the tensor ledger of the
    same pilot alone, row for row (issue 43 saw a baseline of one model and a steady step ~30 % higher)."""
    from pilotrun.rehearsal.all import Budgets, _pilot
    from pilotrun.rehearsal.memory.pilot import pilot

    inside, alone = _inside_all_and_alone(tmp_path, lambda c, home: _pilot(c, home, Budgets()), pilot)
    assert inside.verdict == alone.verdict == "ok"
    assert _tensor_columns(inside) == _tensor_columns(alone)


@pytest.mark.slow
def test_the_train_stage_inside_all_observes_the_peaks_of_a_train_run_alone(tmp_path):
    """The second stage `all` measures: its train run's observed_* rows (each run's worst block per kind, set against
    the pilot) are those of the same run alone, with what overfit leaves kept in the process."""
    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.all import Budgets, _train
    from pilotrun.rehearsal.training.train import train_run

    def observed(home, run_id):
        return [(r["phase"], r["baseline"], r["peak_allocated"], r["end_allocated"])
                for r in Journal(home).phase_rows(run_id) if r["phase"].startswith("observed_")]

    inside, alone = _inside_all_and_alone(tmp_path, lambda c, home: _train(c, home, Budgets()),
                                          lambda c, home: train_run(c, home, progress=False))
    assert inside.verdict == alone.verdict == "ok"
    rows = observed(tmp_path / "home", inside.data["run_id"])
    assert rows and rows == observed(tmp_path / "home2", alone.data["run_id"])


def test_a_file_over_4_mib_replaced_at_the_same_size_and_mtime_is_another_identity(tmp_path):
    """Issue 44: above 4 MiB the key held path, size and mtime only: a file replaced by one of the same size and
    mtime (a restore, ``rsync -t``) served the old encoded data. The key holds the content's hash at any size
    (here the validation file, over 4 MiB; the issue's was the train file)."""
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    valid = tmp_path / "c" / "data" / "validation.jsonl"
    line = json.dumps({"instruction": "reverse " + "a" * 200, "output": "b" * 200}) + "\n"
    valid.write_text(line * (4 * 2**20 // len(line) + 200))
    assert valid.stat().st_size > 4 * 2**20
    key = reuse.identity(load_campaign(path))
    assert reuse.identity(load_campaign(path)) == key  # the clean case: unchanged, the same key
    st = valid.stat()
    valid.write_text(valid.read_text().replace("a" * 200, "c" * 200, 1))
    os.utime(valid, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert valid.stat().st_size == st.st_size and valid.stat().st_mtime_ns == st.st_mtime_ns
    assert reuse.identity(load_campaign(path)) != key


def test_a_kept_trace_edited_or_cut_is_a_miss_traced_again(tmp_path):
    """Issue 44: a trace file reduced to its key made the next sheet FAIL "no GPU fits". Any entry that is not
    whole — here a figure edited in its body — is a miss, traced again, and
    the figures are the fresh trace's."""
    import gzip

    from pilotrun.probe.trace import rows_for, traced

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    loaded = load_campaign(path)
    prep = prepare(loaded, splits=("train", "validation"))
    home = tmp_path / "home"
    with reuse.keeping_traces(home):
        fresh = rows_for(traced(loaded, prep=prep, counted=False))
    kept = next((home / "traces").glob("*.json.gz"))
    head, _, body = gzip.decompress(kept.read_bytes()).partition(b"\n")
    data = json.loads(body)
    data["params"] = data["params"] * 1000  # edited behind pilotrun's back: the header's hash no longer holds
    kept.write_bytes(gzip.compress(head + b"\n" + json.dumps(data).encode()))
    before = _counts()
    with reuse.keeping_traces(home):
        again = rows_for(traced(loaded, prep=prep, counted=False))
    assert reuse.COUNTS["trace_builds"] - before["trace_builds"] == 1 and again == fresh
    before = _counts()
    with reuse.keeping_traces(home):  # the clean case: the entry the retrace wrote is read back
        assert rows_for(traced(loaded, prep=prep, counted=False)) == fresh
    assert reuse.COUNTS["trace_hits"] - before["trace_hits"] == 1


def test_all_that_ends_on_a_stage_raising_keeps_nothing_in_its_process(tmp_path):
    """``all`` dropped what its stages shared only when every stage returned: a stage that raised (here a journal
    newer than this pilotrun, refused once the first stages had built the model) left the pristine copy and the
    encoded splits in the process, where the next pilot of a notebook or script counted that model as its own
    memory (a test session's pilot read 532,656 bytes over its estimate in every phase)."""
    import gc

    from pilotrun.errors import BadInput
    from pilotrun.journal.store import SCHEMA_VERSION, Journal
    from pilotrun.rehearsal.all import run_all

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    home = tmp_path / "home"
    Journal(home)
    stamp_journal(home / "journal.sqlite", SCHEMA_VERSION + 98)
    before = _counts()
    with pytest.raises(BadInput, match="newer than this pilotrun"):
        run_all(load_campaign(path), home)
    assert reuse.COUNTS["pristine_builds"] - before["pristine_builds"] == 1  # a model was built and kept ...
    assert not reuse._PRISTINE and not reuse._ENCODED  # ... and dropped when the stage raised
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o).__name__ == "LlamaForCausalLM"]
    assert not alive, f"{len(alive)} models still alive after all raised"
