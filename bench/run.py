"""Runs every bench/bench_*.py module's ``run()``, writes bench/RESULTS.md atomically and prints it.

Usage: ``python bench/run.py [--quick] [--only NAME ...]``. ``--quick`` is passed to modules whose
``run`` takes a ``quick`` argument (fewer repetitions); the others run as they are. A module that
raises gives one row saying so, and the other modules still run.

run.py owns the table, its notes and the machine line, the top of RESULTS.md down to the line that starts
with ``Machine:``. Whatever follows it (the sections engineers write by hand about an issue's runs: how the
table was run, before and after figures) is kept as it is, below the new table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import inspect
import os
import platform
import sys
import tempfile
import traceback
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MACHINE = "Machine:"
COLUMNS = ("figure", "median", "min–max", "runs", "target", "met", "command")


def _num(x) -> str:
    return "—" if x is None else f"{x:.3g}"


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def machine_line() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{MACHINE} {cpu}, {cores} cores, torch {torch_version}, Python {platform.python_version()}, "
            f"{dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}")


def markdown(rows: list[dict], machine: str | None = None, quick: bool = False) -> str:
    """The results table: one row per figure, then the notes, then the machine line."""
    out = ["# pilotrun benchmarks", "",
           "Every figure is measured in one run; A and B interleaved, warm-up first, medians quoted."
           + (" Run with `--quick` (fewer repetitions)." if quick else ""), "",
           "| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    for r in rows:
        span = "—" if r.get("min") is None else f"{_num(r['min'])}–{_num(r['max'])}"
        met = {True: "yes", False: "NO", None: "—"}[r.get("met")]
        cells = [r["figure"], _num(r.get("median")), span, r.get("runs", 0), r.get("target", ""), met,
                 f"`{r['command']}`" if r.get("command") else ""]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    notes = [f"- {_cell(r['figure'])}: {r['note']}" for r in rows if r.get("note")]
    if notes:
        out += ["", "Notes:", *notes]
    if machine:
        out += ["", machine]
    return "\n".join(out) + "\n"


def kept_sections(old: str) -> str:
    """What of an earlier RESULTS.md run.py does not own: everything after its machine line (or, in a file
    without one, from its first ``##`` heading on); "" when there is nothing."""
    lines = old.splitlines()
    at = next((i + 1 for i, line in enumerate(lines) if line.startswith(MACHINE)), None)
    if at is None:
        at = next((i for i, line in enumerate(lines) if line.startswith("##")), len(lines))
    return "\n".join(lines[at:]).strip("\n")


def with_kept_sections(text: str, path: Path) -> str:
    """The new table ``text`` followed by the sections of ``path`` (if it exists) that run.py does not own."""
    try:
        tail = kept_sections(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        tail = ""
    return text + ("\n" + tail + "\n" if tail else "")


def write_results(text: str, path: Path) -> None:
    """Atomic: a temporary file in the same folder, then a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def child_env(**extra: str) -> dict:
    """The environment of a bench's fresh Python process: this checkout's ``src`` first on its path (then the
    caller's own), the hub offline, and ``extra``."""
    path = [str(REPO / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(path), **extra)


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(f"pilotrun_bench_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_module(path: Path, quick: bool) -> list[dict]:
    try:
        mod = load_module(path)
        kwargs = {"quick": quick} if "quick" in inspect.signature(mod.run).parameters else {}
        return mod.run(**kwargs)
    except Exception as exc:
        traceback.print_exc()
        return [{"figure": f"{path.stem}: failed", "median": None, "min": None, "max": None, "runs": 0,
                 "target": "", "met": False, "command": f"python bench/{path.name}",
                 "note": f"{type(exc).__name__}: {exc}"}]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions where a module allows it")
    ap.add_argument("--only", nargs="*", default=None, help="module names, e.g. bench_loop")
    ap.add_argument("--out", type=Path, default=BENCH / "RESULTS.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(REPO))
    modules = sorted(BENCH.glob("bench_*.py"))
    if args.only:
        modules = [m for m in modules if m.stem in args.only]
    rows: list[dict] = []
    for path in modules:
        print(f"running {path.name} ...", file=sys.stderr, flush=True)
        rows += run_module(path, args.quick)
    text = markdown(rows, machine_line(), args.quick)
    write_results(with_kept_sections(text, args.out), args.out)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
