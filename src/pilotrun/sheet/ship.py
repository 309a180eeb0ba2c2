"""What a rental needs from this machine: the stack the sheet checked, pinned; pilotrun itself as something
an installer can reach (a VCS URL at a pushed revision, else a wheel built here and uploaded); and every
file the campaign reads, with where the rental finds it.

Nothing here contacts an index or a hub: the wheel is built from the source checkout (its PEP 517 build backend,
already installed, called directly: ``pip wheel --no-deps`` builds the same files in twice the time, pip's own
start-up; pip stays the fallback) or repacked from the installed files.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pilotrun
from pilotrun.campaign.load import apply_overrides, parse_set
from pilotrun.campaign.reuse import package_digest
from pilotrun.errors import DiskFull
from pilotrun.journal.files import atomic_write_json, is_disk_full
from pilotrun import jsonsafe
from pilotrun.provenance import package_versions
from pilotrun.tasks.hub import is_hub_id

# pilotrun's own dependencies and what the pilot recorded (provenance.PACKAGES), torch apart
PINNED = ("transformers", "safetensors", "peft", "numpy", "pyarrow", "pydantic")


def pins(piloted: dict | None) -> tuple[str, list[str], str]:
    """``torch==X`` (the local tag, e.g. +cpu, dropped: the rental's index has its own build), the other
    packages ``name==version``, and where the versions come from."""
    source = "the versions the pilot ran with (its run's packages)"
    if not piloted or not piloted.get("torch"):
        piloted, source = package_versions(), "the versions installed here (no pilot recorded them)"
    torch = "torch==" + str(piloted["torch"]).split("+")[0] if piloted.get("torch") else "torch"
    return torch, [f"{p}=={piloted[p]}" for p in PINNED if piloted.get(p)], source


def source_root() -> Path | None:
    """The source checkout the running pilotrun comes from (its pyproject.toml), if it is one."""
    for parent in Path(pilotrun.__file__).resolve().parents[1:4]:
        py = parent / "pyproject.toml"
        if py.is_file() and re.search(r'^name\s*=\s*"pilotrun"', py.read_text(encoding="utf-8"), re.M):
            return parent
    return None


def _git(root: Path, *args: str) -> str | None:
    try:
        p = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout.strip() if p.returncode == 0 else None


def pilotrun_source() -> dict:
    """How the rental gets this pilotrun: ``{"kind": "vcs", "requirement"}`` for a clean git checkout with a
    remote (the revision must be pushed there), else ``{"kind": "wheel", "root"}`` (built from the checkout)
    or ``{"kind": "repack"}`` (the installed files), each with ``why``."""
    from importlib import metadata

    version = metadata.version("pilotrun")
    root = source_root()
    if root is None:
        return {"kind": "repack", "version": version,
                "why": "pilotrun is installed without a source checkout: its installed files, repacked as a wheel"}
    rev = _git(root, "rev-parse", "HEAD")
    if rev is None:
        return {"kind": "wheel", "root": str(root), "version": version,
                "why": f"a wheel built from {root} (not a git checkout)"}
    origin = _git(root, "remote", "get-url", "origin")
    dirty = _git(root, "status", "--porcelain", "--untracked-files=no")
    reachable = bool(origin) and not origin.startswith("file:") and ("://" in origin or "@" in origin)
    if reachable and not dirty:
        url = origin if "://" in origin else "ssh://" + origin.replace(":", "/", 1)
        return {"kind": "vcs", "requirement": f"pilotrun @ git+{url}@{rev}", "version": version,
                "why": f"the git checkout {root} at {rev[:12]}; push that revision to {origin} before launching"}
    why = "uncommitted changes" if dirty else "no remote named origin" if not origin else \
        f"its origin {origin} is a path on this machine"
    return {"kind": "wheel", "root": str(root), "version": version,
            "why": f"a wheel built from the git checkout {root} ({why}, so no URL an installer can reach)"}


WHEEL_KEY = ".pilotrun-wheel.json"  # beside the wheel: the source identity it was built from


def source_identity(root: Path) -> str | None:
    """sha256 of what ``pip wheel`` reads from the checkout ``root``: the package's files, pyproject.toml and the
    readme; None when the checkout is not laid out as src/pilotrun (then the wheel is built every time)."""
    import hashlib

    pkg = root / "src" / "pilotrun"
    if not pkg.is_dir():
        return None
    h = hashlib.sha256(package_digest(pkg).encode())
    for name in ("pyproject.toml", "README.md", "setup.cfg", "setup.py", "MANIFEST.in", "LICENSE"):
        f = root / name
        if f.is_file():
            h.update(name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def _kept_wheel(folder: Path, key: str | None) -> Path | None:
    if key is None:
        return None
    try:
        kept = jsonsafe.loads((folder / WHEEL_KEY).read_text())
        wheel = folder / kept["wheel"]
        if kept.get("key") == key and wheel.is_file() and wheel.stat().st_size == kept.get("size"):
            return wheel
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def build_wheel(src: dict, folder: Path) -> Path:
    """The wheel of ``src`` (``pilotrun_source``) in ``folder``; replaces an older one of the same name. A wheel
    this folder holds from the same source identity (``source_identity``) is reused, not built again; one built
    in the background for it (``wheel_beside``) is waited for and taken, not built again."""
    folder.mkdir(parents=True, exist_ok=True)
    if src["kind"] == "wheel":
        import shutil
        import tempfile

        key = source_identity(Path(src["root"]))
        kept = _kept_wheel(folder, key)
        if kept is not None:
            return kept
        early = _take_beside(src["root"], key)
        with tempfile.TemporaryDirectory(prefix="pilotrun-wheel-", dir=folder) as tmp:
            built = []
            if early is not None:
                try:  # TMPDIR may be another file system: copied in, then renamed into place below
                    built = [Path(shutil.copy2(early, Path(tmp) / early.name))]
                except OSError as e:
                    if is_disk_full(e, folder):
                        raise DiskFull(folder / early.name) from None
                    raise
                finally:
                    _drop_beside()
            built = built or _backend_wheel(Path(src["root"]), Path(tmp))
            if not built:
                p = subprocess.run(_pip_wheel_command(Path(src["root"]), Path(tmp)), cwd=src["root"],
                                   capture_output=True, text=True, timeout=300)
                built = sorted(Path(tmp).glob("pilotrun-*.whl"))
                if p.returncode != 0 and is_disk_full(RuntimeError(p.stderr or p.stdout or ""), folder):
                    raise DiskFull(folder / "pilotrun-*.whl")  # pip says it in its own words: exit 2, not a crash
                if p.returncode != 0 or not built:
                    raise RuntimeError(f"pip wheel {src['root']} failed: {(p.stderr or p.stdout).strip()[-500:]}")
            target = folder / built[0].name
            built[0].replace(target)  # same file system: an atomic rename
        if key is not None:
            atomic_write_json(folder / WHEEL_KEY, {"key": key, "wheel": target.name, "size": target.stat().st_size})
        return target
    return _repack(folder)


# The wheel being built in the background (``wheel_beside``): the checkout, its source identity, the build's process
# and its TMPDIR folder. One at a time, in the process that started it.
_BESIDE: dict = {}
BESIDE_PREFIX = "pilotrun-wheel-"  # its TMPDIR folder, named for its owner (pilotrun.scratch)


@contextmanager
def wheel_beside(folder: Path | None, *, now: bool = True):
    """Inside the block, pilotrun's wheel is built in the background, on another core, while the block works (the
    sheet's traces): ``build_wheel`` inside it waits for what is left of that build instead of building it then.
    Only where pilotrun ships as a wheel built from a checkout (``pilotrun_source``), its build backend can be
    called directly, and ``folder`` (where the launch files go; None: nothing) keeps no wheel of the same source.
    The block gets the function that starts it (``now=False``: the caller starts it when a core is idle; `all`
    does while resume's fresh process runs, ``fresh.meanwhile``); one build at a time, a block inside another's
    leaves it to the outer. The build writes only into a TMPDIR folder of this process; at the end of the block
    that started it a build still running is killed and that folder removed, so a failed or interrupted stage, or
    a sheet that writes no launch files, leaves nothing behind."""
    mine: list[bool] = []

    def start() -> None:
        if folder is not None and not _BESIDE and not mine:
            mine.append(_start_beside(Path(folder)))

    if now:
        start()
    try:
        yield start
    finally:
        if any(mine):
            _drop_beside()


def _start_beside(folder: Path) -> bool:
    from pilotrun.scratch import make_dir

    src = pilotrun_source()
    if src["kind"] != "wheel":
        return False
    root = Path(src["root"])
    key = source_identity(root)
    backend = _backend_of(root)
    if key is None or backend is None or _kept_wheel(folder, key) is not None:
        return False
    try:
        tmp = make_dir(BESIDE_PREFIX)
        proc = subprocess.Popen(_hook_command(backend, tmp), cwd=root, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:  # no room in TMPDIR, no process: build_wheel builds it when it is needed, as before
        return False
    _BESIDE.update(root=str(root), key=key, proc=proc, tmp=tmp, pid=os.getpid())
    return True


def _take_beside(root: str, key: str | None) -> Path | None:
    """The background build's wheel of checkout ``root`` at source identity ``key``, once it has ended; None when
    there is none, it failed or it ran past the foreground's own limit (then built again, as without it)."""
    if not _BESIDE or _BESIDE["pid"] != os.getpid() or _BESIDE["root"] != root or _BESIDE["key"] != key:
        return None
    try:
        code = _BESIDE["proc"].wait(timeout=300)
    except subprocess.TimeoutExpired:
        _drop_beside()
        return None
    built = sorted(_BESIDE["tmp"].glob("pilotrun-*.whl")) if code == 0 else []
    if len(built) != 1:
        _drop_beside()
        return None
    return built[0]


def _drop_beside() -> None:
    """Kill the background build if it still runs and remove its folder (this process's own only: a forked
    worker that shares the record leaves them to the process that started them)."""
    import shutil

    if not _BESIDE or _BESIDE["pid"] != os.getpid():
        return
    proc, tmp = _BESIDE["proc"], _BESIDE["tmp"]
    _BESIDE.clear()
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)


# Every build of the checkout, in a process of its own run in the checkout, first holds it (an exclusive flock on the
# folder, so no file is made for it) until that process ends, a killed build included: setuptools builds in the
# checkout's own build/ and egg-info folders, and two builds of one checkout at once (two sheets or `all`s on one
# machine) broke each other in 9 of 12 tries, each failing on a file the other had just moved or removed ("Directory
# not empty", "File exists", "No such file"). Where there is no flock (Windows) builds are not serialised.
_HOLD_CHECKOUT = """\
import os
try:
    import fcntl
except ImportError:
    fcntl = None
if fcntl is not None:
    fcntl.flock(os.open(".", os.O_RDONLY), fcntl.LOCK_EX)
"""
# PEP 517's build_wheel hook, in a fresh interpreter (as a build frontend calls it)
_HOOK = _HOLD_CHECKOUT + """\
import importlib, sys
mod, _, attr = sys.argv[1].partition(":")
backend = importlib.import_module(mod)
backend = getattr(backend, attr) if attr else backend
backend.build_wheel(sys.argv[2])
"""
# pip, as ``python -m pip`` runs it
_PIP = _HOLD_CHECKOUT + "import runpy\nrunpy.run_module('pip', run_name='__main__', alter_sys=True)\n"


def _hook_command(backend: str, out: Path) -> list[str]:
    """The fresh interpreter that calls ``backend``'s build_wheel into ``out`` (run in the checkout)."""
    return [sys.executable, "-c", _HOOK, backend, str(out)]


def _pip_wheel_command(root: Path, out: Path) -> list[str]:
    """``pip wheel --no-deps`` of the checkout ``root`` into ``out`` (run in the checkout): the build when the backend
    cannot be called directly."""
    return [sys.executable, "-c", _PIP, "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(root)]


def _backend_of(root: Path) -> str | None:
    """The checkout's build backend (pyproject.toml's ``build-system``) as the hook imports it; None when it cannot
    be called directly here (no tomllib before Python 3.11, an in-tree backend, no readable pyproject.toml)."""
    try:
        import tomllib
    except ImportError:
        return None
    try:
        system = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8")).get("build-system") or {}
    except (OSError, ValueError):
        return None
    backend = system.get("build-backend")
    if not isinstance(backend, str) or system.get("backend-path"):
        return None
    return backend


def _backend_wheel(root: Path, out: Path) -> list[Path]:
    """The wheel built by the checkout's own build backend (``_backend_of``) into ``out``; [] when that cannot be
    done here (no backend to call directly, the hook failed): the caller then asks pip."""
    backend = _backend_of(root)
    if backend is None:
        return []
    try:
        p = subprocess.run(_hook_command(backend, out), cwd=root, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(out.glob("pilotrun-*.whl")) if p.returncode == 0 else []


def _repack(folder: Path) -> Path:
    """A wheel of the installed distribution's own files (RECORD), its RECORD written anew."""
    import base64
    import hashlib
    import tempfile
    import zipfile
    from importlib import metadata

    dist = metadata.distribution("pilotrun")
    files = [f for f in dist.files or [] if "__pycache__" not in f.parts and not str(f).endswith(".pyc")
             and not str(f).startswith("..")]
    info = next((str(f.parts[0]) for f in files if f.parts[0].endswith(".dist-info")), None)
    if info is None:
        raise RuntimeError(f"pilotrun {dist.version} is installed without a .dist-info (an egg or a develop "
                           f"install) and no source checkout was found: install it from a wheel or a checkout")
    name = f"pilotrun-{dist.version}-py3-none-any.whl"
    fd, tmp = tempfile.mkstemp(prefix=".pilotrun-wheel-", dir=folder)
    os.close(fd)
    record = []
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for f in files:
            if str(f) == f"{info}/RECORD" or str(f).startswith(f"{info}/INSTALLER") \
                    or str(f).startswith(f"{info}/direct_url"):
                continue
            data = Path(f.locate()).read_bytes()
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            z.writestr(str(f), data)
            record.append(f"{f},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    target = folder / name
    os.replace(tmp, target)
    return target


def campaign_inputs(loaded, sets: tuple[str, ...] = ()) -> list[dict]:
    """Every file or folder the campaign reads: key, local path, the path as the campaign file writes it,
    ``kind`` (file | folder | hub | module | installed) and ``inside`` (under the campaign's folder)."""
    import importlib.util

    import yaml

    c = loaded.campaign
    base = Path(loaded.source).resolve().parent
    raw = yaml.safe_load(Path(loaded.source).read_text(encoding="utf-8")) or {}
    raw = apply_overrides(raw, parse_set(list(sets))) if sets else raw

    def written(section: str, key: str):
        v = (raw.get(section) or {}).get(key)
        return str(v) if v is not None else None

    out = []

    def add(key, value, resolved, kind):
        p = Path(resolved).resolve()
        inside = p == base or base in p.parents
        out.append({"key": key, "written": value, "local": str(p), "kind": kind, "inside": inside})

    mp = written("model", "path")
    # a hub id the campaign loader resolved from the local cache (tasks/hub.py): the rental fetches it
    if "model.path" in getattr(loaded, "hub", {}) or (mp and c.model.path is None and is_hub_id(mp, base)):
        out.append({"key": "model.path", "written": mp, "local": None, "kind": "hub", "inside": True})
    elif c.model.path:
        add("model.path", mp, c.model.path, "folder")
    tok = c.model.tokenizer
    if tok and tok != "byte" and tok != c.model.path:
        add("model.tokenizer", written("model", "tokenizer"), tok, "folder" if Path(tok).is_dir() else "file")
    for k in ("train", "validation", "test"):
        v = getattr(c.data, k)
        if v:
            add(f"data.{k}", written("data", k), v, "file")
    ct = c.data.chat_template
    if ct.endswith(".jinja") and "{" not in ct:
        add("data.chat_template", ct, ct if Path(ct).is_absolute() else base / ct, "file")
    if ":" in c.task:
        top = c.task.split(":")[0].split(".")[0]
        local = base / f"{top}.py" if (base / f"{top}.py").is_file() else base / top
        if local.exists():
            add("task", c.task, local, "module")
        else:
            spec = importlib.util.find_spec(top)
            origin = getattr(spec, "origin", None) if spec else None
            out.append({"key": "task", "written": c.task, "local": origin, "kind": "installed", "inside": False})
    return out


def remote_path(item: dict) -> str | None:
    """Where a file outside the campaign folder goes on a SkyPilot node, so the campaign file's own path
    reaches it from the workdir (~/sky_workdir): the same absolute path, or the relative one from there."""
    import posixpath

    w = item["written"]
    if w is None:
        return None
    if Path(w).is_absolute():
        return w
    rel = posixpath.normpath(posixpath.join("sky_workdir", w))
    return None if rel.startswith("..") else "~/" + rel
