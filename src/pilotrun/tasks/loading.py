"""Tokenizers and models from local folders or configs; never from a hub."""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from pilotrun.console.progress import spending
from pilotrun.errors import BadInput, BadInputs
from pilotrun.journal.base_identity import ATTR, describe_base
from pilotrun.journal.files import reading_weights
from pilotrun import jsonsafe
from pilotrun.provenance import file_identity
from pilotrun.startup import LIBRARY_ENV_DEFAULTS
from pilotrun.tasks.hub import fetch_command, missing_weights, snapshot_of
from pilotrun.tasks.moe import moe_parts
from pilotrun.tasks import quantized

for _k, _v in LIBRARY_ENV_DEFAULTS.items():
    os.environ.setdefault(_k, _v)

_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}


VERBOSE_ENV = "PILOTRUN_VERBOSE"  # set by `pilotrun --verbose`; child processes inherit it

# set inside ``architecture_only``: the config keys to change (a depth), {} for none
_ARCHITECTURE_ONLY: ContextVar[dict | None] = ContextVar("pilotrun_architecture_only", default=None)


@contextmanager
def architecture_only(overrides: dict | None = None):
    """Inside, ``build_model`` builds the architecture it would load without reading weights: the same
    config (model.path's config.json with the same fills, or model.config), ``from_config`` instead of
    ``from_pretrained``, with ``overrides`` (the depths the estimator counts from) set in the config's
    keys before it is made. The estimator's fake build is this under fake tensors: pilot, train and
    estimate share one builder, so they build one model."""
    token = _ARCHITECTURE_ONLY.set(dict(overrides or {}))
    try:
        yield
    finally:
        _ARCHITECTURE_ONLY.reset(token)


@contextmanager
def quiet_transformers():
    """transformers' per-load report, progress bars and deprecation notices (FutureWarning, e.g. peft reading
    ``is_gradient_checkpointing``) are hidden unless ``--verbose``: they print on every build (three times
    per ``overfit``, once per traced option of ``sheet``) and say nothing the campaign did not choose."""
    if os.environ.get(VERBOSE_ENV):
        yield
        return
    import warnings

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"(transformers|peft)(\.|$)")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def torch_dtype(name: str):
    import torch

    return getattr(torch, _DTYPES[name])


def weights_dtype(model_dtype: str, precision: str) -> str:
    """The dtype the trained weights are held in (``_finish`` casts them to bf16 under bf16-true): a reload's."""
    return "bfloat16" if precision == "bf16-true" else model_dtype


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt")


def no_tokenizer_folder(path: Path) -> BadInput:
    """model.tokenizer naming no folder: a file of a tokenizer folder (named with the folder), a tokenizers JSON file
    saved alone (``Tokenizer.save``: to put in a folder as tokenizer.json), else not found."""
    if path.is_file() and path.name in TOKENIZER_FILES:
        return BadInput(f"{path} is a file of the tokenizer folder {path.parent}, not the folder",
                        where="model.tokenizer", fix=f"set model.tokenizer to the folder: {path.parent}")
    if path.is_file() and path.suffix.lower() == ".json":
        return BadInput(f"{path} is a file, not a tokenizer folder", where="model.tokenizer",
                        fix="a tokenizer saved alone (tokenizers' Tokenizer.save) is read from a folder holding it as "
                            "tokenizer.json: copy it there and set model.tokenizer to that folder")
    return BadInput(f"tokenizer folder not found: {path}", where="model.tokenizer",
                    fix="point at a folder written by tokenizer.save_pretrained, or use 'byte'")


def load_tokenizer(c) -> Any:
    """The campaign's tokenizer: "byte" is transformers' ByT5Tokenizer, otherwise a local folder."""
    spec = c.model.tokenizer or c.model.path
    if spec is None:
        raise BadInput("no tokenizer: model.config builds a model but names no tokenizer", where="model.tokenizer",
                       fix="set model.tokenizer: byte (built-in byte-level) or a local tokenizer folder")
    if spec == "byte":
        from transformers import ByT5Tokenizer

        return ByT5Tokenizer()
    path = Path(spec)
    if not path.is_dir():
        raise no_tokenizer_folder(path)
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), local_files_only=True,
                                             trust_remote_code=c.model.trust_remote_code)
    except Exception as e:
        raise BadInput(f"cannot load the tokenizer from {path}: {e}", where="model.tokenizer",
                       fix="the folder needs tokenizer.json or the tokenizer's vocabulary files") from None


_SHARED_TOKENIZERS: dict[tuple, Any] = {}  # (spec, trust_remote_code, its files' file_identity) -> tokenizer


def shared_tokenizer(c) -> Any:
    """``load_tokenizer``'s tokenizer, loaded once a process per folder as it stands (each file's
    ``provenance.file_identity``) and handed to every caller: for builds that only read it (the estimator's fake
    builds: the options table built a task, and loaded SmolLM2-135M's tokenizer, 0.1–0.3 s, for each of its ~19
    traces). A task that tokenizes loads its own (``load_tokenizer``)."""
    spec = c.model.tokenizer or c.model.path
    folder = Path(spec) if spec not in (None, "byte") and Path(spec).is_dir() else None
    files = tuple((f.name, file_identity(f.stat())) for f in sorted(folder.iterdir()) if f.is_file()) if folder else ()
    key = (spec, c.model.trust_remote_code, files)
    if key not in _SHARED_TOKENIZERS:
        _SHARED_TOKENIZERS[key] = load_tokenizer(c)
        while len(_SHARED_TOKENIZERS) > 8:
            _SHARED_TOKENIZERS.pop(next(iter(_SHARED_TOKENIZERS)))
    return _SHARED_TOKENIZERS[key]


