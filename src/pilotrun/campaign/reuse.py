"""What a stage reuses from an earlier one instead of doing it again, never served stale.

- ``identity(loaded)``: the campaign's config hash and the identity of every file it names: its path, size and
  the sha256 of its content, whatever its size (a folder: its files' identities). A file replaced by one of the
  same size and mtime (a restore, ``rsync -t``, a regenerated file) is another identity; the hash is read once
  per process for a file whose inode, size, mtime and ctime are unchanged (a replacement changes its ctime).
- In one process (``all``): the encoded splits (``encoded``, what ``campaign/prepare.prepare`` builds) and a
  model as its first build left it (``keep_pristine``: a deep copy, never a model a stage trained), keyed by it.
  A changed file has another identity, so it is read again; ``COUNTS`` says what was served and built.
- Across processes (the sheet after a pilot or an earlier sheet): the estimator's traces, kept in the journal's
  home (``traces/``) under the identity, pilotrun's version and its own files' digest (``package_digest``), and
  what was traced (device, depth, steps only). ``keeping_traces(home)`` turns that on for a block. A kept entry
  holds the sha256 of its own body: one that is damaged, truncated or edited (a trace reduced to its key) is a
  miss, traced again, never a figure.
"""

from __future__ import annotations

import contextlib
import contextvars
import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pilotrun
from pilotrun import __version__
from pilotrun.console.progress import spending
from pilotrun.journal.files import atomic_write_bytes
from pilotrun import jsonsafe
from pilotrun.provenance import file_sha256
from pilotrun.tasks.loading import shape_only

MAX_ENTRIES = 8  # encoded campaigns (and pristine models) kept in one process
COUNTS = {"encoded_hits": 0, "encoded_builds": 0, "pristine_hits": 0, "pristine_builds": 0, "trace_hits": 0,
          "trace_builds": 0}

_SHARING: contextvars.ContextVar[bool] = contextvars.ContextVar("pilotrun_sharing", default=False)
_ENCODED: dict[str, Any] = {}
_PRISTINE: dict[str, Any] = {}
_TRACES: contextvars.ContextVar[Path | None] = contextvars.ContextVar("pilotrun_traces", default=None)


def _file_id(path: Path) -> list:
    """A file's identity by content: its path, size and sha256 (``file_sha256``'s hash remembered in this process
    while the file's inode, size, mtime and ctime stand)."""
    return [str(path), path.stat().st_size, file_sha256(path, reuse=True)]


def files_of(value: Any, base: Path | None) -> list[list]:
    """The identities of the existing files and folders named by the strings in ``value`` (a folder's own files,
    not its subfolders: a model folder's config, tokenizer and weights)."""
    out: list[list] = []
    if isinstance(value, dict):
        for v in value.values():
            out += files_of(v, base)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += files_of(v, base)
    elif isinstance(value, str) and value and len(value) < 4096 and "\n" not in value:
        p = Path(value)
        if not p.is_absolute() and base is not None:
            p = base / p
        try:
            if p.is_file():
                out.append(_file_id(p))
            elif p.is_dir() and p != Path("/"):
                out += [_file_id(f) for f in sorted(p.iterdir()) if f.is_file()]
        except OSError:
            pass
    return out


def identity(loaded, what: dict | None = None) -> str:
    """One key for the campaign as resolved and every file it names (``what``: what else the key holds)."""
    files = files_of(loaded.resolved_dict(), loaded.base_dir)
    return hashlib.sha256(json.dumps({"config": loaded.config_sha256(), "files": files, "what": what or {}},
                                     sort_keys=True, default=str).encode()).hexdigest()


def _keep(store: dict, key: str, value) -> None:
    store[key] = value
    while len(store) > MAX_ENTRIES:
        store.pop(next(iter(store)))


def encoded(loaded, splits, make_task, encode) -> dict:
    """The task (``make_task()``) once per identity in this process, and each split encoded once
    (``encode(task, missing) -> {split: examples}``): ``{"task", "splits"}``, the cache's own (callers copy
    the lists they hand on)."""
    key = identity(loaded)
    kept = _ENCODED.get(key)
    if kept is None:
        kept = {"task": make_task(), "splits": {}}
        _keep(_ENCODED, key, kept)
    missing = [s for s in splits if s not in kept["splits"]]
    COUNTS["encoded_hits"] += len(splits) - len(missing)
    COUNTS["encoded_builds"] += len(missing)
    if missing:
        kept["splits"].update(encode(kept["task"], missing))
    return kept


def keep_pristine(task, loaded) -> None:
    """A built-in task's ``build_model`` reads the weights once per identity; a later call gets a deep copy of the
    model as that first build left it (before any stage trained it), and the generator state the build left
    (a build seeds and draws new heads), so what follows the build draws the same numbers. A task whose model is
    built around a policy (preference: a reference copy beside it) keeps its ``build_policy`` so: the copy it
    makes of each build is its own, never kept twice."""
    import copy

    name = "build_policy" if hasattr(task, "build_policy") else "build_model"
    build = getattr(task, name)
    if not type(task).__module__.startswith("pilotrun.tasks."):
        return  # a custom task's build is its own

    def build_model():
        import torch

        if shape_only() or str(torch.get_default_device()) != "cpu":  # the estimator's builds, a meta device
            return build()
        key = identity(loaded, {"model": type(task).__name__})
        kept = _PRISTINE.get(key)
        if kept is None:
            COUNTS["pristine_builds"] += 1
            model = build()
            _keep(_PRISTINE, key, (copy.deepcopy(model), torch.get_rng_state()))
            return model
        COUNTS["pristine_hits"] += 1

        with spending("model"):
            model, rng = copy.deepcopy(kept[0]), kept[1]
            torch.set_rng_state(rng)
        return model

    setattr(task, name, build_model)


