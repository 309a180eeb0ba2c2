"""A model folder's weights against the model its config.json describes, read as transformers loads them.

transformers 5 renames and converts checkpoint tensors as it loads: a mixture of experts is saved one tensor per
expert (``model.layers.0.block_sparse_moe.experts.3.w1.weight``) and held fused in memory
(``model.layers.0.mlp.experts.gate_up_proj``, every expert's gate and up projections stacked). Comparing the saved
names with the model's as if nothing were converted refuses every MoE folder transformers itself writes; so the
check routes each saved name through transformers' own conversion mapping (``get_model_conversion_mapping``) and
runs its own loader (``convert_and_load_state_dict_in_model``) on meta tensors of the headers' shapes: no weight is
read, and what the loader would find missing, of another shape or impossible to fuse is what this refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pilotrun.errors import BadInput
from pilotrun.tasks.loading import check_model_dir, check_safetensors, folder_config, model_weight_files, \
    quiet_transformers

_FLOATS = {"F16", "BF16", "F32", "F64"}
_TORCH_DTYPES = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                 "I16": "int16", "U16": "uint16", "F16": "float16", "BF16": "bfloat16", "I32": "int32",
                 "U32": "uint32", "F32": "float32", "I64": "int64", "U64": "uint64", "F64": "float64"}


@dataclass
class MetaLoad:
    """What transformers' loader makes of a checkpoint's headers on a meta model."""

    routes: dict[str, str]
    """Saved name → the model's name it loads into (itself when nothing renames it)."""
    fused: dict[str, list[str]] = field(default_factory=dict)
    """A model tensor built by a converter (fused experts) → the saved names that feed it."""
    patterns: dict[str, tuple[str, list[str]]] = field(default_factory=dict)
    """Saved name that feeds a converter → (the converter's pattern it matched, all of the converter's patterns)."""
    loaded: set[str] = field(default_factory=set)
    """Model names the loader filled (mismatched ones included)."""
    mismatched: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    """Model name → (the shape the checkpoint gives it, the shape the model needs)."""
    errors: dict[str, str] = field(default_factory=dict)
    """Model name → why the converter could not build it."""
    saved_as: dict[str, str] = field(default_factory=dict)
    """Model name → the name save_pretrained gives it, where the two differ (``experts.gate_up_proj`` of GraniteMoE
    is saved as ``input_linear.weight``)."""


