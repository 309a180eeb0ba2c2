"""bench/run.py's table writer: the Markdown it writes from given rows (no timing)."""

import importlib.util
from pathlib import Path

RUN = Path(__file__).resolve().parents[1] / "bench" / "run.py"


def _run_module():
    spec = importlib.util.spec_from_file_location("bench_run", RUN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_results_table_has_every_row_target_and_machine(tmp_path):
    run = _run_module()
    rows = [{"figure": "a | b ratio", "median": 1.0234, "min": 1.01, "max": 1.07, "runs": 5, "target": "<= 1.03",
             "met": True, "command": "python bench/x.py", "note": "detail"},
            {"figure": "rehearsal", "median": None, "min": None, "max": None, "runs": 0, "target": "<= 1.5",
             "met": None, "command": "python bench/y.py", "note": "not measured: pilot stage missing"},
            {"figure": "missed", "median": 2.0, "min": 1.5, "max": 3.0, "runs": 7, "target": "<= 1.03",
             "met": False, "command": "python bench/z.py"}]
    out = tmp_path / "RESULTS.md"
    run.write_results(run.markdown(rows, "Machine: test cpu, 2 cores"), out)
    text = out.read_text()
    lines = text.splitlines()
    assert "| figure | median | min–max | runs | target | met | command |" in lines
    assert "| a \\| b ratio | 1.02 | 1.01–1.07 | 5 | <= 1.03 | yes | `python bench/x.py` |" in lines
    assert "| rehearsal | — | — | 0 | <= 1.5 | — | `python bench/y.py` |" in lines
    assert "| missed | 2 | 1.5–3 | 7 | <= 1.03 | NO | `python bench/z.py` |" in lines
    assert "- rehearsal: not measured: pilot stage missing" in lines
    assert lines[-1] == "Machine: test cpu, 2 cores"
    assert [p.name for p in tmp_path.iterdir()] == ["RESULTS.md"]  # no temporary file left behind


def test_a_new_table_keeps_the_sections_it_does_not_own(tmp_path, monkeypatch, capsys):
    """run.py rewrites its table, notes and machine line; the hand-written issue sections after them stay,
    word for word, below the new table (the old writer rewrote them away)."""
    run = _run_module()
    hand = ("How this table was run: alone on the quiet machine.\n\n"
            "## Issue 9 (loaded machine)\n\n| figure | before | after |\n| --- | --- | --- |\n| x | 2 s | 1 s |\n\n"
            "### Issue 12, the sheet\n\nMachine: a line a person wrote, kept too\n")
    out = tmp_path / "RESULTS.md"
    old = run.markdown([{"figure": "old row", "median": 9.0, "runs": 1, "target": "", "met": None,
                         "command": "python bench/old.py"}], "Machine: old cpu, 2 cores")
    out.write_text(old + "\n" + hand)
    monkeypatch.setattr(run, "machine_line", lambda: "Machine: new cpu, 2 cores")
    assert run.main(["--only", "no_such_module", "--out", str(out)]) == 0
    capsys.readouterr()
    text = out.read_text()
    assert "old row" not in text and "Machine: old cpu" not in text  # the table itself is run.py's: rewritten
    assert text.index("Machine: new cpu, 2 cores") < text.index("How this table was run")
    assert text.endswith(hand)  # every kept line, in order, after the new machine line
    # a file with no machine line (written by hand): its sections from the first heading on are kept
    out.write_text("# pilotrun benchmarks\n\nsome stale table\n\n## Issue 50\n\nkept\n")
    run.main(["--only", "no_such_module", "--out", str(out)])
    assert out.read_text().endswith("Machine: new cpu, 2 cores\n\n## Issue 50\n\nkept\n")
    assert "stale table" not in out.read_text()
    capsys.readouterr()


def test_the_sheet_floor_times_only_traces_and_puts_the_library_back(tmp_path):
    """bench_speed's floor of the first sheet: the fake-tensor traces it patches exist, a verb that traces
    nothing counts none, and every patched function is the original again afterwards."""
    import importlib

    from pilotrun.demo.synth import write_demo

    spec = importlib.util.spec_from_file_location("bench_speed", RUN.parent / "bench_speed.py")
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    owners = []
    for module, cls, name in speed.TRACES + speed.REPLAYS:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        owners.append((owner, name, getattr(owner, name)))
    got = speed.trace_seconds(["validate", str(write_demo(tmp_path / "demo"))], libraries=False)
    assert got == {"seconds": 0.0, "traces": 0, "exit": 0}
    assert all(getattr(owner, name) is fn for owner, name, fn in owners)
