"""estimate: fake-tensor predictions against real tensors and measured RSS, limits, ranks, model folders."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import TINY_LLAMA, tiny_causal_campaign

# Wide enough that the tensors of a phase (tens of MiB) stand well above RSS noise.
WIDE = dict(TINY_LLAMA, hidden_size=384, intermediate_size=768, num_attention_heads=6, num_key_value_heads=6,
            vocab_size=2048)
# Peak tolerance against measured RSS: 15 % of the estimated increase plus 6 MiB for what the process
# touches besides tensors (code pages of kernels run the first time, allocator bookkeeping).
REL_TOL, ABS_TOL = 0.15, 6 * 2**20


def _records(n: int, start: int = 0) -> list[dict]:
    return [{"instruction": "reverse " + "w" * (5 + (i * 7) % 40), "output": "x" * (10 + (i * 5) % 50)}
            for i in range(start, start + n)]


def _campaign(tmp_path, name="c", **overrides):
    defaults = dict(model__config=dict(WIDE), data__max_length=128, train__micro_batch=4, train__accumulation=2,
                    train__eval_batch=8)
    defaults.update(overrides)
    return tiny_causal_campaign(tmp_path / name, _records(40), _records(16, 100), **defaults)


def _rows(result) -> dict:
    return {r["phase"]: r for r in result.data["phases"]}


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def test_parameters_gradients_and_optimizer_state_are_exact(tmp_path):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.loop import make_state, run_update
    from pilotrun.rehearsal.memory.estimate import estimate
    from pilotrun.phases.worst import worst_case
    from pilotrun.campaign.prepare import prepare

    loaded = load_campaign(_campaign(tmp_path))
    rows = _rows(estimate(loaded, device="cpu"))
    prep = prepare(loaded, splits=("train", "validation"))
    model = prep.task.build_model()
    state = make_state(model, prep.c.train, n_train=len(prep.train), seed=0, total_updates=4)
    mbs = worst_case(prep, 1)["micro_batches"]
    run_update(state, prep.task, mbs, max_grad_norm=1.0)
    run_update(state, prep.task, mbs, max_grad_norm=1.0, step=False, zero_grad=False)  # leave the gradients

    params = _nbytes(list(model.parameters()) + list(model.buffers()))
    grads = _nbytes([p.grad for p in model.parameters() if p.grad is not None])
    opt = _nbytes([v for s in state.optimizer.state.values() for v in s.values() if hasattr(v, "numel")])
    assert rows["load"]["parameters"] == rows["load"]["peak_allocated"] == params
    assert rows["steady_step"]["gradients"] == grads
    assert rows["steady_step"]["optimizer_state"] == opt
    assert rows["steady_step"]["baseline"] == params + opt  # gradients are set to None after each update
    assert rows["eval_longest"]["gradients"] == 0


MEASURE = textwrap.dedent("""
    import json, sys
    from pilotrun.campaign.load import load_campaign
    from pilotrun.engine.loop import evaluate, make_state, run_update
    from pilotrun.probe.memory import make_probe
    from pilotrun.phases.worst import worst_case
    from pilotrun.campaign.prepare import prepare

    def phases(path):
        prep = prepare(load_campaign(path), splits=("train", "validation"))
        t, wc = prep.c.train, worst_case(prep, 1)
        state = make_state(prep.task.build_model(), t, n_train=len(prep.train), seed=0, total_updates=4)
        probe, out = make_probe("cpu", exact=False), {}  # RSS (the exact default would need track(model))
        for name in ("first_step", "steady_step", "eval_longest"):
            probe.start()
            if name == "eval_longest":
                evaluate(state, prep.task, wc["eval"], t.eval_batch)
            else:
                run_update(state, prep.task, wc["micro_batches"], max_grad_norm=t.max_grad_norm)
            r = probe.stop()
            out[name] = r["peak_allocated"] - r["baseline"]
        return out

    phases(sys.argv[1])  # the same kernels once, so their code pages are resident before measuring
    print(json.dumps(phases(sys.argv[2])))
