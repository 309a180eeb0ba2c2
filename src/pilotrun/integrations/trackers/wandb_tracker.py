"""Weights & Biases, offline unless the user configured otherwise (``WANDB_MODE``): the files ``wandb sync``
uploads later, in ``WANDB_DIR`` (default the home: HOME/wandb/offline-run-*).

The same content in W&B's idiom: the resolved config as the run's config, every metric in its history against
``update`` (``define_metric``), the outcome in its summary and tags, the phase ledger and a sweep's comparison
as tables, the run's files and the campaign's sheet, launch files and report as artifacts, a sweep as a group
(``group=SWEEP_ID``) with its plan as one more run of the group. The W&B run id is pilotrun's run id. An offline
run cannot be added to once it is finished, so a complete run is never written twice; one logged live but cut
short is written again whole under the same id, the cut-short folder renamed ``superseded-…`` so that
``wandb sync`` passes it by.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from pilotrun.errors import BadInput
from pilotrun.integrations.trackers import content as C

SKIPPED = "skipped"  # the journal's split of skipped updates, keyed by attempt: a table, not history


def needs_wandb() -> None:
    try:
        import wandb  # noqa: F401
    except ImportError as e:
        raise BadInput(f"exporting to Weights & Biases needs the wandb package ({e})", where="--to wandb",
                       fix="pip install 'pilotrun[wandb]'") from None


def wandb_id(subject: str) -> str:
    """A W&B run id (letters, digits, - and _)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", subject)[:64]


def exit_code(o: dict) -> int:
    """W&B marks a run with a non-zero exit code failed: a diverged arm, a failed run or check, an interrupted
    run (130, as a shell says Ctrl-C)."""
    return 130 if o["interrupted"] else 1 if o["failed"] else 0


