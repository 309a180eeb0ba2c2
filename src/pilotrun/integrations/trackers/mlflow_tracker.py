"""MLflow, as its users set it up today: the tracking URI from ``--uri``, the campaign's ``track.uri`` or
``MLFLOW_TRACKING_URI``, else a SQLite store in the home (MLflow 3's default backend; ``./mlruns`` is legacy).

One experiment per campaign, one MLflow run per pilotrun run (tag ``pilotrun.run_id``), the sweep a parent run
whose arms are its children (``mlflow.parentRunId``), the campaign a run of its own holding the sheet, the launch
files and the HTML report. Idempotent: params are the same values again, tags and artifacts are overwritten, and
a metric point is sent only when the run's history in MLflow lacks its step.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pilotrun.errors import BadInput
from pilotrun.integrations.trackers import content as C
from pilotrun.signals import unless_stopping

STATUS = {"running": "RUNNING", "created": "RUNNING", "completed": "FINISHED", "stopped": "FINISHED",
          "check failed": "FAILED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}
"""The shown status → MLflow's run status: a diverged arm or a failed check is FAILED, never FINISHED."""
PARAMS_PER_BATCH, METRICS_PER_BATCH = 100, 1000  # MLflow's log_batch limits
MAX_PARAM, MAX_TAG = 6000, 8000  # MLflow's value lengths
ENV_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30",
                "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
"""pilotrun retries a tracker itself (live.py: a few tries, then it says so); MLflow's own default (7 retries
with exponential back-off, a 120 s timeout each) would hold an export for many minutes. MLflow prints a link on
stdout as each run ends, which --json keeps for its envelope. The user's settings win."""


def default_uri(home: Path) -> str:
    return f"sqlite:///{Path(home).resolve() / 'mlflow.db'}"


def resolve_uri(home: Path, uri: str | None) -> str:
    return uri or os.environ.get("MLFLOW_TRACKING_URI") or default_uri(home)


def shown(uri: str) -> str:
    """The URI with the password of its ``user:password@`` part masked: what is printed and kept in the journal
    (the address as given still reaches MLflow's client, nothing else)."""
    parts = urlsplit(uri)
    if parts.password is None:
        return uri
    host = parts.netloc.rsplit("@", 1)[1]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def key(name: str) -> str:
    """A param, metric or tag key MLflow accepts (slashes, word characters, . - : and spaces; no ``..``)."""
    k = re.sub(r"[^/\w.\- :]", "_", name)[:250]
    return k if posixpath.normpath(k) == k and not k.startswith(("/", "..")) else k.replace("/", "_")


def clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def needs_mlflow() -> None:
    try:
        import mlflow  # noqa: F401
    except ImportError as e:
        raise BadInput(f"exporting to MLflow needs the mlflow package ({e})", where="--to mlflow",
                       fix="pip install 'pilotrun[mlflow]' (MLflow's client and its SQLite store)") from None


