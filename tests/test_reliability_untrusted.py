"""Untrusted files: nothing pilotrun reads can run code. Pickle payloads that would create a marker file if
unpickled are refused and the marker never appears; hashes are checked before any load and a tampered
byte is refused naming the file; archives refuse absolute paths, `..`, links and zip tricks; YAML tags that
build Python objects are refused; model code in a model folder runs only when the campaign sets
model.trust_remote_code, and the journal records when it did."""

from __future__ import annotations

import ast
import io
import json
import os
import shutil
import sqlite3
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_LLAMA, run_cli_process, simple_records, tiny_causal_campaign, write_campaign

from pilotrun.campaign import load_campaign
from pilotrun.engine.loop import make_state, run_update
from pilotrun.engine.state import is_complete, load_state, save_state
from pilotrun.errors import BadInput
from pilotrun.journal.archive import extract
from pilotrun.journal.files import write_manifest
from pilotrun.campaign.prepare import prepare

SRC = Path(__file__).resolve().parents[1] / "src" / "pilotrun"


class Payload:
    """Unpickling this calls open(marker, "w"): the file appears only if the pickle was executed."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


# --- the source: every loader is a safe one ---------------------------------------------------------------
def _calls(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            owner = f.value.id if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) else None
            yield node, owner, name


def test_source_uses_only_safe_loaders():
    torch_loads, problems = 0, []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(SRC.parent)
        for node, owner, name in _calls(tree):
            kw = {k.arg: k.value for k in node.keywords}
            at = f"{where}:{node.lineno}"
            if owner == "torch" and name == "load":
                torch_loads += 1
                wo = kw.get("weights_only")
                if not (isinstance(wo, ast.Constant) and wo.value is True):
                    problems.append(f"{at}: torch.load without weights_only=True")
            if owner in ("pickle", "cloudpickle", "dill", "marshal", "shelve") and name in ("load", "loads", "open"):
                problems.append(f"{at}: {owner}.{name}")
            if owner == "yaml" and name in ("load", "load_all", "unsafe_load", "full_load", "unsafe_load_all"):
                loader = kw.get("Loader")
                if not (isinstance(loader, ast.Attribute) and loader.attr in ("SafeLoader", "CSafeLoader")):
                    problems.append(f"{at}: yaml.{name} without SafeLoader")
            if owner is None and name in ("eval", "exec"):
                problems.append(f"{at}: {name}()")
            for key in ("trust_remote_code", "weights_only"):
                v = kw.get(key)
                if key == "trust_remote_code" and isinstance(v, ast.Constant) and v.value is True:
                    problems.append(f"{at}: trust_remote_code=True hard-coded")
                if key == "weights_only" and isinstance(v, ast.Constant) and v.value is False:
                    problems.append(f"{at}: weights_only=False")
    assert not problems, problems
    assert torch_loads >= 1  # the scan did find the checkpoint loader (engine/state.py)


# --- checkpoints ------------------------------------------------------------------------------------------
@pytest.fixture
def checkpoint(tmp_path):
    """A real checkpoint of a tiny model after one update, and a second state to load it into."""
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    prep = prepare(load_campaign(path), splits=("train",))
    torch.manual_seed(0)
    a = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10)
    run_update(a, prep.task, [[prep.train[i] for i in mb] for mb in a.sampler.next_update()], max_grad_norm=1.0)
    ckpt = save_state(a, tmp_path / "ckpts" / "update-000001")
    torch.manual_seed(1)
    b = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10)
    return ckpt, b


def _weights(state):
    return {k: v.clone() for k, v in state.model.state_dict().items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def _plant_pickle(ckpt: Path, marker: Path) -> None:
    opt = torch.load(ckpt / "optimizer.pt", weights_only=True)
    opt["payload"] = Payload(marker)
    torch.save(opt, ckpt / "optimizer.pt")


def test_the_payload_is_live(tmp_path):
    """The control: an unrestricted unpickle of the planted file really runs the payload."""
    f, marker = tmp_path / "evil.pt", tmp_path / "marker"
    torch.save({"payload": Payload(marker)}, f)
    torch.load(f, weights_only=False)
    assert marker.exists()


def test_pickle_payload_with_matching_hashes_is_refused(checkpoint, tmp_path):
    ckpt, state = checkpoint
    marker = tmp_path / "marker"
    _plant_pickle(ckpt, marker)
    write_manifest(ckpt, {"kind": "pilotrun-checkpoint"})  # the attacker rewrote the manifest too
    before = _weights(state)
    with pytest.raises(BadInput) as e:
        load_state(state, ckpt)
    assert "optimizer.pt holds objects other than tensors and numbers; refused, nothing was loaded" in str(e.value)
    assert e.value.where.endswith("optimizer.pt")
    assert not marker.exists()
    assert _same(before, _weights(state))  # refused before anything was restored


@pytest.mark.parametrize("tamper, words", [
    ("flip-model-byte", "model.safetensors: sha256 differs from manifest.json"),
    ("pickle-optimizer", "optimizer.pt: sha256 differs from manifest.json"),
    ("extra-file", "extra.pt: not listed in manifest.json"),
    ("missing-file", "scheduler.json: missing"),
    ("broken-manifest", "unreadable manifest"),
    ("escaping-entry", "../outside.txt: a manifest entry outside the folder"),
])
def test_tampered_checkpoint_is_refused_before_any_load(checkpoint, tmp_path, tamper, words):
    ckpt, state = checkpoint
    marker = tmp_path / "marker"
    if tamper == "flip-model-byte":
        data = bytearray((ckpt / "model.safetensors").read_bytes())
        data[len(data) // 2] ^= 0x01
        (ckpt / "model.safetensors").write_bytes(bytes(data))
    elif tamper == "pickle-optimizer":
        _plant_pickle(ckpt, marker)
    elif tamper == "extra-file":
        torch.save({"payload": Payload(marker)}, ckpt / "extra.pt")
    elif tamper == "missing-file":
        (ckpt / "scheduler.json").unlink()
    elif tamper == "broken-manifest":
        (ckpt / "manifest.json").write_text('{"files": {"model.safetensors": ')
    elif tamper == "escaping-entry":
        (tmp_path / "outside.txt").write_text("x")
        m = json.loads((ckpt / "manifest.json").read_text())
        m["files"]["../outside.txt"] = {"sha256": "0" * 64, "bytes": 1}
        (ckpt / "manifest.json").write_text(json.dumps(m))
    before = _weights(state)
    assert not is_complete(ckpt)
    with pytest.raises(BadInput) as e:
        load_state(state, ckpt)
    assert words in str(e.value) and "nothing was loaded" in str(e.value)
    assert e.value.where == str(ckpt)
    assert not marker.exists()
    assert _same(before, _weights(state))


# --- model folders and campaign files ---------------------------------------------------------------------
def _model_folder(tmp_path) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path / "model"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**{k: v for k, v in TINY_LLAMA.items() if k != "model_type"})).save_pretrained(
        folder, safe_serialization=True)
    return folder


def _campaign_on(tmp_path, model: Path, **model_keys) -> Path:
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100), train__updates=2)
    c = yaml.safe_load(path.read_text())
    c["model"] = {"path": str(model), "tokenizer": "byte", **model_keys}
    return write_campaign(tmp_path, c)


def test_pickled_weights_in_a_model_folder_never_run(cli, tmp_path):
    model = _model_folder(tmp_path)
    marker = tmp_path / "marker"
    path = _campaign_on(tmp_path, model)
    torch.save({"payload": Payload(marker)}, model / "pytorch_model.bin")
    r = cli("train", path, "--home", tmp_path / "home", "--json")  # safetensors beside it: those are loaded
    assert r.code == 0, r.err[-2000:]
    assert not marker.exists()
    (model / "model.safetensors").unlink()  # pickle only: refused before transformers sees the folder
    r = cli("train", path, "--home", tmp_path / "home")
    assert r.code == 2 and "pickle-based weights (pytorch_model.bin)" in r.err and "model.path" in r.err
    assert not marker.exists()


def test_yaml_tags_that_build_objects_are_refused(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8))
    marker = tmp_path / "marker"
    text = path.read_text().replace("name: tiny", f"name: !!python/object/apply:builtins.open ['{marker}', 'w']")
    path.write_text(text)
    r = cli("validate", path)
    assert r.code == 2, r.err
    assert f"{path}:1" in r.err and "could not determine a constructor for the tag" in r.err
    assert "Traceback" not in r.err
    assert not marker.exists()


# --- archives ---------------------------------------------------------------------------------------------
def _tar_with(path: Path, *members: tuple[str, bytes]) -> Path:
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


@pytest.mark.parametrize("name, words", [
    ("run/./../evil.txt", "climbs out of the target folder"),
    ("C:/evil.txt", "absolute path"),
    ("run\\..\\evil.txt", "climbs out"),
    ("//evil.txt", "absolute path"),
])
def test_extract_refuses_more_escaping_names(tmp_path, name, words):
    archive = _tar_with(tmp_path / "bad.tar.gz", ("run/ok.txt", b"ok"), (name, b"x"))
    with pytest.raises(BadInput) as e:
        extract(archive, tmp_path / "target")
    assert words in str(e.value)
    assert not (tmp_path / "evil.txt").exists() and not list((tmp_path / "target").rglob("*"))


def test_extract_refuses_a_link_then_a_file_through_it(tmp_path):
    """The classic two-step escape: a symlink to a folder outside, then a file written 'inside' it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    archive = tmp_path / "bad.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        link = tarfile.TarInfo("run/escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(outside)
        tar.addfile(link)
        f = tarfile.TarInfo("run/escape/evil.txt")
        f.size = 1
        tar.addfile(f, io.BytesIO(b"x"))
    with pytest.raises(BadInput, match="is a link"):
        extract(archive, tmp_path / "target")
    assert not list(outside.iterdir())


