"""A real MLflow server on 127.0.0.1 (SQLite backend, artifacts under tmp_path), started once for the module and
stopped after it, read back through MlflowClient: a sweep with a diverging arm exported whole (experiments, runs,
params, metric histories equal to the journal's, tags, artifacts), exported twice without a run more, a run logged
live not duplicated by its export, and the UI comparing the sweep's arms in headless chromium. Slow: the server's
start-up (its database's migrations) and the sweep's four runs."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import needs, write_campaign, write_demo_dir

pytestmark = [pytest.mark.slow, needs("mlflow", "the mlflow package is missing: pip install 'pilotrun[mlflow]'")]
MLFLOW = Path(sys.executable).with_name("mlflow")
CHROMIUM = os.environ.get("PILOTRUN_CHROMIUM", "/usr/bin/chromium")
SHOTS = os.environ.get("PILOTRUN_SHOTS_DIR")  # test-only: where the screenshot is kept (docs/ for the README's)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on the loopback address: the SQLite store and the artifacts in a temp folder of the test
    (its TMPDIR too), one worker; stopped (its process group) when the module's tests are done."""
    if not MLFLOW.is_file():
        pytest.skip(f"no mlflow server command at {MLFLOW} (the full mlflow package: make test installs it)")
    root = tmp_path_factory.mktemp("mlflow-server")
    (root / "tmp").mkdir()
    port = _free_port()
    env = dict(os.environ, TMPDIR=str(root / "tmp"), MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    env.pop("MLFLOW_TRACKING_URI", None)
    log = open(root / "server.log", "w")
    proc = subprocess.Popen([str(MLFLOW), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
                             "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}",
                             "--artifacts-destination", str(root / "artifacts")],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "mlflow server did not answer in 300 s"
            time.sleep(0.5)
        yield uri
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def _sweep_campaign(folder: Path, name: str) -> Path:
    """The demo's tiny model, 2 arms (the control and lr 1000, which diverges) × 2 seeds, 4 updates each."""
    d = write_demo_dir(folder)
    c = yaml.safe_load((d / "campaign.yaml").read_text())
    c["name"] = name
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e3}], seeds=[0, 1])
    c["train"].update(updates=4, eval_every=2, save_every=None)
    return write_campaign(d, c)


@pytest.fixture(scope="module")
def exported_sweep(mlflow_server, tmp_path_factory):
    """The sweep, run once (no live logging) and exported to the server: (uri, home, sweep id, export's JSON)."""
    from pilotrun.cli.main import run

    folder = tmp_path_factory.mktemp("sweep")
    campaign, home = _sweep_campaign(folder, "tracker-sweep"), folder / "home"
    assert run(["sweep", str(campaign), "--home", str(home)]) == 0
    from pilotrun.journal.store import Journal

    (sweep_id,) = {r["sweep_id"] for r in Journal(home).list_runs()}
    return mlflow_server, home, sweep_id, campaign


def _export(cli, *args):
    r = cli("export", *args, "--json")
    assert r.code == 0, r.err[-3000:]
    return r.json["data"]


