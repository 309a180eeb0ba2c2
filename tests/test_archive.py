"""archive: a run's folder packed for backups; unpacking refuses members that escape the target."""

import io
import os
import tarfile

import pytest

from pilotrun.errors import BadInput
from pilotrun.journal.archive import extract
from pilotrun.journal.files import verify_manifest
from pilotrun.journal.store import Journal


def test_archive_of_a_run_round_trips(cli, demo_campaign, tmp_path):
    home = tmp_path / "home"
    r = cli("overfit", demo_campaign, "--home", home, "--examples", "2", "--max-updates", "2", "--json")
    overfit_run = r.json["data"]["run_id"]
    r = cli("train", demo_campaign, "--home", home, "--set", "train.updates=2", "--json")
    assert r.code == 0, r.err
    run_id = r.json["data"]["run_id"]
    out = tmp_path / "backup" / "run.tar.gz"
    r = cli("archive", run_id, "--home", home, "--out", out, "--json")
    assert r.code == 0, r.err
    assert out.is_file() and r.json["data"]["bytes"] == out.stat().st_size
    files = extract(out, tmp_path / "restored")
    restored = tmp_path / "restored" / run_id
    names = {p.relative_to(restored).as_posix() for p in files}
    for want in ("artifact/model/model.safetensors", "artifact/model/config.json", "config.yaml", "revisions.json",
                 "metrics.jsonl", "control.safetensors", "control_predictions.json", "run.json", "README.md",
                 "manifest.json"):
        assert want in names, want
    command = Journal(home).get_run(run_id)["command"]
    assert f"```\n{command}\n```" in (restored / "README.md").read_text()
    assert verify_manifest(restored) == []  # every packed file still matches its sha256
    # the archive named where a run id belongs: "run …/run.tar.gz does not exist"; the run it packs is named now
    for verb in ("verify", "show"):
        r = cli(verb, out, "--home", home)
        assert r.code == 2 and f"{out} is a file, not a run id: an archive of run {run_id}" in r.err, r.err
        assert f"fix: pass the run's id ({run_id}), which this journal holds" in r.err
    Journal(tmp_path / "other").add_note("a journal that does not hold the run")
    r = cli("verify", out, "--home", tmp_path / "other")
    assert r.code == 2 and "fix: extract it (tar -xzf) and check its files against its manifest.json" in r.err
    # a run without a README gets one generated into the archive (the folder itself is left as it was)
    r = cli("archive", overfit_run, "--home", home, "--out", tmp_path / "o.tar.gz")
    assert r.code == 0
    # how far the packing is (gzip packs ~30 MiB/s: a run of a few GB was minutes without a word)
    n = sum(1 for p in (home / "runs" / overfit_run).rglob("*") if p.is_file())
    assert f"pilotrun archive: packing {n} files, " in r.err and "pilotrun archive: ended (" in r.err, r.err
    with tarfile.open(tmp_path / "o.tar.gz") as tar:
        assert f"{overfit_run}/README.md" in tar.getnames()
    assert not (home / "runs" / overfit_run / "README.md").exists()


def _tar(path, member: tarfile.TarInfo, data: bytes = b"x"):
    with tarfile.open(path, "w:gz") as tar:
        ok = tarfile.TarInfo("run/ok.txt")
        ok.size = 2
        tar.addfile(ok, io.BytesIO(b"ok"))
        if member.isfile():
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))
        else:
            tar.addfile(member)
    return path


def _member(name, kind=tarfile.REGTYPE, link=""):
    m = tarfile.TarInfo(name)
    m.type, m.linkname = kind, link
    return m


@pytest.mark.parametrize("member, words", [
    (_member("run/../../evil.txt"), "climbs out of the target folder"),
    (_member("/tmp/evil.txt"), "absolute path"),
    (_member("run/link", tarfile.SYMTYPE, "/etc/passwd"), "is a link"),
    (_member("run/hard", tarfile.LNKTYPE, "run/ok.txt"), "is a link"),
    (_member("run/dev", tarfile.CHRTYPE), "device, FIFO"),
])
def test_extract_refuses_escaping_members(tmp_path, member, words):
    archive = _tar(tmp_path / "bad.tar.gz", member)
    target = tmp_path / "target" / "inner"
    with pytest.raises(BadInput) as err:
        extract(archive, target)
    assert words in str(err.value) and member.name in str(err.value)
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "target" / "evil.txt").exists()
    assert not target.exists() or not any(target.iterdir())  # nothing half-written


