"""The report shows every run kind (own loop here; HF Trainer and Lightning runs go through the same
section), draws the CPU ledger as each phase's increase, and opens in a real headless browser."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from pilotrun.journal import Journal
from pilotrun.probe.recorder import own_run

CHROMIUM = os.environ.get("PILOTRUN_CHROMIUM", "/usr/bin/chromium")


@pytest.fixture
def own_loop_home(tmp_path):
    home = tmp_path / "home"
    with own_run(home, name="my-loop") as run:
        model = torch.nn.Linear(64, 64)
        for step in range(1, 5):
            with run.phase("first_step" if step == 1 else "steady_step", {"micro_batch": 8}) as p:
                x = torch.randn(256, 64)
                big = torch.ones(4096, 4096)  # 64 MiB the phase adds over its baseline
                loss = model(x).pow(2).mean() + big[0, 0] * 0
                del big
                p.check_finite(loss)
            run.log(step, loss=loss.item())
    return home, run.run_id


def test_an_own_loop_journal_gets_its_curve_ledger_and_bound(own_loop_home, cli, tmp_path):
    home, run_id = own_loop_home
    out = tmp_path / "r.html"
    r = cli("report", "--home", home, "--out", out)
    assert r.code == 0, r.err
    text = out.read_text()
    assert f"loss curve of {run_id}" in text and f"phase ledger of {run_id}" in text
    assert "memory: this run&#x27;s peak is" in text or "memory: this run's peak is" in text
    assert text.count("<svg") >= 2 and "http://" not in text.replace("http://www.w3.org", "")
    # the CPU chart shows what each phase added over its own baseline, with its duration
    assert "MiB added over the phase&#x27;s own baseline" in text or "MiB added over the phase's own baseline" in text
    rows = Journal(home).phase_rows(run_id)
    added = (rows[0]["peak_allocated"] - rows[0]["baseline"]) / 2**20
    assert f"+{added:.1f} MiB" in text


def test_the_cpu_ledger_chart_is_each_phases_increase():
    from pilotrun.report.plots import phase_ledger

    mib = 2**20
    rows = [{"phase": "load", "rank": 0, "counter": "rss", "baseline": 500 * mib, "peak_allocated": 620 * mib,
             "peak_reserved": None, "end_allocated": 610 * mib, "duration_s": 2.5, "verdict": "ok"},
            {"phase": "steady_step", "rank": 0, "counter": "rss", "baseline": 610 * mib,
             "peak_allocated": 612 * mib, "peak_reserved": None, "end_allocated": 611 * mib, "duration_s": 0.2,
             "verdict": "ok"}]
    svg = phase_ledger(rows)
    assert "ok, +120.0 MiB, 2.5 s" in svg and "ok, +2.0 MiB, 200 ms" in svg
    assert "added over the phase" in svg


@pytest.mark.skipif(not Path(CHROMIUM).is_file(),
                    reason=f"no headless browser at {CHROMIUM} (Debian: apt-get install chromium); "
                           "CI does not install one")
def test_the_report_renders_in_a_headless_browser(own_loop_home, cli, tmp_path):
    from PIL import Image

    home, _ = own_loop_home
    out = tmp_path / "r.html"
    assert cli("report", "--home", home, "--out", out).code == 0
    shot = tmp_path / "shot.png"
    profile = tempfile.mkdtemp(prefix="pilotrun-chromium-")
    try:
        p = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                            "--disable-component-update", "--no-first-run", f"--user-data-dir={profile}",
                            "--window-size=1280,2400", f"--screenshot={shot}", out.as_uri()],
                           capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert shot.is_file(), p.stderr[-2000:]
    img = Image.open(shot).convert("RGB")
    assert img.size == (1280, 2400)
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50, "the screenshot is blank"
    # the page's plots draw coloured bars and lines, not only black text on white
    coloured = sum(n for n, (r, g, b) in colours if max(r, g, b) - min(r, g, b) > 60)
    assert coloured > 500, coloured


def test_the_report_shows_every_run_not_only_the_latest(tmp_path, cli):
    """25 runs (more than the 20 the report used to show): each id is in the index, linked, and has its part."""
    import re

    home = tmp_path / "home"
    ids = []
    for i in range(25):
        with own_run(home, name=f"loop-{i:02d}") as run:
            run.log(1, loss=1.0 / (i + 1))
        ids.append(run.run_id)
    out = tmp_path / "r.html"
    assert cli("report", "--home", home, "--out", out).code == 0
    text = out.read_text()
    for rid in ids:
        assert f'<a href="#run-{rid}">' in text, rid
        assert f'<summary id="run-{rid}">' in text, rid
        assert f"loss curve of {rid}" in text, rid
    assert text.count('<details class="run"') == 25 and text.count('<details class="run" open>') == 3
    assert "25 runs, newest first" in text and "the latest 20" not in text
    # one self-contained file: nothing fetched from the network
    assert not re.search(r'(src|href)="(https?:)?//', text)
