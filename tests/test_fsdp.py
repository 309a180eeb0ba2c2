"""FSDP2 (fully_shard) on 2 CPU ranks over gloo: the pilot's per-rank rows, training with sharded
checkpoints and a full artifact, the resume check across fresh ranks, and the estimator's per-rank
prediction against the exact tensor counter."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.errors import BadInput

pytestmark = pytest.mark.distributed

# wide enough that a phase's tensors (tens of MiB) dwarf the counter's bookkeeping
WIDE = dict(TINY_LLAMA, hidden_size=384, intermediate_size=768, num_attention_heads=6, num_key_value_heads=6,
            vocab_size=2048)
TOLERANCE = 0.10


def _campaign(tmp_path, **overrides):
    overrides = {"train__strategy": "fsdp", "train__nproc": 2, **overrides}
    return tiny_causal_campaign(tmp_path / "c", simple_records(32), simple_records(8, 100), **overrides)


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"instruction": "reverse " + "w" * (5 + (i * 7) % 40), "output": "x" * (10 + (i * 5) % 50)}
            for i in range(start, start + n)]


def test_fsdp_pilot_rows_per_rank_match_the_estimate_within_ten_percent(tmp_path):
    """The exact counter on each rank against the estimator's per-rank FSDP row: the steps and the validation
    on every rank; load, save, export and reload on the rank that holds the most (rank 0 gathers the artifact)."""
    from pilotrun.rehearsal.memory.estimate import estimate
    from pilotrun.rehearsal.memory.pilot import pilot

    path = tiny_causal_campaign(tmp_path / "c", _records(40), _records(16, 100), model__config=WIDE,
                                data__max_length=128, train__micro_batch=4, train__accumulation=2,
                                train__eval_batch=8, train__strategy="fsdp", train__nproc=2)
    loaded = load_campaign(path)
    result = pilot(loaded, tmp_path / "home")
    assert result.verdict == "ok", result.messages
    rows = result.data["rows"]
    assert sorted((r["rank"], r["phase"]) for r in rows) == sorted(
        (rank, r["phase"]) for rank in (0, 1) for r in rows if r["rank"] == 0)
    assert len(rows) == 14 and all(r["counter"] == "tensors+rss" for r in rows)
    assert "14 rows (7 phases × 2 ranks)" in result.messages[0]

    predicted = {r["phase"]: r for r in estimate(loaded, device="cpu").data["phases"]}
    assert all(r["rank"] == "each" for r in predicted.values())
    off = []
    for name, want in predicted.items():
        measured = [r["peak_allocated"] for r in rows if r["phase"] == name]
        checked = measured if name in ("first_step", "steady_step", "eval_longest") else [max(measured)]
        off += [(name, got, want["peak_allocated"]) for got in checked
                if abs(got - want["peak_allocated"]) > TOLERANCE * want["peak_allocated"]]
    assert not off, off
    # the state really is divided: after the steps each rank holds half the parameters and optimizer state
    full = sum(p.numel() * 4 for p in _plain_model(loaded).parameters())
    steady = [r for r in rows if r["phase"] == "steady_step"]
    assert all(r["end_allocated"] == pytest.approx(1.5 * full, rel=0.01) for r in steady)  # (1 + 2 Adam) / 2


def _plain_model(loaded):
    from pilotrun.campaign.prepare import prepare

    return prepare(loaded, splits=("train",)).task.build_model()


def test_fsdp_trains_with_sharded_checkpoints_and_a_full_artifact(tmp_path):
    from safetensors.torch import load_file

    from pilotrun.engine.loop import make_state
    from pilotrun.engine.state import is_complete, load_state
    from pilotrun.journal.checkpoints import reference, resolve
    from pilotrun.rehearsal.training.train import train_run

    path = _campaign(tmp_path, train__save_every=2)
    loaded = load_campaign(path)
    result = train_run(loaded, tmp_path / "home", progress=False)
    assert result.verdict == "ok", result.messages
    run_dir = tmp_path / "home" / "runs" / result.data["run_id"]
    final = run_dir / "checkpoints" / "final"
    assert is_complete(final) and is_complete(run_dir / "checkpoints" / "update-000002")
    # update 4, the last, was saved: final stands for it (a reference), and the shards are that checkpoint's
    assert reference(final)["checkpoint"] == "update-000004"
    held = resolve(final)[0]
    assert held == run_dir / "checkpoints" / "update-000004"
    manifest = json.loads((held / "manifest.json").read_text())
    assert manifest["sharded"] == {"world": 2}
    assert {"model.rank0.safetensors", "model.rank1.safetensors", "optimizer.rank0.pt",
            "optimizer.rank1.pt"} <= set(manifest["files"])
    assert not (held / "model.safetensors").exists()

    # the artifact is the full model: it reloads, and its weights are the two ranks' shards put together
    from transformers import AutoModelForCausalLM

    art = AutoModelForCausalLM.from_pretrained(run_dir / "artifact" / "model")
    shards = [load_file(str(held / f"model.rank{r}.safetensors")) for r in (0, 1)]
    for name, p in art.state_dict().items():
        assert torch.equal(torch.cat([shards[0][name], shards[1][name]]), p), name

    # shards written by 2 ranks do not load into one unsharded process: exit 2 naming the fix, nothing loaded
    model = _plain_model(loaded)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = make_state(model, loaded.campaign.train, n_train=32, seed=0, total_updates=4)
    with pytest.raises(BadInput) as e:
        load_state(state, final)
    assert "FSDP shards written by 2 ranks" in str(e.value) and "train.nproc: 2" in e.value.fix
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    # one rank's shard changed on disk: the manifest's checksum refuses the whole checkpoint
    shard = held / "model.rank1.safetensors"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(BadInput) as e:
        load_state(state, final)
    assert "model.rank1.safetensors" in str(e.value) and "does not match its manifest" in str(e.value)


def test_fsdp_resume_check_passes_across_fresh_ranks(tmp_path):
    from pilotrun.rehearsal.mechanics.resume import resume

    result = resume(load_campaign(_campaign(tmp_path)), tmp_path / "home", at=2)
    assert result.verdict == "ok", result.messages
    assert "2 FSDP ranks, each loading its own shards" in result.messages[0]
    assert result.data["restored"] == ["model", "optimizer", "scheduler", "rng", "sampler", "counters"]
    ckpt = tmp_path / "home" / "runs" / result.data["run_id"] / "checkpoints" / "update-000002"
    assert json.loads((ckpt / "manifest.json").read_text())["sharded"] == {"world": 2}


@pytest.mark.slow
def test_fsdp_resume_without_the_optimizer_shards_fails(tmp_path, monkeypatch):
    from pilotrun.rehearsal.mechanics.resume import SKIP_ENV, resume

    monkeypatch.setenv(SKIP_ENV, "optimizer")
    result = resume(load_campaign(_campaign(tmp_path)), tmp_path / "home", at=2)
    assert result.verdict == "fail"
    assert "optimizer" not in result.data["restored"]
    assert "loss" in " ".join(result.messages)


def test_fsdp_with_one_rank_is_bad_input_naming_nproc(tmp_path, cli):
    path = _campaign(tmp_path, train__nproc=1)
    for verb in ("pilot", "train", "resume"):
        out = cli(verb, path, "--home", tmp_path / "home")
        assert out.code == 2, (verb, out.out, out.err)
        text = out.out + out.err
        assert "train.strategy=fsdp with train.nproc=1" in text and "train.nproc: 2 or more" in text, text
    assert not (tmp_path / "home" / "runs").exists() or not any((tmp_path / "home" / "runs").iterdir())
    # before reading anything: with the data gone too, the pilot and a run still name train.nproc (the pilot checked
    # after the data, so the torch import of its check fell outside the time plan's start-up group)
    gone = list((path.parent / "data").glob("*.jsonl"))
    assert gone
    for f in gone:
        f.unlink()
    for verb in ("pilot", "train"):
        out = cli(verb, path, "--home", tmp_path / "home")
        assert out.code == 2 and "train.nproc: 2 or more" in out.out + out.err, (verb, out.out, out.err)