class WandbTracker:
    name = "wandb"
    updatable = False  # an offline run takes nothing more once finished
    parents = False  # a sweep is a group

    def __init__(self, home: Path, *, project: str | None = None):
        needs_wandb()
        self.home = Path(home)
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        self.dir = Path(os.environ.get("WANDB_DIR") or self.home).resolve()
        self.project = project
        self.offline = self.mode in ("offline", "dryrun")
        self.target = f"offline:{self.dir}" if self.offline else os.environ.get("WANDB_BASE_URL",
                                                                                "https://api.wandb.ai")
        self._live: dict[str, tuple[object, set]] = {}  # pilotrun run id -> (open W&B run, (key, step) logged)

    def experiment_of(self, campaign: str) -> str:
        return self.project or os.environ.get("WANDB_PROJECT") or campaign

    def describe(self) -> str:
        return (f"W&B ({self.mode}) in {self.dir / 'wandb'}, " + (f"project {self.project}" if self.project
                                                                  else "one project per campaign"))

    def how_to_view(self) -> str:
        if self.offline:
            return f"upload them: wandb sync {self.dir / 'wandb'}/offline-run-* (or view them here: wandb leet)"
        return "view them in W&B"

    def _init(self, subject: str, campaign: str, **kw):
        import wandb

        self.dir.mkdir(parents=True, exist_ok=True)
        if self.offline:
            self._set_aside(wandb_id(subject))
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=True, save_code=False,
                                  x_save_requirements=False, disable_git=True)
        return wandb.init(mode=self.mode, dir=str(self.dir), project=self.experiment_of(campaign),
                          id=wandb_id(subject), reinit="create_new", resume="allow" if not self.offline else None,
                          settings=settings, **kw)

    def _set_aside(self, wid: str) -> None:
        """An earlier, cut-short offline folder of this id: renamed so that ``wandb sync`` passes it by."""
        root = self.dir / "wandb"
        for old in root.glob(f"offline-run-*-{wid}") if root.is_dir() else ():
            old.rename(old.with_name(f"superseded-{old.name}"))

    def _history(self, wrun, sent: set, points: list[dict]) -> None:
        """Points grouped by update, one ``log`` per update, each with ``update`` as its x-axis."""
        by_step: dict[int, dict] = {}
        for p in points:
            if p["key"].startswith(SKIPPED + "/") or (p["key"], p["step"]) in sent:
                continue
            by_step.setdefault(p["step"], {})[p["key"]] = p["value"]
        for step in sorted(by_step):
            wrun.log({"update": step, **by_step[step]})
            sent.update((k, step) for k in by_step[step])  # only once W&B took them: a retry sends the rest

    def _start(self, journal, run: dict, label: str | None):
        o = C.outcome(run)
        wrun = self._init(run["run_id"], run["name"], name=C.run_name(run), group=run.get("sweep_id"),
                          job_type=run["kind"], config=run.get("config") or {},
                          tags=[t for t in (run["kind"], run.get("arm"), o["shown_status"]) if t],
                          notes=C.run_description(journal, run))
        wrun.define_metric("update")
        wrun.define_metric("*", step_metric="update")
        wrun.summary.update({k.removeprefix("pilotrun."): v for k, v in C.tags(run, label).items()})
        return wrun

    def send_run(self, journal, run: dict, existing: str | None, parent: str | None, arm_label: str | None) -> str:
        import wandb

        live = self._live.get(run["run_id"])
        if live is None:
            live = self._live[run["run_id"]] = (self._start(journal, run, arm_label), set())
        wrun, sent = live
        self._history(wrun, sent, C.metric_points(journal, run))
        if C.finished(run):
            o = C.outcome(run)
            wrun.summary.update({k.removeprefix("pilotrun."): v for k, v in C.tags(run, arm_label).items()})
            wrun.tags = tuple(t for t in (run["kind"], run.get("arm"), o["shown_status"]) if t)
            wrun.notes = C.run_description(journal, run)
            for p in C.ledger_points(journal, run):
                wrun.summary[f"{p['key']}/rank{p['step']}"] = p["value"]
            columns, rows = C.ledger(journal, run["run_id"])
            if rows:
                wrun.log({"ledger": wandb.Table(columns=columns, data=rows)})
            skipped = [m for m in C.metric_points(journal, run) if m["key"].startswith(SKIPPED + "/")]
            if skipped:
                wrun.log({"skipped_updates": wandb.Table(columns=["key", "attempt", "value"],
                                                         data=[[m["key"], m["step"], m["value"]] for m in skipped])})
            files = C.run_files(journal, run["run_id"])
            if files:
                art = wandb.Artifact(f"run-{wandb_id(run['run_id'])}", type="pilotrun-run")
                for f in files:
                    art.add_file(str(f), name=f"pilotrun/{f.name}")
                wrun.log_artifact(art)
            wrun.finish(exit_code=exit_code(o))
            del self._live[run["run_id"]]
        return wandb_id(run["run_id"])

    def send_sweep(self, journal, sweep: dict, existing: str | None) -> str:
        import wandb

        if sweep["state"] == "running":  # written once, when the sweep has its outcome
            return wandb_id(sweep["sweep_id"])
        wrun = self._init(sweep["sweep_id"], sweep["campaign"], name=sweep["name"], group=sweep["sweep_id"],
                          job_type="sweep-plan", config={"plan": sweep["plan"]}, tags=["sweep-plan", sweep["state"]])
        wrun.summary.update({k.removeprefix("pilotrun."): v for k, v in sweep["tags"].items()})
        columns, rows = sweep["comparison"]
        wrun.log({"comparison": wandb.Table(columns=columns, data=[[str(x) if x is not None else None for x in r]
                                                                   for r in rows])})
        wrun.finish(exit_code=0 if sweep["state"] == "finished" else 1)
        return wandb_id(sweep["sweep_id"])

    def send_campaign(self, journal, name: str, files: list[Path], description: str, existing: str | None) -> str:
        import wandb

        subject = f"campaign-{name}-{C.campaign_digest(journal, name)[:8]}"  # a new campaign run per new content
        wrun = self._init(subject, name, name=f"campaign {name}", job_type="campaign", tags=["campaign"],
                          notes=description)
        art = wandb.Artifact(wandb_id(f"campaign-{name}"), type="pilotrun-campaign")
        for f in files:
            art.add_file(str(f), name=f"pilotrun/{f.name}")
        wrun.log_artifact(art)
        wrun.finish()
        return wandb_id(subject)

    def close(self) -> None:
        for wrun, _ in list(self._live.values()):  # runs still open (the process ends before they did)
            try:
                wrun.finish(exit_code=1)
            except Exception:  # noqa: BLE001 - the offline files are as complete as they got
                pass
        self._live.clear()