def _history(client, run_id: str, key: str) -> list[tuple[int, float | None]]:
    return [(m.step, None if math.isnan(m.value) else m.value)
            for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def test_a_sweep_with_a_diverging_arm_in_a_live_mlflow_server(exported_sweep, cli, monkeypatch):
    from mlflow import MlflowClient

    from pilotrun.integrations.trackers import export
    from pilotrun.journal.store import Journal

    uri, home, sweep_id, _ = exported_sweep
    said = []  # its progress line's counts: a server takes a second or more a run, a journal of hundreds minutes
    monkeypatch.setattr(export, "note", lambda text, **kw: said.append((text.split(":")[0], kw.get("done"))))
    data = _export(cli, sweep_id, "--to", "mlflow", "--uri", uri, "--home", home)
    assert data["counts"] == {"sent": 4, "updated": 0, "unchanged": 0}
    assert said == [(f"run {k}/4", k - 1) for k in range(1, 5)], said
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tracker-sweep")  # one experiment per campaign
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    every = client.search_runs([exp.experiment_id], max_results=100)
    arms = [r for r in every if r.data.tags.get("pilotrun.kind") == "sweep"]
    (parent,) = [r for r in every if r.data.tags.get("pilotrun.sweep_plan") == sweep_id]
    j = Journal(home)
    runs = {r["run_id"]: r for r in j.list_runs(sweep_id=sweep_id)}
    assert len(arms) == 4 and {r.data.tags["pilotrun.run_id"] for r in arms} == set(runs)
    assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in arms)
    assert parent.data.tags["pilotrun.diverged"] == "2" and parent.info.status == "FINISHED"
    for r in arms:
        jr = runs[r.data.tags["pilotrun.run_id"]]
        assert r.data.tags["pilotrun.status"] == jr["status"] and r.data.tags["pilotrun.arm"] == jr["arm"]
        if jr["arm"] == "variant-1":  # lr 1000: the diverged arm is a visible failure, not a finished run
            assert jr["status"] == "diverged" and r.info.status == "FAILED"
            assert r.data.tags["pilotrun.verdict"] == "fail" and "diverge_factor" in r.data.tags["pilotrun.reason"]
            assert r.data.tags["pilotrun.arm_overrides"] == "train.lr=1000.0"
        else:
            assert jr["status"] == "completed" and r.info.status == "FINISHED"
        assert r.data.params["train.lr"] == str(jr["config"]["train"]["lr"])
        assert r.data.params["seed"] == str(jr["seed"])
        # every metric's history is the journal's, point for point (a non-finite value, NULL there, is NaN here)
        journal_metrics = j.metrics(jr["run_id"])
        keys = {(m["split"], m["name"]) for m in journal_metrics}
        assert ("train", "loss") in keys and ("validation", "val_loss") in keys
        for split, name in keys:
            mine = [(m["step"], m["value"]) for m in journal_metrics if (m["split"], m["name"]) == (split, name)]
            assert _history(client, r.info.run_id, f"{split}/{name}") == mine, (split, name)
        # the ledger: a table artifact and per-phase metrics
        got = client.download_artifacts(r.info.run_id, "pilotrun/ledger.json", str(home.parent))
        ledger = json.loads(Path(got).read_text())
        assert [row[0] for row in ledger["data"]] == [p["phase"] for p in j.phase_rows(jr["run_id"])]
        assert any(k.startswith("ledger/observed_train/") for k in r.data.metrics)
        files = {a.path for a in client.list_artifacts(r.info.run_id, "pilotrun")}
        assert {"pilotrun/config.yaml", "pilotrun/README.md", "pilotrun/ledger.json"} <= files
    # exporting the same sweep again: nothing created, nothing resent
    again = _export(cli, sweep_id, "--to", "mlflow", "--uri", uri, "--home", home)
    assert again["counts"] == {"sent": 0, "updated": 0, "unchanged": 4}
    assert len(client.search_runs([exp.experiment_id], max_results=100)) == len(every)
    key = "train/loss"
    arm = arms[0].info.run_id
    assert len(client.get_metric_history(arm, key)) == len(j.metrics(arms[0].data.tags["pilotrun.run_id"], "train",
                                                                       "loss"))


def test_a_run_logged_live_is_not_duplicated_by_its_export(mlflow_server, tmp_path, cli, monkeypatch):
    """train --track mlflow (the URI from MLFLOW_TRACKING_URI, as MLflow's users set it): the run is in MLflow when
    the command returns, failed (lr 1000 diverges); the campaign's export afterwards adds only the campaign's own
    run (sheet, report) and sends no point twice."""
    from mlflow import MlflowClient

    from pilotrun.journal.store import Journal
    from pilotrun.journal.tracked import tracked_rows

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    campaign, home = _sweep_campaign(tmp_path, "tracker-live"), tmp_path / "home"
    r = cli("train", campaign, "--set", "train.lr=1000.0", "--track", "mlflow", "--home", home)
    assert r.code == 1, r.err[-3000:]  # a diverged run is a failing verdict
    assert f"logged live to MLflow at {mlflow_server}" in r.err and "1 run(s)" in r.err, r.err[-2000:]
    (run,) = Journal(home).list_runs()
    (row,) = tracked_rows(Journal(home))
    assert (row["subject"], row["state"]) == (run["run_id"], "complete")
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("tracker-live")
    (live,) = client.search_runs([exp.experiment_id])
    assert live.info.run_id == row["tracker_run_id"] and live.info.status == "FAILED"
    points = len(client.get_metric_history(live.info.run_id, "train/loss"))
    data = _export(cli, str(campaign), "--to", "mlflow", "--home", home)
    assert data["counts"] == {"sent": 0, "updated": 0, "unchanged": 1}
    after = client.search_runs([exp.experiment_id])
    assert {r.info.run_id for r in after} - {live.info.run_id} == {
        d["tracker_run_id"] for d in data["exported"] if d["kind"] == "campaign"}
    assert len(client.get_metric_history(live.info.run_id, "train/loss")) == points
    (campaign_run,) = [r for r in after if r.info.run_id != live.info.run_id]
    assert "pilotrun/report.html" in {a.path for a in client.list_artifacts(campaign_run.info.run_id, "pilotrun")}


