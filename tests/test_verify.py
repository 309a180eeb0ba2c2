"""verify: hashes before loading, no pickles, reload in a fresh process and reproduce the control predictions."""

import shutil

import pytest
import torch
import yaml
from conftest import TINY_LLAMA, write_campaign

from pilotrun.journal.files import write_manifest
from pilotrun.engine.control import CONTROL_FILE, load_control


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One real train run of the demo (tiny budget), shared; tests that tamper work on a copy of its home."""
    from pilotrun.campaign import load_campaign
    from pilotrun.demo.synth import write_demo
    from pilotrun.rehearsal.training.train import train_run

    root = tmp_path_factory.mktemp("verify")
    path = write_demo(root / "demo", n_conversations=60)
    c = yaml.safe_load(path.read_text())
    c["model"]["config"] = dict(TINY_LLAMA)
    c["train"].update(updates=6, eval_every=6, save_every=None, micro_batch=4, accumulation=2)
    write_campaign(path.parent, c)
    home = root / "home"
    res = train_run(load_campaign(path), home, progress=False)
    assert res.verdict == "ok"
    return home, res.data["run_id"]


def _copy(trained, tmp_path):
    home, run_id = trained
    shutil.copytree(home, tmp_path / "home")
    return tmp_path / "home", run_id, tmp_path / "home" / "runs" / run_id


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_clean_run_reloads_and_reproduces(cli, trained):
    home, run_id = trained
    control = load_control(home / "runs" / run_id / CONTROL_FILE)
    assert len(control["rids"]) == 4 and control["values"][0].shape[-1] == 8
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert "every file matches manifest.json (sha256)" in text
    assert "artifact/model: loaded as a user would (LlamaForCausalLM" in text
    assert "4 control predictions reproduced, logits within" in text
    row = r.json["stages"][0]["rows"][0]
    assert row["ids_equal"] and row["max_logit_diff"] <= row["tolerance"] == 1e-4


def test_flipped_byte_refused_naming_the_file(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    _flip_a_byte(run_dir / "artifact" / "model" / "model.safetensors")
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    assert "artifact/model/model.safetensors: sha256 differs from manifest.json" in r.json["summary"]
    assert "fresh process" not in "\n".join(r.json["messages"])  # refused before anything was loaded


def test_the_run_folder_is_hashed_once_in_the_process_that_loads(cli, trained, tmp_path, monkeypatch):
    """Issue 50: verify hashed the whole run folder here and again in its fresh process. Only the fresh process,
    which loads, checks now (nothing can change between its check and its load); its refusal is said here as
    before, through a zygote's child or a cold interpreter (PILOTRUN_FRESH=cold) alike."""
    import pilotrun.journal.checkpoints as checkpoints
    import pilotrun.provenance as provenance

    hashed, real = [], provenance.file_sha256

    def counting(p, *a, **k):  # the real sha256, each path this process hashes recorded
        hashed.append(p)
        return real(p, *a, **k)

    monkeypatch.setattr(provenance, "file_sha256", counting)  # journal.files hashes through it
    monkeypatch.setattr(checkpoints, "file_sha256", counting)
    home, run_id = trained
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 0, r.out + r.err
    assert r.json["messages"][0].startswith("every file matches manifest.json (sha256); no pickle-based weights; "
                                            "fresh process pid ")
    assert hashed == []
    home, run_id, run_dir = _copy(trained, tmp_path)
    _flip_a_byte(run_dir / "artifact" / "model" / "model.safetensors")
    monkeypatch.setenv("PILOTRUN_FRESH", "cold")
    r = cli("verify", run_id, "--home", home, "--json")
    refused = ["artifact/model/model.safetensors: sha256 differs from manifest.json — refused, nothing was loaded"]
    assert (r.code, r.json["verdict"]) == (1, "fail"), r.err
    assert r.json["summary"] == (f"run {run_id}: refused before loading: artifact/model/model.safetensors: sha256 "
                                 "differs from manifest.json")
    assert r.json["messages"] == refused and r.json["data"] == {"run_id": run_id, "refused": refused}
    assert hashed == []


def test_a_path_the_system_refuses_in_the_fresh_process_is_exit_2_naming_it(cli, trained, tmp_path):
    """The fresh process's check meets an OSError (a manifest entry whose name the file system cannot hold): said as
    bad input naming the path, as when the check ran in the verb's process, not as an artifact that does not reload."""
    import json

    home, run_id, run_dir = _copy(trained, tmp_path)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    manifest["files"]["artifact/" + "x" * 300] = {"sha256": "0" * 64}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    r = cli("verify", run_id, "--home", home)
    assert r.code == 2, (r.code, r.out, r.err)
    assert f"{run_dir}/artifact/xxx" in r.err and "a name in the path is longer than the file system allows" in r.err
    assert "use a shorter path" in r.err and "does not reload" not in r.out + r.err


