"""A quantised base (model.quantization): bitsandbytes' 4-bit (NF4/FP4) and 8-bit linear layers under an adapter.

The base is loaded as the user's trainer loads it (transformers' ``BitsAndBytesConfig`` through
``from_pretrained``, then peft's ``prepare_model_for_kbit_training``, as TRL and Axolotl do); a base built from
model.config, and the estimator's fake build, are quantised in place by the same transformers pieces
(``replace_with_bnb_linear`` over the modules ``from_pretrained`` converts, each weight through bitsandbytes'
own ``Params4bit`` / ``Int8Params``), so every stage and the estimate hold the same modules.
"""

from __future__ import annotations

import logging
import os
import warnings
from contextlib import contextmanager, nullcontext

from pilotrun.errors import BadInput

QLORA_EXTRA = "pip install 'pilotrun[qlora]'"
QUIET = ("bitsandbytes.backends.cpu.ops", "kernels")
"""Loggers quietened below ERROR unless ``--verbose``: bitsandbytes' import (peft's import pulls it in) looks for a
hub kernel for the CPU's AVX512-BF16 inference path and warns when it cannot have one (never here: nothing is
downloaded); the path it would speed is the one ``no_cpu_repacking`` turns off."""
ATTR = "pilotrun_quantized"  # the quantisation a built model was checked to hold (``check_quantized``)


def missing_bitsandbytes() -> BadInput:
    return BadInput("model.quantization needs bitsandbytes, which is not installed in this environment",
                    where="model.quantization", fix=f"{QLORA_EXTRA} (bitsandbytes runs 4- and 8-bit on the CPU "
                                                    "too), or remove model.quantization")


if not os.environ.get("PILOTRUN_VERBOSE"):
    for _name in QUIET:
        logging.getLogger(_name).setLevel(logging.ERROR)
    # the paged optimizers' fallback on the CPU, at every state's creation; pilotrun's own words say it once
    warnings.filterwarnings("ignore", message="Paged optimizers are not supported on CPU")
    # LLM.int8()'s fp16 matmul without gradients (validation), said at every call: what 8-bit is, by design
    warnings.filterwarnings("ignore", message="MatMul8bitLt: inputs will be cast")


@contextmanager
def _quiet_import():
    """bitsandbytes' import looks for a hub kernel for the CPU's AVX512-BF16 inference path and logs a warning when
    it cannot have one (never here: nothing is downloaded); the path it would speed is the one pilotrun turns off."""
    logs = [logging.getLogger(n) for n in ("bitsandbytes", "kernels")]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def import_bitsandbytes():
    """bitsandbytes, or exit 2 naming the extra."""
    try:
        with _quiet_import():
            import bitsandbytes
    except ImportError:
        raise missing_bitsandbytes() from None
    return bitsandbytes


def describe(q) -> dict | None:
    """The quantisation as plain data (the base's identity, the ledger's load row); None for none."""
    if q is None:
        return None
    if q.bits == 8:
        return {"bits": 8}
    return {"bits": 4, "type": q.type, "double_quant": q.double_quant, "compute_dtype": q.compute_dtype}


def said(q) -> str:
    """``4-bit nf4 (double-quantised, bfloat16 compute)`` / ``8-bit (LLM.int8())``."""
    if q.bits == 8:
        return "8-bit (LLM.int8())"
    return f"4-bit {q.type} ({'double-quantised, ' if q.double_quant else ''}{q.compute_dtype} compute)"


def held(model) -> str | None:
    """What ``check_quantized`` found the built model to hold, in words; None for an unquantised model."""
    found = getattr(model, ATTR, None)
    if found is None:
        return None
    if found["bits"] == 8:
        return "8-bit (LLM.int8())"
    return f"4-bit {found['type']} ({'double-quantised, ' if found['double_quant'] else ''}" \
           f"{found['compute_dtype']} compute)"


def load_device() -> str:
    """Where a quantised base is quantised and held: the run's device (the GPU of this rank, as
    ``engine/distributed.default_device`` picks it, which a user's ``device_map`` names), else the CPU. A 4-bit base
    quantised on the host and moved would show the GPU only the packed bytes at load, not the user's load."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
    return "cpu"


def bnb_config(q):
    """transformers' BitsAndBytesConfig for model.quantization."""
    import torch
    from transformers import BitsAndBytesConfig

    import_bitsandbytes()
    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=q.type, bnb_4bit_use_double_quant=q.double_quant,
                              bnb_4bit_compute_dtype=getattr(torch, q.compute_dtype))


