"""Files the user names for a verb's output (--out, --write, --tensorboard): a device or a pipe is written into and
never replaced, a link is written through and kept, and a value left empty is refused."""

import io
import os
import stat
import tarfile
import threading

import pytest
from conftest import run_cli_process

from pilotrun.journal.store import Journal


def _reader(path):
    """The other end of a named pipe: what was written into it, once the writer closes it."""
    got = {}
    thread = threading.Thread(target=lambda: got.update(data=path.read_bytes()), daemon=True)
    thread.start()
    return thread, got


def _one_run(cli, campaign, home) -> str:
    """A finished one-update train run of ``campaign`` in ``home``: its id."""
    r = cli("train", campaign, "--home", home, "--set", "train.updates=1", "--json")
    assert r.code == 0, r.err
    return r.json["data"]["run_id"]


def test_an_archive_and_a_report_sent_to_a_pipe_leave_it_a_pipe(cli, demo_campaign, tmp_path):
    # archive and report renamed a temporary file over --out: a pipe (or, as root, /dev/null) became a plain file
    home = tmp_path / "home"
    run_id = _one_run(cli, demo_campaign, home)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    thread, got = _reader(pipe)
    r = cli("archive", run_id, "--home", home, "--out", pipe)
    thread.join(60)
    assert r.code == 0, r.err
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)
    with tarfile.open(fileobj=io.BytesIO(got["data"]), mode="r:gz") as tar:
        assert f"{run_id}/config.yaml" in tar.getnames()
    assert f"packed into {pipe}" in r.out and "bytes)" not in r.out
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]

    thread, got = _reader(pipe)
    r = cli("report", "--home", home, "--out", pipe)
    thread.join(60)
    assert r.code == 0, r.err
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and got["data"].startswith(b"<!DOCTYPE html>")


def test_an_archive_or_a_report_never_replaces_a_file_pilotrun_did_not_write_as_one(cli, demo_campaign, tmp_path):
    # `archive RUN --out campaign.yaml` and `report --out campaign.yaml` replaced the campaign (a tar.gz, a page in
    # its place), and `--out backup.tar.gz` any other archive: exit 2 naming it, the file as it was; an archive or a
    # report of pilotrun's is replaced as before (the clean case)
    home = tmp_path / "home"
    run_id = _one_run(cli, demo_campaign, home)
    other = tmp_path / "backup.tar.gz"
    with tarfile.open(other, "w:gz") as tar:
        tar.add(demo_campaign, arcname="mine/campaign.yaml")
    for path in (demo_campaign, other):
        before = path.read_bytes()
        for argv, what in ((["archive", run_id], "archive"), (["report"], "report")):
            r = cli(*argv, "--home", home, "--out", path)
            assert r.code == 2 and f"{path}: holds a file that is no {what} of pilotrun's" in r.err, r.err
            assert path.read_bytes() == before
    said = {demo_campaign: f"its first line: {demo_campaign.read_text().splitlines()[0][:60]!r}", other: "binary data"}
    assert said[demo_campaign] in cli("report", "--home", home, "--out", demo_campaign).err
    assert said[other] in cli("report", "--home", home, "--out", other).err
    for argv, out in ((["archive", run_id], tmp_path / "run.tar.gz"), (["report"], tmp_path / "report.html")):
        for _ in range(2):  # written, then written again over its own
            assert cli(*argv, "--home", home, "--out", out).code == 0
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]


def test_a_report_to_stdout_is_the_file_alone_on_stdout(tmp_path):
    # a link into /proc/self/fd/1, as /dev/stdout is: the report goes to the process's stdout (a pipe here), the
    # verb's own lines to stderr, and the link stays
    home = tmp_path / "home"
    Journal(home)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    p = run_cli_process("report", "--home", home, "--out", link)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("<!DOCTYPE html>") and p.stdout.endswith("</html>\n")
    assert "report: wrote" in p.stderr
    assert link.is_symlink()


def test_a_campaign_file_is_never_written_into_a_pipe(tmp_path, cli, demo_campaign):
    # its paths are relative to its folder: import --out and fit --write refuse a device or a pipe, --force or not
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    source = tmp_path / "axolotl.yml"
    (tmp_path / "d.jsonl").write_text('{"instruction": "q", "input": "", "output": "a"}\n')
    source.write_text("base_model: ./m\ndatasets:\n  - path: d.jsonl\n    type: alpaca\nmicro_batch_size: 1\n")
    r = cli("import", source, "--out", pipe, "--force")
    assert r.code == 2 and "is not a file (a device, a pipe or the terminal)" in r.err, r.err
    assert "fix: name a file for --out" in r.err
    r = cli("fit", demo_campaign, "--memory-limit", "1GiB", "--write", pipe, "--home", tmp_path / "home")
    assert r.code == 2 and "is not a file (a device, a pipe or the terminal)" in r.err, r.err
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode)


