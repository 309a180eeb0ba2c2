"""A run's life in the journal: created only once the run can start, logged as it goes, always finished.

A run that fails, diverges or is interrupted keeps its row, its curve and its status.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from pilotrun.errors import DiskFull
from pilotrun.journal.files import atomic_write_json, atomic_write_text
from pilotrun.journal.files import is_disk_full as disk_full
from pilotrun.journal.store import Journal
from pilotrun.stages.prepare import run_provenance


FLUSH_S = 1.0  # the longest per-update metrics wait in memory before they reach the journal


def command_line() -> str:
    return "pilotrun " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else "pilotrun"


class RunRecorder:
    """Creates the run row and folder, records metrics to the journal and metrics.jsonl, finishes the run."""

    def __init__(self, journal: Journal, loaded, *, kind: str, supersedes: str | None = None,
                 sweep_id: str | None = None, arm: str | None = None, command: str | None = None):
        self.journal = journal
        prov = run_provenance(loaded)
        self.run_id = journal.create_run(kind=kind, name=loaded.campaign.name, supersedes=supersedes,
                                         sweep_id=sweep_id, arm=arm, command=command or command_line(), **prov)
        self.dir = journal.run_dir(self.run_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        from pilotrun.campaign.load import dump_yaml

        atomic_write_text(self.dir / "config.yaml", dump_yaml(prov["config"]))
        atomic_write_json(self.dir / "revisions.json", {k: prov[k] for k in ("git_rev", "packages", "data",
                                                                             "config_sha256", "trust_remote_code")})
        self._open_metrics()

    @classmethod
    def attach(cls, journal: Journal, run_id: str) -> "RunRecorder":
        """A recorder for a run another process created and will finish (rank 0 of spawned ranks): it logs
        metrics into the run; ``flush`` writes them; finishing stays with the run's owner."""
        rec = cls.__new__(cls)
        rec.journal, rec.run_id, rec.dir = journal, run_id, journal.run_dir(run_id)
        rec._open_metrics()
        return rec

    def _open_metrics(self) -> None:
        self._metrics = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        self._rows: list[tuple] = []
        self._progress: tuple[int, int] | None = None
        self._flushed = time.monotonic()
        self.finished = False

    def log(self, split: str, step: int, values: dict, *, examples_seen: int | None = None,
            wall_s: float | None = None, flush: bool = False) -> None:
        """Journal rows are buffered: written in one transaction at most every ``FLUSH_S`` seconds, at every validation
        and checkpoint (``flush=True`` or ``flush()``) and when the run finishes — a killed run loses
        at most the last second of per-update metrics, never a validation or a checkpoint's."""
        self._rows += [(split, k, step, float(v), examples_seen, wall_s) for k, v in values.items()]
        self._metrics.write(json.dumps({"split": split, "step": step, "examples_seen": examples_seen,
                                        "wall_s": wall_s, **{k: float(v) for k, v in values.items()}}) + "\n")
        self._metrics.flush()  # the file is whole whenever a manifest hashes it; only the journal batches
        if flush or time.monotonic() - self._flushed >= FLUSH_S:
            self.flush()

    def progress(self, updates_done: int, examples_seen: int) -> None:
        self._progress = (updates_done, examples_seen)

    def flush(self) -> None:
        self._metrics.flush()
        if self._rows or self._progress is not None:
            self.journal.add_metrics(self.run_id, self._rows, progress=self._progress)
            self._rows, self._progress = [], None
        self._flushed = time.monotonic()

    def finish(self, status: str, summary: dict | None = None) -> None:
        if self.finished:
            return
        self.flush()
        self._metrics.close()
        self.journal.finish_run(self.run_id, status, summary)
        self.finished = True

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.finished:
            if exc_type is KeyboardInterrupt:
                self.finish("interrupted", {"reason": "interrupted by the user (Ctrl-C)"})
            elif isinstance(exc, DiskFull) or (exc is not None and disk_full(exc, self.dir)):
                full = exc if isinstance(exc, DiskFull) else DiskFull(getattr(exc, "filename", None) or self.dir)
                self.finish("interrupted", {"reason": str(full).splitlines()[0]})
                if full is not exc:
                    raise full from None
            elif exc_type is not None:
                self.finish("failed", {"reason": f"{exc_type.__name__}: {exc}"})
            else:
                self.finish("completed")
        return False


def write_run_readme(run_dir: Path, run: dict, extra: list[str] | None = None) -> None:
    lines = [f"# pilotrun run {run['run_id']}", "",
             f"- campaign: {run['name']} ({run.get('campaign_path')})",
             f"- kind: {run['kind']}, seed: {run['seed']}",
             f"- config sha256: {run['config_sha256']}",
             f"- git revision of the campaign folder: {run.get('git_rev') or 'not a git repository'}", "",
             "Reproduce this run:", "", "```", f"{run.get('command')}", "```", "",
             "The resolved config is in `config.yaml`; package versions and data fingerprints in `revisions.json`;",
             "metrics per update in `metrics.jsonl`; every file's sha256 in `manifest.json`."]
    atomic_write_text(run_dir / "README.md", "\n".join(lines + (extra or [])) + "\n")