def quantize_in_place(model, q):
    """Quantise a model built with ``from_config`` (model.config, or the estimator's fake build) as
    ``from_pretrained(quantization_config=...)`` quantises one read from a folder: the same modules converted
    (transformers' skips: the output head, tied and fp32-kept modules), each weight handed to bitsandbytes'
    parameter class and moved to the run's device, which quantises it (``load_device``)."""
    import torch
    from transformers.integrations.bitsandbytes import replace_with_bnb_linear
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers import AutoHfQuantizer

    bnb = import_bitsandbytes()
    cfg = bnb_config(q)
    quantizer = AutoHfQuantizer.from_config(cfg, pre_quantized=False)
    skip = quantizer.get_modules_to_not_convert(model, cfg.llm_int8_skip_modules,
                                                getattr(model, "_keep_in_fp32_modules", None) or [])
    old = {name: (m.weight, m.bias) for name, m in model.named_modules()
           if type(m) is torch.nn.Linear or isinstance(m, Conv1D)}
    fake = any(_is_fake(w) for w, _ in old.values())
    with _real_meta() if fake else nullcontext():  # the new layers' placeholders: meta tensors, as from_pretrained's
        replace_with_bnb_linear(model, modules_to_not_convert=skip, quantization_config=cfg)
    with torch.no_grad():
        for name, m in list(model.named_modules()):
            if name not in old or not isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
                continue
            weight, bias = old.pop(name)  # each original freed once quantised, as from_pretrained reads one at a time
            value = weight.detach().T if issubclass(m.source_cls, Conv1D) else weight.detach()
            kwargs = dict(m.weight.__dict__)
            if _is_fake(value):
                m.weight = _fake_quantized(bnb, value, kwargs, q)
            elif q.bits == 4:
                m.weight = bnb.nn.Params4bit(value, requires_grad=False, **kwargs).to(load_device())
            else:
                kwargs.pop("SCB", None)
                m.weight = bnb.nn.Int8Params(value.to("cpu"), requires_grad=False, **kwargs).to(load_device())
            if bias is not None:
                m.bias = torch.nn.Parameter(bias.detach(), requires_grad=False)
            del weight, value
    model.config.quantization_config = cfg
    model.is_quantized = True
    model.quantization_method = cfg.quant_method
    model.hf_quantizer = quantizer
    setattr(model, "is_loaded_in_4bit" if q.bits == 4 else "is_loaded_in_8bit", True)
    return model


def _real_meta():
    """Outside the fake mode for a while: bitsandbytes' parameter classes wrap the layers' meta placeholders, which
    they cannot when the placeholders are fake tensors."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def _is_fake(t) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _fake_quantized(bnb, value, kwargs: dict, q):
    """The estimator's quantised weight on fake tensors: bitsandbytes' own quantisation ops (their fake kernels give
    the packed weight and the statistics at their real shapes and dtypes), held in a plain parameter carrying what
    ``Params4bit`` / ``Int8Params`` carry (their classes cannot wrap a fake tensor); the layers' forward and backward
    are then bitsandbytes' own code on it."""
    import torch

    if q.bits == 4:
        with _real_meta():  # the double quantisation's code book: built from values (a fake tensor has none), as the
            bnb.functional.name2qmap.setdefault("dynamic", bnb.functional.create_dynamic_map())  # run's, one for all
        packed, state = bnb.functional.quantize_4bit(value, blocksize=kwargs.get("blocksize") or 64,
                                                     compress_statistics=kwargs.get("compress_statistics", True),
                                                     quant_type=kwargs.get("quant_type", "fp4"),
                                                     quant_storage=kwargs.get("quant_storage", torch.uint8))
        param = torch.nn.Parameter(packed, requires_grad=False)
        for k, v in kwargs.items():
            if k not in ("data", "quant_state", "module", "bnb_quantized"):
                setattr(param, k, v)
        param.quant_state, param.bnb_quantized, param.module = state, True, None
        return param
    cb, scb, _ = bnb.functional.int8_vectorwise_quant(value.to(torch.float16))
    param = torch.nn.Parameter(cb, requires_grad=False)
    param.CB, param.SCB, param.has_fp16_weights = cb, scb, False
    return param


def original_bytes(model, dtype) -> list[tuple[object, int]]:
    """(quantised layer, bytes its weight held in ``dtype`` before quantisation) in module order: what a build from
    model.config holds before it quantises them one by one (the estimator's load)."""
    import torch

    try:
        with _quiet_import():
            import bitsandbytes as bnb
    except ImportError:
        return []
    size = torch.empty((), dtype=dtype).element_size()
    return [(m, m.in_features * m.out_features * size) for m in model.modules()
            if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]