def test_extract_accepts_the_dot_member_tar_writes(tmp_path):
    """`tar -C dir -czf x.tgz .` starts with './': the target itself, not an error (was an IndexError)."""
    archive = _tar_with(tmp_path / "dot.tar.gz", ("./", None), ("./run/", None), ("./run/a.txt", b"hello"))
    files = extract(archive, tmp_path / "target")
    assert [p.relative_to(tmp_path / "target").as_posix() for p in files] == ["run/a.txt"]
    assert (tmp_path / "target" / "run" / "a.txt").read_bytes() == b"hello"


@pytest.mark.parametrize("member", ["../evil.txt", "/tmp/evil.txt", "run/ok.txt"])
def test_zip_files_are_refused(tmp_path, member):
    archive = tmp_path / "run.tar.gz"  # a zip under a tar name: never unpacked by another reader
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr(member, "x")
    with pytest.raises(BadInput) as e:
        extract(archive, tmp_path / "target")
    assert "cannot read the archive" in str(e.value) and str(archive) in str(e.value)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "target").exists()


def test_archive_refuses_to_pack_a_link(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path, simple_records(8), simple_records(4, 100), train__updates=1)
    home = tmp_path / "home"
    r = cli("train", path, "--home", home, "--json")
    assert r.code == 0, r.err[-2000:]
    run_id = r.json["data"]["run_id"]
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the backup")
    os.symlink(secret, home / "runs" / run_id / "notes.txt")
    r = cli("archive", run_id, "--home", home, "--out", tmp_path / "b.tar.gz")
    assert r.code == 2 and "notes.txt is a link" in r.err
    assert not (tmp_path / "b.tar.gz").exists()


