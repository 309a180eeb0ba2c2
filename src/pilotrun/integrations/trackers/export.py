"""``export``: what the journal holds — a run, a sweep, a campaign, or all of it — in the team's tracker.

Idempotent through the journal: each subject's tracker id is kept (``journal/tracked.py``), so a second export
finds the same tracker run and sends only what it lacks; a complete subject whose digest (its final status and
notes) is unchanged is not touched; a run logged live is the run its export completes. A tracker that is down
or refuses is bad input naming it (exit 2); what was sent before stays recorded, so the next export goes on.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pilotrun.console.progress import head, note
from pilotrun.errors import BadInput, raised_by_pilotrun
from pilotrun.integrations.trackers import content as C
from pilotrun.journal.tracked import record_tracked, tracked
from pilotrun.verdicts import StageResult


def make_tracker(to: str, home: Path, *, uri: str | None = None, experiment: str | None = None):
    """The tracker object (its package imported here, never before a tracker is asked for)."""
    if to == "mlflow":
        from pilotrun.integrations.trackers.mlflow_tracker import MlflowTracker

        return MlflowTracker(home, uri=uri, experiment=experiment)
    if to == "wandb":
        if uri:
            raise BadInput("--uri is MLflow's tracking URI; W&B reads its own settings", where="--uri",
                           fix="leave --uri out for W&B: set WANDB_MODE, WANDB_DIR, WANDB_BASE_URL as W&B's docs say")
        from pilotrun.integrations.trackers.wandb_tracker import WandbTracker

        return WandbTracker(home, project=experiment)
    raise BadInput(f"unknown tracker {to!r}", where="--to", fix="pass --to mlflow or --to wandb")


class TrackerFailed(BadInput):
    """The tracker did not answer, or refused what was sent."""


def failed(tracker, exc: BaseException) -> TrackerFailed:
    what = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    uri = getattr(tracker, "uri", None)
    if uri and uri != tracker.target:  # the client's message may quote the address as given: its password masked
        what = what.replace(uri, tracker.target)
    return TrackerFailed(f"{tracker.name} at {tracker.target} did not take the export: {type(exc).__name__}: {what}",
                         where=tracker.target, fix="check that the tracker is up and the URI is right (--uri, the "
                         "campaign's track.uri, $MLFLOW_TRACKING_URI), then export again: what was sent is kept "
                         "in the journal and not sent twice")


TRACKER_NAMES = {"mlflow": "MLflow", "wandb": "W&B"}


class Exporter:
    """Sends subjects to one tracker, keeping each tracker id in the journal."""

    def __init__(self, journal, tracker):
        self.journal, self.tracker = journal, tracker
        self.done: list[dict] = []  # what each call did: subject, kind, tracker id, action
        self.sweeps: dict[str, dict] = {}  # the sweeps whose runs were sent: id -> the arms' labels
        self.total, self.k = 0, 0  # runs `export` will look at, and how many it has: its progress line's count
        # (0: the live tracker's exporter, on a worker thread beside the training's own line, says nothing)

    def _row(self, subject: str) -> dict | None:
        return tracked(self.journal, self.tracker.name, self.tracker.target, subject)

    def _record(self, subject: str, tid: str, experiment: str, state: str, digest: str | None) -> None:
        record_tracked(self.journal, self.tracker.name, self.tracker.target, subject, tid, experiment=experiment,
                       state=state, digest=digest)

    def run(self, run_id: str, *, live: bool = False) -> str:
        """One run (its sweep's parent first, if it has one). Returns the tracker's id for it."""
        run = self.journal.get_run(run_id)
        if self.total:
            self.k += 1
            self.total = max(self.total, self.k)  # a sweep's run under another campaign name, counted as it comes
            note(f"run {self.k}/{self.total}: {run_id} ({run['kind']})", done=self.k - 1, total=self.total)
        row = self._row(run_id)
        digest = C.run_digest(self.journal, run)
        if row and row["state"] == "complete" and (row["digest"] == digest or not self.tracker.updatable):
            self.done.append({"subject": run_id, "kind": run["kind"], "tracker_run_id": row["tracker_run_id"],
                              "action": "unchanged"})
            return row["tracker_run_id"]
        parent, label = None, None
        if run.get("sweep_id"):
            parent, labels = self.sweep_parent(run["sweep_id"])
            label = labels.get(run.get("arm"))
        tid = self.tracker.send_run(self.journal, run, row["tracker_run_id"] if row else None, parent, label)
        finished = C.finished(run)
        self._record(run_id, tid, self.tracker.experiment_of(run["name"]),
                     "complete" if finished else "live" if live else "partial", digest if finished else None)
        self.done.append({"subject": run_id, "kind": run["kind"], "tracker_run_id": tid,
                          "action": "updated" if row else "sent"})
        return tid

    def sweep_parent(self, sweep_id: str) -> tuple[str | None, dict]:
        """The sweep's parent run in the tracker (created when missing) and its arms' labels."""
        row = self._row(sweep_id) if self.tracker.parents else None
        if sweep_id in self.sweeps and (row or not self.tracker.parents):
            return (row["tracker_run_id"] if row else None), self.sweeps[sweep_id]
        sweep = C.sweep_content(self.journal, sweep_id)
        self.sweeps[sweep_id] = sweep["labels"]
        if not self.tracker.parents:
            return None, sweep["labels"]
        if row:
            return row["tracker_run_id"], sweep["labels"]
        return self._send_sweep(sweep, None), sweep["labels"]

    def _send_sweep(self, sweep: dict, row: dict | None) -> str:
        tid = self.tracker.send_sweep(self.journal, sweep, row["tracker_run_id"] if row else None)
        done = sweep["state"] != "running"
        self._record(sweep["sweep_id"], tid, self.tracker.experiment_of(sweep["campaign"]),
                     "complete" if done else "partial", sweep["digest"] if done else None)
        self.done.append({"subject": sweep["sweep_id"], "kind": "sweep-plan", "tracker_run_id": tid,
                          "action": "updated" if row else "sent"})
        return tid

    def sweep(self, sweep_id: str) -> None:
        """Every run of the sweep (superseded ones too: they stay in the journal), then the parent's outcome."""
        for run in self.journal.list_runs(sweep_id=sweep_id):
            self.run(run["run_id"])
        sweep = C.sweep_content(self.journal, sweep_id)
        row = self._row(sweep_id)
        if row and row["state"] == "complete" and (row["digest"] == sweep["digest"] or not self.tracker.updatable):
            self.done.append({"subject": sweep_id, "kind": "sweep-plan", "tracker_run_id": row["tracker_run_id"],
                              "action": "unchanged"})
            return
        self._send_sweep(sweep, row)

    def campaign(self, name: str) -> None:
        """Every run of the campaign, each of its sweeps, and the campaign's own run: the sheet, its launch files,
        the HTML report and the journal's notes and decisions."""
        runs = self.journal.list_runs(name=name)
        for sweep_id in C.sweeps_of(self.journal, name):
            self.sweep(sweep_id)
        for run in runs:
            if not run.get("sweep_id"):
                self.run(run["run_id"])
        subject = f"campaign:{name}"
        digest = C.campaign_digest(self.journal, name)
        row = self._row(subject)
        if row and row["digest"] == digest:
            self.done.append({"subject": subject, "kind": "campaign", "tracker_run_id": row["tracker_run_id"],
                              "action": "unchanged"})
            return
        from pilotrun.report.html import write_report
        from pilotrun.scratch import make_dir

        if self.total:
            note(f"campaign {name}'s own run: its sheet, report and notes")

        tmp = make_dir("pilotrun-export-")
        try:
            files = C.sheet_files(self.journal.home) + [write_report(self.journal, tmp / "report.html")]
            desc = C.notes_text([n for n in self.journal.notes() if n["run_id"] is None],
                                [f"pilotrun campaign `{name}`: {len(runs)} runs in {self.journal.path}", ""])
            tid = self.tracker.send_campaign(self.journal, name, files, desc,
                                             row["tracker_run_id"] if row else None)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self._record(subject, tid, self.tracker.experiment_of(name), "complete", digest)
        self.done.append({"subject": subject, "kind": "campaign", "tracker_run_id": tid,
                          "action": "updated" if row else "sent"})


def resolve_subject(journal, what: str | None, campaign_name: str | None) -> tuple[str, str | None]:
    """("campaign", NAME), ("sweep", SWEEP_ID), ("run", RUN_ID) or ("all", None)."""
    if campaign_name is not None:
        return "campaign", campaign_name
    if what is None:
        return "all", None
    if what.startswith("sweep-"):
        return "sweep", journal.resolve_sweep_id(what, where="SWEEP_ID")
    return "run", journal.resolve_run_id(what, where="RUN_ID")


def export(journal, to: str, what: str | None = None, *, campaign_name: str | None = None, uri: str | None = None,
           experiment: str | None = None) -> StageResult:
    """Send ``what`` (a run id, a sweep id, or with ``campaign_name`` a campaign; None: every campaign of the
    journal) to tracker ``to``; the result says what was sent, updated or found unchanged."""
    kind, subject = resolve_subject(journal, what, campaign_name)
    if kind == "campaign" and not journal.list_runs(name=subject):
        raise BadInput(f"the journal {journal.path} has no run of campaign {subject!r}", where="CAMPAIGN",
                       fix="run a stage of it first (pilotrun all CAMPAIGN), or pass the --home of its runs")
    head(f"opening {TRACKER_NAMES[to]} (importing its package)")
    tracker = make_tracker(to, journal.home, uri=uri, experiment=experiment)
    ex = Exporter(journal, tracker)
    names = [subject] if kind == "campaign" else C.campaigns(journal) if kind == "all" else []
    ex.total = 1 if kind == "run" else len(journal.list_runs(sweep_id=subject)) if kind == "sweep" else \
        sum(len(journal.list_runs(name=n)) for n in names)
    head(f"sending {ex.total} run{'s' if ex.total != 1 else ''} to {TRACKER_NAMES[to]}")
    try:
        if kind == "run":
            ex.run(subject)
        elif kind == "sweep":
            ex.sweep(subject)
        else:
            for name in names:
                ex.campaign(name)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - the tracker refused or is down: bad input naming it, what was sent kept
        if raised_by_pilotrun(e):  # pilotrun's own bug, not the tracker's refusal: exit 3, as any other
            raise
        raise failed(tracker, e) from e
    finally:
        tracker.close()
    return export_result(tracker, kind, subject, ex.done)


def export_result(tracker, kind: str, subject: str | None, done: list[dict]) -> StageResult:
    seen: dict[str, dict] = {}  # one line per subject: a sweep's parent is made as its first arm is sent
    for d in done:
        if d["subject"] not in seen or d["action"] != "unchanged":
            seen[d["subject"]] = dict(d, action=d["action"] if d["subject"] not in seen or
                                      seen[d["subject"]]["action"] == "unchanged" else seen[d["subject"]]["action"])
    done = list(seen.values())
    runs = [d for d in done if d["kind"] not in ("sweep-plan", "campaign")]
    counts = {a: sum(d["action"] == a for d in runs) for a in ("sent", "updated", "unchanged")}
    others = [d for d in done if d["kind"] in ("sweep-plan", "campaign")]
    what = {"run": f"run {subject}", "sweep": f"sweep {subject}", "campaign": f"campaign {subject}",
            "all": "the journal"}[kind]
    msgs = [f"{tracker.describe()}", f"{len(runs)} runs: {counts['sent']} sent, {counts['updated']} updated, "
            f"{counts['unchanged']} unchanged (already there)"
            + (f"; {len(others)} sweep/campaign runs: " + ", ".join(f"{d['subject']} {d['action']}" for d in others)
               if others else "")]
    msgs += [f"  {d['subject']} ({d['kind']}) → {d['tracker_run_id']}: {d['action']}" for d in runs]
    msgs.append(tracker.how_to_view())
    return StageResult("export", "ok", f"exported {what} to {tracker.name}", msgs,
                       {"tracker": tracker.name, "target": tracker.target, "subject": subject, "kind": kind,
                        "exported": done, "counts": counts})
