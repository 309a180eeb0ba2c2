"""report: one self-contained HTML file with the curves, the comparison, the pilot's ledger, notes and decisions."""

import re

import pytest
import yaml

from conftest import write_campaign


@pytest.fixture
def journal_with_everything(demo_dir):
    """A real journal: a sweep with a diverging arm, a pilot run with real phase rows, a note and a decision."""
    import torch

    from pilotrun.journal.store import Journal
    from pilotrun.probe.recorder import phase
    from pilotrun.rehearsal.training.sweep import sweep

    from pilotrun.campaign.load import load_campaign

    path = demo_dir / "campaign.yaml"
    c = yaml.safe_load(path.read_text())
    c["plan"].update(control={"train.lr": 3e-3}, variants=[{"train.lr": 1e3}], seeds=[0])
    c["train"].update(updates=4, eval_every=2)
    write_campaign(demo_dir, c)
    home = demo_dir / "home"
    result = sweep(load_campaign(path), home, progress=False)
    j = Journal(home)
    pilot = j.create_run(kind="pilot", name="demo", config={}, config_sha256="0" * 64, campaign_path=None, seed=0,
                         git_rev=None, packages={}, data={}, trust_remote_code=False)
    for name in ("load", "first_step", "steady_step", "eval_longest", "save"):
        with phase(name, {"micro_batch": 4, "seq_len": 64}, journal=j, run_id=pilot):
            torch.randn(256, 256) @ torch.randn(256, 256)
    j.finish_run(pilot, "completed", {})
    j.add_note("lr 1e3 is absurd <b>on purpose</b>", run_id=result.data["runs"][0]["run_id"])
    j.add_note("keep lr 3e-3 for the rental", decision=True)
    return home, result


def test_report_is_one_self_contained_file_with_plots_and_tables(journal_with_everything, cli, tmp_path):
    home, result = journal_with_everything
    out = tmp_path / "out" / "report.html"
    r = cli("report", "--home", home, "--out", out)
    assert r.code == 0, r.err
    # progress on stderr: a journal of hundreds of runs draws for a minute (200 runs: 40 s), each section said
    assert "pilotrun report: started" in r.err and "pilotrun report: section 1/6: Runs (" in r.err
    assert "pilotrun report: section 5/6: Notes and decisions (" in r.err
    assert "pilotrun report: ended" in r.err
    text = out.read_text(encoding="utf-8")
    assert text.startswith("<!DOCTYPE html>")
    assert not re.search(r"https?://", text)  # no network: no URL at all, not even a namespace
    assert "<script" not in text and "<link" not in text and not re.search(r"\ssrc=", text)
    # loss curves, the phase ledger chart, and the memory bound / time plan drawn when the sweep has them
    assert text.count("<svg") >= 2
    assert "training loss per update" in text and "validation (plan metric)" in text  # plot text stays text
    assert "diverged (seed 0)" in text  # the diverged run is marked on the plot
    assert result.data["sweep_id"] in text and result.data["plan_sha256"] in text
    for col in ("at_budget", "vs_control", "verdict", "diverged"):
        assert f"<th>{col}</th>" in text
    assert "train.lr=1000.0" in text and "1 of 1" in text
    for run in result.data["runs"]:
        assert run["run_id"] in text  # every run, diverged too
    for ph in ("first_step", "steady_step", "eval_longest"):
        assert ph in text
    assert "<td>tensors+rss</td>" in text and "phase ledger of pilot run" in text
    assert "bytes held by live tensors, exact" in text
    assert "keep lr 3e-3 for the rental" in text and ">decision<" in text
    # journal text is escaped, never markup
    assert "&lt;b&gt;on purpose&lt;/b&gt;" in text and "<b>on purpose" not in text
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]  # atomic: no temporary file left


def test_default_report_path_and_an_empty_journal(demo_dir, cli):
    from pilotrun.journal.store import Journal

    home = demo_dir / "empty"
    Journal(home)
    r = cli("report", "--home", home)
    assert r.code == 0, r.err
    text = (home / "report.html").read_text()
    assert "no sweep in this journal yet" in text and "no pilot run in this journal yet" in text
    assert "<svg" not in text
    missing = cli("report", "--home", demo_dir / "nowhere")
    assert missing.code == 2 and "no journal" in missing.err


def test_sections_are_pluggable(journal_with_everything, tmp_path):
    from pilotrun.journal.store import Journal
    from pilotrun.report.html import SECTIONS, esc, write_report

    home, _ = journal_with_everything
    sections = SECTIONS + [("Selection sheet", lambda j: f"<p>runs: {esc(len(j.list_runs()))}</p>")]
    text = write_report(Journal(home), tmp_path / "r.html", sections).read_text()
    assert "<h2>Selection sheet</h2><p>runs: 3</p>" in text
    assert text.index("Notes and decisions") < text.index("Selection sheet")
    notes = next(s for s in SECTIONS if s[0] == "Notes and decisions")
    only = write_report(Journal(home), tmp_path / "only.html", [notes]).read_text()
    assert "<svg" not in only and "keep lr 3e-3" in only


@pytest.mark.parametrize("counter", ["tensors+rss", "cuda"])
def test_journal_text_reaches_the_page_and_its_plots_as_written(tmp_path, cli, counter):
    """A run name, a phase and a note are the user's words: two dollar signs are not mathtext (matplotlib raised on
    "$\\frac$": exit 3), markup is escaped, and control characters are shown escaped, in the tables and the plots."""
    from pilotrun.journal.store import Journal

    evil = "lr $\\frac$, cost $5 vs $10 <script>x</script>\x00\x1b[31m\u202eevil"
    home = tmp_path / "home"
    j = Journal(home)
    rid = j.create_run(kind="train", name=evil, config={}, config_sha256="0" * 64, campaign_path=None, seed=0,
                       git_rev=None, packages={}, data={}, trust_remote_code=False)
    j.add_metrics(rid, [("train", "loss", s, 2.0 - s / 10, None, None) for s in range(1, 4)]
                  + [("validation", "val_loss", 3, 1.9, None, None)])
    j.add_phase_rows(rid, [{"phase": evil, "rank": 0, "device": "cpu", "counter": counter, "baseline": 2 ** 20,
                            "peak_allocated": 2 ** 22, "peak_reserved": 2 ** 23 if counter == "cuda" else None,
                            "duration_s": 0.5, "verdict": "ok"}])
    j.finish_run(rid, "completed", {})
    j.add_note(evil, run_id=rid)
    out = tmp_path / "report.html"
    r = cli("report", "--home", home, "--out", out)
    assert r.code == 0, r.err
    assert "missing from font" not in r.err  # controls never reach the font
    text = out.read_text(encoding="utf-8")
    shown = "lr $\\frac$, cost $5 vs $10 &lt;script&gt;x&lt;/script&gt;\\x00\\x1b[31m\\u202eevil"
    assert text.count(shown) >= 4  # the runs table, the run's heading, the note, and the plots' text
    assert ">train: " + shown in text  # the loss curve's legend, as text (mathtext would have drawn paths)
    assert "<script>" not in text and not any(ch in text for ch in "\x00\x1b\u202e")