""")


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_peak_matches_measured_rss_within_tolerance(tmp_path):
    """RSS is noisy; measured in a fresh process where glibc returns freed tensors to the OS at once
    (a fixed mmap threshold), after a warm-up, as the increase over the phase's baseline."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    path = _campaign(tmp_path)
    warm = _campaign(tmp_path, "warm", model__config=dict(TINY_LLAMA))
    script = tmp_path / "measure.py"
    script.write_text(MEASURE)
    import pilotrun

    # the measuring process imports the pilotrun this test imports (a worktree's, where PYTHONPATH names one)
    env = {"MALLOC_MMAP_THRESHOLD_": "65536", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(Path(pilotrun.__file__).parents[1])}
    done = subprocess.run([sys.executable, str(script), str(warm), str(path)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    rows = _rows(estimate(load_campaign(path), device="cpu"))
    for name, got in measured.items():
        predicted = rows[name]["peak_allocated"] - rows[name]["baseline"]
        assert predicted > 8 * 2**20, (name, predicted)  # the phase is big enough to be measured
        assert abs(got - predicted) <= REL_TOL * predicted + ABS_TOL, (name, got, predicted)


def test_over_budget_names_phase_and_inputs_and_fails(tmp_path, cli):
    path = _campaign(tmp_path)
    over = cli("estimate", path, "--gpu-memory", "64MiB", "--json")
    assert over.code == 1
    payload = over.json
    assert payload["verdict"] == "fail"
    first = next(r for r in payload["data"]["phases"] if r["verdict"] == "over-budget")
    assert first["phase"] == "first_step"
    text = " ".join(payload["messages"])
    assert "is above 64.0 MiB at phase first_step (micro_batch 4, accumulation 2" in text
    assert "pilotrun fit" in text

    ok = cli("estimate", path, "--gpu-memory", "80GiB", "--json")
    assert ok.code == 0, ok.err
    # what it is doing (a 70B model's traces are seconds each on 2 cores): the phases traced, on the stage's line
    said = [ln.split(" (")[0] for ln in ok.err.splitlines() if ln.startswith("pilotrun estimate: ")]
    assert said[0] == "pilotrun estimate: started" and said[-1] == "pilotrun estimate: ended", ok.err
    assert "pilotrun estimate: tracing every phase on fake tensors" in said, said
    phases = ok.json["data"]["phases"]
    assert [r["phase"] for r in phases] == ["load", "first_step", "steady_step", "eval_longest", "save", "export",
                                            "reload"]
    assert all(r["counter"] == "estimate" and r["device"] == "cuda (estimate)" for r in phases)
    assert all(r["peak_allocated"] % 512 == 0 for r in phases)  # the CUDA allocator's rounding


@pytest.mark.parametrize("r", [65, 2**70])
def test_a_lora_rank_above_every_adapted_layer_is_bad_input(tmp_path, cli, r):
    # the update B·A of a 64-wide projection has rank 64 at most; 2**70 failed inside torch (exit 3)
    path = _campaign(tmp_path, model__config=dict(TINY_LLAMA))
    res = cli("estimate", path, "--set", f"model.adapter={{r: {r}, target_modules: [q_proj, v_proj]}}")
    assert res.code == 2, res.err
    assert f"model.adapter.r: LoRA rank {r} is above every adapted layer's smaller side (at most 64, q_proj)" in res.err
    assert "fix: set model.adapter.r to 64 or less" in res.err
    res = cli("estimate", path, "--options", "--lora-r", r)
    assert res.code == 2 and f"--lora-r: LoRA rank {r} is above" in res.err, res.err
    assert cli("estimate", path, "--set", "model.adapter={r: 64, target_modules: [q_proj, v_proj]}").code == 0


def test_fsdp_divides_state_by_ranks_but_not_activations(tmp_path):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    base = load_campaign(_campaign(tmp_path, data__max_length=64))
    single = _rows(estimate(base, device="cuda"))
    fsdp = _rows(estimate(base.with_overrides({"train.strategy": "fsdp", "train.nproc": 2,
                                               }), device="cuda"))
    s, f = single["steady_step"], fsdp["steady_step"]
    for key in ("parameters", "gradients", "optimizer_state"):
        assert f[key] == s[key] // 2, key
    assert f["activations"] == s["activations"]
    assert f["rank"] == "each"


def test_gradient_checkpointing_and_adapter_shrink_what_they_should(tmp_path):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    base = load_campaign(_campaign(tmp_path, data__max_length=64))
    plain = _rows(estimate(base, device="cuda"))["steady_step"]
    ckpt = _rows(estimate(base.with_overrides({"model.gradient_checkpointing": True}), device="cuda"))["steady_step"]
    lora = _rows(estimate(base.with_overrides({"model.adapter": {"kind": "lora", "r": 4,
                                                                 "target_modules": ["q_proj", "v_proj"]}}),
                          device="cuda"))["steady_step"]
    assert ckpt["activations"] < plain["activations"] / 3
    assert lora["optimizer_state"] < plain["optimizer_state"] / 20
    assert lora["parameters"] > plain["parameters"]  # the base weights stay, the adapter adds


def test_model_folder_is_estimated_from_its_config(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    cfg = dict(TINY_LLAMA)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg))
    model.save_pretrained(tmp_path / "model", safe_serialization=True)
    folder = load_campaign(_campaign(tmp_path, model__config=None, model__path=str(tmp_path / "model"),
                                     model__tokenizer="byte"))
    from_config = load_campaign(_campaign(tmp_path, "cfg", model__config=dict(TINY_LLAMA)))
    a, b = _rows(estimate(folder, device="cuda")), _rows(estimate(from_config, device="cuda"))
    assert a["steady_step"]["peak_allocated"] == b["steady_step"]["peak_allocated"]
    on_cpu = _rows(estimate(folder, device="cpu"))
    assert on_cpu["load"]["parameters"] == _nbytes(list(model.parameters()) + list(model.buffers()))


@pytest.mark.slow
def test_one_billion_parameter_config(tmp_path):
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.estimate import estimate

    big = {"model_type": "llama", "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632,
           "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
           "max_position_embeddings": 2048}
    r = estimate(load_campaign(_campaign(tmp_path, model__config=big, data__max_length=256)), device="cuda",
                 gpu_memory=80 * 2**30)
    rows = _rows(r)
    assert r.data["params"] > 1.0e9
    # fp32 AdamW: 4 bytes of weights, 4 of gradients, 8 of moments per parameter
    assert rows["steady_step"]["optimizer_state"] >= 8 * r.data["params"]
    assert rows["steady_step"]["gradients"] >= 4 * r.data["params"]
    assert r.verdict == "ok"


def test_a_fake_build_never_reads_a_fake_tensors_data_pointer(tmp_path):
    """PEFT deep-copies a classifier head into ``modules_to_save`` while the estimator builds on fake tensors, and
    torch's ``Tensor.__deepcopy__`` reads the data pointer, which a fake tensor does not have: undefined behaviour
    that corrupted the heap ("free(): invalid next size", SIGABRT) in a long-lived process. The build copies a
    fake tensor as a fake clone instead: no warning, and the copied head is fake and trainable."""
    import warnings

    from torch._subclasses.fake_tensor import FakeTensorMode, is_fake

    from conftest import minilm_campaign
    from pilotrun.campaign.load import load_campaign
    from pilotrun.probe.estimate import fake_build

    lora = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["query", "value"]}
    loaded = load_campaign(minilm_campaign(tmp_path / "c", model__adapter=lora))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Accessing the data pointer of FakeTensor")
        model = fake_build(loaded, FakeTensorMode(allow_non_fake_inputs=True))
    saved = [p for n, p in model.named_parameters() if "modules_to_save" in n]
    assert saved and all(is_fake(p) and p.requires_grad for p in saved)