class _Chromium:
    """Headless chromium driven over its DevTools pipe (fds 3 and 4, NUL-separated JSON): its profile, TMPDIR
    and log in a short folder of the temp directory (its socket's path must stay within the 107 bytes a socket's
    address holds, which a test's own folder can pass), removed with the test."""

    def __init__(self):
        import tempfile

        self.folder, self.n, self.buf = Path(tempfile.mkdtemp(prefix="chr-")), 0, b""

    def __enter__(self):
        try:
            return self._start()
        except BaseException:  # a chromium that never answered: killed, its folder removed
            if hasattr(self, "proc"):
                if self.proc.poll() is None:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                self.log.close()
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _start(self):
        r3, w3 = os.pipe()
        r4, w4 = os.pipe()

        def pipes():  # in the child, before exec: chromium reads fd 3 and writes fd 4
            os.dup2(r3, 3)
            os.dup2(w4, 4)

        self.log = open(self.folder / "chromium.log", "wb")
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--disable-background-networking", "--disable-component-update", "--no-first-run",
             f"--user-data-dir={self.folder / 'chromium-profile'}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=pipes, stdout=subprocess.DEVNULL, stderr=self.log,
            env=dict(os.environ, TMPDIR=str(self.folder)), start_new_session=True)
        os.close(r3)
        os.close(w4)
        self.w, self.r = w3, r4
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=1600, height=1100, deviceScaleFactor=1, mobile=False,
                  session=True)
        return self

    def __exit__(self, *exc):
        try:
            self.call("Browser.close")
            self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - whatever went wrong, chromium does not outlive the test
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        os.close(self.w)
        os.close(self.r)
        self.log.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        return False

    def call(self, method: str, session: bool = False, **params):
        self.n += 1
        msg = {"id": self.n, "method": method, "params": params, **({"sessionId": self.session} if session else {})}
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        while True:  # events come between the answers: skipped
            while b"\0" not in self.buf:
                chunk = os.read(self.r, 1 << 20)
                assert chunk, f"chromium closed its DevTools pipe (exit {self.proc.poll()}): " + (
                    self.folder / "chromium.log").read_text(errors="replace")[-2000:]
                self.buf += chunk
            line, self.buf = self.buf.split(b"\0", 1)
            answer = json.loads(line)
            if answer.get("id") == self.n:
                assert "error" not in answer, (method, answer["error"])
                return answer["result"]

    def open(self, url: str, reload: bool = False) -> None:
        self.call("Page.reload", session=True) if reload else self.call("Page.navigate", url=url, session=True)

    def run(self, js: str):
        return self.call("Runtime.evaluate", expression=js, returnByValue=True, session=True)["result"].get("value")

    def wait(self, js: str, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.run(js):
            assert time.monotonic() < deadline, f"the page never showed: {js}"
            time.sleep(0.25)

    def screenshot(self, path: Path) -> None:
        import base64

        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png", session=True)["data"]))


@pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                    reason=f"no headless browser at {CHROMIUM} (Debian: apt-get install chromium)")
def test_the_mlflow_ui_compares_the_sweeps_arms(exported_sweep, cli, tmp_path):
    """MLflow's own compare page of the sweep's four runs, in headless chromium against the test server. The
    README's docs/mlflow-sweep-compare.png is this screenshot (PILOTRUN_SHOTS_DIR=docs keeps it there)."""
    from mlflow import MlflowClient
    from PIL import Image

    uri, home, sweep_id, _ = exported_sweep
    _export(cli, sweep_id, "--to", "mlflow", "--uri", uri, "--home", home)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("tracker-sweep")
    arms = client.search_runs([exp.experiment_id], filter_string="tags.`pilotrun.kind` = 'sweep'",
                              order_by=["tags.`pilotrun.arm`", "params.seed"])
    ids = json.dumps([r.info.run_id for r in arms])
    url = (f"{uri}/#/compare-runs?runs={urllib.parse.quote(ids)}"
           f"&experiments={urllib.parse.quote(json.dumps([exp.experiment_id]))}")
    shot = tmp_path / "shot.png"
    with _Chromium() as page:
        page.open(url + "&workflowType=machine_learning")  # MLflow 3's training-runs view, not the GenAI one
        page.wait("document.body && document.body.innerText.includes('Comparing 4 Runs')")
        # MLflow opens its assistant's panel on a first visit (a quarter of the page): closed, as a user would
        page.run("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true');"
                 "localStorage.setItem('mlflow.assistant.panelOpen_v1', 'false')")
        page.open(url + "&workflowType=machine_learning", reload=True)
        page.wait("document.body && document.body.innerText.includes('Comparing 4 Runs') && "
                  "document.querySelector('.js-plotly-plot svg') !== null")
        time.sleep(2)  # the plot's lines are drawn after its frame
        text = page.run("document.body.innerText")
        page.screenshot(shot)
    for name in ("control seed 0", "control seed 1", "variant-1 seed 0", "variant-1 seed 1"):
        assert name in text, name
    assert "Ask a question" not in text  # the assistant's panel is closed
    img = Image.open(shot).convert("RGB")
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 200, "the screenshot is blank"
    # the parallel-coordinates plot draws each run as a coloured line: not only black text on white
    coloured = sum(n for n, (r, g, b) in colours if max(r, g, b) - min(r, g, b) > 80)
    assert coloured > 2000, coloured
    if SHOTS:
        shutil.copyfile(shot, Path(SHOTS) / "mlflow-sweep-compare.png")


