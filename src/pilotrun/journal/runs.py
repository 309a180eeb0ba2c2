"""A run's life in the journal — the one place runs are created, finished, failed and interrupted.

Created only once the run can start (``create_run``: provenance and the one config hash), logged as
it goes, always ended (``finish_run`` / ``end_run``: completed, diverged, failed, interrupted). Used by
the stages (``RunRecorder``), the framework callbacks (``integrations._common``) and the own-loop
recorder (``probe.recorder.own_run``). A run that fails, diverges or is interrupted keeps its row, its
curve and its status.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from pilotrun.errors import BadInput, DiskFull
from pilotrun.journal.files import atomic_write_json, atomic_write_text, dump_yaml, write_manifest
from pilotrun.journal.files import is_disk_full as disk_full
from pilotrun.journal.observers import tell
from pilotrun.journal.store import Journal, Lease, check_fence, iso, last_heartbeat, wall_time
from pilotrun.provenance import (command_line, config_sha256, file_sha256, git_revision, package_versions,
                                 plain_config)
from pilotrun.signals import interruption

FLUSH_S = 1.0  # the longest per-update metrics wait in memory before they reach the journal
SPLITS = ("train", "validation", "test")
INTERRUPTED = "interrupted by the user (Ctrl-C)"


def run_provenance(loaded) -> dict:
    """What a campaign's run records about where it came from (a :class:`LoadedCampaign`)."""
    c = loaded.campaign
    return {"config": loaded.resolved_dict(), "config_sha256": loaded.config_sha256(),
            "campaign_path": str(loaded.source) if loaded.source else None, "seed": c.seed,
            "git_rev": git_revision(loaded.base_dir), "packages": package_versions(),
            "data": data_fingerprints(c), "trust_remote_code": c.model.trust_remote_code}


def hub_revisions(loaded) -> dict[str, dict]:
    """model.path / model.tokenizer named by hub id: what each asked for and the commit it resolved to."""
    return {k: v.as_dict() for k, v in getattr(loaded, "hub", {}).items()}


def data_fingerprints(c) -> dict[str, dict]:
    """Each data file of the campaign ``c``: its path and the sha256 of its bytes."""
    return {s: {"path": getattr(c.data, s), "sha256": file_sha256(getattr(c.data, s), reuse=True)}
            for s in SPLITS if getattr(c.data, s)}


def create_run(journal: Journal, *, kind: str, name: str, config: dict, seed: int | None = None,
               campaign_path: str | None = None, git_rev: str | None = None, data: dict | None = None,
               trust_remote_code: bool = False, command: str | None = None, **links) -> str:
    """The run row, its config hashed by the one :func:`config_sha256` (``links``: supersedes, sweep_id, arm)."""
    config = plain_config(config)
    return journal.create_run(kind=kind, name=name, config=config, config_sha256=config_sha256(config),
                              campaign_path=campaign_path, seed=seed, git_rev=git_rev, packages=package_versions(),
                              data=data or {}, trust_remote_code=trust_remote_code,
                              command=command or command_line(), **links)


def ending(exc: BaseException) -> tuple[str, dict]:
    """The status and summary of a run ended by ``exc``: Ctrl-C or a signal (``signals.Preempted``: SIGTERM,
    SIGHUP) interrupts it, and so does an error that is part of such a stop (``signals.interruption``: one after
    a signal, a peer rank lost in a collective); anything else fails it."""
    stopped = interruption(exc)
    if stopped is not None:
        return "interrupted", {"reason": getattr(stopped, "reason", INTERRUPTED)}
    if isinstance(exc, BadInput):  # the user's to fix: the message names it (no class name in what they read)
        return "failed", {"reason": f"bad input: {exc}"}
    return "failed", {"reason": f"{type(exc).__name__}: {exc}"}  # a bug: the exception, as it reads in a report


def end_run(journal: Journal, run_id: str, exc: BaseException) -> None:
    journal.finish_run(run_id, *ending(exc))


def missing_run_folder(journal: Journal, run_id: str) -> "BadInput":
    """A run whose folder is gone (deleted or moved by hand): what it means and how to get it back."""
    run_dir = journal.run_dir(run_id)
    return BadInput(f"the folder of run {run_id} does not exist: {run_dir} (deleted or moved); the journal keeps the "
                    "run's rows, its checkpoints, artifact and files are gone", where=str(run_dir),
                    fix=f"restore it from an archive of the run (`tar -xzf FILE.tar.gz -C {journal.runs_dir}`), or pass "
                        "the --home whose runs/ folder holds it")