# --- the steady step replayed (phases/registry._steady_traced): the ledger dispatching it would write --------------
def _ledger(loaded, monkeypatch, replay: bool) -> tuple[list, list, int]:
    """The whole ledger of one trace (every event's live and reserved bytes and stage, every block's size,
    category and life) with the steady step replayed or dispatched, its rows, and how often it was replayed."""
    from pilotrun.campaign.prepare import prepare
    from pilotrun.phases import registry
    from pilotrun.phases.worst import worst_case
    from pilotrun.probe import estimate as E
    from pilotrun.probe.trace import _traced_once, rows_for

    monkeypatch.setattr(registry, "REPLAY", replay)
    replays = []
    real = E.Accountant.replay
    monkeypatch.setattr(E.Accountant, "replay", lambda self, *a: replays.append(a) or real(self, *a))
    prep = prepare(loaded, splits=("train", "validation"))
    out = _traced_once(loaded, "cuda", prep, worst_case(prep, 1), False, None)
    rows = rows_for(dict(out, counted=None), ranks=1)
    return _whole(out["accountant"]), rows, len(replays)


def _whole(acc) -> list:
    return [acc.timeline, acc.cublas, acc.stages, sorted(acc.marks.items()),
            [(b.nbytes, b.category, b.born, b.died, b.in_optimizer) for b in acc.blocks]]


