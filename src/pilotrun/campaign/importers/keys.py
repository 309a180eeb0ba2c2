"""Which of a source's keys its tool knows, and the unknown-key rule.

The keys come from the tools' own schemas (``schemas.py``). A key none of them knows is a typo (exit 2, nothing
written) only when it is near a known key the file does not also set: one or two letters apart (inserted,
dropped, changed or swapped; one for keys of up to seven letters), as ``lora_droput`` is from ``lora_dropout``.
Any other unknown key (a key of a newer release, a removed one, one of a plugin this version does not ship) is
carried nowhere and named, with the schema versions it is unknown to.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilotrun.campaign.importers import schemas
from pilotrun.errors import BadInput


def distance(a: str, b: str, limit: int) -> int:
    """The optimal-string-alignment distance (insert, delete, change, swap two neighbours), or ``limit`` + 1 once
    it is certainly above ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


def near(key: str, known: set[str]) -> list[str]:
    """The known keys one or two edits from ``key`` (one for keys of up to seven letters), nearest first."""
    limit = 1 if len(key) <= 7 else 2
    found = sorted((distance(key, k, limit), k) for k in known)
    return [k for d, k in found if d <= limit]


def check_keys(raw: dict[str, Any], known: set[str], path: Path, tool_label: str,
               where_prefix: str = "") -> tuple[list[BadInput], list[str]]:
    """(typos, unknown): a typo is an unknown key near a known key ``raw`` does not set; the unknown keys are
    every other key no schema knows."""
    typos, unknown = [], []
    for k in raw:
        if k in known:
            continue
        close = [c for c in near(str(k), known) if raw.get(c) in (None, "", [], {})]  # null sets nothing
        if close:
            typos.append(BadInput(f"unknown key '{where_prefix}{k}': {tool_label} does not know it, and it is one "
                                  f"letter or two from '{where_prefix}{close[0]}', which the file does not set",
                                  where=str(path), fix=f"did you mean '{where_prefix}{close[0]}'?"))
        else:
            unknown.append(k)
    return typos, unknown


def unknown_reason(tool: str) -> str:
    return (f"unknown to {schemas.label(tool)} (pilotrun's schemas of the tool): carried nowhere; if a newer "
            "release of the tool knows it, the rehearsal runs as if it were unset")


# what a `trl sft|dpo --config` file holds beside the training arguments: TRL's ModelConfig and ScriptArguments
def trl_group(name: str) -> set[str]:
    return schemas.known("trl", name)