def phase_summary(journal: Journal, run_id: str) -> dict:
    verdicts = [r["verdict"] for r in journal.phase_rows(run_id)]
    return {"phases": len(verdicts), "failing": sum(v != "ok" for v in verdicts)}


# What a pilot's measurements (memory per phase, seconds per update) do not depend on: the campaign's name, its
# plan and hardware, how long it trains, when it validates and saves, the optimizer's numbers (not its kind), the
# seed, where it was imported from; the data files are compared by content (a copy elsewhere is the same data)
NOT_MEASURED = ("name", "plan", "hardware", "imported", "seed", "train.updates", "train.epochs", "train.eval_every",
                "train.save_every", "train.keep_checkpoints", "train.lr", "train.weight_decay", "train.schedule",
                "train.warmup", "train.max_grad_norm", "train.stop", "data.train", "data.validation", "data.test")
IDENTITY = ("task", "model.path", "model.config")  # a pilot of another model or task is never the nearest


def flat(d: dict, prefix: str = "") -> dict[str, object]:
    """A (resolved) config's nested dicts as dotted keys (``train.lr``); lists and other values as they are."""
    out: dict[str, object] = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _free(key: str) -> bool:
    return any(key == f or key.startswith(f + ".") for f in NOT_MEASURED)


def measured_differences(config: dict, run: dict, hashes: dict | None = None) -> list[str]:
    """The keys whose values differ between the config ``config`` and what the pilot ``run`` measured: settings
    that change its measurements, and each data split by content (``hashes``: the sha256 of files read so far)."""
    a, b = flat(config), flat(run.get("config") or {})
    keys = sorted(k for k in set(a) | set(b) if not _free(k) and a.get(k) != b.get(k))
    hashes = {} if hashes is None else hashes
    for split in SPLITS:
        cur, rec = (config.get("data") or {}).get(split), (run.get("data") or {}).get(split)
        if cur is None and rec is None:
            continue
        if cur is None or rec is None:
            keys.append(f"data.{split}")
        else:  # by content, the same path included: a file replaced since (a restore, rsync -t) is other data
            if cur not in hashes:
                try:
                    hashes[cur] = file_sha256(cur)
                except OSError:
                    hashes[cur] = None
            if hashes[cur] != rec.get("sha256"):
                keys.append(f"data.{split}")
    return keys


def _said(keys: list[str], config: dict | None, run: dict, hashes: dict) -> str:
    """The differences ``keys`` in words: a data file at the path the pilot read, whose content changed since,
    named as such with both hashes."""
    out = []
    for k in keys:
        split = k.removeprefix("data.")
        cur, rec = ((config or {}).get("data") or {}).get(split), (run.get("data") or {}).get(split) or {}
        if k.startswith("data.") and cur is not None and cur == rec.get("path"):
            now = hashes.get(cur)
            out.append(f"{k} (the file {cur} holds other data now: sha256 {str(rec.get('sha256'))[:12]} when the "
                       f"pilot read it, {str(now)[:12] if now else 'unreadable'} now)")
        else:
            out.append(k)
    return _keys(out)


def find_pilot(journal, name: str, sha: str | None, config: dict | None = None) -> tuple[dict | None, str | None]:
    """The pilot whose measurements stand for this campaign, and None or why they may not.

    The latest pilot of the campaign ``name`` with the config sha256 ``sha``; else, given the resolved ``config``,
    the latest pilot of any name that measured the same thing (``measured_differences`` empty: a copy of the
    campaign under another name, another budget or learning rate); else the latest of the same name, or the
    nearest pilot of the same task and model (fewest measured differences), said as another config's."""
    runs = [r for r in journal.list_runs(kind="pilot") if journal.phase_rows(r["run_id"])]
    mine = [r for r in runs if r["name"] == name]
    hashes: dict = {}
    diffs = {r["run_id"]: measured_differences(config, r, hashes) for r in runs} if config is not None else {}
    same = [r for r in mine if r["config_sha256"] == sha and not diffs.get(r["run_id"])]  # its data by content too
    if same:
        return same[-1], None
    measured_same = [r for r in runs if config is not None and not diffs[r["run_id"]]]
    if measured_same:
        return measured_same[-1], None
    if mine:
        run = mine[-1]
        what = (f"another setting of {_said(diffs[run['run_id']], config, run, hashes)}" if diffs.get(run["run_id"]) else
                f"another version of the campaign (config sha256 {run['config_sha256'][:12]} vs {str(sha)[:12]})")
        return run, f"the latest pilot {run['run_id']} measured {what}; rerun `pilotrun pilot` for numbers of this version"
    if config is None:
        return None, None
    near = [r for r in runs if not any(k == i or k.startswith(i + ".") for k in diffs[r["run_id"]] for i in IDENTITY)]
    if not near:
        return None, None
    run = min(reversed(near), key=lambda r: len(diffs[r["run_id"]]))  # the latest among the nearest
    return run, (f"no pilot of campaign {name!r} measured this config; the nearest is pilot {run['run_id']} of campaign "
                 f"{run['name']!r}, which measured another setting of {_said(diffs[run['run_id']], config, run, hashes)}: its figures are "
                 "for that config; run `pilotrun pilot` for this one")