@pytest.mark.parametrize("kind", ["adamw", "sgd", "lora+ckpt", "seq-cls"])
def test_the_steady_step_replayed_is_the_one_dispatched_event_by_event(tmp_path, monkeypatch, kind):
    from conftest import write_campaign, write_jsonl
    from pilotrun.campaign.load import load_campaign

    if kind == "seq-cls":
        write_jsonl(tmp_path / "data" / "train.jsonl",
                    [{"text": "word " * (3 + i % 7), "label": ("neg", "pos")[i % 2]} for i in range(24)])
        path = write_campaign(tmp_path, {
            "name": "cls", "task": "seq-cls", "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
            "data": {"train": "data/train.jsonl", "text": "text", "label": "label", "labels": ["neg", "pos"],
                     "max_length": 32}, "train": {"micro_batch": 2, "accumulation": 2, "updates": 2}})
    else:
        extra = {"sgd": dict(train__optimizer="sgd"),
                 "lora+ckpt": dict(model__gradient_checkpointing=True, model__adapter={"kind": "lora", "r": 4})}
        path = _campaign(tmp_path, model__config=dict(TINY_LLAMA), data__max_length=64, **extra.get(kind, {}))
    loaded = load_campaign(path)
    replayed, rows, n = _ledger(loaded, monkeypatch, True)
    dispatched, rows_dispatched, none = _ledger(loaded, monkeypatch, False)
    assert (n, none) == (1, 0)
    assert replayed == dispatched  # every event, its live and reserved bytes, its stage; every block's life
    assert rows == rows_dispatched


def test_a_step_that_differs_from_the_first_is_dispatched_not_replayed(tmp_path, monkeypatch):
    """Planted: a custom task whose second update computes on a longer tensor than its first (its model keeps a
    count between calls), and an fp16 campaign whose grad scaler allocates its scale at the first update: the
    steady step is dispatched, so its ledger shows what the step really books (the custom task's longer tensor)."""
    import shutil

    from pilotrun.campaign.load import load_campaign

    examples = __import__("pathlib").Path(__file__).resolve().parents[1] / "examples"
    folder = tmp_path / "tab"
    shutil.copytree(examples, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "growing_task.py").write_text(textwrap.dedent("""
        import torch
        from tabular_task import TabularTask

        class Growing(TabularTask):
            calls = 0

            def loss(self, model, batch):
                Growing.calls += 1
                wide = torch.ones(batch["x"].shape[0], 4096 * Growing.calls, device=batch["x"].device)
                s, n = super().loss(model, batch)
                return s + (wide * 0).sum(), n
    """))
    text = (folder / "tabular_campaign.yaml").read_text().replace("tabular_task:TabularTask", "growing_task:Growing")
    (folder / "growing.yaml").write_text(text)
    monkeypatch.syspath_prepend(str(folder))
    loaded = load_campaign(folder / "growing.yaml")
    ledger, rows, n = _ledger(loaded, monkeypatch, True)
    assert n == 0
    by = {r["phase"]: r for r in rows}
    assert by["steady_step"]["activations"] > by["first_step"]["activations"]  # the longer tensor, booked
    # traced again on the same prepared data, its reload (a longer tensor again) is not replayed either
    from pilotrun.campaign.prepare import prepare
    from pilotrun.phases.worst import worst_case
    from pilotrun.probe.trace import _traced_once

    prep = prepare(loaded, splits=("train", "validation"))
    first = _traced_once(loaded, "cuda", prep, worst_case(prep, 1), False, None)["accountant"]
    again = _traced_once(loaded, "cuda", prep, worst_case(prep, 1), False, None)["accountant"]
    grown = [max(a.timeline[slice(*a.marks["reload"])]) - a.timeline[a.marks["reload"][0]] for a in (first, again)]
    assert grown[1] > grown[0]

    fp16 = load_campaign(_campaign(tmp_path, "fp16", model__config=dict(TINY_LLAMA), data__max_length=64,
                                   train__precision="fp16-mixed"))
    _, rows, n = _ledger(fp16, monkeypatch, True)
    assert n == 0
    by = {r["phase"]: r for r in rows}
    assert by["steady_step"]["optimizer_state"] > 0  # dispatched: the step ran on the state the first allocated