def eos_id(tokenizer) -> int:
    eos = tokenizer.eos_token_id
    if eos is None:
        raise BadInput("the tokenizer sets no EOS token, so the model cannot learn to stop", where="model.tokenizer",
                       fix="set tokenizer.eos_token (e.g. '<|endoftext|>') and save_pretrained the tokenizer again")
    return int(eos)


def leading_specials(tokenizer) -> list[int]:
    """The special tokens ``tokenizer(text)`` puts before the text (a BOS for Llama-style tokenizers, none
    for SmolLM2 or ByT5), so a training example starts as an inference prompt does."""
    sample = "Hello"
    plain = list(tokenizer(sample, add_special_tokens=False)["input_ids"])
    full = list(tokenizer(sample)["input_ids"])
    for i in range(len(full) - len(plain) + 1):
        if full[i: i + len(plain)] == plain:
            return full[:i]
    return []


def pad_id(tokenizer) -> int:
    """The pad id; a tokenizer without one pads with EOS (positions are masked by the attention mask)."""
    return int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else eos_id(tokenizer)


POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
# families whose positions are rows of a learned table: a sequence longer than the table indexes past it
# ("IndexError: index out of range in self"). Rotary and ALiBi families (Llama, Qwen2, Mistral, Phi-3,
# Gemma-2, GPT-NeoX, BLOOM) run past max_position_embeddings: the length they were trained to, not an index.
LEARNED_POSITIONS = ("gpt2", "gpt_neo", "gpt_bigcode", "opt", "biogpt", "bert", "distilbert", "roberta",
                     "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "electra", "albert",
                     "megatron-bert", "longformer", "ibert", "mpnet", "deberta", "deberta-v2", "bart", "mbart")
# positions counted on from padding_idx: rows 0..padding_idx of the table are never a position
PADDED_POSITIONS = ("roberta", "xlm-roberta", "xlm-roberta-xl", "camembert", "data2vec-text", "longformer", "ibert")


def _reader(cfg):
    return cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))


def positions_of(cfg) -> tuple[str, int] | None:
    """(key, value) of the first position key a config (dict or object) sets, else None."""
    get = _reader(cfg)
    for k in POSITION_KEYS:
        v = get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return k, v
    return None


def position_limit(cfg) -> tuple[int, str] | None:
    """The longest sequence a model with a learned position table takes, and where that is said (``n_positions
    32``), from its config (dict or object); None for rotary/ALiBi families or when the config says nothing."""
    get = _reader(cfg)
    kind = get("model_type")
    if kind not in LEARNED_POSITIONS or get("position_embedding_type") not in (None, "absolute"):
        return None
    if kind.startswith("deberta") and not get("position_biased_input", True):
        return None  # relative positions only (DeBERTa-v3)
    found = positions_of(cfg)
    if found is None:
        return None
    key, n = found
    if kind in PADDED_POSITIONS:
        pad = get("pad_token_id", 1)
        pad = 1 if pad is None else int(pad)
        return n - pad - 1, f"{key} {n} less padding_idx {pad} + 1"
    return n, f"{key} {n}"


def check_max_length(c, cfg, source: str) -> None:
    """data.max_length against the model's position limit (``cfg``: its config, ``source``: where it was read)."""
    found = position_limit(cfg)
    if found is None or c.data.max_length <= found[0]:
        return
    limit, said = found
    raise BadInput(f"{c.data.max_length} tokens, but the model takes at most {limit} positions ({said}, "
                   f"{source}): a longer sequence indexes past its position table", where="data.max_length",
                   fix=f"set data.max_length: {limit} (or less), or use a model with more positions")


def folder_config_dict(path: Path) -> dict | None:
    """config.json of a model folder as a dict (no transformers, no torch); None when it cannot be read."""
    try:
        cfg = jsonsafe.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return cfg if isinstance(cfg, dict) else None


# a model config's structural sizes, under the names the common families give them: each a positive whole number
# where set. transformers builds a model of 0 or -1 decoder layers, a 0-wide MLP or a 0-long position table without a
# word; the first forward then fails deep inside (or trains nothing at all)
SIZE_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
             "num_key_value_heads", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_positions",
             "n_inner", "d_model", "num_layers", "num_heads", "d_ff", "ffn_dim")


def architecture_problems(c) -> list[BadInput]:
    """The model's config as written (model.config with model.config_overrides, or model.path's config.json), read
    without transformers: every structural size (``SIZE_KEYS``) a positive whole number, and the attention heads a
    whole number of groups of the key/value heads (grouped-query attention repeats each key/value head for a group)."""
    if c.model.path:
        cfg = folder_config_dict(Path(c.model.path))
        source = f"{Path(c.model.path) / 'config.json'}"
    else:
        cfg, source = (c.model.config if isinstance(c.model.config, dict) else None), "model.config"
    if cfg is None:
        return []
    overrides = c.model.config_overrides or {}
    cfg = {**cfg, **overrides}

    def where(key: str) -> str:
        if key in overrides:
            return f"model.config_overrides.{key}"
        return f"model.config.{key}" if source == "model.config" else f"{source}: {key}"

    out = []
    for key in SIZE_KEYS:
        v = cfg.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v <= 0):
            out.append(BadInput(f"{key} is {v!r}: a model's {key} is a positive whole number", where=where(key),
                                fix=f"set {key} to the size of the model you mean to rehearse, or leave it out for "
                                    "the model_type's default"))
    heads, groups = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if not out and isinstance(heads, int) and isinstance(groups, int) and heads % groups:
        divisors = ", ".join(str(d) for d in range(1, heads + 1) if heads % d == 0)
        out.append(BadInput(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {groups}: each "
                            "key/value head serves a whole group of query heads", where=where("num_key_value_heads"),
                            fix=f"set num_key_value_heads to a divisor of {heads} ({divisors})"))
    return out