# --- trust_remote_code ------------------------------------------------------------------------------------
CUSTOM_CONFIG = '''
from pathlib import Path

from transformers import LlamaConfig as _Base

Path({marker!r}).write_text("the model folder's code ran")


class LlamaConfig(_Base):  # the folder's own code, under the built-in class name so the Auto classes map it
    pass
'''


def test_model_code_runs_only_when_the_campaign_trusts_it(tmp_path):
    model = _model_folder(tmp_path)
    marker = tmp_path / "marker"
    (model / "configuration_custom.py").write_text(CUSTOM_CONFIG.format(marker=str(marker)))
    cfg = json.loads((model / "config.json").read_text())
    cfg["auto_map"] = {"AutoConfig": "configuration_custom.LlamaConfig"}
    (model / "config.json").write_text(json.dumps(cfg))
    env = {"HF_MODULES_CACHE": str(tmp_path / "hf-modules"), "HF_HOME": str(tmp_path / "hf")}
    home = tmp_path / "home"

    off = _campaign_on(tmp_path / "off", model)
    p = run_cli_process("train", off, "--home", home, "--json", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not marker.exists()  # the code is in the folder, but the default never runs it
    run_off = json.loads(p.stdout)["data"]["run_id"]

    on = _campaign_on(tmp_path / "on", model, trust_remote_code=True)
    p = run_cli_process("validate", on, env=env)
    assert "model.trust_remote_code=true: code in the model folder will run" in p.stdout + p.stderr
    p = run_cli_process("train", on, "--home", home, "--json", env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    assert marker.exists()
    run_on = json.loads(p.stdout)["data"]["run_id"]

    db = sqlite3.connect(home / "journal.sqlite")
    rows = dict(db.execute("SELECT run_id, trust_remote_code FROM runs").fetchall())
    config = dict(db.execute("SELECT run_id, config_json FROM runs").fetchall())
    db.close()
    assert rows == {run_off: 0, run_on: 1}
    assert json.loads(config[run_on])["model"]["trust_remote_code"] is True
    assert json.loads(config[run_off])["model"]["trust_remote_code"] is False
    assert json.loads((home / "runs" / run_on / "revisions.json").read_text())["trust_remote_code"] is True
    shown = run_cli_process("show", run_on, "--home", home)
    assert "trust_remote_code: ON (model code from the model folder ran)" in shown.stdout
    assert "trust_remote_code" not in run_cli_process("show", run_off, "--home", home).stdout
    shutil.rmtree(tmp_path / "hf-modules", ignore_errors=True)