def check_weights_fit(c, kind: str) -> None:
    """The folder's weights against the model its config.json describes, before any run exists: every tensor of
    the base model (and a causal LM's output head) present in the safetensors headers once transformers has renamed
    and fused them, each of the shape the model needs. The model is built on the meta device (no memory, no weights
    read: milliseconds) and only the headers are read; a tensor missing (a lost expert too), of another shape or
    not fusable is exit 2 naming the file, the saved tensors and the fix, where from_pretrained would fail mid-run
    or, for a missing tensor, silently draw it at random. A folder whose names this does not recognise (under half
    the model's found: renamed keys, quantised weights) is left to from_pretrained, and so is a tensor missing by
    name while one of its shape is under a name the model does not have (a key this transformers renames)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    path = Path(c.model.path)
    check_model_dir(path)  # the folder, its config.json and every weights file's header first
    headers: dict[str, tuple[Path, dict]] = {}
    for f in model_weight_files(path):
        for name, t in check_safetensors(f).items():
            if name != "__metadata__":
                headers[name] = (f, t)
    if not headers:
        return
    config = folder_config(path, c.model.trust_remote_code, getattr(c.model, "config_overrides", None) or {})
    if getattr(config, "quantization_config", None):
        return
    auto = AutoModelForCausalLM if kind == "causal-lm" else AutoModelForSequenceClassification
    try:
        with torch.device("meta"), quiet_transformers():
            model = auto.from_config(config, trust_remote_code=c.model.trust_remote_code)
    except Exception:  # noqa: BLE001 - what cannot be built is the build's to report, with its own message
        return
    prefix = getattr(model, "base_model_prefix", "") or ""
    groups: dict[int, tuple[Any, list[str]]] = {}  # a parameter → every name it has (tied weights share one)
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), (p, []))[1].append(name)
    shapes = {n: list(p.shape) for p, names in groups.values() for n in names}
    head = model.get_output_embeddings() if kind == "causal-lm" else None
    heads = {id(head.weight)} if getattr(head, "weight", None) is not None else set()  # its bias may be new
    ignore = [re.compile(r) for r in (getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    needed = [names for key, (p, names) in groups.items()
              if (key in heads or any(n.startswith(f"{prefix}.") for n in names) or not prefix)
              and not any(r.search(n) for r in ignore for n in names)]
    with quiet_transformers():
        load = _load_on_meta(model, headers, shapes)
    present = [names for names in needed if any(n in load.loaded for n in names)]
    if not needed or len(present) * 2 < len(needed):
        return
    files = sorted({str(f.name) for f, _ in headers.values()})
    what = f"the {config.model_type} model config.json describes"
    broken = [n for n in shapes if n in load.errors or (n in load.mismatched and n in load.fused)]
    lost = {t: _lost_experts(load, t, shapes.get(t)) for t in broken}
    if any(lost.values()):
        into = [t for t in broken if lost[t]]
        _refuse_missing(sorted({n for t in into for n in lost[t]}, key=_natural), what, files, path,
                        f"; transformers fuses the experts' tensors into {', '.join(repr(t) for t in into[:3])}"
                        f"{' ...' if len(into) > 3 else ''} as it loads")
    for target in broken:
        got, want = load.mismatched.get(target, (None, shapes.get(target)))
        sources = load.fused.get(target, [])
        raise BadInput(f"the {len(sources)} saved tensors transformers fuses into {target!r} "
                       f"({_pattern_list(load, sources)}) {'make shape ' + str(got) if got else 'cannot be fused'}, "
                       f"but {what} needs {want}; nothing was loaded",
                       where=str(headers[sources[0]][0] if sources else path / files[0]),
                       fix="the weights and config.json are of different models or sizes (the number of experts, "
                           "their width): copy the folder again from one save_pretrained, or set config.json's sizes "
                           "to the weights'")
    for target in (n for n in shapes if n in load.mismatched and n not in load.fused):  # in the model's order
        want = load.mismatched[target][1]
        source = next((s for s, t in load.routes.items() if t == target), target)
        f, t = headers[source]
        if t["dtype"] in _FLOATS:
            raise BadInput(f"tensor {source!r} in {f.name} has shape {list(t['shape'])}, but {what} needs {want}; "
                           "nothing was loaded", where=str(f),
                           fix="the weights and config.json are of different models or sizes: copy the folder again "
                               "from one save_pretrained, or set config.json's sizes to the weights' (hidden_size, "
                               "num_hidden_layers, vocab_size, ...)")
    # a tensor saved under a name this transformers does not map onto the model is no loss when its shape is that
    # of a tensor the model lacks: one the model lacks counts as missing only when no unclaimed tensor has its shape
    unclaimed = {tuple(headers[s][1]["shape"]) for s, t in load.routes.items() if t not in shapes}
    lost = [names[0] for names in needed
            if not any(n in load.loaded for n in names) and tuple(shapes[names[0]]) not in unclaimed]
    if lost:
        _refuse_missing([load.saved_as.get(n, n) for n in lost], what, files, path, "")


def _refuse_missing(lost: list[str], what: str, files: list[str], path: Path, how: str) -> None:
    n = len(lost)
    raise BadInput(f"{n} tensor{'s' if n > 1 else ''} of {what} {'are' if n > 1 else 'is'} missing from "
                   f"{', '.join(files)}: {', '.join(repr(x) for x in lost[:5])}{' ...' if n > 5 else ''}{how}; "
                   "from_pretrained would draw them at random or fail; nothing was loaded", where=str(path / files[0]),
                   fix="copy the model folder again (a shard or tensors were lost), or write it again with "
                       "save_pretrained")


def _load_on_meta(model, headers: dict, shapes: dict) -> MetaLoad:
    """transformers' own loader run over meta tensors of the headers' shapes (nothing read, nothing allocated); under
    a transformers without the conversion machinery (4.x), the saved names are the model's, as that loader reads them."""
    import torch

    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, \
            convert_and_load_state_dict_in_model, rename_source_key
        from transformers.modeling_utils import LoadStateDictConfig
    except ImportError:
        return _load_by_name(model, headers, shapes)
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {p: conv for conv in converters for p in conv.source_patterns}
    prefix = model.base_model_prefix
    load = MetaLoad(routes={})
    for name in headers:  # the loader's own first step: each saved name renamed, at most one converter matched
        target, pattern = rename_source_key(name, renamings, converters, prefix, shapes)
        if target not in shapes and name in shapes:
            target, pattern = name, None
        load.routes[name] = target
        if pattern is not None and target in shapes:
            load.fused.setdefault(target, []).append(name)
            load.patterns[name] = (pattern, list(by_pattern[pattern].source_patterns))
    state = {n: torch.empty(t["shape"], dtype=getattr(torch, _TORCH_DTYPES.get(t["dtype"], "float32")), device="meta")
             for n, (_, t) in headers.items()}
    info, _ = convert_and_load_state_dict_in_model(
        model, state, LoadStateDictConfig(weight_mapping=get_model_conversion_mapping(model), device_map={"": "meta"}))
    load.loaded = set(model.state_dict()) - set(info.missing_keys)
    load.mismatched = {t: (list(got), list(want)) for t, got, want in info.mismatched_keys}
    load.errors = {t: str(e).strip().splitlines()[-1] for t, e in info.conversion_errors.items()}
    back = [m.reverse_transform() for m in mapping if isinstance(m, WeightRenaming) and m.was_used()]
    for t in info.missing_keys:  # the name a missing tensor is saved under (what a user finds in the header)
        saved = rename_source_key(t, [m for m in back if isinstance(m, WeightRenaming)],
                                  [m for m in back if isinstance(m, WeightConverter)], reverse=True)[0]
        if saved != t:
            load.saved_as[t] = saved
    return load