def logical_numel(p) -> int:
    """A parameter's weights as the model counts them: a packed 4-bit weight holds two per stored byte."""
    state = getattr(p, "quant_state", None)
    if state is not None and getattr(state, "shape", None) is not None:
        n = 1
        for d in state.shape:
            n *= int(d)
        return n
    return p.numel()


def upcast_by_preparation(model, dtype) -> list:
    """The frozen unquantised parameters peft's ``prepare_model_for_kbit_training`` moved from a 16-bit model.dtype
    to float32, in its order (``named_parameters``); [] for a float32 model."""
    import torch

    if dtype not in (torch.float16, torch.bfloat16):
        return []
    return [p for _, p in model.named_parameters() if p.dtype == torch.float32 and not p.requires_grad
            and getattr(p, "quant_state", None) is None]


def quantized_layers(model) -> tuple[int, int, dict]:
    """(linear layers in bitsandbytes' quantised classes, linear layers transformers would quantise, what the
    quantised ones hold: {bits, type, compute_dtype, double_quant} as found, first seen)."""
    import torch
    from transformers.pytorch_utils import Conv1D

    try:
        with _quiet_import():
            import bitsandbytes as bnb
    except ImportError:
        bnb = None
    quantised = plain = 0
    found: dict = {}
    for name, m in model.named_modules():
        if name.endswith(".base_layer") is False and hasattr(m, "base_layer"):
            continue  # a peft wrapper: its base_layer is counted
        if bnb is not None and isinstance(m, bnb.nn.Linear4bit) and getattr(m.weight, "quant_state", None) is None:
            plain += 1  # the class without the packing: a folder's pre-quantised config over plain weights
        elif bnb is not None and isinstance(m, bnb.nn.Linear8bitLt) and m.weight.dtype != torch.int8:
            plain += 1
        elif bnb is not None and isinstance(m, bnb.nn.Linear4bit):
            quantised += 1
            if not found:
                state = m.weight.quant_state
                found = {"bits": 4, "type": getattr(state, "quant_type", None) or m.weight.quant_type,
                         "double_quant": bool(getattr(state, "nested", False)),
                         "compute_dtype": str(m.compute_dtype).removeprefix("torch.")}
        elif bnb is not None and isinstance(m, bnb.nn.Linear8bitLt):
            quantised += 1
            found = found or {"bits": 8}
        elif type(m) is torch.nn.Linear or isinstance(m, Conv1D):
            if _head(model, m):
                continue
            plain += 1
    return quantised, quantised + plain, found


def _head(model, module) -> bool:
    """The output head, which transformers keeps in the model's dtype (with tied or classifier weights)."""
    out = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if out is not None and out is module:
        return True
    for attr in ("score", "classifier"):
        if getattr(model, attr, None) is module:
            return True
    base = getattr(model, "base_model", None)
    base = getattr(base, "model", None)
    return base is not None and base is not model and _head(base, module)


def check_quantized(model, q, source: str) -> None:
    """The built model holds model.quantization's layers, else exit 2 naming what it holds: a base asked in 4 bits
    and silently loaded in 16 (a folder whose config.json carries its own quantization_config, which transformers
    lets win over the one passed; every linear layer skipped) rehearses another experiment."""
    n, total, found = quantized_layers(model)
    want = describe(q)
    wrong = {k: (found.get(k), v) for k, v in want.items() if found.get(k) != v}
    if n and n == total and not wrong:
        setattr(model, ATTR, want)
        return
    if not n:
        what = f"none of its {total} linear layers is quantised: they hold {_dtype_of(model)} weights"
    elif n < total and not wrong:
        what = f"only {n} of its {total} linear layers are quantised"
    else:
        what = "its layers hold " + ", ".join(f"{k} {got}" for k, (got, _) in wrong.items()) + " instead"
    raise BadInput(f"model.quantization asks for a {said(q)} base, but the model {source} built has {what}; the "
                   "rehearsal would run another experiment than the campaign's", where="model.quantization",
                   fix="remove quantization_config from the model folder's config.json (transformers lets the "
                       "folder's win over the campaign's), or set model.quantization to what the folder holds")


def _dtype_of(model) -> str:
    import torch

    for m in model.modules():
        if isinstance(m, torch.nn.Linear) and m.weight.is_floating_point():
            return str(m.weight.dtype).removeprefix("torch.")
    return "unquantised"


def no_cpu_repacking(model) -> int:
    """Turn off bitsandbytes' CPU inference layout. On a CPU with AVX512-BF16, bitsandbytes 0.50 repacks a
    Linear4bit's weight in place the first time it runs in eval mode without gradients (a validation), and every
    later forward, training ones too, goes through ``gemv_4bit``, which has no backward: the adapter stops
    receiving gradients after the first validation (loss.backward finds no graph). Returns the layers changed."""
    n = 0
    for m in model.modules():
        if hasattr(m, "support_avx512bf16_for_cpu"):
            m.support_avx512bf16_for_cpu = False
            n += 1
    return n