def check_positions(c, defaults: bool = True) -> None:
    """data.max_length against the model's position limit before anything is built: config.json of model.path,
    or model.config with its class's defaults for what it leaves out (``defaults``: transformers is imported
    for them; without, only the keys model.config sets are read)."""
    if c.model.path:
        cfg = folder_config_dict(Path(c.model.path))
        if cfg is not None:
            check_max_length(c, cfg, f"{Path(c.model.path) / 'config.json'}")
    elif isinstance(c.model.config, dict) and c.model.config.get("model_type") in LEARNED_POSITIONS:
        cfg = dict(c.model.config)
        if positions_of(cfg) is None:
            if not defaults:
                return
            from transformers import AutoConfig

            try:
                cfg = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
            except Exception:
                return  # an invalid model.config is reported where the model is built
            check_max_length(c, cfg, f"the {cfg.model_type} default, model.config does not set it")
            return
        check_max_length(c, cfg, "model.config")


def check_config_json(path: Path) -> dict:
    """A model folder's config.json as a JSON object, each key once; anything else (damaged, a list, a string, a key
    twice) is exit 2 naming the file, before any stage builds or traces the model."""
    try:
        cfg = jsonsafe.loads(path.read_text(encoding="utf-8"), object_pairs_hook=jsonsafe.object_once)
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read {path.name}: {e}", where=str(path),
                       fix="check the file's permissions, or write it again with save_pretrained") from None
    except jsonsafe.KeyTwice as e:  # transformers keeps the last: num_hidden_layers given twice builds the second
        raise BadInput(f"{path.name} gives {e.key!r} twice in one object; transformers would keep the last, silently",
                       where=str(path), fix=f"keep one {e.key!r} (the value the model was saved with)") from None
    except ValueError as e:
        raise BadInput(f"{path.name} is not valid JSON ({e})", where=str(path),
                       fix="write it again with model.save_pretrained (or repair the JSON by hand)") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path.name} holds a JSON {type(cfg).__name__}, not an object of the model's settings",
                       where=str(path), fix='config.json is one JSON object ({"model_type": ..., ...}): write it '
                                             "again with model.save_pretrained")
    return cfg


_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def check_safetensors(path: Path) -> dict:
    """A weights file whose header parses and whose tensors all lie within the file, each exactly as long as its
    dtype and shape say (a truncated copy, a garbage header, a renamed pickle): exit 2 naming the file before any
    run exists. Reads the header only (no torch); returns it."""
    import math

    def bad(why: str) -> BadInput:
        return BadInput(f"the weights file is damaged: {why}; nothing was loaded", where=str(path),
                        fix="copy the model folder again (or write it again with save_pretrained); a partial "
                            "download or copy leaves a file like this")

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            n = int.from_bytes(head, "little") if len(head) == 8 else -1
            if n < 2 or 8 + n > size:
                raise bad(f"its header claims {n} bytes, the file has {size}")
            header = jsonsafe.loads(f.read(n))
    except OSError as e:
        raise BadInput(f"cannot read the weights: {e.strerror}", where=str(path),
                       fix="check the file's permissions") from None
    except (ValueError, UnicodeDecodeError):
        raise bad("its header is not the JSON safetensors writes (not a safetensors file?)") from None
    if not isinstance(header, dict):
        raise bad("its header is not a JSON object")
    end = 0
    for name, t in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in t["data_offsets"])
            want = math.prod(int(d) for d in t["shape"]) * _ITEMSIZE.get(t["dtype"], 0)
        except (KeyError, TypeError, ValueError):
            raise bad(f"tensor {name!r} has no valid dtype, shape and offsets") from None
        if t["dtype"] in _ITEMSIZE and stop - start != want:
            raise bad(f"tensor {name!r} takes {stop - start} bytes, its {t['dtype']} shape {t['shape']} needs {want}")
        end = max(end, stop)
    if 8 + n + end != size:
        raise bad(f"its tensors end at byte {8 + n + end}, the file has {size} (truncated or padded)")
    return header


def _adapter_folder(path: Path) -> BadInput:
    """model.path naming a PEFT adapter's folder (adapter_config.json and its weights, no config.json): a campaign
    trains from a base model; "no config.json … save the model with save_pretrained" sent the user to save it
    again."""
    try:
        cfg = jsonsafe.loads((path / "adapter_config.json").read_bytes())
    except (OSError, ValueError):
        cfg = {}
    cfg = cfg if isinstance(cfg, dict) else {}
    base = cfg.get("base_model_name_or_path")
    said = f", trained on {base}" if isinstance(base, str) and base else ""
    lora = ", ".join(f"{k}: {cfg[s]}" for k, s in (("r", "r"), ("alpha", "lora_alpha")) if cfg.get(s) is not None)
    return BadInput(f"{path} is a PEFT adapter's folder ({cfg.get('peft_type') or 'adapter'}{said}), not a model: "
                    "a campaign trains from a base model", where="model.path",
                    fix=(f"set model.path to its base ({base})" if said else "set model.path to its base model")
                        + (f" and model.adapter to {{{lora}}} to rehearse training an adapter like it" if lora else "")
                        + "; to train on from this adapter, merge it into the base first (PeftModel.from_pretrained"
                          "(base, folder).merge_and_unload().save_pretrained(merged)) and name the merged folder")