class MlflowTracker:
    name = "mlflow"
    updatable = True  # a run in MLflow takes later points, tags and artifacts
    parents = True  # a sweep is a parent run, its arms nested under it

    def __init__(self, home: Path, *, uri: str | None = None, experiment: str | None = None):
        needs_mlflow()
        for k, v in ENV_DEFAULTS.items():
            os.environ.setdefault(k, v)
        from mlflow import MlflowClient

        self.home = Path(home)
        self.uri = resolve_uri(self.home, uri)
        self.target = shown(self.uri)  # printed, and the journal's key: never a password
        self.experiment_name = experiment
        try:
            self.client = MlflowClient(tracking_uri=self.uri)
        except Exception as e:  # noqa: BLE001 - MLflow refuses the URI itself: a folder store (MLflow 3), a scheme
            unless_stopping(e)
            said = (str(e).strip() or type(e).__name__).split(". ")[0][:300]
            raise BadInput(f"MLflow refuses the tracking URI {self.target}: {said}", where="MLflow tracking URI",
                           fix="pass a database (--uri sqlite:///PATH/mlflow.db) or a server (--uri http://HOST:5000), "
                               "or fix the campaign's track.uri or $MLFLOW_TRACKING_URI, wherever it came from; "
                               "MLflow 3 writes a folder store (./mlruns) only with MLFLOW_ALLOW_FILE_STORE=true"
                           ) from None
        self._experiments: dict[str, str] = {}
        self._sent: dict[str, set[tuple[str, int]]] = {}  # tracker run id -> (key, step) already in MLflow
        self._asked: dict[str, set[str] | None] = {}  # tracker run id -> the keys whose history was read from MLflow
        self._params_sent: set[str] = set()  # tracker run ids this process has sent their params to

    def experiment_of(self, campaign: str) -> str:
        return self.experiment_name or campaign

    def describe(self) -> str:
        return f"MLflow at {self.target}, " + (f"experiment {self.experiment_name}" if self.experiment_name
                                             else "one experiment per campaign")

    def how_to_view(self) -> str:
        if self.uri.startswith("sqlite:"):
            return f"view it: mlflow ui --backend-store-uri {self.target} (the full mlflow package: pip install mlflow)"
        return f"view it at {self.target}"

    # --- experiments and runs -----------------------------------------------------------------------------
    def experiment_id(self, campaign: str) -> str:
        name = self.experiment_name or campaign
        if name in self._experiments:
            return self._experiments[name]
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            location = None
            if self.uri == default_uri(self.home):  # our own store: its artifacts in the home too, not ./mlruns
                location = (self.home.resolve() / "mlartifacts" / key(name).replace("/", "_")).as_uri()
            # MLflow 3's UI shows an experiment of this kind as training runs (its default is the GenAI view)
            exp_id = self.client.create_experiment(name, artifact_location=location, tags={
                "pilotrun.campaign": campaign, "mlflow.experimentKind": "custom_model_development"})
        elif exp.lifecycle_stage == "deleted":
            raise BadInput(f"the MLflow experiment {name!r} (id {exp.experiment_id}) is deleted at {self.target}; "
                           "MLflow refuses runs in it", where="MLflow experiment",
                           fix=f"restore it (mlflow experiments restore --experiment-id {exp.experiment_id}), or "
                               "pass --experiment NAME (the campaign's track.experiment) for another one")
        else:
            exp_id = exp.experiment_id
        self._experiments[name] = exp_id
        return exp_id

    def _find(self, exp_id: str, tag: str, value: str) -> str | None:
        found = self.client.search_runs([exp_id], filter_string=f"tags.`{tag}` = '{value}'", max_results=1)
        return found[0].info.run_id if found else None

    def _open(self, exp_id: str, existing: str | None, tag: tuple[str, str], *, name: str, start: float | None,
              tags: dict[str, str]) -> tuple[str, bool]:
        """The MLflow run: the one the journal names, else one tagged as this subject (a mapping lost), else new."""
        if existing:
            try:
                run = self.client.get_run(existing)
                if run.info.lifecycle_stage != "deleted":
                    return existing, False
            except Exception as e:  # noqa: BLE001 - gone from the server: made again below
                if "RESOURCE_DOES_NOT_EXIST" not in str(e) and "not found" not in str(e).lower():
                    raise
        found = self._find(exp_id, *tag)
        if found:
            return found, False
        run = self.client.create_run(exp_id, start_time=int(start * 1000) if start else None, run_name=name,
                                     tags={key(k): clip(v, MAX_TAG) for k, v in tags.items()})
        self._sent[run.info.run_id], self._asked[run.info.run_id] = set(), None  # new: nothing to ask
        return run.info.run_id, True

    def _log(self, tid: str, *, params: dict | None = None, tags: dict | None = None,
             points: list[dict] = ()) -> int:
        from mlflow.entities import Metric, Param, RunTag

        p = [Param(key(k), clip(v, MAX_PARAM)) for k, v in (params or {}).items()]
        t = [RunTag(key(k), clip(str(v), MAX_TAG)) for k, v in (tags or {}).items()]
        for i in range(0, len(p), PARAMS_PER_BATCH):
            self.client.log_batch(tid, params=p[i:i + PARAMS_PER_BATCH])
        for i in range(0, len(t), PARAMS_PER_BATCH):
            self.client.log_batch(tid, tags=t[i:i + PARAMS_PER_BATCH])
        sent = self._sent_points(tid, {key(pt["key"]) for pt in points})
        new = [pt for pt in points if (key(pt["key"]), pt["step"]) not in sent]
        m = [Metric(key(pt["key"]), pt["value"], int(pt["time"] * 1000), pt["step"]) for pt in new]
        for i in range(0, len(m), METRICS_PER_BATCH):
            self.client.log_batch(tid, metrics=m[i:i + METRICS_PER_BATCH])
            sent.update((x.key, x.step) for x in m[i:i + METRICS_PER_BATCH])
        return len(m)

    def _sent_points(self, tid: str, keys: set[str]) -> set[tuple[str, int]]:
        """What MLflow already holds of ``keys`` for the run: asked once per run and key, then kept here."""
        sent = self._sent.setdefault(tid, set())
        asked = self._asked.setdefault(tid, set())
        if asked is None:  # a run this process created: MLflow holds only what it sent
            return sent
        for k in sorted(keys - asked):
            sent.update((m.key, m.step) for m in self.client.get_metric_history(tid, k))
            asked.add(k)
        return sent

    def _params_once(self, tid: str, params: dict) -> dict | None:
        """A run's params, the first time this process sends to it (MLflow takes the same values again: a run an
        earlier process created before it could log them gets them now)."""
        if tid in self._params_sent:
            return None
        self._params_sent.add(tid)
        return params

    def _table(self, tid: str, path: str, columns: list[str], rows: list[list]) -> None:
        """A table artifact in MLflow's own table format, overwritten (``log_table`` would append rows to it)."""
        self.client.log_dict(tid, {"columns": columns, "data": rows}, path)

    def _files(self, tid: str, files: list[Path], folder: str) -> None:
        for f in files:
            self.client.log_artifact(tid, str(f), folder)

    def _end(self, tid: str, status: str, end: float | None) -> None:
        self.client.set_terminated(tid, status=status, end_time=int(end * 1000) if end else None)

    # --- what export and live logging call -------------------------------------------------------------------
    def send_run(self, journal, run: dict, existing: str | None, parent: str | None, arm_label: str | None) -> str:
        o = C.outcome(run)
        exp_id = self.experiment_id(run["name"])
        tags = {**C.tags(run, arm_label), "mlflow.runName": C.run_name(run)}
        if parent:
            tags["mlflow.parentRunId"] = parent
        if run.get("git_rev"):
            tags["mlflow.source.git.commit"] = run["git_rev"]
        tid, _ = self._open(exp_id, existing, ("pilotrun.run_id", run["run_id"]), name=C.run_name(run),
                            start=C.epoch_s(run.get("started_at")), tags=tags)
        done = C.finished(run)
        points = C.metric_points(journal, run) + (C.ledger_points(journal, run) if done else [])
        self._log(tid, params=self._params_once(tid, C.params(run)), tags=tags, points=points)
        if done:
            desc = C.run_description(journal, run)
            ledger_cols, ledger_rows = C.ledger(journal, run["run_id"])
            logged = []
            if ledger_rows:
                self._table(tid, "pilotrun/ledger.json", ledger_cols, ledger_rows)
                logged.append({"path": "pilotrun/ledger.json", "type": "table"})
            self._files(tid, C.run_files(journal, run["run_id"]), "pilotrun")
            self._log(tid, tags={"mlflow.note.content": desc, "mlflow.loggedArtifacts": json.dumps(logged)})
            self._end(tid, STATUS[o["shown_status"]], C.epoch_s(run.get("ended_at")))
        return tid

    def send_sweep(self, journal, sweep: dict, existing: str | None) -> str:
        exp_id = self.experiment_id(sweep["campaign"])
        tags = {**sweep["tags"], "mlflow.runName": sweep["name"]}
        tid, _ = self._open(exp_id, existing, ("pilotrun.sweep_plan", sweep["sweep_id"]), name=sweep["name"],
                            start=None, tags={**tags, "pilotrun.sweep_plan": sweep["sweep_id"]})
        self._log(tid, params=self._params_once(tid, sweep["params"]), tags=tags)
        columns, rows = sweep["comparison"]
        self._table(tid, "pilotrun/comparison.json", columns, rows)
        self._log(tid, tags={"mlflow.loggedArtifacts": json.dumps([{"path": "pilotrun/comparison.json",
                                                                    "type": "table"}])})
        if sweep["state"] != "running":
            self._end(tid, "FINISHED" if sweep["state"] == "finished" else "FAILED", None)
        return tid

    def send_campaign(self, journal, name: str, files: list[Path], description: str, existing: str | None) -> str:
        exp_id = self.experiment_id(name)
        tags = {"pilotrun.kind": "campaign", "pilotrun.campaign": name, "mlflow.runName": f"campaign {name}",
                "mlflow.note.content": description}
        tid, _ = self._open(exp_id, existing, ("pilotrun.campaign_run", name), name=f"campaign {name}", start=None,
                            tags={**tags, "pilotrun.campaign_run": name})
        self._log(tid, tags=tags)
        self._files(tid, files, "pilotrun")
        self._end(tid, "FINISHED", None)
        return tid

    def close(self) -> None:
        pass