@contextlib.contextmanager
def sharing():
    """Inside the block (``all``'s stages), ``prepare`` and a built-in task's model build reuse what an earlier
    call of the same identity made."""
    token = _SHARING.set(True)
    try:
        yield
    finally:
        _SHARING.reset(token)


@contextlib.contextmanager
def unshared():
    """Inside the block nothing is reused and nothing kept is held: a stage whose own timings are a term of the plan
    (the pilot's ``prepare_s`` and load, a train run's) reads, encodes and builds for itself, as it will on the
    rental, and a stage that measures memory (the pilot's ledger, a run's observed rows) measures only its own:
    what ``all`` kept for its other stages (encoded splits, a pristine model and its generator state) is dropped
    first, since a copy of the model held beside the run is counted as the run's memory. A later stage that shares
    builds it again."""
    forget()
    token = _SHARING.set(False)
    try:
        yield
    finally:
        _SHARING.reset(token)


def shared() -> bool:
    return _SHARING.get()


def forget() -> None:
    """Drop what this process keeps (a stage that measures memory: ``unshared``; the end of ``all``; tests)."""
    _ENCODED.clear()
    _PRISTINE.clear()


_OWN_DIGEST: list[str] = []


def package_digest(root: Path | None = None) -> str:
    """sha256 of pilotrun's own files (paths and contents, caches left out): the code's identity beside its version.
    Without ``root`` (the package this process runs) read once per process: its code is what it imported; a
    ``root`` given (a checkout a wheel is built from) is read every time."""
    if root is not None:
        return _digest(root)
    if not _OWN_DIGEST:
        _OWN_DIGEST.append(_digest(Path(pilotrun.__file__).parent))
    return _OWN_DIGEST[0]


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.endswith((".pyc", ".pyo")) or name.startswith("."):
                continue
            p = Path(dirpath) / name
            h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


@contextlib.contextmanager
def keeping_traces(home):
    """Inside the block, the estimator's traces are read from and written to ``home``/traces."""
    token = _TRACES.set(Path(home) / "traces")
    try:
        yield
    finally:
        _TRACES.reset(token)


def trace_key(loaded, what: dict) -> str | None:
    """The key of a trace of ``loaded`` (None outside ``keeping_traces``)."""
    if _TRACES.get() is None:
        return None

    return identity(loaded, dict(what, version=__version__, code=package_digest()))


def stored_trace(key: str | None) -> dict | None:
    """The trace kept under ``key``, or None (a miss: traced again) when there is none or it cannot be trusted
    whole: not gzip, not JSON, another key, or a body whose sha256 is not the one written beside it (truncated,
    edited behind pilotrun's back, reduced to its key)."""
    folder = _TRACES.get()
    if key is None or folder is None:
        return None
    try:
        head, _, body = gzip.decompress((folder / f"{key}.json.gz").read_bytes()).partition(b"\n")
        header = jsonsafe.loads(head)
        if (not isinstance(header, dict) or header.get("key") != key
                or header.get("sha256") != hashlib.sha256(body).hexdigest()):
            return None
        trace = jsonsafe.loads(body)
    except Exception:  # noqa: BLE001 - none yet, or damaged in any way: a miss, traced again
        return None
    if not isinstance(trace, dict):
        return None
    COUNTS["trace_hits"] += 1
    return trace


def has_trace(key: str | None) -> bool:
    """Whether a trace is kept under ``key`` (not whether it can be trusted: ``stored_trace`` says that)."""
    folder = _TRACES.get()
    return key is not None and folder is not None and (folder / f"{key}.json.gz").is_file()


def store_trace(key: str | None, trace: dict) -> None:
    folder = _TRACES.get()
    COUNTS["trace_builds"] += 1
    if key is None or folder is None:
        return

    body = json.dumps(trace).encode()
    head = json.dumps({"key": key, "sha256": hashlib.sha256(body).hexdigest()}).encode()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(folder / f"{key}.json.gz", gzip.compress(head + b"\n" + body, compresslevel=3))
    except OSError:  # a read-only or full home: the trace is only not kept
        pass


def _result_key(loaded, what: dict) -> str | None:
    return trace_key(loaded, dict(what, result=True))


def has_result(loaded, what: dict) -> bool:
    """Whether ``kept_result(loaded, what, ...)`` has a value kept (not whether it can be trusted)."""
    return has_trace(_result_key(loaded, what))


def kept_result(loaded, what: dict, compute):
    """``compute()`` (a JSON value the estimator derives from the campaign alone and ``what``, such as the largest
    sizes' bisection, the predicted rows or the options table) read back from the journal's home under
    ``trace_key(loaded, what)``, else computed and kept; the same value either way (a JSON round trip)."""
    key = _result_key(loaded, what)
    stored = stored_trace(key)
    if stored is not None and "value" in stored:
        return stored["value"]
    value = jsonsafe.loads(json.dumps(compute()))  # as a later read gives it back (lists, string keys)
    if key is not None:
        store_trace(key, {"value": value})
    return value