def _a_file(path: Path) -> BadInput:
    """model.path naming a file: one of a model folder's (its weights, its config.json), said with the folder to
    name; a GGUF file (llama.cpp's), said with the folder to start from. It was "model folder not found" of a file
    that is there."""
    if path.suffix.lower() == ".gguf":
        return BadInput(f"{path} is a GGUF file (llama.cpp's format, quantised for inference), not a Hugging Face "
                        "model folder", where="model.path",
                        fix="fine-tune from the Hugging Face folder it was converted from (its hub id, usually the "
                            "GGUF's without -GGUF), or dequantise it into one: transformers' "
                            f"AutoModelForCausalLM.from_pretrained(folder, gguf_file={path.name!r}) loads it, and its "
                            "state_dict loads into AutoModelForCausalLM.from_config(its config without "
                            "quantization_config), which save_pretrained writes; AutoTokenizer reads its tokenizer "
                            "the same way")
    if (path.parent / "config.json").is_file():
        return BadInput(f"{path} is a file of the model folder {path.parent}, not the folder", where="model.path",
                        fix=f"set model.path to the folder: {path.parent}")
    return BadInput(f"{path} is a file, not a model folder", where="model.path",
                    fix="point at a folder written by model.save_pretrained (config.json beside the weights)")


def check_model_dir(path: Path, weights: bool = True) -> None:
    """A model folder with config.json and (unless ``weights`` is false: the estimate, or ``validate`` of a
    hub snapshot) safetensors weights; a cached hub snapshot without them names the missing files."""
    if not path.is_dir():
        if path.is_file():
            raise _a_file(path)
        raise BadInput(f"model folder not found: {path}", where="model.path",
                       fix="point at a folder written by model.save_pretrained (nothing is downloaded)")
    if not (path / "config.json").is_file():
        if (path / "adapter_config.json").is_file():
            raise _adapter_folder(path)
        raise BadInput(f"no config.json in {path}", where="model.path",
                       fix="save the model with save_pretrained, which writes config.json beside the weights")
    check_config_json(path / "config.json")
    if not weights:
        return

    hub = snapshot_of(path)
    lacking = missing_weights(path) if hub else []
    if lacking:
        raise BadInput(f"the cached hub model {hub[0]} (commit {hub[1]}) holds config.json but not its weights: "
                       f"{', '.join(lacking)} missing from {path}; this stage runs the model", where="model.path",
                       fix=f"fetch the weights with `{fetch_command(hub[0])}`; estimate, estimate --options and the "
                           "sheet without a pilot work from config.json alone")
    names = [p.name for p in path.iterdir()]
    if any(n.endswith(".safetensors") or n == "model.safetensors.index.json" for n in names):
        for n in sorted(names):
            if n.endswith(".safetensors"):
                check_safetensors(path / n)
        return
    pickled = [n for n in names if n.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    if pickled:
        raise BadInput(f"{path} holds only pickle-based weights ({', '.join(sorted(pickled))}); pilotrun never "
                       "unpickles weights", where="model.path",
                       fix="convert once with model.save_pretrained(dir, safe_serialization=True) in a trusted session")
    raise BadInput(f"no weights in {path} (no *.safetensors file)", where="model.path",
                   fix="save the model with save_pretrained; or use model.config for random initialisation")


def model_weight_files(path: Path) -> list[Path]:
    """The safetensors files that hold a model folder's weights: the shards its index names, else model.safetensors."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(jsonsafe.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise BadInput(f"{index.name} is not the index save_pretrained writes (no weight_map)", where=str(index),
                           fix="copy the model folder again, or write it again with save_pretrained") from None
        missing = [f for f in files if not (path / f).is_file()]
        if missing:
            raise BadInput(f"{index.name} names weight files the folder lacks: {', '.join(missing)}", where=str(index),
                           fix="copy the missing shards (a partial download or copy leaves a folder like this)")
        return [path / f for f in files]
    return [path / "model.safetensors"] if (path / "model.safetensors").is_file() else []


def _generic_labels(config) -> bool:
    names = list((getattr(config, "id2label", None) or {}).values())
    return all(str(n).startswith("LABEL_") for n in names)


def shape_only() -> bool:
    """True inside ``architecture_only`` (the estimator's and the adapter check's builds: no weights read)."""
    return _ARCHITECTURE_ONLY.get() is not None


def build_model(c, tokenizer, kind: str, labels: list[str] | None = None):
    """The model for a built-in task: loaded from model.path or initialised from model.config (its time is the
    stage's model build, ``progress.spending``)."""
    with spending("model"):
        return _build_model(c, tokenizer, kind, labels)


def _build_model(c, tokenizer, kind: str, labels: list[str] | None):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

    auto = AutoModelForCausalLM if kind == "causal-lm" else AutoModelForSequenceClassification
    dtype = torch_dtype(c.model.dtype)
    shape_only = _ARCHITECTURE_ONLY.get()
    head_kwargs: dict[str, Any] = {}
    if labels is not None:
        head_kwargs = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
                       "label2id": {n: i for i, n in enumerate(labels)}}
    if c.model.path:
        path = Path(c.model.path)
        check_model_dir(path, weights=shape_only is None)  # the architecture alone needs config.json only
        overrides = {**(c.model.config_overrides or {}), **(shape_only or {})}  # a depth counted from wins
        if c.model.config_overrides and not c.model.trust_remote_code:  # config.json read only to check them
            folder_type = (folder_config_dict(path) or {}).get("model_type")
            if isinstance(folder_type, str):
                check_config_keys(folder_type, c.model.config_overrides, "model.config_overrides")
        config = folder_config(path, c.model.trust_remote_code, overrides)
        if labels is not None and _generic_labels(config):
            for k, v in head_kwargs.items():
                setattr(config, k, v)
        if kind == "seq-cls" and getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = pad_id(tokenizer)
        torch.manual_seed(c.seed)  # weights the folder does not hold (a new head) are drawn under the campaign seed
        if shape_only is not None:
            model = _quantized(_from_config(auto, config, c, "model.path").to(dtype), c)
        else:
            model = _from_folder(auto, path, config, c, dtype)
    elif c.model.config:
        cfg = {**c.model.config, **(c.model.config_overrides or {}), **(shape_only or {})}
        model_type = cfg.pop("model_type", None)
        if not model_type:
            raise BadInput("model.config has no model_type", where="model.config",
                           fix="add model_type (e.g. llama, gpt2, bert) to model.config")
        if not c.model.trust_remote_code:
            check_config_keys(model_type, c.model.config, "model.config")
            check_config_keys(model_type, c.model.config_overrides or {}, "model.config_overrides")
        try:
            config = AutoConfig.for_model(model_type, **cfg, **head_kwargs)
        except Exception as e:
            raise BadInput(f"invalid model.config: {e}", where="model.config",
                           fix="use keys of the transformers config class of that model_type") from None
        if kind == "seq-cls":
            config.pad_token_id = pad_id(tokenizer)
        torch.manual_seed(c.seed)
        model = _quantized(_from_config(auto, config, c, "model.config").to(dtype), c)
    else:
        raise BadInput("no model: set model.path (a local model folder) or model.config (random init)",
                       where="model", fix="see `pilotrun init` for both forms")
    return _finish(model, c, tokenizer, kind)


# the settings every config class takes through PretrainedConfig's own keyword arguments
COMMON_CONFIG_KEYS = frozenset({"bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
                                "torch_dtype", "dtype", "use_cache", "tie_word_embeddings", "architectures",
                                "model_type", "transformers_version", "_name_or_path", "num_labels", "auto_map"})
CLOSE = 0.7  # difflib's ratio from which an unknown key reads as a misspelt setting (num_hiden_layers, num_layers)


def misspelt_config_keys(model_type: str, keys) -> list[tuple[str, str]]:
    """(key, the setting it resembles) for each of ``keys`` that ``model_type``'s transformers config class neither
    takes nor reads and that is within ``CLOSE`` of one it does: transformers keeps such a key as a plain attribute
    and builds the model from the default of the setting meant (``num_hiden_layers: 2`` built 32 layers). A key that
    resembles none is left alone (a setting of another transformers version, or one custom code reads)."""
    import difflib

    known = _config_settings(model_type)
    if known is None:
        return []
    out = []
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=5, cutoff=CLOSE)
            if close:  # the nearest of those sharing the most words (num_layers: num_hidden_layers, not num_labels)
                words = set(key.split("_"))
                out.append((key, max(close, key=lambda k: len(words & set(k.split("_"))))))
    return out


