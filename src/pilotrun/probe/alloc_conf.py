"""The caching allocator's settings, as a launch sets them: ``PYTORCH_ALLOC_CONF`` (torch >= 2.9) or
``PYTORCH_CUDA_ALLOC_CONF``, parsed and checked as torch's ``c10/core/AllocatorConfig.cpp`` and
``c10/cuda/CUDAAllocatorConfig`` parse them (the keys, their ranges, the first variable set wins), so a value
torch would refuse is refused here, naming the key."""

from __future__ import annotations

import dataclasses

from pilotrun.errors import BadInput

MiB = 2**20
LARGE_BUFFER = 20 * MiB         # kLargeBuffer: max_split_size_mb and max_non_split_rounding_mb start here
UNLIMITED = 2**64 - 1           # max_split_size when none is set
DIVISION_INTERVALS = 16         # roundup_power2_divisions: one value per power of two from 1 MiB to 64 GiB

ENV_KEYS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # the first set wins (torch >= 2.9 reads both)
_ACCEPTED = {  # keys torch's CUDA allocator accepts that do not change where blocks go
    "backend", "release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "pinned_num_register_threads",
    "pinned_use_background_threads", "pinned_reserve_segment_size_mb", "pinned_free_catch_all",
    "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom", "release_lock_on_hipmalloc",
    "pinned_use_hip_host_register"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """The allocator's settings, as ``PYTORCH_ALLOC_CONF`` / ``PYTORCH_CUDA_ALLOC_CONF`` set them."""

    expandable_segments: bool = False
    max_split_size: int = UNLIMITED
    max_non_split_rounding: int = LARGE_BUFFER
    roundup_power2_divisions: tuple[int, ...] = (0,) * DIVISION_INTERVALS
    garbage_collection_threshold: float = 0.0
    memory_fraction: float | None = None  # per_process_memory_fraction (torch.cuda.set_per_process_memory_fraction)
    text: str = ""  # the setting as written ("" for torch's defaults)

    def divisions(self, size: int) -> int:
        """The divisions that apply to a request of ``size`` bytes (its power of two's interval, from 1 MiB)."""
        index = max(0, size.bit_length() - 1 - 20)
        return self.roundup_power2_divisions[min(index, DIVISION_INTERVALS - 1)]

    def said(self) -> str:
        return self.text or "torch's defaults"


DEFAULTS = Settings()


def _tokens(text: str) -> list[str]:
    out, word = [], ""
    for ch in text:
        if ch in ",:[]":
            if word:
                out.append(word)
            out.append(ch)
            word = ""
        elif ch.isspace():
            if word:
                out.append(word)
            word = ""
        else:
            word += ch
    if word:
        out.append(word)
    return out


def parse_settings(text: str | None, where: str = "PYTORCH_CUDA_ALLOC_CONF") -> Settings:
    """The settings of ``text`` ("expandable_segments:True,max_split_size_mb:512"), checked as torch checks
    them: a key torch would refuse, or a value out of its range, is bad input naming the key."""
    if not text or not text.strip():
        return DEFAULTS
    toks = _tokens(text)
    values: dict = {}
    i = 0

    def bad(msg: str, fix: str) -> BadInput:
        return BadInput(f"{msg} in {text!r}", where=where, fix=fix)

    def value(k: int) -> str:
        if k + 1 >= len(toks) or toks[k] != ":":
            raise bad(f"{toks[k - 1]!r} needs ':' and a value", "write key:value pairs separated by commas")
        return toks[k + 1]

    def number(s: str, key: str, kind=int):
        try:
            return kind(s)
        except ValueError:
            raise bad(f"{key} takes a number, not {s!r}", f"e.g. {key}:512") from None

    while i < len(toks):
        key = toks[i]
        if key == "expandable_segments":
            v = value(i + 1)
            if v not in ("True", "False"):
                raise bad(f"expandable_segments takes True or False, not {v!r}", "expandable_segments:True")
            values["expandable_segments"] = v == "True"
            i += 3
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            mb = number(value(i + 1), key)
            if mb < LARGE_BUFFER // MiB:
                raise bad(f"{key} must be at least {LARGE_BUFFER // MiB} (torch refuses less), got {mb}",
                          f"{key}:{LARGE_BUFFER // MiB} or more")
            values["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding"] = mb * MiB
            i += 3
        elif key == "garbage_collection_threshold":
            v = number(value(i + 1), key, float)
            if not 0.0 < v < 1.0:
                raise bad(f"garbage_collection_threshold must be in (0.0, 1.0), got {v}",
                          "garbage_collection_threshold:0.8")
            values["garbage_collection_threshold"] = v
            i += 3
        elif key == "per_process_memory_fraction":
            v = number(value(i + 1), key, float)
            if not 0.0 < v <= 1.0:
                raise bad(f"per_process_memory_fraction must be in (0.0, 1.0], got {v}",
                          "per_process_memory_fraction:0.9")
            values["memory_fraction"] = v
            i += 3
        elif key == "roundup_power2_divisions":
            values["roundup_power2_divisions"], i = _divisions(toks, i, bad)
        elif key in _ACCEPTED:
            v = value(i + 1)
            if key == "backend" and v != "native":
                raise bad(f"backend:{v} replaces the caching allocator, which the replay models",
                          "leave backend unset (native) or measure on the GPU with `pilotrun pilot`")
            i += 3
            while i < len(toks) and toks[i] != ",":  # a value's own tokens (none today)
                i += 1
        else:
            raise bad(f"unknown allocator key {key!r} (torch refuses it: 'Unrecognized key')",
                      "expandable_segments, max_split_size_mb, max_non_split_rounding_mb, roundup_power2_divisions, "
                      "garbage_collection_threshold or per_process_memory_fraction")
        if i < len(toks):
            if toks[i] != ",":
                raise bad(f"expected ',' after {key}, found {toks[i]!r}", "separate key:value pairs with commas")
            i += 1
    return Settings(text=text.strip(), **values)


def _divisions(toks: list[str], i: int, bad) -> tuple[tuple[int, ...], int]:
    """``roundup_power2_divisions:4`` (every size) or ``roundup_power2_divisions:[256:1,512:2,>:4]`` (per power of
    two in MiB, ``>`` for the rest); each a power of two (0 turns rounding off in the list form)."""
    if i + 2 >= len(toks) or toks[i + 1] != ":":
        raise bad("roundup_power2_divisions needs ':' and a value", "roundup_power2_divisions:4")
    out = [0] * DIVISION_INTERVALS
    k = i + 2
    if toks[k] != "[":
        v = _int(toks[k], bad)
        if v < 1 or v & (v - 1):
            raise bad(f"roundup_power2_divisions must be a power of two, got {v}", "roundup_power2_divisions:4")
        return (v,) * DIVISION_INTERVALS, k + 1
    first, last = True, 0
    k += 1
    while k < len(toks) and toks[k] != "]":
        boundary = toks[k]
        if k + 2 >= len(toks) or toks[k + 1] != ":":
            raise bad("roundup_power2_divisions entries are SIZE_MB:DIVISIONS", "roundup_power2_divisions:[256:1,>:4]")
        v = _int(toks[k + 2], bad)
        if v and v & (v - 1):
            raise bad(f"roundup_power2_divisions must be powers of two or 0, got {v}", "[256:1,512:2,>:4]")
        if boundary == ">":
            out[last + 1:] = [v] * (DIVISION_INTERVALS - last - 1)
        else:
            b = _int(boundary, bad)
            if b < 1 or b & (b - 1):
                raise bad(f"roundup_power2_divisions' sizes must be powers of two (MiB), got {b}", "[256:1,>:4]")
            index = min(b.bit_length() - 1, DIVISION_INTERVALS - 1)
            if first:
                out[:index] = [v] * index
                first = False
            out[index] = v
            last = index
        k += 3
        if k < len(toks) and toks[k] == ",":
            k += 1
    if k >= len(toks):
        raise bad("roundup_power2_divisions' list has no closing ']'", "roundup_power2_divisions:[256:1,>:4]")
    return tuple(out), k + 1


def _int(s: str, bad) -> int:
    try:
        return int(s)
    except ValueError:
        raise bad(f"not a whole number: {s!r}", "roundup_power2_divisions:[256:1,512:2,>:4]") from None


def settings_from_env(env: dict) -> tuple[Settings, str | None]:
    """The settings a launch with this environment gives torch, and the variable they came from."""
    for name in ENV_KEYS:
        if env.get(name):
            return parse_settings(env[name], where=name), name
    return DEFAULTS, None