def _keys(keys: list[str]) -> str:
    return ", ".join(keys[:5]) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")


def still_alive(run: dict) -> str:
    """Where a running run lives and when it last renewed its lease (the journal's wall clock)."""
    beat = last_heartbeat(run)
    return f"pid {run['pid']} on host {run['host']}, last heartbeat {iso(beat)} ({wall_time() - beat:.0f}s ago)"


def user_command() -> str:
    """The command that started this process as the user typed it (``python train_hf.py --lr 3e-4``), for
    runs recorded from the user's own script (callbacks, own loops) rather than from the pilotrun CLI."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if argv and argv[0] == sys.executable:
        argv[0] = Path(argv[0]).name
    return shlex.join(argv)


class RunRecorder:
    """Creates the run row and folder, records metrics to the journal and metrics.jsonl, finishes the run."""

    def __init__(self, journal: Journal, loaded, *, kind: str, supersedes: str | None = None,
                 sweep_id: str | None = None, arm: str | None = None, command: str | None = None):
        self.journal = journal
        prov = run_provenance(loaded)
        self.run_id = create_run(journal, kind=kind, name=loaded.campaign.name, supersedes=supersedes,
                                 sweep_id=sweep_id, arm=arm, command=command,
                                 **{k: v for k, v in prov.items() if k not in ("config_sha256", "packages")})
        self.dir = journal.run_dir(self.run_id)
        self.dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.dir / "config.yaml", dump_yaml(prov["config"]))
        # hub: a model.path / model.tokenizer given as a hub id, and the cached commit it resolved to (the
        # config's model.path is that commit's snapshot folder)
        atomic_write_json(self.dir / "revisions.json", {**{k: prov[k] for k in ("git_rev", "packages", "data",
                                                                                "config_sha256", "trust_remote_code")},
                                                        "hub": hub_revisions(loaded)})
        self._open_metrics()
        tell("started", journal, self.run_id)

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
        self._lines: list[str] = []  # metrics.jsonl's lines wait with the journal's rows (see flush)
        self._progress: tuple[int, int] | None = None
        self._flushed = time.monotonic()
        self.finished = False

    def log(self, split: str, step: int, values: dict, *, examples_seen: int | None = None,
            wall_s: float | None = None, flush: bool = False) -> None:
        """Journal rows are buffered: written in one transaction at most every ``FLUSH_S`` seconds, at every validation
        and checkpoint (``flush=True`` or ``flush()``) and when the run finishes — a killed run loses
        at most the last second of per-update metrics, never a validation or a checkpoint's."""
        check_fence(self.run_id)  # a run the journal reaped while this process was stopped gets nothing more
        self._rows += [(split, k, step, float(v), examples_seen, wall_s) for k, v in values.items()]
        self._lines.append(json.dumps({"split": split, "step": step, "examples_seen": examples_seen,
                                       "wall_s": wall_s, **{k: float(v) for k, v in values.items()}}) + "\n")
        if flush or time.monotonic() - self._flushed >= FLUSH_S:
            self.flush()

    def progress(self, updates_done: int, examples_seen: int) -> None:
        self._progress = (updates_done, examples_seen)

    def flush(self) -> None:
        """The journal's rows first, in a transaction that is fenced (a run reaped while this process was stopped
        refuses it), then the same lines into metrics.jsonl: the file never gains a line the journal refused.
        Called before anything hashes the run folder (a checkpoint, the run's manifest) and at the end."""
        if self._rows or self._progress is not None:
            self.journal.add_metrics(self.run_id, self._rows, progress=self._progress)
            logged, self._rows, self._progress = bool(self._rows), [], None
            if logged:
                tell("logged", self.journal, self.run_id)
        if self._lines:
            self._metrics.write("".join(self._lines))
            self._lines = []
        self._metrics.flush()
        self._flushed = time.monotonic()

    def seal(self, extra: list[str] | None = None) -> None:
        """The run folder's README (``extra`` lines appended) and its manifest, metrics.jsonl made whole before
        the manifest hashes it (a finished recorder flushed it when it closed it)."""
        write_run_readme(self.dir, self.journal.get_run(self.run_id), extra)
        if not self.finished:
            self.flush()
        write_manifest(self.dir, {"kind": "pilotrun-run", "run_id": self.run_id})

    def finish(self, status: str, summary: dict | None = None) -> None:
        if self.finished:
            return
        if self.run_id in Lease.reaped:  # fenced (signals.Reaped): its row and files stay as the reaper left them
            self._rows, self._lines, self._progress, self.finished = [], [], None, True
            self._metrics.close()
            return
        self.flush()
        self._metrics.close()
        self.journal.finish_run(self.run_id, status, summary)
        self.finished = True
        tell("finished", self.journal, self.run_id)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if not self.finished:
            if exc_type is None:
                self.finish("completed")
            elif not isinstance(exc, KeyboardInterrupt) and (isinstance(exc, DiskFull) or disk_full(exc, self.dir)):
                full = exc if isinstance(exc, DiskFull) else DiskFull(getattr(exc, "filename", None) or self.dir)
                self.finish("interrupted", {"reason": str(full).splitlines()[0]})
                if full is not exc:
                    raise full from None
            else:
                self.finish(*ending(exc))
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


