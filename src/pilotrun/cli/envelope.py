"""The one JSON shape every verb's ``--json`` writes on stdout, errors included (README "JSON output").

    {"ok": true, "exit_code": 0, "verb": "train", "verdict": "ok", "summary": "...", "messages": [...],
     "data": {...}, "stages": [{"stage", "verdict", "summary", "messages", "data", "columns", "rows"}],
     "error": null}

``data`` is the verb's payload (a stage's data; ``runs``: {"runs": [...]}; ``show``: the run record).
``stages`` holds each stage result (one for a single stage, every stage for ``all``/``demo``, none
for the journal verbs). On bad input or an internal error ``ok`` is false, ``exit_code`` 2 or 3 and
``error`` says what: {"kind", "message", "where", "file", "line", "key", "fix", ...}.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click

from pilotrun.verdicts import worst

_FILE_SUFFIXES = {".yaml", ".yml", ".json", ".jsonl", ".csv", ".parquet", ".txt", ".md", ".gz", ".py"}
_FILE_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+)(?::\d+)?(?:\s+(?P<key>\S+))?$")


def envelope(*, exit_code: int, verb: str | None, verdict: str | None = None, summary: str = "",
             messages: list | None = None, data=None, stages: list | None = None, error: dict | None = None) -> dict:
    return {"ok": exit_code == 0, "exit_code": int(exit_code), "verb": verb, "verdict": verdict,
            "summary": summary, "messages": list(messages or []), "data": {} if data is None else data,
            "stages": list(stages or []), "error": error}


def write(payload: dict) -> None:
    click.echo(json.dumps(payload, indent=2, default=str))


def for_results(results, verb: str | None, exit_code: int) -> dict:
    stages = [r.to_json() for r in results]
    if len(results) == 1:
        r = results[0]
        return envelope(exit_code=exit_code, verb=verb, verdict=r.verdict, summary=r.summary, messages=r.messages,
                        data=r.data, stages=stages)
    verdict = worst([r.verdict for r in results])
    counts = {v: sum(r.verdict == v for r in results) for v in ("ok", "warn", "fail")}
    summary = f"{len(results)} stages: " + ", ".join(f"{n} {v}" for v, n in counts.items() if n)
    return envelope(exit_code=exit_code, verb=verb, verdict=verdict, summary=summary,
                    data={"stages": [r.stage for r in results]}, stages=stages)


def _a_path(where: str) -> bool:
    """Whether ``where`` names a path: one that exists, or one the system refused to look up (a name too long,
    a NUL), which only a path is (the refusal is the error being reported)."""
    try:
        return Path(where).exists()
    except (OSError, ValueError):
        return True


def error_info(exc: BaseException, kind: str) -> dict:
    """The ``error`` member: the message, and where the input is wrong split into file/line/key."""
    where = getattr(exc, "where", None)
    info = {"kind": kind, "message": getattr(exc, "detail", None) or str(exc), "where": where, "file": None,
            "line": None, "key": None, "fix": getattr(exc, "fix", None)}
    if where:
        m = _FILE_LINE.match(where)
        if m:
            info.update(file=m["file"], line=int(m["line"]), key=m["key"])
        elif "/" in where or Path(where).suffix.lower() in _FILE_SUFFIXES or _a_path(where):
            info["file"] = where
        else:
            info["key"] = where  # an option (--set), an argument (RUN_ID), a variable or a campaign key (train.lr)
    for extra in ("candidates",):
        if getattr(exc, extra, None) is not None:
            info[extra] = getattr(exc, extra)
    problems = getattr(exc, "problems", None)
    if problems:
        info["problems"] = [error_info(p, kind) for p in problems]
    return info
