"""data.packing (issue 43 item 3): several examples in one row, each trained as if alone.

The must-hold property: a packed row's loss (a sum over its targets) equals the sum of its examples' losses
computed one by one, on a real tiny Llama from a config, under sdpa and eager attention. It fails when the
positions do not restart per example or when attention crosses examples (both planted)."""

from __future__ import annotations

import pytest

from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign


def _prepared(tmp_path, records, **overrides):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.campaign.prepare import prepare

    path = tiny_causal_campaign(tmp_path, records, **overrides)
    return prepare(load_campaign(path), splits=("train",))


def _model(attn: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})
    cfg._attn_implementation = attn
    return LlamaForCausalLM(cfg).eval()


def _records():
    """Examples of unlike lengths (prompt and completion), several to a 64-token row."""
    return [{"instruction": f"reverse {'w' * (i % 5)}ord{i}", "output": f"{i}dro{'w' * (i % 3)}"} for i in range(9)]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_a_packed_rows_loss_is_the_sum_of_its_examples_losses(tmp_path, attn):
    import torch

    alone = _prepared(tmp_path / "alone", _records())
    packed = _prepared(tmp_path / "packed", _records(), data__packing=True)
    rows = packed.train
    assert len(rows) < len(alone.train) and all(len(r.meta["segments"]) >= 2 for r in rows[:-1])
    assert sum(len(r.meta["segments"]) for r in rows) == len(alone.train)
    assert all(r.length <= 64 for r in rows)
    model = _model(attn)
    task = packed.task
    with torch.no_grad():
        for batch_rows in (rows[:1], rows[:2]):  # one row; two rows of other lengths (padding after the shorter)
            batch = task.collate(batch_rows)
            row_loss = float(task.loss(model, batch)[0])
            n = sum(len(r.meta["segments"]) for r in batch_rows)
            one_by_one = sum(float(task.loss(model, task.collate([e]))[0]) for e in alone.train[:n])
            assert row_loss == pytest.approx(one_by_one, rel=1e-5), (row_loss, one_by_one)
            assert task.count_targets(batch) == sum(e.n_targets for e in alone.train[:n])
        # planted: positions that do not restart, and attention across examples (the padding mask instead)
        batch = task.collate(rows[:1])
        plain = float(task.loss(model, {**batch, "position_ids": torch.arange(batch["input_ids"].size(1))[None]})[0])
        crossing = float(task.loss(model, {k: v for k, v in batch.items() if k != "position_ids"})[0])
        n = len(rows[0].meta["segments"])
        want = sum(float(task.loss(model, task.collate([e]))[0]) for e in alone.train[:n])
        # the property's own tolerance tells them apart (a random tiny model: differences of ~3e-4, 30x it)
        assert plain != pytest.approx(want, rel=1e-5) and crossing != pytest.approx(want, rel=1e-5), (plain, crossing)


def test_packed_rows_on_chat_records_restart_and_mask_each_conversation(tmp_path):
    """The second instance: chat records (data.messages, plain role lines) packed; each conversation's first
    label is IGNORE, its positions restart, and the row's targets are the conversations' targets."""
    from pilotrun.tasks.base import IGNORE

    chats = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"yo {i}"}]}
             for i in range(6)]
    alone = _prepared(tmp_path / "a", chats, data__prompt=None, data__response=None, data__messages="messages")
    packed = _prepared(tmp_path / "p", chats, data__prompt=None, data__response=None, data__messages="messages",
                       data__packing=True)
    row = packed.train[0]
    starts = [sum(row.meta["segments"][:k]) for k in range(len(row.meta["segments"]))]
    assert all(row.labels[s] == IGNORE for s in starts)
    batch = packed.task.collate([row])
    pos = batch["position_ids"][0].tolist()
    assert [pos[s] for s in starts] == [0] * len(starts) and pos[starts[1] - 1] == row.meta["segments"][0] - 1
    assert [r.rsplit("/", 1)[1] for r in row.meta["rids"]] == ["train.jsonl:%d" % (k + 1) for k in range(len(starts))]
    assert row.n_targets == sum(e.n_targets for e in alone.train[:len(starts)])


def test_packing_is_refused_for_a_task_without_rows_of_tokens(tmp_path, cli):
    path = tiny_causal_campaign(tmp_path, simple_records(4))
    import yaml

    c = yaml.safe_load(path.read_text())
    c["task"] = "seq-cls"
    c["data"] = {"train": "data/train.jsonl", "text": "instruction", "label": "output", "labels": ["a", "b"],
                 "packing": True}
    path.write_text(yaml.safe_dump(c))
    r = cli("validate", path)
    assert r.code == 2 and "data.packing" in r.err and "seq-cls" in r.err, r.err


def test_validate_says_its_counts_are_records_that_packing_makes_fewer_rows(tmp_path, cli):
    """validate reads no tokenizer, so its batch arithmetic counts records; under data.packing it says so, and the
    same line is absent without packing."""
    said = "data.packing: the counts above are records; packed, they make fewer rows"
    r = cli("validate", tiny_causal_campaign(tmp_path / "packed", _records(), data__packing=True))
    assert r.code == 0 and said in " ".join((r.out + r.err).split()), r.err
    r = cli("validate", tiny_causal_campaign(tmp_path / "plain", _records()))
    assert r.code == 0 and "data.packing" not in r.out + r.err, r.err


