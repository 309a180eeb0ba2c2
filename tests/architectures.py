"""The architectures people fine-tune, tiny: each family built from transformers' own config class (2 layers,
64 wide, or deeper to reach the counted path), saved with save_pretrained beside a real byte-level BPE
tokenizer that has no pad token and uses one id for eos, bos and unk (as GPT-2's does), loaded back through
model.path as a user's model folder is."""

from __future__ import annotations

from pathlib import Path

from conftest import SHARED_DATA, write_campaign, write_jsonl

VOCAB = 2048  # the shared BPE's 2003 tokens fit
POSITIONS = 256

# family → (config class's model_type, keys, task); every width 64, heads 4
DECODERS = {
    "gpt2": {"n_embd": 64, "n_head": 4, "n_positions": POSITIONS},  # tied; Conv1D projections
    "gpt_neox": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                 "max_position_embeddings": POSITIONS},  # untied
    "qwen2": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": POSITIONS, "tie_word_embeddings": True},
    "mistral": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": POSITIONS},
    "phi3": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
             "max_position_embeddings": POSITIONS, "original_max_position_embeddings": POSITIONS,
             "pad_token_id": None},  # the class's default pad id (32000) lies outside a small vocabulary
    "gemma2": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
               "head_dim": 16, "max_position_embeddings": POSITIONS, "sliding_window": 128},
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_attention_heads": 4, "word_embed_proj_dim": 64,
            "max_position_embeddings": POSITIONS},
    "bloom": {"hidden_size": 64, "n_head": 4},  # ALiBi: no position limit
}
ENCODERS = {
    "distilbert": {"dim": 64, "hidden_dim": 128, "n_heads": 4, "max_position_embeddings": POSITIONS},
    "roberta": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                "max_position_embeddings": POSITIONS + 2},  # positions counted from padding_idx (1)
    "deberta-v2": {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
                   "max_position_embeddings": POSITIONS},
}
# mixtures of experts: 4 experts, 2 per token (Llama 4: 1, its shared expert beside), 32 wide each; DeepSeek's
# first layer dense (first_k_dense_replace), its attention low-rank (MLA); Qwen2-MoE a shared expert
_MOE = {"hidden_size": 64, "num_attention_heads": 4, "max_position_embeddings": POSITIONS, "num_experts_per_tok": 2}
MOE = {
    "mixtral": {**_MOE, "intermediate_size": 96, "num_key_value_heads": 2, "num_local_experts": 4},
    "qwen3_moe": {**_MOE, "intermediate_size": 96, "moe_intermediate_size": 32, "num_key_value_heads": 2,
                  "head_dim": 16, "num_experts": 4},
    "olmoe": {**_MOE, "intermediate_size": 32, "num_key_value_heads": 4, "num_experts": 4},
    "deepseek_v3": {**_MOE, "intermediate_size": 96, "moe_intermediate_size": 32, "num_key_value_heads": 4,
                    "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16,
                    "q_lora_rank": 24, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16, "n_group": 1,
                    "topk_group": 1},
    "qwen2_moe": {**_MOE, "intermediate_size": 96, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
                  "num_key_value_heads": 2, "num_experts": 4},
    "deepseek_v2": {**_MOE, "intermediate_size": 96, "moe_intermediate_size": 32, "num_key_value_heads": 4,
                    "n_routed_experts": 4, "n_shared_experts": 1, "first_k_dense_replace": 1, "kv_lora_rank": 16,
                    "q_lora_rank": None, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
                    "n_group": 1, "topk_group": 1},
    "granitemoe": {**_MOE, "intermediate_size": 32, "num_key_value_heads": 4, "num_local_experts": 4},
    "gpt_oss": {**_MOE, "intermediate_size": 32, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
                "sliding_window": 64, "rope_parameters": {"rope_type": "default", "rope_theta": 150000.0}},
    "llama4_text": {**_MOE, "intermediate_size": 32, "intermediate_size_mlp": 96, "num_key_value_heads": 2,
                    "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 1},
}
DEPTH_KEY = {"gpt2": "n_layer", "bloom": "n_layer", "distilbert": "n_layers"}
# the attention projections by their real names (what a user writes in model.adapter.target_modules)
ATTENTION = {"gpt2": ["c_attn"], "gpt_neox": ["query_key_value"], "qwen2": ["q_proj", "v_proj"],
             "mistral": ["q_proj", "v_proj"], "phi3": ["qkv_proj"], "gemma2": ["q_proj", "v_proj"],
             "opt": ["q_proj", "v_proj"], "bloom": ["query_key_value"], "distilbert": ["q_lin", "v_lin"],
             "roberta": ["query", "value"], "deberta-v2": ["query_proj", "value_proj"]}
# an MoE's default LoRA: its attention (PEFT's q/v where it names the family), never the experts or the router
ATTENTION.update({f: ["q_proj", "v_proj"] for f in MOE})
ATTENTION.update({"deepseek_v3": ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"],
                  "deepseek_v2": ["q_proj", "kv_a_proj_with_mqa", "kv_b_proj"]})
FAMILIES = list(DECODERS) + list(ENCODERS)
LABELS = ["neg", "pos"]


def tokenizer():
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_file=str(SHARED_DATA / "tiny_bpe_tokenizer.json"),
                                  eos_token="<|endoftext|>", bos_token="<|endoftext|>", unk_token="<|endoftext|>")
    assert tok.pad_token is None and tok.unk_token_id == tok.eos_token_id
    return tok