_SETTINGS: dict[str, frozenset | None] = {}


def _config_settings(model_type: str) -> frozenset | None:
    """What ``model_type``'s config class takes or reads: its and its bases' ``__init__`` parameters, its attribute
    map, sub-configs and saved keys (``to_dict``), and every key its module and transformers' config code read from the
    keyword arguments (``kwargs.pop("rope_scaling")``: the older names each version still honours); None where the
    class cannot be found or made."""
    if model_type in _SETTINGS:
        return _SETTINGS[model_type]
    import inspect
    import re
    import sys

    from transformers import CONFIG_MAPPING, PretrainedConfig

    try:
        cls = CONFIG_MAPPING[model_type]
        known = set(COMMON_CONFIG_KEYS) | set(getattr(cls, "attribute_map", None) or {}) \
            | set(getattr(cls, "sub_configs", None) or {}) | set(cls().to_dict())
        sources = {sys.modules[PretrainedConfig.__module__]}
        for k in cls.__mro__:
            if isinstance(k, type) and issubclass(k, PretrainedConfig):
                sources.add(sys.modules[k.__module__])
                if "__init__" in k.__dict__:
                    known |= set(inspect.signature(k.__init__).parameters) - {"self", "kwargs"}
        rope = sys.modules.get("transformers.modeling_rope_utils")
        for module in sources | ({rope} if rope else set()):
            text = inspect.getsource(module)
            known |= set(re.findall(r"kwargs\.(?:pop|get)\(\s*[\"']([A-Za-z_0-9]+)[\"']", text))
            known |= set(re.findall(r"[\"']([A-Za-z_0-9]+)[\"']\s+(?:not\s+)?in\s+kwargs", text))
    except Exception:  # noqa: BLE001 - an unknown or unmakeable class: its build reports it
        known = None
    _SETTINGS[model_type] = frozenset(known) if known is not None else None
    return _SETTINGS[model_type]


def check_config_keys(model_type: str, written: dict, where: str) -> None:
    """Exit 2 naming each key of ``written`` (model.config or model.config_overrides as the user wrote them) that reads
    as a misspelt setting of ``model_type``'s config class (``misspelt_config_keys``)."""
    found = misspelt_config_keys(model_type, [k for k in written if k != "model_type"])
    if not found:
        return
    problems = [BadInput(f"not a setting of {model_type}'s config, which ignores it and builds the model from the "
                         f"default of the setting it takes; did you mean {close}?", where=f"{where}.{key}",
                         fix=f"rename {key} to {close} (or remove it)") for key, close in found]
    raise problems[0] if len(problems) == 1 else BadInputs(problems)


