"""A Hugging Face hub cache laid out in a temp dir as huggingface_hub writes it: models--ORG--NAME/blobs/SHA (the
files' bytes), snapshots/COMMIT/NAME -> ../../blobs/SHA (symlinks), refs/main (the commit). No network."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

# Llama-3.2-1B's published config.json (meta-llama/Llama-3.2-1B): a real 1B model's architecture
LLAMA_32_1B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": True, "vocab_size": 128256,
}


def shared_tokenizer() -> Path:
    from conftest import SHARED_DATA

    return SHARED_DATA / "tiny_bpe_tokenizer.json"


def add_model(cache: Path, repo_id: str, files: dict[str, bytes], commit: str | None = None,
              ref: str = "main") -> Path:
    """Lay out one model revision; returns its snapshot folder."""
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    commit = commit or hashlib.sha1(repo_id.encode() + b"".join(files[k] for k in sorted(files))).hexdigest()
    snap = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (folder / "refs").mkdir(exist_ok=True)
    for name, data in files.items():
        sha = hashlib.sha256(data).hexdigest()
        (folder / "blobs" / sha).write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(folder / "blobs" / sha, link.parent), link)
    (folder / "refs" / ref).write_text(commit)
    return snap


def tokenizer_files() -> dict[str, bytes]:
    return {"tokenizer.json": shared_tokenizer().read_bytes(),
            "tokenizer_config.json": json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                 "eos_token": "<|endoftext|>", "bos_token": None}).encode()}


def config_only(cache: Path, repo_id: str = "meta-llama/Llama-3.2-1B", config: dict | None = None) -> Path:
    """A model whose config.json and tokenizer alone are cached (no weights)."""
    files = {"config.json": json.dumps(config or LLAMA_32_1B).encode(), **tokenizer_files()}
    return add_model(cache, repo_id, files)


def config_json_only(cache: Path, repo_id: str, config: dict) -> Path:
    """A model whose config.json alone is cached: no tokenizer, no weights (``hf download ORG/NAME config.json``)."""
    return add_model(cache, repo_id, {"config.json": json.dumps(config).encode()})


def saved_model(cache: Path, repo_id: str, folder: Path) -> Path:
    """A model saved with save_pretrained in ``folder``, put into the cache as a hub download would."""
    files = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}
    return add_model(cache, repo_id, files)