def prepare(model, c):
    """What TRL's SFTTrainer and Axolotl do to a quantised base before the adapter: peft's
    ``prepare_model_for_kbit_training`` (the base frozen, its 16-bit parameters upcast to float32, input
    gradients on for checkpointing), with pilotrun's non-reentrant checkpointing."""
    from peft import prepare_model_for_kbit_training

    no_cpu_repacking(model)
    return prepare_model_for_kbit_training(
        model, use_gradient_checkpointing=c.model.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False})


def quant_tensors(model) -> list:
    """The tensors a quantised base holds besides its parameters and buffers: each 4-bit weight's absmax, code
    and nested (double-quantised) statistics, each 8-bit weight's row scales."""
    out = []
    for m in model.modules():
        w = getattr(m, "weight", None)
        state = getattr(w, "quant_state", None)
        if state is not None:
            out += [t for t in (state.absmax, state.code) if t is not None]
            nested = getattr(state, "state2", None)
            if nested is not None:
                out += [t for t in (nested.absmax, nested.code) if t is not None]
            if getattr(state, "offset", None) is not None:
                out.append(state.offset)
        scb = getattr(w, "SCB", None)
        if scb is not None:
            out.append(scb)
    return out


def dequantized_linear(module, dtype):
    """An nn.Linear holding a quantised layer's weights dequantised to ``dtype``: the values the adapter trained
    against (not the base's original weights)."""
    import torch
    from transformers.integrations.bitsandbytes import dequantize_bnb_weight

    weight = dequantize_bnb_weight(module.weight, state=getattr(module, "state", None))
    new = torch.nn.Linear(module.in_features, module.out_features, bias=module.bias is not None, device="cpu",
                          dtype=dtype)
    with torch.no_grad():
        new.weight.copy_(weight.to(dtype))
        if module.bias is not None:
            new.bias.copy_(module.bias.to(dtype))
    return new


def merged_dequantized(peft_model):
    """A plain model from an adapter on a quantised base, for a merged copy: each adapted layer's weights dequantised
    (4-bit ones to their compute dtype, 8-bit ones to float16: the values the adapter trained against, not the
    base's original weights) plus the adapter's delta, every other quantised layer dequantised. peft's own merge
    would quantise the sum back to 4 bits. Returns (model, what was done in words); changes ``peft_model``."""
    import torch

    bnb = import_bitsandbytes()
    layers = [m for m in peft_model.modules() if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt))]
    if not layers:
        return None, None
    first = layers[0]
    four = hasattr(first.weight, "quant_state")
    dtype = (first.compute_dtype or torch.float32) if four else torch.float16
    was = f"4-bit {first.weight.quant_state.quant_type}" if four else "8-bit"
    n = 0
    for name, m in list(peft_model.named_modules()):
        base = getattr(m, "base_layer", None)
        if base is None or base not in layers or not hasattr(m, "get_delta_weight"):
            continue
        plain = dequantized_linear(base, torch.float32)
        with torch.no_grad():
            for adapter in m.active_adapters:
                plain.weight += m.get_delta_weight(adapter).to(torch.float32)
        peft_model.set_submodule(name, plain.to(dtype))
        n += 1
    n += dequantize_in_place(peft_model, dtype)
    model = peft_model.get_base_model()
    said = (f"{n} linear layers dequantised from {was} to {str(dtype).removeprefix('torch.')}, the adapter merged "
            "into them: the values the adapter trained against, not the base model's original weights")
    return model, said


def dequantize_in_place(model, dtype) -> int:
    """Every quantised layer of ``model`` (a peft model: the base layers under the adapter) replaced by its
    dequantised nn.Linear in ``dtype``; returns how many."""
    import bitsandbytes as bnb

    n = 0
    for name, m in list(model.named_modules()):
        if isinstance(m, (bnb.nn.Linear4bit, bnb.nn.Linear8bitLt)):
            model.set_submodule(name, dequantized_linear(m, dtype))
            n += 1
    for obj in (model, getattr(model, "base_model", None), getattr(getattr(model, "base_model", None), "model", None)):
        if obj is None:
            continue
        for attr in ("is_loaded_in_4bit", "is_loaded_in_8bit", "is_quantized"):
            if getattr(obj, attr, False):
                setattr(obj, attr, False)
        cfg = getattr(obj, "config", None)
        if cfg is not None and hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        if hasattr(obj, "hf_quantizer"):
            obj.hf_quantizer = None
    return n