def folder_config(path: Path, trust_remote_code: bool, overrides: dict):
    """The folder's config as ``from_pretrained`` reads it, with ``overrides`` in its keys before it is made."""
    from transformers import AutoConfig

    try:
        if not overrides:
            return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code)
        from transformers import PretrainedConfig

        cfg, _ = PretrainedConfig.get_config_dict(str(path), local_files_only=True)
        cfg = dict(cfg, **overrides)
        if "auto_map" in cfg and trust_remote_code:
            return AutoConfig.from_pretrained(str(path), local_files_only=True, trust_remote_code=trust_remote_code, **overrides)
        return AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    except Exception as e:
        raise BadInput(f"cannot read {path}/config.json: {e}", where="model.path",
                       fix="the folder must be a Hugging Face model folder") from None


def _from_config(auto, config, c, where: str):
    """The architecture, initialised under the seed set before, in the default dtype (the builder converts
    after; a fake build sets the final dtype as the default), whatever dtype a folder's config names."""
    import torch

    try:
        return auto.from_config(config, dtype=torch.get_default_dtype(), trust_remote_code=c.model.trust_remote_code)
    except Exception as e:
        raise BadInput(f"cannot build a {config.model_type} model from {where}: {e}", where=where,
                       fix="check the sizes in model.config" if where == "model.config"
                       else "check config.json's sizes (save_pretrained writes them)") from None


def _quantized(model, c):
    """A model built from its config, quantised as ``from_pretrained`` would have loaded it (model.quantization)."""
    if c.model.quantization is None or _on_meta(model):  # the meta builds name modules: the same names unquantised
        return model
    with quiet_transformers():
        return quantized.quantize_in_place(model, c.model.quantization)


def _on_meta(model) -> bool:
    return any(p.device.type == "meta" for p in model.parameters())


def _from_folder(auto, path: Path, config, c, dtype):
    q = c.model.quantization
    extra = {} if q is None else {"quantization_config": quantized.bnb_config(q),
                                  "device_map": {"": quantized.load_device()}}
    try:
        with quiet_transformers():
            model = auto.from_pretrained(str(path), config=config, local_files_only=True, dtype=dtype,
                                         use_safetensors=True, trust_remote_code=c.model.trust_remote_code, **extra)
    except Exception as e:
        raise BadInput(f"cannot load the model from {path}: {e}", where="model.path",
                       fix="check that the weights match config.json (save_pretrained writes both)") from None
    return model


def _finish(model, c, tokenizer, kind: str):
    """What every build does after the weights: the position and vocabulary checks, precision, checkpointing,
    the adapter."""
    import torch

    check_max_length(c, model.config, c.model.path and f"{Path(c.model.path) / 'config.json'}" or "model.config")
    _check_vocab(model, tokenizer)
    q = None if _on_meta(model) else c.model.quantization
    if q is not None:
        quantized.check_quantized(model, q, "model.path" if c.model.path else "model.config")
    if c.train.precision == "bf16-true" and q is None:
        model = model.to(torch.bfloat16)
    with quiet_transformers():
        if q is not None:
            model = quantized.prepare(model, c)  # checkpointing too, as peft's prepare turns it on
            if c.train.precision == "bf16-true":  # the quantised layers stay as they are; the rest in bf16
                _to_bf16_unquantized(model)
        elif c.model.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if c.model.gradient_checkpointing and hasattr(model.config, "use_cache"):
            model.config.use_cache = False
        if c.model.adapter is not None:
            torch.manual_seed(c.seed)  # the adapter's A matrices: two builds of one campaign are bitwise equal
            model = _apply_adapter(model, c.model.adapter, kind)
            setattr(model, ATTR, describe_base(c))  # checkpoints hold the adapter and name this base
    if c.train.strategy != "fsdp" and not torch.cuda.is_available():  # FSDP's shards and a GPU's copy are new memory
        own_trained_weights(model)
    touch_weights(model)  # what is left in the file's map: a LoRA base, frozen weights, a model bound for a GPU
    return model


def own_trained_weights(model) -> int:
    """Copy into memory torch allocates every trainable CPU weight whose storage torch did not allocate: the
    memory map of a safetensors checkpoint (``from_pretrained`` keeps the file mapped, privately). The optimizer
    writes every trained weight at its first step, and a first write into a private file mapping copies it page
    by page (copy-on-write, one fault per 4 KiB): on SmolLM2-135M's 540 MB that first step's ``_fused_adamw_``
    took 1.10 s against 0.07 s for the next, in every run of `all` that loads it (overfit, the pilot, resume's
    three, train); one copy here takes 0.04–0.17 s (tests/test_loading_owned.py). Resume's restored state is
    such a write too. Weights no update writes (a LoRA base, frozen layers) stay mapped; a storage several
    weights share is copied once and stays shared. The copies are operators: the pilot's exact counter counts them
    as the load makes them, where it counted the mapped weights after it (``engine/tensors.track``). Returns the
    bytes copied."""
    import torch

    mapped = [(p, p.untyped_storage().data_ptr()) for p in model.parameters() if _mapped(p)]
    trained = {key for p, key in mapped if p.requires_grad}
    copies, copied = {}, 0
    with torch.no_grad():
        for p, key in mapped:
            if key not in trained:
                continue
            if key not in copies:
                copies[key] = torch.empty(p.untyped_storage().nbytes(), dtype=torch.uint8).untyped_storage()
                copied += copies[key].nbytes()
            # each weight copied into its own place in the new storage: no operator ever returns the mapped
            # storage, so the counter, which never saw it, does not count it while the copies are made
            new = torch.empty(0, dtype=p.dtype).set_(copies[key], p.storage_offset(), p.size(), p.stride())
            p.data = new.copy_(p)
    return copied