def test_pickle_weights_refused_with_explanation(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    model_dir = run_dir / "artifact" / "model"
    from safetensors.torch import load_file

    torch.save(load_file(str(model_dir / "model.safetensors")), model_dir / "pytorch_model.bin")
    (model_dir / "model.safetensors").unlink()
    write_manifest(run_dir, {"kind": "pilotrun-run", "run_id": run_id})  # hashes match: only the format is wrong
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    msg = r.json["messages"][0]
    assert msg.startswith("artifact/model/pytorch_model.bin: pickle-based weights refused")
    assert "unpickling runs arbitrary code" in msg and "safetensors" in msg


def test_artifact_that_is_not_the_trained_model_fails(cli, trained, tmp_path):
    """The reproduce step can fail: consistent hashes, but the weights are another model's."""
    home, run_id, run_dir = _copy(trained, tmp_path)
    from safetensors.torch import load_file, save_file

    weights = run_dir / "artifact" / "model" / "model.safetensors"
    tensors = load_file(str(weights))
    save_file({k: v * 0.5 for k, v in tensors.items()}, str(weights), metadata={"format": "pt"})
    write_manifest(run_dir, {"kind": "pilotrun-run", "run_id": run_id})
    r = cli("verify", run_id, "--home", home, "--json")
    assert r.code == 1
    text = "\n".join(r.json["messages"])
    assert "artifact/model: logits differ from training by up to" in text


def test_run_without_artifact_is_bad_input(cli, trained, tmp_path):
    home, run_id, run_dir = _copy(trained, tmp_path)
    shutil.rmtree(run_dir / "artifact")
    r = cli("verify", run_id, "--home", home)
    assert r.code == 2 and "has no artifact folder" in r.err


@pytest.mark.slow
def test_lora_adapter_reloads_through_peft(cli, tmp_path):
    """A LoRA run on a base model saved to disk: the adapter through peft, and the merged copy (asked for)."""
    from conftest import simple_records, tiny_causal_campaign
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

    cfg = dict(TINY_LLAMA)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(
        tmp_path / "base")
    ByT5Tokenizer().save_pretrained(tmp_path / "base")
    path = tiny_causal_campaign(tmp_path / "c", simple_records(16), simple_records(4, 100))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(tmp_path / "base"),
                  "adapter": {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"],
                              "merged_copy": True}}
    path.write_text(yaml.safe_dump(c))
    r = cli("train", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    r = cli("verify", r.json["data"]["run_id"], "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.out + r.err
    text = "\n".join(r.json["messages"])
    assert "artifact/adapter: loaded as a user would (PeftModelForCausalLM" in text
    assert "artifact/merged: loaded as a user would (LlamaForCausalLM" in text


def _lora_on_saved_base(tmp_path, **train):
    """A LoRA run (2 updates) on a tiny Llama saved in fp32, trained as ``train`` says (dtype, precision)."""
    from conftest import simple_records, tiny_causal_campaign
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.training.train import train_run

    cfg = dict(TINY_LLAMA)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(
        tmp_path / "base")
    ByT5Tokenizer().save_pretrained(tmp_path / "base")
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, 100))
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(tmp_path / "base"), "dtype": train.pop("dtype"),
                  "adapter": {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}
    c["train"].update(updates=2, eval_every=2, **train)
    path.write_text(yaml.safe_dump(c))
    res = train_run(load_campaign(path), tmp_path / "home", progress=False)
    assert res.verdict == "ok", res.messages
    return tmp_path / "home", res.data["run_id"]


def _worker_in_process(home, run_id, tmp_path):
    """verify's fresh-process half, called here (the comparison is under test, not the process start)."""
    import json

    from pilotrun.journal.store import Journal
    from pilotrun.rehearsal.mechanics.verify import compare, verify_worker

    control = Journal(home).predictions(run_id, "control")
    tmp_path.mkdir()
    (tmp_path / "control.json").write_text(json.dumps(control))
    verify_worker(str(home / "runs" / run_id), str(tmp_path / "control.json"), str(tmp_path / "out.json"))
    return compare(run_id, control, json.loads((tmp_path / "out.json").read_text()))


