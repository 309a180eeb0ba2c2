"""`pilotrun env`: the software-stack report, human and --json, and reading it back as a target env."""

import json

import pytest

from pilotrun.sheet.stack import read_target_env
from pilotrun.rehearsal.rental.env import ENV_KEYS, collect_env, env_lines


def test_env_json_has_the_keys(cli):
    r = cli("env", "--json")
    assert r.code == 0, r.err
    data = r.json["data"]
    assert set(ENV_KEYS) <= set(data)
    assert {"version", "cuda", "cudnn", "nccl"} <= set(data["torch"])
    assert {"available", "device_count"} <= set(data["cuda"])
    assert {"cuda", "cpu"} == set(data["bf16"])
    assert {"sdpa", "flash_sdp_kernel", "flash_attn_package"} <= set(data["attention"])
    assert {"transformers", "peft", "safetensors"} <= set(data["packages"])
    assert data["packages"]["transformers"] and data["packages"]["safetensors"]
    assert {"gloo", "nccl", "mpi"} <= set(data["distributed"]) and data["distributed"]["gloo"] is True
    import torch

    assert data["torch"]["version"] == torch.__version__
    for d in data["devices"]:
        assert {"name", "memory_bytes", "compute_capability", "bf16"} <= set(d)


def test_env_human_form_says_no_cuda_on_a_cpu_machine(cli):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    r = cli("env")
    assert r.code == 0
    assert "no CUDA" in r.out and "torch " in r.out and "gloo yes" in r.out
    lines = env_lines(collect_env())
    assert any(line.startswith("no CUDA:") for line in lines)


def test_env_json_reads_back_as_a_target_env(cli, tmp_path):
    out = tmp_path / "target-env.json"
    out.write_text(cli("env", "--json").out)
    env = read_target_env(out)
    assert env["torch"]["version"] and "devices" in env
    (tmp_path / "raw.json").write_text(json.dumps(env))  # the bare data form reads too
    assert read_target_env(tmp_path / "raw.json") == env