def test_init_writes_through_a_link_and_never_replaces_a_folder_or_a_pipe(tmp_path, cli):
    # init checked exists(), which a link naming nothing yet fails, then renamed a file over the link; a folder named
    # campaign.yaml was exit 3 under --force (IsADirectoryError)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "campaign.yaml").symlink_to("kept/starter.yaml")
    r = cli("init", linked)
    assert r.code == 2 and "campaign.yaml already exists" in r.err, r.err
    (linked / "kept").mkdir()
    r = cli("init", linked, "--force")
    assert r.code == 0, r.err
    assert (linked / "campaign.yaml").is_symlink() and "task: causal-lm" in (linked / "kept/starter.yaml").read_text()
    for name, make in (("folder", os.mkdir), ("pipe", os.mkfifo)):
        (tmp_path / name).mkdir()
        make(tmp_path / name / "campaign.yaml")
        r = cli("init", tmp_path / name, "--force")
        assert r.code == 2 and "init writes the campaign there as a file" in r.err, r.err
        assert "fix: give init another FOLDER" in r.err
    assert (tmp_path / "folder/campaign.yaml").is_dir()
    assert stat.S_ISFIFO(os.lstat(tmp_path / "pipe/campaign.yaml").st_mode)
    assert not [p for p in tmp_path.rglob("*") if ".tmp-" in p.name]


@pytest.mark.parametrize("argv, option", [
    (("split", "{data}", "--out", ""), "--out"),
    (("split", "{data}", "--out", "{tmp}/s", "--period", " "), "--period"),
    (("import", "{tmp}/axolotl.yml", "--out", ""), "--out"),
    (("estimate", "{campaign}", "--gpu-memory", ""), "--gpu-memory"),
    (("show", "RUN", "--tensorboard", ""), "--tensorboard"),
    (("validate", "{campaign}", "--set", ""), "--set"),
    (("note", ""), "TEXT"),
])
def test_a_value_left_empty_is_refused(cli, demo_campaign, tmp_path, monkeypatch, argv, option):
    # an unset shell variable (--out "$OUT") used to read as the option left out, or as the current folder: split
    # and show wrote there, import wrote beside its source and estimate planned without a memory limit
    monkeypatch.chdir(tmp_path)
    (tmp_path / "axolotl.yml").write_text("base_model: ./m\nmicro_batch_size: 1\n")
    data = demo_campaign.parent / "data" / "train.jsonl"
    args = [a.format(data=data, tmp=tmp_path, campaign=demo_campaign) for a in argv]
    before = sorted(os.listdir(tmp_path))
    r = cli(*args, "--home", tmp_path / "home") if argv[0] != "import" else cli(*args)
    assert r.code == 2, r.err
    assert f"Invalid value for '{option}': it is empty: give a value, or leave it out" in r.err, r.err
    assert sorted(os.listdir(tmp_path)) == before


def test_split_ratios_must_be_finite(cli, demo_campaign, tmp_path):
    # nan passed every comparison: --ratios nan put every record in train and said ok
    data = demo_campaign.parent / "data" / "train.jsonl"
    for ratios in ("nan", "nan,nan,nan", "0.8,nan,0.2"):
        r = cli("split", data, "--out", tmp_path / "s", "--ratios", ratios)
        assert r.code == 2 and "holds a share that is not a finite number" in r.err, (ratios, r.err)
    assert not (tmp_path / "s").exists()


def test_split_ratios_and_seed_as_written(cli, demo_campaign, tmp_path):
    """--ratios 1e-400,0.5,0.5 was refused for "train above 0", a share written above 0 (it reads as 0); --seed took
    any integer (-5, 2**80), where a campaign's seed and `train --seed` take 0..4294967295."""
    data = demo_campaign.parent / "data" / "train.jsonl"
    r = cli("split", data, "--out", tmp_path / "s", "--ratios", "1e-400,0.5,0.5")
    assert r.code == 2 and "1e-400 is smaller than any number a float holds" in r.err, r.err
    for seed in ("-5", str(2**32), str(2**80)):
        r = cli("split", data, "--out", tmp_path / "s", "--seed", seed)
        assert r.code == 2 and f"Invalid value for '--seed': {seed} is not in the range 0<=x<=4294967295" in r.err
    assert not (tmp_path / "s").exists()
    assert cli("split", data, "--out", tmp_path / "s", "--seed", str(2**32 - 1), "--ratios", "0.5,0.5").code == 0


def test_all_refuses_a_sheet_of_the_users_in_its_home_before_any_stage(cli, demo_campaign, tmp_path):
    # `all --home .` in a folder holding the user's own sheet.md: the sheet stage replaced it after every other
    # stage had run. Now exit 2 before the first stage: nothing is run or written
    home = tmp_path / "project"
    home.mkdir()
    (home / "sheet.md").write_text("# my notes on GPUs\n")
    r = cli("all", demo_campaign, "--home", home)
    assert r.code == 2 and f"{home / 'sheet.md'}: holds a file that is no selection sheet of pilotrun's" in r.err, r.err
    assert "pass another --home (`all` writes its sheet and launch files there)" in r.err
    assert sorted(p.name for p in home.iterdir()) == ["sheet.md"] and "overfit" not in r.err