def save_model(folder: Path, family: str, *, layers: int = 2, seq_cls: bool | None = None, **keys) -> Path:
    """The family's tiny model and the tokenizer in ``folder`` (save_pretrained both), random weights under seed 0."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    seq_cls = family in ENCODERS if seq_cls is None else seq_cls
    cfg = dict(DECODERS.get(family) or MOE.get(family) or ENCODERS[family], vocab_size=VOCAB, **keys)
    cfg[DEPTH_KEY.get(family, "num_hidden_layers")] = layers
    tok = tokenizer()
    if not seq_cls:
        cfg.update(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    config = AutoConfig.for_model(family, **cfg)
    if seq_cls:
        config.num_labels = len(LABELS)
    torch.manual_seed(0)
    auto = AutoModelForSequenceClassification if seq_cls else AutoModelForCausalLM
    auto.from_config(config).save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder


def causal_records(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "instruction": f"reverse the word number {i}" + " please" * (i % 4),
             "output": f"{i} rebmun drow eht" + " yes" * (i % 3)} for i in range(start, start + n)]


def cls_records(n: int, start: int = 0) -> list[dict]:
    return [{"id": i, "text": ("a fine day " if i % 2 else "a sad night ") + "word " * (i % 5) + str(i),
             "label": LABELS[i % 2]} for i in range(start, start + n)]


def campaign(folder: Path, model: Path, *, seq_cls: bool, **overrides) -> Path:
    """A short campaign on the model folder: 4 updates, validation every 2."""
    if seq_cls:
        write_jsonl(folder / "data" / "train.jsonl", cls_records(24))
        write_jsonl(folder / "data" / "validation.jsonl", cls_records(8, 100))
        data = {"text": "text", "label": "label", "labels": LABELS}
    else:
        write_jsonl(folder / "data" / "train.jsonl", causal_records(24))
        write_jsonl(folder / "data" / "validation.jsonl", causal_records(8, 100))
        data = {"prompt": "instruction", "response": "output"}
    c = {
        "name": "arch", "seed": 0, "task": "seq-cls" if seq_cls else "causal-lm",
        "model": {"path": str(model)},
        "data": {"train": "data/train.jsonl", "validation": "data/validation.jsonl", "max_length": 48, **data},
        "train": {"micro_batch": 2, "accumulation": 2, "lr": 1e-3, "updates": 4, "eval_every": 2,
                  "save_every": 2, "eval_batch": 4},
        "plan": {"seeds": [0]},
    }
    for key, value in overrides.items():
        section, _, leaf = key.partition("__")
        c.setdefault(section, {})[leaf] = value
    return write_campaign(folder, c)
