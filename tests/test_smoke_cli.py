from conftest import run_cli_process


def test_help_lists_verbs():
    p = run_cli_process("--help")
    assert p.returncode == 0
    for verb in ("demo", "init", "validate", "train", "all", "runs", "show", "note"):
        assert verb in p.stdout


def test_train_on_demo_json(cli, demo_campaign, tmp_path):
    r = cli("train", demo_campaign, "--home", tmp_path / "home", "--json")
    assert r.code == 0, r.err
    data = r.json
    assert data["data"]["status"] == "completed"
    vals = [v["val_loss"] for v in data["data"]["validation"]]
    assert vals[-1] < vals[0]


def test_the_process_freezes_what_is_left_before_it_exits():
    """main()'s last act before sys.exit is gc.freeze: the interpreter's collections at exit then skip the
    objects left (torch's and transformers' modules), which their reference counts still free. An atexit
    hook registered before main runs after it and reads the frozen count."""
    import subprocess
    import sys

    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count()))\n"
            "from pilotrun.cli.main import main\n"
            "print('before', gc.get_freeze_count())\n"
            "sys.argv = ['pilotrun', '--help']\n"
            "main()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    counts = dict(line.split() for line in p.stdout.splitlines() if line.startswith(("before", "frozen")))
    assert counts["before"] == "0" and int(counts["frozen"]) > 0
