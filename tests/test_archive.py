"""archive: a run's folder packed for backups; unpacking refuses members that escape the target."""

import io
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
    # a run without a README gets one generated into the archive (the folder itself is left as it was)
    r = cli("archive", overfit_run, "--home", home, "--out", tmp_path / "o.tar.gz")
    assert r.code == 0
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
