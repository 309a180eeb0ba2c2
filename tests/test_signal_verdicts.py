"""A signal is never a measurement (issue 44): a phase ended by SIGTERM (or by an error that follows one) writes
no ledger row and goes on up as the interruption, even where the recorder keeps going after errors (the pilot's
phases, fit's probes); a control ledger with a phase that measured nothing is no "fits"; every verb sent SIGTERM
mid-work exits 143 with no verdict."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TINY_LLAMA, simple_records, tiny_causal_campaign

from pilotrun import signals
from pilotrun.probe.recorder import phase


def test_a_phase_ended_by_a_signal_is_no_row_and_propagates_under_catch_errors():
    rows: list = []
    with pytest.raises(signals.Preempted):
        with phase("steady_step", {"micro_batch": 2}, rows=rows, device="cpu", catch_errors=True, barrier=False):
            raise signals.Preempted(signal.SIGTERM)
    assert rows == []
    # the clean case: an ordinary error in a phase is the row "error" and, under catch_errors, goes no further
    with phase("steady_step", {"micro_batch": 2}, rows=rows, device="cpu", catch_errors=True, barrier=False):
        raise RuntimeError("a real failure")
    assert [r["verdict"] for r in rows] == ["error"] and "a real failure" in rows[0]["note"]


def test_an_error_after_a_signal_is_the_interruption_not_an_error_row(monkeypatch):
    """A library that turns our signal into its own exception (a C extension's RuntimeError): after a SIGTERM the
    error is part of the stop — raised as the Preempted naming SIGTERM, no row; the verdict paths that turn an
    error into a finding (``unless_stopping``) raise it too."""
    rows: list = []
    monkeypatch.setattr(signals, "_received", int(signal.SIGTERM))
    with pytest.raises(signals.Preempted) as caught:
        with phase("eval_longest", rows=rows, device="cpu", catch_errors=True, barrier=False):
            raise RuntimeError("operation interrupted")
    assert rows == [] and caught.value.exit_code == 143 and "operation interrupted" in caught.value.reason
    with pytest.raises(signals.Preempted):
        signals.unless_stopping(ValueError("x"))
    monkeypatch.setattr(signals, "_received", None)
    signals.unless_stopping(ValueError("x"))  # no signal: the caller's own handling goes on


def test_a_control_ledger_with_an_unmeasured_phase_is_no_fits(tmp_path):
    """The pilot that fit runs or reuses ended a phase in an error (its peak is where it stopped, not the phase's):
    fit fails saying it could not measure the control, never "the control fits" on the peak of what remains."""
    from pilotrun.campaign.load import load_campaign
    from pilotrun.rehearsal.memory.fit import fit

    loaded = load_campaign(tiny_causal_campaign(tmp_path / "c", simple_records(8), simple_records(4, 100),
                                                model__config=dict(TINY_LLAMA)))
    load = {"phase": "load", "inputs": {}, "verdict": "ok", "counter": "rss", "peak_allocated": 2**20,
            "peak_reserved": None}
    broken = dict(load, phase="first_step", verdict="error", note="RuntimeError: boom")
    r = fit(loaded, tmp_path / "home", 2**30, pilot_rows=[load, broken])
    assert r.verdict == "fail" and "could not be measured: phase first_step ended error" in r.summary, r.summary
    assert "fits" not in r.summary.replace("whether it fits", "")
    assert any("RuntimeError: boom" in m for m in r.messages)
    assert fit(loaded, tmp_path / "home", 2**30, pilot_rows=[load]).verdict == "ok"  # all measured: it fits


# --- fresh processes: SIGTERM at several moments ------------------------------------------------------------

def _fit_campaign(tmp_path: Path) -> Path:
    """Logits-heavy enough that a 40 MiB limit sends fit through the pilot and into variant probes."""
    recs = [{"instruction": "reverse " + "w" * (20 + (i * 7) % 20), "output": "x" * (20 + (i * 5) % 20)}
            for i in range(40)]
    return tiny_causal_campaign(tmp_path / "c", recs[:32], recs[32:], data__max_length=64,
                                model__config=dict(TINY_LLAMA, vocab_size=32768), train__micro_batch=8,
                                train__accumulation=2, train__eval_batch=2)


def _term_at(args: list, cwd: Path, marker: str | float, after: float = 0.5) -> tuple[int, str]:
    """Start ``pilotrun ARGS``, send SIGTERM when a progress line holding ``marker`` appears on stderr (after
    ``marker`` seconds; ``lib:NAME``: ``after`` seconds after the library NAME is mapped; ``at:STEP``: the process
    sends it to itself inside a save, at that step, by the test switch), return (exit code, all it wrote)."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if isinstance(marker, str) and marker.startswith("at:"):
        env["PILOTRUN_TEST_SIGTERM_SAVE_AT"] = marker[3:]
    proc = subprocess.Popen([sys.executable, "-m", "pilotrun", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    seen = []
    if isinstance(marker, str) and marker.startswith("at:"):
        out, _ = proc.communicate(timeout=300)
        return proc.returncode, out
    if isinstance(marker, float):
        time.sleep(marker)
    elif marker.startswith("lib:"):  # the verb's work has begun: torch (imported lazily, by the work) is mapped
        deadline = time.monotonic() + 120
        while marker[4:] not in Path(f"/proc/{proc.pid}/maps").read_text() and proc.poll() is None:
            assert time.monotonic() < deadline, f"{marker} never loaded"
            time.sleep(0.01)
        time.sleep(after)
    else:
        for line in proc.stdout:
            seen.append(line)
            if marker in line:
                break
        else:
            proc.wait(60)
            pytest.fail(f"{marker!r} never appeared; exit {proc.returncode}:\n{''.join(seen)}")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    return proc.returncode, "".join(seen) + out


VERDICT = re.compile(r"^(OK|WARN|FAIL)\s", re.M)

FIT_MOMENTS = [0.4,  # starting up: imports, the campaign read
               "reading and encoding the train split",
               "phase 1/8: load",  # the control's pilot, its first phase (the "fits 40 MiB" at load)
               "phase 3/8: steady_step",
               "traced phase 2/7",  # the pilot's fake-tensor trace
               "probe: precision",  # a variant's probe (the "no variant fits")
               "at:model",  # inside the pilot's save phase (its rows are kept past errors): deterministic
               "at:artifact"]  # inside the pilot's export phase


@pytest.mark.slow
def test_sigterm_to_fit_at_any_moment_is_143_and_never_a_verdict(tmp_path):
    from pilotrun.journal.store import Journal

    campaign = _fit_campaign(tmp_path)
    for i, moment in enumerate(FIT_MOMENTS):
        home = tmp_path / f"home{i}"
        code, out = _term_at(["fit", campaign, "--home", home, "--memory-limit", "40MiB"], campaign.parent, moment)
        assert code == 143, (moment, out[-3000:])
        assert "interrupted: stopped by SIGTERM" in out and not VERDICT.search(out), (moment, out[-3000:])
        if (home / "journal.sqlite").exists():
            for run in Journal(home).list_runs():  # a pilot that ended before the signal stays completed
                assert run["status"] in ("interrupted", "completed"), (moment, run)
                assert run["status"] == "completed" or "SIGTERM" in run["summary"]["reason"], (moment, run)


@pytest.mark.slow
def test_sigterm_to_estimate_sheet_import_and_archive_is_143(tmp_path, cli):
    """The same rule for the verbs that run no training: SIGTERM mid-work, exit 143, no verdict, nothing written
    half (the archive's temporary removed)."""
    campaign = _fit_campaign(tmp_path)
    home = tmp_path / "home"
    # estimate and sheet print no progress lines: SIGTERM once torch is loaded (the trace's imports, then the trace)
    code, out = _term_at(["estimate", campaign, "--home", home], campaign.parent, "lib:libtorch_cpu")
    assert code == 143 and not VERDICT.search(out), out[-3000:]
    assert cli("pilot", campaign, "--home", home).code == 0  # the sheet's own work: the estimator's trace after it
    code, out = _term_at(["sheet", campaign, "--home", home, "--out", tmp_path / "s.md"], campaign.parent,
                         "lib:libtorch_cpu")
    assert code == 143 and not VERDICT.search(out) and not (tmp_path / "s.md").exists(), out[-3000:]
    axolotl = tmp_path / "ax.yaml"
    axolotl.write_text("base_model: org/x\nmicro_batch_size: 2\ndatasets:\n  - path: d.jsonl\n    type: alpaca\n")
    (tmp_path / "d.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    code, out = _term_at(["import", axolotl, "--out", tmp_path / "imp.yaml"], tmp_path, "lib:_pydantic_core", 0)
    assert code == 143 and not (tmp_path / "imp.yaml").exists(), out[-3000:]
    assert cli("train", campaign, "--home", home, "--set", "train.updates=2").code == 0
    run_id = [r for r in __import__("pilotrun.journal.store", fromlist=["Journal"]).Journal(home).list_runs()
              if r["kind"] == "train"][-1]["run_id"]
    code, out = _term_at(["archive", run_id, "--home", home, "--out", tmp_path / "a.tar.gz"], tmp_path, 0.5)
    assert code == 143 and not list(tmp_path.glob("a.tar.gz*")), (out[-3000:], list(tmp_path.iterdir()))
