"""What a user sees during and after `all` (issue 35): a start and end line per stage with its time, a time
column and the budgets in the summary; tables that fit PILOTRUN_WIDTH / COLUMNS; the token view readable
without colour; runs, show and the report agreeing on a failed check; the pilot's start-up inside `all`."""

from __future__ import annotations

import re

import pytest
from conftest import run_cli_process, simple_records, tiny_causal_campaign

from pilotrun.journal import Journal


# --- 1. all: a line per stage, times, budgets -------------------------------------------------------
def test_all_logs_each_stage_start_and_end_with_its_time(cli, tmp_path, monkeypatch):
    from pilotrun.rehearsal import all as all_module

    stages = all_module.STAGES[:3]  # validate, inspect, leakage: the real stages that take no training
    monkeypatch.setattr(all_module, "STAGES", stages)
    monkeypatch.setenv("COLUMNS", "80")
    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    r = cli("all", path, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    err = r.err.splitlines()
    for i, (name, _) in enumerate(stages, 1):
        start = err.index(f"pilotrun all {i}/3 {name}: started")
        end = err.index(next(ln for ln in err if re.fullmatch(rf"pilotrun all {i}/3 {name}: ended ok \(\d+ s\)", ln)))
        assert start < end and (i == 1 or err.index(f"pilotrun all {i - 1}/3 {stages[i - 2][0]}: started") < start)
    assert all(isinstance(s["seconds"], float) and s["seconds"] >= 0 for s in r.json["stages"]), r.json["stages"]
    summary = err[err.index("rehearsal summary") + 1:]
    assert summary[0].split() == ["stage", "verdict", "time"], summary
    assert any(ln.startswith("budgets: overfit 8 examples, ≤ 150 updates; resume at update 4") for ln in summary)
    assert max(map(len, summary)) <= 80, summary


def test_budgets_said_are_the_ones_used(tmp_path):
    """Issue 43: overfit's line read "update 2/150 … about 24.1 min left", then "update 6/40", and `all`'s summary
    "≤ 150 updates" while 40 were used. A memorising run's total is a ceiling it stops before (said "≤", "at most …
    left"), and the summary names the budget overfit sized and the updates it took — here for a budget sized from
    a pilot (the second instance: the issue's was sized from the run's own updates), and one given."""
    from types import SimpleNamespace

    from pilotrun.engine.loop import update_line
    from pilotrun.rehearsal.all import Budgets
    from pilotrun.verdicts import StageResult

    out = {"loss": 0.5, "lr": 1e-3, "examples": 8, "seconds": 2.0}
    assert update_line(SimpleNamespace(update=6, total_updates=40, bound=True), out).startswith("update 6/≤40, ")
    assert update_line(SimpleNamespace(update=6, total_updates=40, bound=False), out).startswith("update 6/40, ")
    loaded = SimpleNamespace(campaign=SimpleNamespace(train=SimpleNamespace(updates=200, epochs=None)))
    sized = StageResult("overfit", "ok", "", data={"updates": 12, "budget": {
        "updates": 40, "ceiling": 150, "sized": True, "seconds_per_update": 3.0, "seconds": 120.0,
        "source": "pilot r1: 6 timed updates"}})
    line = Budgets().lines(loaded, [sized])[0]
    assert line.startswith("budgets: overfit 8 examples, ≤ 40 updates (sized to 120 s at 3 s each; ceiling 150), "
                           "12 taken; resume at update 4"), line
    given = StageResult("overfit", "fail", "", data={"updates": 3, "budget": {
        "updates": 3, "ceiling": 3, "sized": False, "seconds_per_update": None, "seconds": 120.0, "source": ""}})
    assert Budgets(max_updates=3, sized=False).lines(loaded, [given])[0].startswith(
        "budgets: overfit 8 examples, ≤ 3 updates, 3 taken; resume")
    assert Budgets().lines(loaded)[0].startswith("budgets: overfit 8 examples, ≤ 150 updates; resume")


@pytest.mark.slow
def test_all_through_a_pipe_says_each_stage_and_its_time(tmp_path):
    from pilotrun.rehearsal.all import STAGES

    path = tiny_causal_campaign(tmp_path / "c", simple_records(12), simple_records(4, start=50))
    p = run_cli_process("all", path, "--home", tmp_path / "home", "--quick", "--max-updates", "3",
                        "--train-updates", "2", env={"COLUMNS": "80", "PILOTRUN_HEARTBEAT_S": "60"})
    assert p.returncode in (0, 1), p.stderr[-3000:]
    err = p.stderr.splitlines()
    n = len(STAGES)
    for i, (name, _) in enumerate(STAGES, 1):
        start = err.index(f"pilotrun all {i}/{n} {name}: started")
        end = next(k for k, ln in enumerate(err) if re.fullmatch(rf"pilotrun all {i}/{n} {name}: ended "
                                                                 r"(ok|warn|fail) \(\d+ s\)", ln))
        assert start < end, (name, err)
    out = p.stdout.splitlines()
    head = out.index("rehearsal summary") + 1
    assert out[head].split() == ["stage", "verdict", "time"], out[head:]  # the summary shown moves below at 80
    assert re.search(r"^overfit\s+fail\s+\d", p.stdout, re.M), p.stdout  # 3 updates cannot memorise
    assert "budgets: overfit 4 examples, ≤ 3 updates, 3 taken; resume at update 2 (reference 4); train ≤ 2 updates " \
           "(the campaign's budget is 4 updates)" in p.stdout.replace("\n ", " ").replace("  ", " "), p.stdout
    assert re.search(r"^total \d", p.stdout, re.M), p.stdout
    assert max(map(len, out)) <= 80, [ln for ln in out if len(ln) > 80]
    runs = {r["kind"]: r for r in Journal(tmp_path / "home").list_runs()}
    assert runs["train"]["updates_done"] == 2 and runs["overfit"]["summary"]["updates"] == 3


def test_budgets_from_the_options():
    from pilotrun.cli.start import _budgets
    from pilotrun.rehearsal.all import Budgets

    assert _budgets(False, None, None, None, None) == Budgets()
    assert _budgets(True, None, None, None, None) == Budgets.quick()
    assert _budgets(True, 6, None, 3, None) == Budgets(examples=6, max_updates=120, at=3, train_updates=8)


def test_a_train_budget_above_the_campaigns_leaves_it(tmp_path):
    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.all import Budgets

    loaded = load_campaign(tiny_causal_campaign(tmp_path, simple_records(6), train__updates=4))
    assert Budgets(train_updates=10).for_train(loaded) is loaded
    assert "train 4 updates (the campaign's budget)" in Budgets(train_updates=10).lines(loaded)[0]
    bounded = Budgets(train_updates=2).for_train(loaded)
    assert bounded.campaign.train.updates == 2 and loaded.campaign.train.updates == 4
    epochs = load_campaign(tiny_causal_campaign(tmp_path / "e", simple_records(6), train__updates=None,
                                                train__epochs=2))
    assert Budgets(train_updates=3).for_train(epochs).campaign.train.updates == 3
    assert "the campaign's budget is 2 epochs" in Budgets(train_updates=3).lines(epochs)[0]


def test_the_summary_has_a_time_column_only_when_timed():
    from test_cli_surfaces import _render

    from pilotrun.report.terminal import render_summary
    from pilotrun.verdicts import StageResult

    plain = [StageResult("validate", "ok", "valid"), StageResult("pilot", "fail", "2 rows failing")]
    text = _render(lambda con: render_summary(plain, con), 80)
    assert "time" not in text and "total" not in text
    timed = [StageResult("validate", "ok", "valid", seconds=0.02), StageResult("pilot", "fail", "x", seconds=75.0)]
    text = _render(lambda con: render_summary(timed, con, ["budgets: overfit 8 examples"]), 80)
    assert re.search(r"pilot\s+fail\s+75 s", text) and "20 ms" in text and "total 75 s" in text, text
    assert text.rstrip().endswith("budgets: overfit 8 examples"), text


def test_the_pilot_inside_all_does_not_count_the_stages_before_it(monkeypatch):
    import time

    from pilotrun import startup

    monkeypatch.setattr(startup, "_STATE", startup._Start())
    startup.mark()
    time.sleep(0.2)
    startup.discount(0.2)  # a stage (validate, overfit ...) took 0.2 s of this process
    alone = startup.seconds()
    assert alone is not None and alone < startup._STATE.boot + 0.15, alone
    assert startup.take() is not None
    startup.discount(50.0)  # once a run took the start-up, later stages change nothing
    assert startup.seconds() == pytest.approx(alone, abs=0.1)


# --- 2. the token view in a pipe ------------------------------------------------------------------
def _strip_lines(out: str) -> list[str]:
    """The token strip's lines: each has its marker row under it."""
    lines = out.splitlines()
    return [ln for ln, nxt in zip(lines, lines[1:]) if nxt.strip() and set(nxt) <= {"^", "-", "~", " "}]


def test_inspect_in_a_pipe_marks_the_loss_and_is_no_wider_than_its_strip(cli, demo_campaign, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.delenv("PILOTRUN_WIDTH", raising=False)
    r = cli("inspect", demo_campaign, "-n", "2")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    strips = _strip_lines(r.out)
    assert strips, r.out
    widest = max(map(len, strips))
    table = [ln for ln in lines if ln.startswith(("┏", "┃", "│", "└", "┡"))]
    assert table and max(map(len, table)) <= widest, (widest, table[:2])  # it was padded to 10,006 columns
    assert "the row under each line marks them: ^ trained, - masked" in r.out
    for strip in strips:  # the row under a strip marks each token: the answer ^, the prompt -
        marks = lines[lines.index(strip) + 1]
        assert set(marks) <= {"^", "-", "~", " "} and "^" in marks and "-" in marks, (strip, marks)
        first = strip.split("│")[0]
        assert marks.startswith("-" * len(first)), (strip, marks)  # the prompt's first token is masked


def test_inspect_at_40_columns_breaks_between_tokens(cli, demo_campaign, monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    r = cli("inspect", demo_campaign, "-n", "1", "--json")
    assert r.code == 0, r.err
    assert max(map(len, r.err.splitlines())) <= 40, r.err
    pieces = [p for _, p, _ in r.json["stages"][0]["data"]["examples"][0]["tokens"]]
    shown = [t for ln in _strip_lines(r.err) for t in ln.split("│")]
    from pilotrun.report.tokens import _piece

    assert len(_strip_lines(r.err)) >= 2 and shown[:len(pieces)] == [_piece(p) for p in pieces], shown


def test_strip_lines_never_cut_a_token():
    from pilotrun.report.tokens import strip_lines

    tokens = [(i, p, "trained" if i > 3 else "masked") for i, p in
              enumerate(["<|im_start|>", "user", "\n", "Huggi", "ng", "Face", "<|im_end|>", "!" * 30])]
    for width, plain in ((12, True), (12, False), (20, True), (25, False)):
        lines = strip_lines(tokens, width, plain)
        assert [p for line in lines for p, _, _ in line] == ["<|im_start|>", "user", "↵", "Huggi", "ng", "Face",
                                                             "<|im_end|>", "!" * 30]
        for line in lines:  # each fits, or is one token wider than the width alone
            w = sum(len(p) for p, _, _ in line) + (len(line) - 1 if plain else 0)
            assert w <= width or len(line) == 1, (width, line)


# --- 3. runs, show and the report on a failed check -----------------------------------------------
def test_runs_show_and_report_say_a_failed_overfit_failed(cli, tmp_path):
    path = tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, start=50))
    home = tmp_path / "home"
    r = cli("overfit", path, "--home", home, "--max-updates", "2")
    assert r.code == 1, r.out + r.err
    j = Journal(home)
    run_id, = [x["run_id"] for x in j.list_runs(kind="overfit")]
    # a second, different run: interrupted at update 5 before its counter was written
    other = j.create_run(kind="train", name="tiny", config={}, config_sha256="0", campaign_path=None, seed=0,
                         git_rev=None, packages={}, data={}, trust_remote_code=False,
                         command="pilotrun train c.yaml --set train.lr=0.01 --set 'seed=1'")
    j.add_metrics(other, [("train", "loss", s, 3.0 - s / 10, s * 4, None) for s in range(1, 6)] +
                  [("validation", "val_loss", 4, 2.5, 16, None)])
    j.finish_run(other, "interrupted", {"reason": "interrupted by the user (Ctrl-C)"})
    r = cli("runs", "--home", home)
    assert r.code == 0, r.err
    row, = [ln for ln in r.out.splitlines() if ln.startswith(run_id)]
    assert "check failed" in row and "fail" in row.replace("check failed", "") and "completed" not in row, r.out
    row2, = [ln for ln in r.out.splitlines() if ln.startswith(other)]
    assert re.search(r"interrupted\s+5\s+20\s+val_loss 2\.5", row2), r.out
    assert "train.lr=0.01, seed=1" in row2, r.out  # the overrides, from the command line the run recorded
    r = cli("runs", "--home", home, "--json")
    runs = {x["run_id"]: x for x in r.json["data"]["runs"]}
    assert runs[run_id]["verdict"] == "fail" and runs[run_id]["shown_status"] == "check failed"
    assert runs[other]["updates_done"] == 5 and runs[other]["final"] == "val_loss 2.5"
    r = cli("show", run_id, "--home", home)
    assert r.out.splitlines()[0].endswith(": check failed (verdict fail)"), r.out
    assert r.out.count("examples_seen") == 1 and r.out.count("updates_done") == 1, r.out
    r = cli("report", "--home", home, "--out", tmp_path / "r.html")
    html = (tmp_path / "r.html").read_text()
    assert f'<span class="status-check-failed">check failed</span>' in html and ">fail<" in html


def test_a_completed_run_without_a_verdict_stays_completed(tmp_path):
    from pilotrun.journal.runs import run_table_rows, shown_status

    j = Journal(tmp_path / "h")
    ids = [j.create_run(kind=k, name="t", config={}, config_sha256="0", campaign_path=None, seed=0, git_rev=None,
                        packages={}, data={}, trust_remote_code=False) for k in ("train", "resume")]
    j.finish_run(ids[0], "completed", {"updates": 4})
    j.finish_run(ids[1], "completed", {"verdict": "ok"})
    rows = run_table_rows(j, j.list_runs())
    assert [shown_status(r) for r in rows] == ["completed", "completed"]
    assert [r["verdict"] for r in rows] == [None, "ok"] and rows[0]["final"] is None and rows[0]["overrides"] is None


# --- 7. noise ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("verbose", [False, True])
def test_a_checkpointed_lora_build_says_no_future_warning_unless_verbose(tmp_path, monkeypatch, verbose):
    import warnings

    import yaml

    from pilotrun.campaign import load_campaign
    from pilotrun.tasks import make_task

    from transformers import PreTrainedModel

    if verbose and not hasattr(PreTrainedModel, "activation_checkpointing_enable"):
        pytest.skip("this transformers has not renamed gradient checkpointing: nothing to warn about")
    if verbose:
        monkeypatch.setenv("PILOTRUN_VERBOSE", "1")
    else:
        monkeypatch.delenv("PILOTRUN_VERBOSE", raising=False)
    path = tiny_causal_campaign(tmp_path / "c", simple_records(6), model__gradient_checkpointing=True)
    c = yaml.safe_load(path.read_text())
    c["model"]["adapter"] = {"kind": "lora", "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    path.write_text(yaml.safe_dump(c))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        make_task(load_campaign(path)).build_model()
    future = [str(w.message) for w in seen if issubclass(w.category, FutureWarning)]
    if verbose:  # transformers does warn here (the deprecated names): --verbose shows it, as it shows load reports
        assert any("checkpointing" in m for m in future), future
    else:
        assert future == [], future


def test_a_summary_headline_is_not_cut_at_a_file_line_colon():
    from pilotrun.verdicts import headline, plural

    assert headline("data/train.jsonl:3 has no answer: set data.response") == "data/train.jsonl:3 has no answer"
    assert headline("the loss is nan at 12:30 (update 4): lower train.lr") == "the loss is nan at 12:30 (update 4)"
    assert headline("no colon here") == "no colon here"
    assert [plural(1, "example"), plural(2, "example"), plural(0, "update")] == ["1 example", "2 examples",
                                                                                "0 updates"]


# --- 4. the time check names a term, and advises a rerun only for noise ------------------------------
def test_the_time_check_blames_one_term_not_the_machine():
    from pilotrun.rehearsal.training.timecheck import time_plan_warning

    run = {"run_id": "r1", "arm": "control", "seed": 0, "predicted_s": 880.0, "actual_s": 260.0, "ratio": 3.38,
           "updates": 12, "status": "completed"}
    check = {"pilot_run": "p", "runs": [run], "predicted_s": 880.0, "actual_s": 260.0, "ratio": 3.38,
             "goal": (0.9, 1.1),
             "breakdown": [{"term": "start-up, data and cold load (1st run)", "predicted_s": 858.8, "actual_s": 7.1},
                           {"term": "updates (the first's optimizer state)", "predicted_s": 200.0, "actual_s": 205.0},
                           {"term": "validations", "predicted_s": 21.0, "actual_s": 20.0}]}
    said = time_plan_warning(check)
    assert "most of the gap is one term, start-up, data and cold load (1st run) (predicted 858.8s, actual 7.1s)" \
        in said and "idle machine" not in said, said
    # a second instance: the updates themselves run slow and the rest agrees
    slow = dict(check, ratio=0.6, breakdown=[{"term": "updates (the first's optimizer state)", "predicted_s": 100.0,
                                              "actual_s": 180.0}, {"term": "checkpoints", "predicted_s": 5.0,
                                                                   "actual_s": 5.2}])
    assert "one term, updates" in time_plan_warning(slow)
    # spread over every term: noise, and the advice to rerun on an idle machine
    noisy = dict(check, breakdown=[{"term": t, "predicted_s": 10.0, "actual_s": 3.0} for t in ("a", "b", "c")])
    assert time_plan_warning(noisy).endswith("(rerun `pilotrun pilot` on an idle machine)")


# --- 5. advice that fits the machine ----------------------------------------------------------------
def test_over_budget_advice_fits_this_machine(tmp_path):
    import psutil

    from pilotrun.campaign import load_campaign
    from pilotrun.rehearsal.memory.estimate import over_budget_advice

    loaded = load_campaign(tiny_causal_campaign(tmp_path, simple_records(6)))
    small = over_budget_advice(loaded, 64 * 2**20)  # a limit this machine can hold: fit measures it here
    assert small.startswith("try `pilotrun fit ") and small.endswith("--memory-limit 64MiB`"), small
    beyond = 2 * psutil.virtual_memory().total + 2**30  # 141GiB on a 22 GiB box: fit cannot measure that
    said = over_budget_advice(loaded, beyond)
    assert "`pilotrun fit` cannot measure that here (this machine has" in said, said
    assert said.endswith("--options` for the GPUs, counts and options that fit") and "--memory-limit" not in said


@pytest.mark.slow
def test_the_options_table_names_what_it_leaves_out_and_the_qlora_rows(tmp_path, cli):
    bf16 = tiny_causal_campaign(tmp_path / "b", simple_records(24), simple_records(8, start=100),
                                train__precision="bf16-mixed")
    done = cli("estimate", bf16, "--options", "--json")
    assert done.code == 0, done.err
    data = done.json["data"]
    t4, = [x for x in data["left_out"] if x["gpu"] == "t4"]
    assert t4["why"] == "no bf16-mixed tensor rate on it (train.precision)"
    assert not [r for r in data["rows"] if r["gpu"] == "t4"]
    said = " ".join(done.json["messages"])
    assert "Left out of the table: T4 16GB (no bf16-mixed tensor rate on it (train.precision))" in said, said
    qlora = [r for r in data["rows"] if r["option"] == "qlora" and r["fits"]]
    if qlora and not any(r["option"] == "qlora" for r in data["shown"]):
        assert "QLoRA (" in said and "fitting QLoRA rows in `--json`" in said, said
    fp32 = cli("estimate", tiny_causal_campaign(tmp_path / "f", simple_records(24), simple_records(8, start=100)),
               "--options", "--json")  # fp32 runs on every catalogue GPU: nothing is left out
    assert fp32.code == 0 and fp32.json["data"]["left_out"] == [] and "Left out" not in " ".join(fp32.json["messages"])


def test_the_options_text_says_what_is_left_out_and_the_cheapest_qlora():
    from pilotrun.sheet.options_view import to_lines

    def row(option, gpu, count, seconds, fits=True):
        return {"option": option, "gpu": gpu, "name": gpu.upper(), "count": count, "seconds": seconds, "fits": fits,
                "peak": 3 * 2**30, "phase": "steady_step", "label": option, "short": option, "keeps": option == "w",
                "changes": "trains an adapter on a 4-bit copy" if option == "qlora" else "keeps the experiment",
                "gpu_hours": seconds / 3600 * count, "cost": None}

    written = row("w", "l4", 1, 60.0)
    table = {"recommended": written, "cheapest": None, "pilot_run": None, "params": 10, "by": "gpu_hours",
             "currency": "", "shown": [written], "meanings": {}, "assumptions": [], "skipped": None,
             "rows": [written, row("qlora", "l4", 2, 90.0), row("qlora", "l4", 1, 80.0), row("qlora", "a10", 1, 70.0,
                                                                                          fits=False)],
             "left_out": [{"gpu": "t4", "name": "T4 16GB", "why": "no bf16-mixed tensor rate on it (train.precision)"}]}
    text = "\n".join(to_lines(table))
    assert "Left out of the table: T4 16GB (no bf16-mixed tensor rate on it (train.precision))." in text, text
    assert "QLoRA (trains an adapter on a 4-bit copy): fits from 1 × L4 at 3.00 GiB per GPU, 80 s" in text, text
    assert "(2 fitting QLoRA rows in `--json`)" in text, text
    shown = dict(table, shown=[written, table["rows"][2]], left_out=[])
    text = "\n".join(to_lines(shown))
    assert "QLoRA (" not in text and "Left out" not in text  # a QLoRA row in the table is not said twice


def test_inspect_and_runs_on_a_terminal_of_80_columns(demo_campaign, tmp_path):
    from test_progress import run_pty, visible_lines

    code, _, raw = run_pty("inspect", demo_campaign, "-n", "1", "--json", cols=80)  # human output on the pty
    assert code == 0, raw
    shown = visible_lines(raw)
    assert shown and max(map(len, shown)) <= 80, [ln for ln in shown if len(ln) > 80]
    assert "\x1b[" in raw and "row under each line marks" not in raw  # colour marks the tokens here
    home = tmp_path / "home"
    j = Journal(home)
    rid = j.create_run(kind="overfit", name="tiny", config={}, config_sha256="0", campaign_path=None, seed=0,
                       git_rev=None, packages={}, data={}, trust_remote_code=False)
    j.finish_run(rid, "completed", {"verdict": "fail"})
    code, _, raw = run_pty("runs", "--home", home, "--json", cols=80)
    shown = visible_lines(raw)
    assert code == 0 and max(map(len, shown)) <= 80 and "check failed" in raw and rid in raw, shown