def test_a_reload_replayed_from_another_trace_is_the_one_dispatched(tmp_path, monkeypatch):
    """The LoRA variant reloads the same merged model as the campaign as written: its reload replays the written
    trace's (same plain campaign, depth, device and prepared sample), and its ledger is the dispatched one; another
    depth or other prepared data is traced again."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.campaign.prepare import prepare
    from pilotrun.phases import registry
    from pilotrun.phases.worst import worst_case
    from pilotrun.probe import estimate as E
    from pilotrun.probe.trace import _traced_once

    loaded = load_campaign(_campaign(tmp_path, model__config=dict(TINY_LLAMA), data__max_length=64))
    lora = loaded.with_overrides({"model.adapter": {"kind": "lora", "r": 4}})
    replays = []
    real = E.Accountant.replay
    monkeypatch.setattr(E.Accountant, "replay", lambda self, events: replays.append(events) or real(self, events))
    got = {}
    for replay in (True, False):
        monkeypatch.setattr(registry, "REPLAY", replay)
        prep = prepare(loaded, splits=("train", "validation"))
        wc = worst_case(prep, 1)
        _traced_once(loaded, "cuda", prep, wc, False, None)  # the campaign as written: its reload recorded
        replays.clear()
        got[replay] = _whole(_traced_once(lora, "cuda", prep, wc, False, None)["accountant"]), len(replays)
        if replay:  # another depth, other prepared data: nothing recorded for them, traced
            replays.clear()
            _traced_once(lora, "cuda", prep, wc, False, {"num_hidden_layers": 1})
            _traced_once(lora, "cuda", prepare(loaded, splits=("train", "validation")), wc, False, None)
            assert len(replays) == 2  # the steady steps only
    assert got[True][1] == 2 and got[False][1] == 0  # the steady step and the reload / neither
    assert got[True][0] == got[False][0]

    # planted: this trace's evaluation left a block behind (which the reload could free): the reload is dispatched,
    # on the merged model built then, and its ledger is still the dispatched one
    real_replayable = E.Accountant.replayable
    monkeypatch.setattr(E.Accountant, "replayable",
                        lambda self, name, kept=None: name != "eval_longest" and real_replayable(self, name, kept))
    monkeypatch.setattr(registry, "REPLAY", True)
    prep = prepare(loaded, splits=("train", "validation"))
    wc = worst_case(prep, 1)
    _traced_once(loaded, "cuda", prep, wc, False, None)
    replays.clear()
    assert _whole(_traced_once(lora, "cuda", prep, wc, False, None)["accountant"]) == got[False][0]
    assert len(replays) == 1  # the steady step only


@pytest.mark.parametrize("padded", [False, True])
def test_the_trace_skips_the_attention_mask_where_the_run_does(padded):
    """The run reads the padding mask and, for a batch without padding, lets SDPA apply causality itself (is_causal):
    no (batch, 1, L, L) mask. transformers takes a fake tensor for a graph being traced and keeps the mask, which the
    trace booked once per layer and held for the backward (the H200's steps read 2-3 % under the trace: 64 MiB of
    wider1024's 3160). The batch's mask is data the trace carries: unpadded, no mask; one example shorter, one per layer."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from transformers import LlamaConfig, LlamaForCausalLM

    from pilotrun.probe.estimate import Accountant
    from pilotrun.tasks.base import Example
    from pilotrun.tasks.common import pad_batch

    config = LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"}, attn_implementation="sdpa")
    batch_size, width = 4, 48
    examples = [Example(input_ids=list(range(1, width + 1 - (padded and i == 0))),
                        labels=list(range(1, width + 1 - (padded and i == 0))), rid=f"x:{i}") for i in range(batch_size)]
    acc = Accountant("cpu")
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = LlamaForCausalLM(config)
        with acc.tracking(model):
            batch = pad_batch(examples, 0)
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            out.logits.float().sum().backward()
    mask = batch_size * width * width * torch.empty((), dtype=torch.float32).element_size()
    masks = [b for b in acc.blocks if b.nbytes == mask and b.category == "activations"]
    assert len(masks) == (config.num_hidden_layers if padded else 0), (padded, len(masks))