def _load_by_name(model, headers: dict, shapes: dict) -> MetaLoad:
    prefix = getattr(model, "base_model_prefix", "") or ""

    def full(name: str) -> str:  # a checkpoint's name as the whole model names it (a base model saved alone)
        return name if name in shapes or not prefix else f"{prefix}.{name}" if f"{prefix}.{name}" in shapes else name

    load = MetaLoad(routes={n: full(n) for n in headers})
    load.loaded = {t for t in load.routes.values() if t in shapes}
    load.mismatched = {t: (list(headers[n][1]["shape"]), shapes[t]) for n, t in load.routes.items()
                       if t in shapes and list(headers[n][1]["shape"]) != shapes[t]}
    return load


def _pattern_list(load: MetaLoad, sources: list[str]) -> str:
    return ", ".join(sorted({load.patterns[s][0].strip(".") for s in sources if s in load.patterns}))


def _lost_experts(load: MetaLoad, target: str, want: list[int] | None) -> list[str]:
    """The saved per-expert names a fused tensor lacks: for each of its converter's patterns (``experts.*.w1.weight``)
    the expert indices 0..n-1 that no saved name fills, n the most any pattern has, or the fused tensor's first
    dimension (the experts it stacks) when that is more."""
    sources = load.fused.get(target, [])
    if not sources:
        return []
    found: dict[str, dict[int, str]] = {}  # pattern → index → a template with {} where the index goes
    everyone: list[str] = []
    for s in sources:
        pattern, everyone = load.patterns[s]
        m = _index_in(s, pattern)
        if m is not None:
            found.setdefault(pattern, {})[m[0]] = m[1]
    if not found:
        return []
    n = max(max(ix) + 1 for ix in found.values())
    if want and len(want) == 3:  # experts × rows × columns: the stack's depth is the number of experts
        n = max(n, want[0])
    any_template = next(iter(next(iter(found.values())).values()))
    any_pattern = next(iter(found))
    lost = []
    for pattern in everyone:
        have = found.get(pattern, {})
        template = next(iter(have.values()), None) or _swap(any_template, any_pattern, pattern)
        lost += [template.format(i) for i in range(n) if i not in have]
    return sorted(lost, key=_natural)


def _index_in(name: str, pattern: str) -> tuple[int, str] | None:
    """Where a converter pattern's ``*`` falls in a saved name: (the index, the name with ``{}`` in its place)."""
    head, star, tail = pattern.partition("*")
    if not star:
        return None
    m = re.search(re.escape(head) + r"(\d+)" + re.escape(tail), name)
    if m is None:
        return None
    at, end = m.span(1)
    return int(m.group(1)), name[:at].replace("{", "{{").replace("}", "}}") + "{}" + \
        name[end:].replace("{", "{{").replace("}", "}}")


def _swap(template: str, pattern: str, other: str) -> str:
    """A sibling pattern's template: ``...experts.{}.w1.weight`` → ``...experts.{}.w3.weight``."""
    tail, other_tail = pattern.partition("*")[2], other.partition("*")[2]
    return template[: len(template) - len(tail)] + other_tail if template.endswith(tail) else template


def _natural(s: str) -> list:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", s)]