def test_inspect_shows_a_packed_row(tmp_path, cli):
    """inspect under data.packing: the examples one by one, then the row they pack into: its positions restart at
    each example, no attention mask, each example's first token masked — said in words and kept in --json."""
    path = tiny_causal_campaign(tmp_path, _records(), data__packing=True)
    r = cli("inspect", path, "-n", "3", "--json")
    assert r.code == 0, r.err
    items = r.json["stages"][0]["data"]["examples"]
    row = items[-1]
    assert len(items) == 4 and row["rid"].startswith("packed row (") and row["rid"].count(" + ") == 2
    pos = row["position_ids"]
    starts = [p for p, q in enumerate(pos) if q == 0]
    assert len(starts) == 3 and all(row["tokens"][s][2] == "masked" for s in starts)
    alone = [sum(k != "padding" for _, _, k in items[i]["tokens"]) for i in range(3)]
    assert alone == [b - a for a, b in zip(starts, starts[1:] + [len(pos)])], (alone, starts)
    said = " ".join(r.err.split())
    assert "a packed row of 3 examples" in said and "attention stays within each example" in said, r.err


def test_the_worst_case_of_a_packed_campaign_is_full_rows_and_estimate_equals_the_pilot(tmp_path, cli):
    """Every phase's rows are full (data.max_length tokens, topped up with other examples where the greedy packing
    left room), and estimate ÷ pilot per phase is 1 as for unpacked campaigns: the pilot and the trace run the same
    packed rows, positions and all."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.campaign.prepare import prepare
    from pilotrun.phases.worst import worst_case

    path = tiny_causal_campaign(tmp_path, _records() * 3, validation=_records() * 2, data__packing=True,
                                train__eval_batch=2)
    prep = prepare(load_campaign(path))
    w = worst_case(prep, 1)
    rows = [e for mb in w["micro_batches"] for e in mb] + w["eval"]
    assert all(e.length == 64 for e in rows), [e.length for e in rows]
    assert w["train_inputs"]["seq_len"] == 64 and w["eval_inputs"]["seq_len"] == 64
    r = cli("pilot", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    assert "examples packed in" in " ".join(r.err.split()), r.err
    est = cli("estimate", path, "--home", tmp_path / "home", "--device", "cpu", "--json")
    assert est.code == 0, est.err[-2000:]
    predicted = {row["phase"]: row["peak_allocated"] for row in est.json["stages"][0]["data"]["phases"]}
    measured = {row["phase"]: row["peak_allocated"] for row in r.json["stages"][0]["data"]["rows"]}
    off = {k: (predicted[k], v) for k, v in measured.items() if abs(predicted[k] - v) > 0.05 * v}
    assert measured and not off, off
    # the sheet's largest sizes probe packed rows stretched or cut to other lengths: their examples with them
    sheet = cli("sheet", path, "--home", tmp_path / "home")
    assert sheet.code == 0 and "failed while attempting" not in sheet.err, sheet.err[-3000:]
    assert "Largest sizes" in sheet.out or "largest" in sheet.out.lower(), sheet.out[-2000:]
    # the time plan counts validation batches of packed rows, not of the file's 18 records (9 batches of 2)
    from pilotrun.journal.store import Journal
    from pilotrun.sheet.build import build_sheet

    journal = Journal(tmp_path / "home")
    run = journal.get_run(r.json["stages"][0]["data"]["run_id"])
    counts = build_sheet(run["config"], journal, run, predict=False)["time"]["counts"]
    assert len(prep.validation) < 18 and counts["eval_batches"] == -(-len(prep.validation) // 2), counts


TINY_OPT = {"model_type": "opt", "vocab_size": 384, "hidden_size": 64, "ffn_dim": 128, "num_attention_heads": 4,
            "word_embed_proj_dim": 64, "max_position_embeddings": 256, "num_hidden_layers": 2}
TINY_BLOOM = {"model_type": "bloom", "vocab_size": 384, "hidden_size": 64, "n_head": 4, "n_layer": 2}


@pytest.mark.parametrize("config", [TINY_OPT, TINY_BLOOM], ids=["opt", "bloom"])
def test_a_model_whose_attention_crosses_packed_examples_is_refused(tmp_path, cli, config):
    """OPT builds its mask without the restarting positions and BLOOM takes no positions (transformers 5.25): a
    packed row's examples would see each other, so the first packed loss refuses them (exit 2 naming data.packing);
    the same model unpacked, and the Llama packed, train."""
    from pilotrun.errors import BadInput

    def loss(folder, **overrides):
        prep = _prepared(tmp_path / folder, _records(), **overrides)
        model = prep.task.build_model()
        value = prep.task.loss(model, prep.task.collate(prep.train[:2]))
        assert model.training  # the check leaves the model as it found it
        return value

    with pytest.raises(BadInput) as e:
        loss("crossing", model__config=dict(config), data__packing=True)
    assert e.value.where == "data.packing" and config["model_type"] in str(e.value), str(e.value)
    assert "does not keep a packed row's examples apart" in str(e.value) and "remove data.packing" in e.value.fix
    loss("unpacked", model__config=dict(config))
    loss("llama", data__packing=True)
    if config is TINY_BLOOM:
        return  # the verb's exit once, on OPT: the pilot's first update refuses it, no FAIL row
    path = tiny_causal_campaign(tmp_path / "cli", _records() * 3, model__config=dict(config), data__packing=True)
    r = cli("pilot", path, "--home", tmp_path / "home")
    said = " ".join(r.err.split())
    assert r.code == 2 and "data.packing" in said and "does not keep a packed row's examples apart" in said, r.err
