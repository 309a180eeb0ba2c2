"""What a person looks at: run-id prefixes, the one JSON envelope, tables at 80/100/160 columns and in
pipes, a quiet broken pipe."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli_process, simple_records, tiny_causal_campaign

from pilotrun.journal import Journal

SNAPSHOTS = Path(__file__).parent / "snapshots"
WIDTHS = (80, 100, 160)


def _runs(home: Path, n: int, **kw) -> list[str]:
    j = Journal(home)
    ids = [j.create_run(kind=kw.get("kind", "train"), name="tiny", config={"i": i}, config_sha256="0",
                        campaign_path=None, seed=i, git_rev=None, packages={}, data={}, trust_remote_code=False)
           for i in range(n)]
    for run_id in ids:
        j.finish_run(run_id, "completed", {"updates": 0})
    return ids


# --- 1. run ids -----------------------------------------------------------------------------------
def test_unique_prefix_is_accepted_by_show_note_and_supersedes(cli, tmp_path):
    home = tmp_path / "home"
    a, b = _runs(home, 2)
    shared = os.path.commonprefix([a, b])
    r = cli("show", a[:len(shared) + 1], "--home", home, "--json")
    assert r.code == 0, r.err
    assert r.json["data"]["run"]["run_id"] == a
    r = cli("note", "looks fine", "--run", b[:len(shared) + 1], "--home", home, "--json")
    assert r.code == 0 and r.json["data"]["run_id"] == b
    assert [n["run_id"] for n in Journal(home).notes()] == [b]
    j = Journal(home)
    c = j.create_run(kind="train", name="tiny", config={}, config_sha256="0", campaign_path=None, seed=0,
                     git_rev=None, packages={}, data={}, trust_remote_code=False, supersedes=a[:len(shared) + 1])
    assert j.get_run(c)["supersedes"] == a


def test_ambiguous_prefix_exits_2_listing_candidates(cli, tmp_path):
    home = tmp_path / "home"
    a, b = _runs(home, 2)
    shared = os.path.commonprefix([a, b])
    r = cli("show", shared, "--home", home)
    assert r.code == 2
    assert f"run id prefix '{shared}' is ambiguous: 2 runs match" in r.err
    assert a in r.err and b in r.err and "type more characters" in r.err
    r = cli("show", shared, "--home", home, "--json")
    assert r.code == 2
    err = r.json["error"]
    assert r.json["ok"] is False and err["kind"] == "bad_input" and err["key"] == "RUN_ID"
    assert err["candidates"] == sorted([a, b])
    r = cli("note", "x", "--run", "zzz", "--home", home)
    assert r.code == 2 and "run zzz does not exist" in r.err and "--run" in r.err


def test_a_run_folders_path_given_as_a_run_id_names_its_run(cli, tmp_path, monkeypatch):
    # `show .pilotrun/runs/RUN_ID/` (as the shell completes it), a file in it, or `RUN_ID/` in runs/: "run … does not
    # exist" of a run the journal holds. Its run is named now, with the --home of the journal that holds it
    home, other = tmp_path / "home", tmp_path / "other"
    (run_id,) = _runs(home, 1)
    (home / "runs" / run_id).mkdir(parents=True, exist_ok=True)
    Journal(other).add_note("a journal that does not hold the run")
    folder = home / "runs" / run_id
    for verb, given in (("show", f"{folder}/"), ("verify", folder / "config.yaml"), ("archive", folder)):
        r = cli(verb, given, "--home", home, *(["--out", tmp_path / "a.tar.gz"] if verb == "archive" else []))
        assert r.code == 2 and f"{given} is a path, not a run id: the folder of run {run_id}" in r.err, r.err
        assert f"fix: pass the run's id ({run_id})" in r.err
    r = cli("note", "x", "--run", folder, "--home", other)
    assert r.code == 2 and f"the folder of run {run_id} in the journal at {home}" in r.err, r.err
    assert f"fix: pass the run's id with that journal's home: {run_id} --home {home}" in r.err
    monkeypatch.chdir(home / "runs")
    r = cli("show", f"{run_id}/", "--home", home)
    assert r.code == 2 and f"{run_id}/ is a path, not a run id" in r.err, r.err
    assert cli("show", run_id, "--home", home).code == 0  # the id itself, as before
    r = cli("show", "x/y", "--home", home)  # a path that names no run: as any id that does not exist
    assert r.code == 2 and "run x/y does not exist" in r.err, r.err


def test_runs_never_cuts_an_id_at_any_width(tmp_path):
    from pilotrun.report.terminal import render_runs

    home = tmp_path / "home"
    ids = _runs(home, 3)
    runs = Journal(home).list_runs()
    for width in (40, 60, 80, 100):
        text = _render(lambda con: render_runs(con, runs), width)
        assert all(run_id in text for run_id in ids), text
        assert "…" not in text and max(map(len, text.splitlines())) <= width, text


def test_runs_and_the_report_list_runs_in_one_order_and_the_report_never_breaks_an_id(cli, tmp_path):
    """Issue 43: `runs --json` listed oldest first, the report newest first; and the report's table broke run ids
    and timestamps across lines at 1280 px. One order (newest first) in the terminal table, --json and the report;
    an id, a time and a status kept on one line, the columns no run fills left out (here four runs of two kinds)."""
    import re

    home = tmp_path / "home"
    ids = _runs(home, 2) + _runs(home, 2, kind="pilot")
    r = cli("runs", "--home", home, "--json")
    assert [x["run_id"] for x in r.json["data"]["runs"]] == ids[::-1] and r.json["summary"] == "4 runs, newest first"
    text = cli("runs", "--home", home).out
    assert [text.index(i) for i in ids[::-1]] == sorted(text.index(i) for i in ids)
    r = cli("report", "--home", home, "--out", tmp_path / "r.html")
    assert r.code == 0, r.err
    html = (tmp_path / "r.html").read_text()
    table = html[html.index('<table class="runs">'):]
    table = table[:table.index("</table>")]
    assert [table.index(i) for i in ids[::-1]] == sorted(table.index(i) for i in ids)
    assert "<th>sweep</th>" not in table and "<th>arm</th>" not in table
    assert len(re.findall(r'<td class="id">', table)) == 4 and len(re.findall(r'<td class="time">', table)) == 4
    assert "white-space:nowrap" in html and 'class="scroll"' in html and "T" not in re.findall(
        r'<td class="time">([^<]*)<', table)[0]


# --- 5. one JSON envelope -------------------------------------------------------------------------
ENVELOPE_KEYS = ["ok", "exit_code", "verb", "verdict", "summary", "messages", "data", "stages", "error"]


def test_every_kind_of_verb_writes_the_same_envelope(cli, tmp_path):
    home = tmp_path / "home"
    [run_id] = _runs(home, 1)
    init = cli("init", tmp_path / "c", "--json")
    campaign = tiny_causal_campaign(tmp_path / "t", simple_records(8))
    shapes = {"init": init, "runs": cli("runs", "--home", home, "--json"),
              "show": cli("show", run_id, "--home", home, "--json"),
              "note": cli("note", "hello", "--home", home, "--json"),
              "validate": cli("validate", campaign, "--json"),
              "show-missing": cli("show", "nope", "--home", home, "--json"),
              "bad-set": cli("validate", campaign, "--set", "train.lr", "--json"),
              "usage": cli("runs", "--bogus", "--json")}
    for name, r in shapes.items():
        assert list(r.json) == ENVELOPE_KEYS, name
        assert r.json["exit_code"] == r.code and r.json["ok"] is (r.code == 0), name
    assert shapes["runs"].json["data"]["runs"][0]["run_id"] == run_id
    assert shapes["show"].json["data"]["run"]["run_id"] == run_id
    assert shapes["validate"].json["stages"][0]["stage"] == "validate"
    assert shapes["init"].json["verb"] == "init" and shapes["init"].json["error"] is None
    bad = shapes["bad-set"].json
    assert bad["exit_code"] == 2 and bad["error"]["key"] == "--set" and "KEY=VALUE" in bad["error"]["message"]
    assert shapes["usage"].json["error"]["kind"] == "usage" and shapes["usage"].code == 2


def test_error_envelope_names_file_and_line(cli, tmp_path):
    campaign = tmp_path / "campaign.yaml"
    campaign.write_text("name: x\ntask: causal-lm\nmodel: [unclosed\n")
    r = cli("validate", campaign, "--json")
    assert r.code == 2
    err = r.json["error"]
    assert err["file"] == str(campaign) and isinstance(err["line"], int) and err["line"] >= 3, err
    assert err["fix"]


# --- 2. tables at three widths --------------------------------------------------------------------
def _render(draw, width: int) -> str:
    from rich.console import Console

    buf = io.StringIO()
    draw(Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, soft_wrap=False))
    return buf.getvalue()


def _stage_tables():
    from pilotrun.verdicts import StageResult

    fixtures = json.loads((SNAPSHOTS / "tables.json").read_text())
    results = {k: StageResult(v["stage"], v["verdict"], v["summary"], [], {}, v["columns"], v["rows"])
               for k, v in fixtures.items()}
    results["all"] = [StageResult("validate", "ok", "campaign valid; examples per update = 4 (micro_batch 2 × "
                                  "accumulation 2 × ranks 1)", seconds=0.031),
                      StageResult("pilot", "fail", "2 of 7 phase rows failing: first_step/0: over-budget, "
                                  "steady_step/0: over-budget", seconds=212.4),
                      StageResult("sheet", "warn", "needs 17.43 GiB per GPU (peak at steady_step); target "
                                  "L4 24GB; campaign 3.2 h", seconds=9.87)]
    return results


def _draw(name, value):
    from pilotrun.report.terminal import render_result, render_summary

    if name == "all":
        return lambda con: render_summary(value, con)
    return lambda con: render_result(value, con)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", ["pilot", "estimate", "sheet", "all"])
def test_table_snapshot(name, width):
    value = _stage_tables()[name]
    text = _render(_draw(name, value), width)
    path = SNAPSHOTS / f"{name}-{width}.txt"
    if os.environ.get("PILOTRUN_UPDATE_SNAPSHOTS"):
        path.write_text(text)
    assert max(map(len, text.splitlines())) <= width, text
    assert "…" not in text
    results = value if isinstance(value, list) else [value]
    for r in results:
        for row in r.rows:  # every cell, whole, somewhere
            for v in (row.get(c) for c in r.columns) if r.columns else row.values():
                for word in str(v if not isinstance(v, float) else f"{v:.4g}").split():
                    assert word in text, (word, text)
        for col in r.columns:
            for word in col.replace("_", " ").split():  # whole, or stacked at its first _
                assert word in text, (col, text)
    assert text == path.read_text(), f"{path.name} changed; rerun with PILOTRUN_UPDATE_SNAPSHOTS=1 and review"


def test_ledger_tolerates_an_extra_memory_column():
    from pilotrun.verdicts import StageResult

    pilot = _stage_tables()["pilot"]
    rows = [dict(r, peak_exact="301.2 MiB") for r in pilot.rows]
    cols = pilot.columns[:5] + ["peak_exact"] + pilot.columns[5:]
    for width in WIDTHS:
        text = _render(_draw("pilot", StageResult("pilot", "ok", "x", [], {}, cols, rows)), width)
        assert "301.2 MiB" in text and "exact" in text and max(map(len, text.splitlines())) <= width


def test_layouts_by_width():
    from pilotrun.report.table import render_table

    sheet = _stage_tables()["sheet"]
    layouts = {w: None for w in (40, 80, 100, 160)}
    for w in layouts:
        _render(lambda con: layouts.__setitem__(w, render_table(con, sheet.columns, sheet.rows)), w)
    assert layouts == {40: "vertical", 80: "split", 100: "split", 160: "stacked-headers"}


def test_piped_output_is_not_wrapped_at_80_unless_columns_says_so(tmp_path):
    home = tmp_path / "home"
    ids = _runs(home, 2)
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "PILOTRUN_WIDTH")}
    p = subprocess.run([sys.executable, "-m", "pilotrun", "runs", "--home", str(home)], capture_output=True,
                       text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ids[0] in ln]
    assert len(lines) == 1 and "completed" in lines[0] and len(lines[0]) > 80 and "created" in p.stdout
    for width in ("80", "60"):  # a pipe with COLUMNS is laid out at it; PILOTRUN_WIDTH wins over both
        for key in ("COLUMNS", "PILOTRUN_WIDTH"):
            p = run_cli_process("runs", "--home", home, env={key: width, "COLUMNS": width if key == "COLUMNS"
                                                              else "300"})
            assert p.returncode == 0, p.stderr
            assert max(map(len, p.stdout.splitlines())) <= int(width), (key, width, p.stdout)
            assert all(i in p.stdout for i in ids) and "completed" in p.stdout, p.stdout
            assert not [ln for ln in p.stdout.splitlines() if ln != ln.rstrip()], p.stdout  # no trailing blanks


# --- 7. a broken pipe is not a failure ------------------------------------------------------------
def test_pipe_closed_early_exits_0_quietly(tmp_path):
    home = tmp_path / "home"
    _runs(home, 700)
    proc = subprocess.Popen([sys.executable, "-m", "pilotrun", "runs", "--home", str(home)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ))
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert b"run" in first and "Traceback" not in err and "Broken pipe" not in err and "BrokenPipe" not in err, err


# --- 7. small things ------------------------------------------------------------------------------
def test_help_lists_verbs_in_rehearsal_order_with_defaults_and_no_home_where_useless(cli):
    r = cli("--help")
    listed = [ln.split()[0] for ln in r.out.split("Commands:")[1].splitlines() if ln.strip()]
    assert listed[:7] == ["demo", "init", "import", "validate", "inspect", "leakage", "split"]
    assert listed.index("pilot") < listed.index("sweep") < listed.index("sheet") < listed.index("runs")
    validate = cli("validate", "--help").out
    assert "--home" not in validate and "--json" in validate
    resume = " ".join(cli("resume", "--help").out.split())
    assert "[default: (4); x>=2]" in resume and "(default" not in resume
    assert "--home" in cli("train", "--help").out


def test_env_is_paste_ready_markdown(cli):
    r = cli("env")
    assert r.code == 0
    assert r.out.startswith("## pilotrun env\n") and "| RAM | " in r.out and f"| CPUs | {os.cpu_count()}" in r.out
    for pkg in ("transformers", "lightning", "peft", "accelerate", "tensorboard", "datasets"):
        assert f"| {pkg} | " in r.out, pkg
    data = cli("env", "--json").json["data"]
    assert data["host"]["cpu_count"] == os.cpu_count() and data["host"]["ram_bytes"] > 0


def test_a_bad_set_value_blames_set_not_the_file(cli, tmp_path):
    campaign = tiny_causal_campaign(tmp_path, simple_records(8))
    r = cli("validate", campaign, "--set", "train.lr=abc")
    assert r.code == 2
    assert r.err.startswith("pilotrun: error: --set train.lr=\"abc\": key 'train.lr'"), r.err
    assert f"{campaign}:" not in r.err


def test_a_bad_pilotrun_home_names_the_variable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    p = run_cli_process("runs", env={"PILOTRUN_HOME": str(blocker / "home")})
    assert p.returncode == 2
    assert f"$PILOTRUN_HOME={blocker / 'home'}" in p.stderr and "environment variable PILOTRUN_HOME" in p.stderr
    p = run_cli_process("runs", "--home", blocker / "home", env={"PILOTRUN_HOME": ""})
    assert p.returncode == 2 and "$PILOTRUN_HOME" not in p.stderr.split("fix:")[0]


# --- 3. progress ----------------------------------------------------------------------------------
def test_a_long_stage_writes_a_plain_progress_line_to_a_log(tmp_path):
    """stderr is a file here: a line at the start and then every PILOTRUN_HEARTBEAT_S (30 s by default)."""
    campaign = tiny_causal_campaign(tmp_path, simple_records(8), train__updates=3)
    p = run_cli_process("train", campaign, "--home", tmp_path / "home", env={"PILOTRUN_HEARTBEAT_S": "0.3"})
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pilotrun train")]
    assert len(lines) >= 2, p.stderr  # the start line, then heartbeats
    assert lines[0] == "pilotrun train: started" and "\x1b" not in p.stderr
    assert any("update " in ln and "/3" in ln for ln in lines) or len(lines) >= 3, p.stderr


def test_a_beat_before_a_stage_says_what_it_does_says_it_is_starting(log_stream):
    """A stage opening its journal or importing torch has no head yet: its beats read "pilotrun archive (0 s)", a
    bare name; they say "starting" now."""
    import time

    from pilotrun.console.progress import head, stage_progress

    with stage_progress("archive", stream=log_stream):
        time.sleep(0.3)
        head("packing 3 files")
    lines = log_stream.getvalue().splitlines()
    assert lines[0] == "pilotrun archive: started" and lines[-1].startswith("pilotrun archive: ended"), lines
    assert any(re.fullmatch(r"pilotrun archive: starting \(0 s\)", ln) for ln in lines), lines
    assert all(ln.startswith("pilotrun archive: ") for ln in lines), lines


@pytest.mark.parametrize("variable, value, said", [
    ("PILOTRUN_WIDTH", "1", "PILOTRUN_WIDTH='1' is not a width of at least 40 columns"),  # a character a line
    ("PILOTRUN_WIDTH", "wide", "PILOTRUN_WIDTH='wide' is not a width"),  # dropped without a word
    ("PILOTRUN_WIDTH", "39", "is not a width of at least 40 columns"),
    ("PILOTRUN_HEARTBEAT_S", "nan", "PILOTRUN_HEARTBEAT_S='nan' is not a finite number of seconds above 0"),
    ("PILOTRUN_HEARTBEAT_S", "-5", "PILOTRUN_HEARTBEAT_S='-5' is not"),  # a beat every 50 ms
    ("PILOTRUN_HEARTBEAT_S", "0", "is not a finite number of seconds above 0"),
    ("PILOTRUN_HEARTBEAT_S", "30s", "is not a finite number of seconds above 0"),
])
def test_pilotruns_own_variables_are_checked_as_its_options_are(cli, demo_campaign, monkeypatch, variable, value,
                                                                said):
    monkeypatch.setenv(variable, value)
    r = cli("validate", demo_campaign, "--json")
    assert r.code == 2 and said in r.err, r.err
    assert r.json["error"]["where"] == f"${variable}" and "unset it" in r.json["error"]["fix"]
    for clean in {"PILOTRUN_WIDTH": ("", "40"), "PILOTRUN_HEARTBEAT_S": ("", "0.2")}[variable]:  # "": unset
        monkeypatch.setenv(variable, clean)
        assert cli("validate", demo_campaign).code == 0


def test_heartbeat_names_what_the_stage_is_doing(log_stream):
    import time

    from pilotrun.console.progress import note, stage_progress

    with stage_progress("pilot", stream=log_stream):
        note("phase steady_step")
        time.sleep(0.3)
    lines = log_stream.getvalue().splitlines()
    assert lines[0] == "pilotrun pilot: started" and len(lines) >= 4
    assert lines[-2].startswith("pilotrun pilot: phase steady_step (")
    assert lines[-1] == "pilotrun pilot: ended (0 s)"  # the last line says it ended, and its time