def test_the_same_sweep_in_wandb_is_a_group(exported_sweep, cli, monkeypatch):
    """W&B's idiom for the same sweep: four offline runs in the sweep's group (read back with W&B's own record
    classes), the diverged ones failed, their config and history; the plan a run of the group holding the
    comparison table; exported again, nothing written twice."""
    from wandb_records import read_records

    from pilotrun.journal.store import Journal

    _, home, sweep_id, _ = exported_sweep
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_DIR", str(home.parent / "wandb-files"))
    data = _export(cli, sweep_id, "--to", "wandb", "--home", home)
    assert data["counts"] == {"sent": 4, "updated": 0, "unchanged": 0}
    root = home.parent / "wandb-files" / "wandb"
    runs = {r["run_id"]: r for r in Journal(home).list_runs(sweep_id=sweep_id)}
    for run_id, jr in runs.items():
        (folder,) = root.glob(f"offline-run-*-{run_id}")
        recs = read_records(folder / f"run-{run_id}.wandb")
        run = recs["run"][0]
        assert (run.run_group, run.job_type, run.project) == (sweep_id, "sweep", "tracker-sweep")
        assert recs["exit"][-1].exit_code == (1 if jr["status"] == "diverged" else 0)
        losses = [float(i.value_json) for h in recs["history"] for i in h.item
                  if (i.nested_key[0] if i.nested_key else i.key) == "train/loss"]
        mine = [m["value"] for m in Journal(home).metrics(run_id, "train", "loss")]
        assert [None if math.isnan(v) else v for v in losses] == mine
    (plan,) = root.glob(f"offline-run-*-{sweep_id}")
    recs = read_records(plan / f"run-{sweep_id}.wandb")
    assert recs["run"][0].run_group == sweep_id and recs["run"][0].job_type == "sweep-plan"
    assert any("comparison" in (i.nested_key[0] if i.nested_key else i.key) for h in recs["history"] for i in h.item)
    again = _export(cli, sweep_id, "--to", "wandb", "--home", home)
    assert again["counts"]["unchanged"] == 4 and len(list(root.glob("offline-run-*"))) == 5
