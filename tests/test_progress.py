"""Progress on every long stage: what it is doing and how far, on a terminal (a real pseudo-terminal) and
through a pipe; the workers that resume and verify start report into their parent's line."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import TINY_LLAMA, run_cli_process, tiny_causal_campaign
from pilotrun.console.progress import BAR_WIDTH

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def _records(n: int) -> list[dict]:
    return [{"instruction": "reverse " + "w" * (20 + (i * 7) % 20), "output": "x" * (20 + (i * 5) % 20)}
            for i in range(n)]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """One tiny campaign and one home shared by the verbs."""
    root = tmp_path_factory.mktemp("progress")
    campaign = tiny_causal_campaign(root / "c", _records(16), _records(4), train__micro_batch=2,
                                    train__accumulation=2, train__eval_batch=2, train__updates=4)
    return campaign, root / "home"


@pytest.fixture(scope="module")
def heavy(tmp_path_factory):
    """A campaign whose logits dominate the activations, so fit has a micro-batch to bisect."""
    root = tmp_path_factory.mktemp("progress-fit")
    campaign = tiny_causal_campaign(root / "c", _records(16), _records(4), model__config=dict(TINY_LLAMA,
                                    vocab_size=4096), data__max_length=64, train__micro_batch=8,
                                    train__accumulation=1, train__eval_batch=2, train__updates=4)
    return campaign, root / "home"


def run_pty(*args, cols: int = 80, env: dict | None = None) -> tuple[int, str, str]:
    """The CLI with stderr on a pseudo-terminal of ``cols`` columns: (exit code, stdout, stderr's text)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    full = dict(os.environ, TERM="xterm-256color", **(env or {}))
    for key in ("COLUMNS", "LINES", "PILOTRUN_WIDTH", "NO_COLOR"):
        full.pop(key, None)
    p = subprocess.Popen([sys.executable, "-m", "pilotrun", *map(str, args)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=slave, env=full)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    out = p.stdout.read().decode()
    p.wait(timeout=600)
    os.close(master)
    return p.returncode, out, b"".join(chunks).decode("utf-8", "replace")


def visible_lines(raw: str) -> list[str]:
    """What a terminal shows, line by line (cursor movements and colours removed)."""
    return [ln for ln in re.split(r"[\r\n]", ANSI.sub("", raw)) if ln.strip()]


def unwrapped(lines: list[str]) -> str:
    """The live line's text column wraps under itself (indented past the bar): join those lines back."""
    out: list[str] = []
    for ln in lines:
        if out and ln[:BAR_WIDTH + 1].strip() == "":
            out[-1] += " " + ln.strip()
        else:
            out.append(ln.rstrip())
    return "\n".join(out)


def run_pipe(*args) -> subprocess.CompletedProcess:
    return run_cli_process(*args, env={"PILOTRUN_HEARTBEAT_S": "0.2"})


def _counts(pattern: str, text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in re.findall(pattern, text)]


def _fits(lines: list[str], cols: int) -> None:
    """Every line shown within ``cols``, and the live line on one row (one that wraps leaves fragments: issue 43)."""
    long = [ln for ln in lines if len(ln) > cols]
    assert not long, f"lines over {cols} columns: {long[:3]}"
    assert unwrapped(lines) == "\n".join(ln.rstrip() for ln in lines), "the live line wrapped"


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_pilot_shows_its_phase_of_eight(setup):
    campaign, home = setup
    p = run_pipe("pilot", campaign, "--home", home)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("pilotrun pilot")]
    assert lines[0] == "pilotrun pilot: started" and "\x1b" not in p.stderr
    seen = _counts(r"phase (\d)/(\d)", p.stderr)
    assert {t for _, t in seen} == {8} and len({d for d, _ in seen}) >= 3, p.stderr  # 7 phases + the time model
    assert re.search(r"phase 4/8: eval_longest", p.stderr) or re.search(r"phase 1/8: load", p.stderr), p.stderr
    assert all(ln.endswith(")") for ln in lines[1:]), lines
    code, _, raw = run_pty("pilot", campaign, "--home", home, cols=80)
    assert code == 0, raw
    shown = visible_lines(raw)
    assert re.search(r"pilotrun pilot: .*phase \d/8: \w+", unwrapped(shown)), shown
    _fits(shown, 80)


def test_overfit_shows_updates_and_loss(setup):
    campaign, home = setup
    code, _, raw = run_pty("overfit", campaign, "--home", home, "--max-updates", "30", cols=100)
    assert code in (0, 1), raw
    shown = visible_lines(raw)
    text = unwrapped(shown)
    counts = _counts(r"update (\d+)/≤?(\d+), loss [\d.]+", text)  # ≤: a memorising run may stop before
    assert counts and {t for _, t in counts} == {30}, text
    assert "memorising 8 examples" in text and "━" in text, text
    _fits(shown, 100)
    p = run_pipe("overfit", campaign, "--home", home, "--max-updates", "30")
    assert "pilotrun overfit: accumulation check" in p.stderr, p.stderr
    assert _counts(r"pilotrun overfit: memorising 8 examples — update (\d+)/≤?(\d+), loss", p.stderr), p.stderr


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_resume_and_verify_show_their_workers_counts(setup):
    campaign, home = setup
    p = run_pipe("resume", campaign, "--home", home, "--at", "2", "--json")
    assert p.returncode == 0, p.stderr
    err = p.stderr
    assert re.search(r"reference run \(4 updates, its state saved at update 2\) — update \d/4", err), err
    assert "second run, to update 1 (is the reference reproducible?) — update 1/4" in err, err
    # the fresh process's own counts, read from the file it reports into
    assert re.search(r"resumed run \(a new process, from update 2\) — (loading the saved state|update \d/4)", err), err
    assert "resumed run (a new process, from update 2) — update 4/4" in err, err
    import json

    run_id = json.loads(p.stdout)["data"]["run_id"]
    code, out, raw = run_pty("resume", campaign, "--home", home, "--at", "2", cols=160)
    shown = visible_lines(raw)
    assert code == 0, raw
    text = unwrapped(shown)
    # each update's line has its learning rate and rate (the loop's one line, train's and sweep's alike)
    assert re.search(r"pilotrun resume: reference run \(4 updates, its state saved at update 2\) — update \d/4, "
                     r"loss [\d.]+, lr \S+, [\d.]+ ex/s \(", text), text
    assert re.search(r"pilotrun resume: resumed run \(a new process, from update 2\) — update \d/4, loss", text), text
    _fits(shown, 160)
    verifying = r"pilotrun verify: reloading the artifact in a new process — artifact 1/\d: \w+, \d+ control inputs"
    p = run_pipe("verify", run_id, "--home", home)
    assert p.returncode == 0, p.stderr
    assert re.search(verifying, p.stderr), p.stderr
    code, _, raw = run_pty("verify", run_id, "--home", home, cols=100)
    shown = visible_lines(raw)  # on one row of 100 columns: the outer part shortened, the artifact's count kept
    assert code == 0 and re.search(verifying.replace("in a new process", "[^—]*"), "\n".join(shown)), raw
    _fits(shown, 100)


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_fit_shows_the_probe_and_its_bound(heavy):
    campaign, home = heavy
    import json

    p = run_pipe("pilot", campaign, "--home", home, "--json")
    rows = {r["phase"]: r for r in json.loads(p.stdout)["data"]["rows"]}
    from pilotrun.probe.recorder import peak_of

    peak = {k: peak_of(r) for k, r in rows.items()}  # what fit judges against the limit: the live tensors on CPU
    limit = (peak["load"] + peak["steady_step"]) // 2  # load fits, the training phases do not: bisect micro_batch
    assert peak["steady_step"] > peak["load"]
    code, out, raw = run_pty("fit", campaign, "--home", home, "--memory-limit", str(limit), cols=160)
    shown = visible_lines(raw)
    text = unwrapped(shown)
    probes = _counts(r"probe (\d) \(≤(\d)\): micro_batch \d+, accumulation \d+", text)
    assert probes and all(d <= b for d, b in probes), text
    assert "at most" in text or len(probes) == 1, text
    _fits(shown, 160)
    p = run_pipe("fit", campaign, "--home", home, "--memory-limit", str(limit))
    probes = _counts(r"pilotrun fit: probe (\d) \(≤(\d)\): micro_batch \d+, accumulation \d+ — ", p.stderr)
    assert probes and all(d <= b for d, b in probes), p.stderr
    assert "pilotrun fit: the control's ledger (the latest pilot of this config, else a new one) (" in p.stderr
    assert re.search(r"pilotrun fit: probe 1 \(≤\d\): [^\n]* — phase 1/\d: first_step \(", p.stderr), p.stderr


def test_train_shows_the_shared_line_with_counts(setup):
    campaign, home = setup
    code, _, raw = run_pty("train", campaign, "--home", home, cols=80)
    assert code == 0, raw
    shown = visible_lines(raw)
    assert _counts(r"pilotrun train: update (\d)/(4), loss", unwrapped(shown)), shown
    _fits(shown, 80)


def test_the_line_counts_the_time_left(log_stream):
    import time

    from pilotrun.console.progress import head, note, stage_progress

    with stage_progress("sweep", stream=log_stream):
        head("run 2/4: control seed 1", done=1, total=4, eta_s=600)
        for i in range(1, 4):
            note(f"update {i}/10, loss 1.0", done=i, total=10)
            time.sleep(0.1)
    lines = log_stream.getvalue().splitlines()
    assert lines[0] == "pilotrun sweep: started"
    assert any(re.fullmatch(r"pilotrun sweep: run 2/4: control seed 1 — update \d+/10, loss 1\.0 "
                            r"\(\d s, about (9\.\d|10\.0) min left\)", ln) for ln in lines), lines


@pytest.mark.slow  # end to end and among the suite's costliest (its 12 minutes); `pytest -m slow` runs it
def test_sweep_says_the_run_and_its_update_while_it_trains(tmp_path):
    """The sweep's line followed the data's encoding and then nothing of the run: through the model's build,
    the first validation and every update it said ``reading and encoding the validation split``. Now each
    phase of the run is a milestone after the run's head, and each update has its rate."""
    campaign = tiny_causal_campaign(tmp_path / "c", _records(16), _records(4), train__micro_batch=2,
                                    train__accumulation=2, train__eval_batch=2, train__updates=4,
                                    train__eval_every=2, train__save_every=2,
                                    plan__control={"train.lr": 3e-3}, plan__variants=[{"train.lr": 1e-3}])
    p = run_cli_process("sweep", campaign, "--home", tmp_path / "home", env={"COLUMNS": "80"})
    assert p.returncode == 0, p.stderr
    # a log read at 80 columns: each progress line wrapped under a 4-column indent (issue 43), joined back here
    assert max(map(len, p.stderr.splitlines())) <= 80, [ln for ln in p.stderr.splitlines() if len(ln) > 80]
    log = re.sub(r"\n    (?=\S)", " ", p.stderr)
    lines = [ln for ln in log.splitlines() if ln.startswith("pilotrun sweep: run ")]
    first = [ln for ln in lines if ln.startswith("pilotrun sweep: run 1/2: control seed 0 — ")]
    built = next(i for i, ln in enumerate(first) if " — building the model (" in ln)
    assert not any("reading and encoding" in ln for ln in first[built:]), first
    assert any(" — validation of 4 examples before update 1 (" in ln for ln in first), first
    assert any(re.search(r" — update 2/4, loss [\d.]+, lr \S+, [\d.]+ ex/s; validation of 4 examples \(", ln)
               for ln in first), first
    assert any("; saving checkpoint update-000002 (" in ln for ln in first), first
    rates = [float(r) for r in re.findall(r"run 2/2: variant train\.lr=0\.001 seed 0 — update 4/4, loss [\d.]+, "
                                          r"lr \S+, ([\d.]+) ex/s", log)]
    assert rates and all(r > 0 for r in rates), log
    code, _, raw = run_pty("sweep", campaign, "--home", tmp_path / "home2", cols=80)
    assert code == 0, raw
    shown = visible_lines(raw)
    # one row of 80 columns: the run shortened, its update and loss kept (the whole line is the log's, above)
    assert re.search(r"^pilotrun sweep: run 1/2: c[^—]*… — update \d/4, loss [\d.]+", "\n".join(shown), re.M), shown
    _fits(shown, 80)


def test_a_slow_update_has_a_rate_not_rounded_to_nothing():
    """135M on a CPU: 8 examples in 200 s is 0.04 ex/s, which one decimal place showed as ``0.0 ex/s``."""
    from types import SimpleNamespace

    from pilotrun.engine.loop import update_line

    state = SimpleNamespace(update=1, total_updates=4, bound=False)
    slow = update_line(state, {"loss": 2.5, "lr": 1e-4, "examples": 8, "seconds": 200.0})
    assert slow == "update 1/4, loss 2.5000, lr 1.00e-04, 0.04 ex/s (25 s/ex)", slow
    fast = update_line(state, {"loss": 2.5, "lr": 1e-4, "examples": 16, "seconds": 0.08})
    assert fast.endswith(", 200.0 ex/s"), fast


def test_the_live_line_keeps_to_one_row_and_says_how_a_stage_stopped_in_words():
    """Issue 43: the live line wrapped at 80 columns (fragments left on screen when it shrank) and a stage ended
    "stopped (Preempted)" after a Ctrl-C. Here a 60-column terminal and a long sweep line (another width, another
    stage): one row, its verb and time kept; SIGTERM, a bad input and a full disk said in words."""
    import signal
    import threading

    from rich.console import Console

    from pilotrun.console.progress import _count, _Line, fit, stopped_by
    from pilotrun.errors import BadInput, DiskFull
    from pilotrun.signals import Preempted

    line = ("pilotrun sweep: run 3/12 lr=0.0003 seed=1 — update 17/40, loss 2.4312, lr 2.9e-04, 8 examples, "
            "3.1 s/update (1 min 12 s, about 4 min left)")
    for width in (80, 60, 40):
        short = fit(line, width)
        assert len(short) == width and short.startswith("pilotrun sweep: run 3/12") and "…" in short, short
    assert fit(line, 80).endswith(" (1 min 12 s, about 4 min left)")
    assert fit("pilotrun pilot: phase 2/8 (3 s)", 80) == "pilotrun pilot: phase 2/8 (3 s)"
    cur = {"label": "sweep", "t0": 0.0, "head": _count("run 3/12 lr=0.0003 seed=1", None, None, False),
           "doing": _count(line.split(" — ")[1], 17, 40, False), "child": None, "seq": 0, "series": {}, "file": None,
           "lock": threading.Lock()}
    for width in (80, 50):
        con = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
        con.print(_Line(cur))
        rows = [r for r in con.export_text().splitlines() if r.strip()]
        assert len(rows) == 1 and len(rows[0]) <= width and "pilotrun sweep" in rows[0], rows

    assert stopped_by(Preempted(signal.SIGINT)) == "interrupted (Ctrl-C)"
    assert stopped_by(Preempted(signal.SIGTERM)) == "interrupted (SIGTERM)"
    assert stopped_by(KeyboardInterrupt()) == "interrupted (Ctrl-C)"
    assert stopped_by(BadInput("x", where="c.yaml")) == "stopped (bad input)"
    assert stopped_by(DiskFull("/x")) == "stopped (disk full)"
    assert stopped_by(ValueError("x")) == "stopped (internal error)"


def test_a_log_read_at_a_set_width_wraps_each_line_under_an_indent(log_stream, monkeypatch):
    """The other surface of issue 43's 80 columns: a log (not a terminal) with COLUMNS set has its progress lines
    wrapped at that width, each still starting with its verb; without COLUMNS a log is never wrapped."""
    from pilotrun.console.progress import note, stage_progress

    monkeypatch.setenv("COLUMNS", "60")
    monkeypatch.delenv("PILOTRUN_WIDTH", raising=False)
    with stage_progress("resume", stream=log_stream):
        note("reference run (4 updates) — update 3/4, loss 2.4312, lr 2.00e-04, 2.7 ex/s", done=3, total=4,
             log=True)
    lines = log_stream.getvalue().splitlines()
    assert max(map(len, lines)) <= 60 and all(ln.startswith(("pilotrun resume", "    ")) for ln in lines), lines
    joined = re.sub(r"\n    (?=\S)", " ", log_stream.getvalue())
    assert "pilotrun resume: reference run (4 updates) — update 3/4, loss 2.4312, lr 2.00e-04, 2.7 ex/s (" in joined
    monkeypatch.delenv("COLUMNS")
    from pilotrun.console.progress import log_width, wrapped

    assert log_width(log_stream) is None and wrapped("x " * 100, None) == "x " * 100