def _mapped(p) -> bool:
    """A plain CPU tensor whose storage torch's allocator did not make (it cannot resize it): a file's memory map.
    Never a fake or meta tensor (the estimator's builds), nor a subclass (a quantised weight, a DTensor)."""
    import torch
    from torch._subclasses.fake_tensor import is_fake

    return type(p) in (torch.Tensor, torch.nn.Parameter) and p.device.type == "cpu" and not is_fake(p) \
        and not p.untyped_storage().resizable()


def _to_bf16_unquantized(model) -> None:
    """bf16-true on a quantised base: every floating parameter and buffer that is not a quantised weight in bf16
    (transformers refuses ``.to(dtype)`` on a quantised model)."""
    import torch

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point() and t.dtype != torch.bfloat16 and not hasattr(t, "quant_state"):
                t.data = t.data.to(torch.bfloat16)


def no_dropout(model) -> int:
    """Zero every dropout probability (modules and config values read at forward time); returns how many."""
    import torch

    n = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout) and m.p:
            m.p, n = 0.0, n + 1
        for attr in ("attention_dropout", "dropout", "dropout_p"):
            if isinstance(getattr(m, attr, None), float) and getattr(m, attr):
                setattr(m, attr, 0.0)
                n += 1
    configs = (getattr(m, "config", None) for m in model.modules())
    for cfg in {id(c): c for c in configs if hasattr(c, "__dict__")}.values():  # a custom model's dict config has none
        for key, value in list(vars(cfg).items()):
            if "dropout" in key and isinstance(value, float) and value:
                setattr(cfg, key, 0.0)
                n += 1
    return n


def touch_weights(model) -> None:
    """Read once every weight still in a file's memory map (``_mapped``: safetensors are memory-mapped; what the
    build copied or converted is in memory already): without this the pages arrive during the first step, and
    the memory a load really takes shows there (+53 MiB of RSS for a 540 MB model at load)."""
    import torch

    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.numel() and _mapped(t):
                t.sum()  # a read of every page; the result is not needed


def _check_vocab(model, tokenizer) -> None:
    emb = model.get_input_embeddings()
    if emb is None:
        return
    n = emb.num_embeddings
    need = len(tokenizer)
    if need > n:
        raise BadInput(f"the tokenizer has {need} tokens but the model's embedding has {n} rows",
                       where="model.tokenizer",
                       fix="use the tokenizer the model was trained with, or resize the embeddings and save the model")


# families PEFT's mapping (peft.utils.constants) has no LoRA default for: their attention projections by real names.
# Mixtures of experts get their attention alone, as PEFT's own Mixtral default and the trainers' MoE examples (Axolotl's
# Qwen3-30B-A3B LoRA: q/k/v/o): the experts and the router stay frozen. DeepSeek's attention is low-rank (MLA): its
# query projection is q_proj, or q_a_proj and q_b_proj where the config sets q_lora_rank; those the model has are used
_MLA = ["q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"]
LORA_DEFAULTS = {"phi3": ["qkv_proj"], "distilbert": ["q_lin", "v_lin"],
                 **{f: ["q_proj", "v_proj"] for f in ("qwen2_moe", "qwen3_moe", "olmoe", "granitemoe",
                                                      "granitemoeshared", "gpt_oss", "llama4_text", "jetmoe")},
                 "deepseek_v2": _MLA, "deepseek_v3": _MLA}
LORA_ANY_OF = ("deepseek_v2", "deepseek_v3")  # defaults listing alternatives: the ones the model has


def lora_defaults(model_type: str | None) -> tuple[list[str], str] | None:
    """The modules LoRA adapts when model.adapter.target_modules is not given, and whose choice that is: PEFT's
    own mapping for the family, else pilotrun's (``LORA_DEFAULTS``); None for a family neither knows."""
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as PEFT

    if model_type in PEFT:
        return list(PEFT[model_type]), f"peft's default for {model_type}"
    if model_type in LORA_DEFAULTS:
        return list(LORA_DEFAULTS[model_type]), f"pilotrun's default for {model_type}; peft has none"
    return None


def linear_layers(model) -> list[str]:
    """The names (last part) of the model's linear layers, nn.Linear or GPT-2's Conv1D: what LoRA can adapt."""
    import torch

    names = set()
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D":
            names.add(name.rpartition(".")[2])
    return sorted(names)


def lora_targets(model, adapter) -> tuple[list[str], str]:
    """The modules the adapter goes on and why (given, or the family's default); a name that matches no module is
    bad input listing the model's linear layers."""
    kind = getattr(model.config, "model_type", None)
    layers = linear_layers(model)
    if adapter.target_modules == "all-linear":  # PEFT's own keyword: every linear layer but the output head
        return ["all-linear"], "model.adapter.target_modules"
    if adapter.target_modules:
        targets, why = list(adapter.target_modules), "model.adapter.target_modules"
    else:
        found = lora_defaults(kind)
        if found is None:
            raise BadInput(f"no default LoRA modules for model_type {kind}", where="model.adapter.target_modules",
                           fix=f"name the attention projections; the model's linear layers: {', '.join(layers)}")
        targets, why = found
        if kind in LORA_ANY_OF:
            have = {name.rpartition(".")[2] for name, _ in model.named_modules()}
            targets = [t for t in targets if t in have] or targets
        if moe_parts(model)[0]:
            why += "; a mixture of experts: attention only, the experts and the router stay frozen"
    names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        said = "" if adapter.target_modules else f" ({why})"
        raise BadInput(f"{', '.join(missing)} match{'es' if len(missing) == 1 else ''} no module of the {kind} "
                       f"model{said}", where="model.adapter.target_modules",
                       fix=f"choose among the model's linear layers: {', '.join(layers)}")
    return targets, why