CHECK_FAILED = "check failed"  # a run that ended normally but whose check's verdict is fail (overfit, resume ...)


def shown_status(run: dict) -> str:
    """The run's status as ``runs``, ``show`` and the report print it: the journal's, except that a run that
    completed with a failing verdict (``summary.verdict``) is not shown ``completed``."""
    verdict = (run.get("summary") or {}).get("verdict")
    return CHECK_FAILED if run.get("status") == "completed" and verdict == "fail" else run.get("status")


def _set_pairs(command: str | None) -> list[str]:
    """The ``--set KEY=VALUE`` pairs of a recorded command line."""
    try:
        argv = shlex.split(command or "")
    except ValueError:
        return []
    out = []
    for i, a in enumerate(argv):
        if a == "--set" and i + 1 < len(argv):
            out.append(argv[i + 1])
        elif a.startswith("--set="):
            out.append(a.removeprefix("--set="))
    return out


def run_table_rows(journal: Journal, runs: list[dict]) -> list[dict]:
    """``runs`` (journal rows) with what a runs table shows: the shown status, the verdict, the updates
    counted from the logged metrics where the row's counter lags (an interrupted or running run flushes its
    counter seldom), the final metric (the last validation value, else the last training loss) and the
    overrides (the command's --set pairs, the sweep arm)."""
    ids = [r["run_id"] for r in runs]
    logged: dict[str, tuple] = {}
    final: dict[str, str] = {}
    if ids:
        marks = ",".join("?" * len(ids))
        with journal.connect() as db:
            for row in db.execute(f"SELECT run_id, MAX(step), MAX(examples_seen) FROM metrics WHERE split='train' "
                                  f"AND run_id IN ({marks}) GROUP BY run_id", ids):
                logged[row[0]] = (row[1], row[2])
            for row in db.execute(f"SELECT run_id, split, name, value, step FROM metrics WHERE run_id IN ({marks}) "
                                  f"AND (split='validation' OR (split='train' AND name='loss')) "
                                  f"ORDER BY run_id, split='validation', step, name='val_loss'", ids):
                v = "nan" if row[3] is None else format(row[3], ".4g")
                final[row[0]] = f"{row[2]} {v}"  # validation rows sort last: the last validation wins
    out = []
    for r in runs:
        steps, seen = logged.get(r["run_id"], (None, None))
        summary = r.get("summary") or {}
        pairs = _set_pairs(r.get("command")) + ([f"arm {r['arm']}"] if r.get("arm") else [])
        out.append(dict(r, updates_done=max(r.get("updates_done") or 0, steps or 0),
                        examples_seen=max(r.get("examples_seen") or 0, seen or 0),
                        shown_status=shown_status(r), verdict=summary.get("verdict"), final=final.get(r["run_id"]),
                        overrides=", ".join(pairs) or None))
    return out