def test_archive_says_files_that_no_longer_match_the_manifest_and_refuses_a_running_run(cli, tmp_path):
    """Issue 44, item 7: a run whose weights were changed after its manifest was written was packed without a word;
    now each file that differs (here a checkpoint's weights, and an artifact file gone; the issue's was the
    artifact's weights) is said as verify says it, the files packed as they are. Item 5: a run still running (a live
    lease) is refused, exit 2 naming it, nothing written; once it ends it packs clean."""
    from pilotrun.journal.archive import pack
    from pilotrun.journal.files import write_manifest
    from pilotrun.journal.runs import create_run

    j = Journal(tmp_path / "home")
    run_id = create_run(j, kind="train", name="c", config={"name": "c"})
    d = j.run_dir(run_id)
    for rel, data in (("artifact/model.safetensors", b"w" * 64), ("artifact/config.json", b"{}"),
                      ("checkpoints/2/model.safetensors", b"c" * 64)):
        (d / rel).parent.mkdir(parents=True, exist_ok=True)
        (d / rel).write_bytes(data)
    write_manifest(d / "checkpoints" / "2")
    write_manifest(d)
    out = tmp_path / "run.tar.gz"
    r = cli("archive", run_id, "--home", tmp_path / "home", "--out", out)
    assert r.code == 2 and f"run {run_id} is still running (pid {os.getpid()} on host" in r.err, r.err
    assert "fix: archive it once it ends" in r.err and not list(tmp_path.glob("run.tar.gz*"))
    j.finish_run(run_id, "completed")
    assert pack(j, run_id, out)["problems"] == []  # the clean case
    (d / "checkpoints" / "2" / "model.safetensors").write_bytes(b"x" * 64)  # same size, other bytes
    (d / "artifact" / "config.json").unlink()
    got = pack(j, run_id, out)["problems"]
    assert sorted(got) == ["artifact/config.json: missing",
                           "checkpoints/2/model.safetensors: sha256 differs from manifest.json"], got
    r = cli("archive", run_id, "--home", tmp_path / "home", "--out", out, "--json")
    assert r.code == 0 and r.json["verdict"] == "warn" and r.json["data"]["problems"] == got
    assert "WARN: 2 file(s) no longer match the run's manifest, so `pilotrun verify` refuses" in r.json["summary"]


def test_archive_says_how_far_it_is(cli, demo_campaign, tmp_path, monkeypatch):
    from pilotrun.journal import archive

    home = tmp_path / "home"
    r = cli("train", demo_campaign, "--home", home, "--set", "train.updates=2", "--json")
    run_id = r.json["data"]["run_id"]
    folder = home / "runs" / run_id
    (folder / "big.bin").write_bytes(os.urandom(40 * 2**20))  # 40 MiB: said every 16 MiB within the file too
    sizes = [p.stat().st_size for p in folder.rglob("*") if p.is_file()]
    said = []
    monkeypatch.setattr(archive, "note", lambda text, **kw: said.append((text, kw["done"], kw["total"])))
    archive.pack(Journal(home), run_id, tmp_path / "a.tar.gz")
    total = sum(sizes)
    assert all(t == total >> 20 for _, _, t in said)
    files = [text.split(": ", 1)[1] for text, _, _ in said if "file " in text]
    assert len(set(files)) == len(sizes) and said[-1][0].startswith(f"{archive.fmt_bytes(total)} of ")
    within = [done for text, done, _ in said if text.endswith(": big.bin")]
    assert len(within) >= 3 and within == sorted(within), said  # at the file's start, then at 16 and 32 MiB read
    assert said[-1][1] == total >> 20