def _apply_adapter(model, adapter, kind: str):
    from peft import LoraConfig, TaskType, get_peft_model

    targets, _ = lora_targets(model, adapter)
    _check_rank(model, adapter.r, targets)
    cfg = LoraConfig(r=adapter.r, lora_alpha=adapter.alpha, lora_dropout=adapter.dropout,
                     target_modules="all-linear" if targets == ["all-linear"] else targets,
                     task_type=TaskType.CAUSAL_LM if kind == "causal-lm" else TaskType.SEQ_CLS)
    try:
        return get_peft_model(model, cfg)
    except ValueError as e:
        raise BadInput(f"cannot apply the LoRA adapter: {e}", where="model.adapter.target_modules",
                       fix=f"name modules that exist in the model: {', '.join(linear_layers(model))}") from None


def _check_rank(model, r: int, targets: list[str]) -> None:
    """Exit 2 where the LoRA rank ``r`` is above every adapted layer's smaller side: an update B·A of such a layer
    has at most that rank, so the rest adds parameters and memory and nothing else (and a rank past torch's sizes,
    ``r: 1e21``, failed inside torch as an internal error)."""
    sides = {}
    for name, m in model.named_modules():
        short = name.rpartition(".")[2]
        if targets == ["all-linear"] or short in targets:
            dims = [getattr(m, "in_features", None), getattr(m, "out_features", None)]
            if None in dims and getattr(getattr(m, "weight", None), "ndim", 0) == 2:
                dims = list(m.weight.shape)  # GPT-2's Conv1D holds no in/out_features
            if None not in dims:
                sides[short] = max(sides.get(short, 0), min(dims))
    if sides and r > max(sides.values()):
        widest = max(sides, key=sides.get)
        raise BadInput(f"LoRA rank {r} is above every adapted layer's smaller side (at most {sides[widest]}, "
                       f"{widest}): an adapter's update of such a layer has at most that rank, so a larger r adds "
                       "parameters and memory and changes nothing else", where="model.adapter.r",
                       fix=f"set model.adapter.r to {sides[widest]} or less (8 to 64 is usual)")


def lora_wrapped(model, adapter, kind: str) -> list[str]:
    """The names of the modules PEFT wraps with LoRA on ``model`` (changed in place: give it a throwaway, e.g. one
    built on the meta device), as ``model.named_modules`` names them."""
    with quiet_transformers():
        peft_model = _apply_adapter(model, adapter, kind)
    return [name.removeprefix("base_model.model.") for name, m in peft_model.named_modules()
            if hasattr(m, "lora_A") and not name.endswith(".base_layer")]


def load_hf_artifact(c, tokenizer, kind: str, path, labels: list[str] | None = None):
    """Load an exported artifact as a user would; an adapter goes onto its base model (the folder it
    names, or for a base built from model.config, that config rebuilt under the campaign seed)."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    path = Path(path)
    # in the dtype the run trained in, as its user loads it (a base folder saved in fp32 under a bf16 campaign
    # would otherwise come back in fp32: other logits, not another model); a quantised base's merged copy says its own
    held = {} if c.model.quantization is not None else {"dtype": torch_dtype(weights_dtype(c.model.dtype,
                                                                                          c.train.precision))}
    with quiet_transformers(), reading_weights(path, "artifact"):
        if (path / "adapter_config.json").is_file():
            from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification, PeftModel

            base = jsonsafe.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
            if base and Path(base).is_dir() and c.model.quantization is None:  # a quantised base: built below
                auto = AutoPeftModelForCausalLM if kind == "causal-lm" else AutoPeftModelForSequenceClassification
                return auto.from_pretrained(str(path), local_files_only=True, **held)
            plain = c.model_copy(update={"model": c.model.model_copy(update={"adapter": None})})
            return PeftModel.from_pretrained(build_model(plain, tokenizer, kind, labels), str(path))
        auto = AutoModelForCausalLM if kind == "causal-lm" else AutoModelForSequenceClassification
        return auto.from_pretrained(str(path), local_files_only=True, use_safetensors=True, **held)


def save_hf_artifact(model, tokenizer, out_dir, *, merged: bool = False) -> list[str]:
    """Write an artifact: full weights as safetensors (or the adapter, plus a merged copy when asked:
    model.adapter.merged_copy), config, tokenizer.

    Returns the sub-folders written, relative to out_dir.
    """
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out_dir = Path(out_dir)
    written = []
    if hasattr(model, "peft_config"):
        model.save_pretrained(str(out_dir / "adapter"), safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir / "adapter"))
        written.append("adapter")
        if merged:
            import copy

            full, said = quantized.merged_dequantized(copy.deepcopy(model))
            if said:
                full.config.pilotrun_dequantized = said  # config.json says what the merged weights are
            else:
                full = copy.deepcopy(model).merge_and_unload()
            full.save_pretrained(str(out_dir / "merged"), safe_serialization=True)
            tokenizer.save_pretrained(str(out_dir / "merged"))
            written.append("merged")
    else:
        model.save_pretrained(str(out_dir / "model"), safe_serialization=True)
        tokenizer.save_pretrained(str(out_dir / "model"))
        written.append("model")
    return written