@pytest.mark.slow
def test_fp16_adapter_on_an_fp32_base_folder_reloads_in_the_trained_dtype(tmp_path):
    """Issue 43: a bf16 campaign's adapter was reloaded onto its base in the folder's dtype and failed on logits its
    own dtype rounds. Here another instance: fp16 weights (model.dtype float16, fp32 precision: the math is fp16)
    over a folder saved in fp32 — reloaded in fp16, judged at fp16's tolerance; the same artifact with its adapter
    scaled (another model) still fails."""
    from safetensors.torch import load_file, save_file

    home, run_id = _lora_on_saved_base(tmp_path, dtype="float16", precision="fp32")
    res = _worker_in_process(home, run_id, tmp_path / "clean")
    assert res.verdict == "ok", res.messages
    row = res.rows[0]
    assert row["dtype"] == "float16" and row["ids_equal"] and row["max_logit_diff"] <= row["tolerance"]
    assert 1e-4 < row["tolerance"] < 5e-2  # fp16's spacing at the logits' scale, not fp32's 1e-4
    assert "loaded as a user would (PeftModelForCausalLM, torch.float16)" in "\n".join(res.messages)

    weights = home / "runs" / run_id / "artifact" / "adapter" / "adapter_model.safetensors"
    save_file({k: v * 40 for k, v in load_file(str(weights)).items()}, str(weights), metadata={"format": "pt"})
    write_manifest(home / "runs" / run_id, {"kind": "pilotrun-run", "run_id": run_id})
    res = _worker_in_process(home, run_id, tmp_path / "planted")
    assert res.verdict == "fail"
    assert "artifact/adapter: logits differ from training by up to" in "\n".join(res.messages)


def test_a_flip_at_a_near_tie_is_said_and_a_real_difference_fails():
    """The ids may differ only where the training-time logits of both ids were within the tolerance."""
    from pilotrun.rehearsal.mechanics.verify import compare, logit_tolerance, near_ties

    tol = logit_tolerance("bfloat16", 12.0)
    assert tol == pytest.approx(8 * 2 ** -7 * 12.0) and logit_tolerance("float32", 12.0) == 1e-4
    values = torch.tensor([[12.0, 9.0, 3.0], [12.0, 11.99, 11.9], [12.0, 11.9, 11.8]])
    indices = torch.tensor([[5, 6, 7], [8, 9, 10], [1, 2, 3]])
    control = {"a": {"pred": [5, 8, 1]}, "b": {"pred": [5, 8, 1]}, "c": {"pred": [5, 8, 1]}}
    # a: a tie flipped, and an id below a top-k that is flat within the tolerance; b: 3 apart; c: far below the top-k
    pred = {"a": [5, 9, 77], "b": [6, 8, 1], "c": [42, 8, 1]}
    stored = {r: (values, indices) for r in control}
    ties = near_ties(control, pred, stored, tol)
    assert set(ties) == {"a"} and [t["position"] for t in ties["a"]] == [1, 2]
    assert ties["a"][0]["gap"] == pytest.approx(0.01, abs=1e-3)
    reloaded = {"pid": 1, "artifacts": {"model": {"pred": pred, "ties": ties, "atol": tol, "max_logit_diff": 0.01,
                                                  "compute_dtype": "bfloat16", "tokenizer": "same", "loaded": "x"}}}
    res = compare("r1", control, reloaded)
    text = "\n".join(res.messages)
    assert res.verdict == "fail" and "(2 of 3 control examples differ beyond a near tie)" in text
    assert "predicted ids of b differ from the end of training at target 0: [6, 8, 1] against [5, 8, 1]" in text
    assert "2 target position(s) of 1 control example(s) predict the other id of a near tie" in text
    del pred["b"], pred["c"], control["b"], control["c"]
    assert compare("r1", control, reloaded).verdict == "ok"


@pytest.mark.parametrize("dtype,precision,held", [("float16", "fp32", torch.float16),
                                                  ("float32", "bf16-true", torch.bfloat16)])
def test_an_artifact_reloads_in_the_dtype_it_was_trained_in(tmp_path, dtype, precision, held):
    """An adapter over a base folder saved in fp32, and a whole model, reload in the weights' dtype of the run (the
    folder's own dtype would compute other logits), as verify's fresh process loads them."""
    from transformers import AutoConfig, AutoModelForCausalLM, ByT5Tokenizer

    from pilotrun.campaign import load_campaign
    from pilotrun.tasks import make_task

    cfg = dict(TINY_LLAMA)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(cfg.pop("model_type"), **cfg)).save_pretrained(
        tmp_path / "base")
    ByT5Tokenizer().save_pretrained(tmp_path / "base")
    from conftest import simple_records, tiny_causal_campaign

    lora = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    for adapter in (lora, None):
        path = tiny_causal_campaign(tmp_path / f"c{bool(adapter)}", simple_records(4), model__path=str(tmp_path / "base"),
                                    model__config=None, model__tokenizer=None, model__dtype=dtype,
                                    model__adapter=adapter, train__precision=precision)
        task = make_task(load_campaign(path))
        written = task.save_artifact(task.build_model(), tmp_path / f"art{bool(adapter)}")
        reloaded = task.load_artifact(tmp_path / f"art{bool(adapter)}" / written[0])
        base = reloaded.get_base_model() if adapter else reloaded
        assert base.model.embed_tokens.weight.dtype == held, (adapter, written)
