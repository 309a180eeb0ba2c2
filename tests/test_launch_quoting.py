"""Launch files written for a campaign whose folder, home, name, ``--set`` items and pilotrun requirement hold
what a shell would run (``$(…)``, backticks, ``;``, quotes, braces, a line break, non-ASCII): every file parses
(``bash -n``), runs for real with stubs of ``pilotrun``, ``srun`` and ``pip`` on PATH, hands each value through
as the one literal argument it is, and nothing named in a value is executed (issue 44)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from conftest import TINY_LLAMA, write_campaign, write_jsonl

from pilotrun.campaign.load import load_campaign
from pilotrun.sheet.catalogue import BY_KEY
from pilotrun.sheet.launch import launch_plan, write_launch

# each runs `touch INJ…` in whatever folder the shell is in, if a shell ever evaluates it
FOLDERS = {
    "dollar": ("camp $(touch INJ1) ü", "home `touch INJ2` ; touch INJ3 \"q\" 'sq' é"),
    "braces-newline": ("c}'$(touch INJ4)'{x} ∂", "h\n touch INJ5 ${HOME} $((1+1)) }"),
}
NAME = "n\ntouch INJ6 $(touch INJ7)"  # a campaign name with a line break: it reaches the files' comments
SET = "data.prompt=Q $(touch INJ8) `touch INJ9` {instruction}\nA: "
REQUIREMENT = "pilotrun @ git+https://example.invalid/x.git@$(touch INJ10)"

STUB = """#!/usr/bin/env bash
# records its arguments, one per NUL-terminated field, and where it ran
{ printf '%s\\0' "$(basename "$0")" "$PWD" "$@"; printf '\\n'; } >> "$STUB_LOG"
"""
SRUN = """#!/usr/bin/env bash
while [ "${1#--}" != "$1" ]; do shift; done  # srun's own options
exec "$@"
"""


def _stubs(folder: Path) -> Path:
    bin_ = folder / "bin"
    bin_.mkdir(parents=True)
    for name, text in (("pilotrun", STUB), ("pip", STUB), ("srun", SRUN)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return bin_


def _calls(log: Path) -> list[list[str]]:
    if not log.exists():
        return []
    return [rec.split("\0") for rec in log.read_text().split("\0\n") if rec]


def _injected(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("INJ*"))


@pytest.mark.parametrize("case", FOLDERS, ids=list(FOLDERS))
def test_hostile_names_reach_the_launch_files_as_literals_and_nothing_runs(tmp_path, case):
    camp_name, home_name = FOLDERS[case]
    camp = tmp_path / camp_name
    rec = [{"instruction": "say hi", "output": "hi"}] * 8
    write_jsonl(camp / "data" / "train.jsonl", rec)
    path = write_campaign(camp, {
        "name": NAME, "model": {"config": dict(TINY_LLAMA), "tokenizer": "byte"},
        "data": {"train": "data/train.jsonl", "validation": "data/train.jsonl", "prompt": "instruction",
                 "response": "output"},
        "train": {"micro_batch": 1, "accumulation": 2, "updates": 2},
        "plan": {"control": {"train.lr": 1e-4}, "variants": [{"train.lr": 2e-4}], "seeds": [0]}})
    home = tmp_path / home_name
    loaded = load_campaign(path)
    s = {"campaign": NAME, "home": str(home), "hardware": {"gpus": 1, "rental_days": [3], "reserve": 0.2},
         "settings": {"ranks": 1}, "stack": {"piloted": {"torch": "2.9.1", "transformers": "4.57.0"}}}
    launch = launch_plan(s, loaded, BY_KEY["h100-sxm"], None, (SET,))
    launch["pilotrun"] = {"kind": "vcs", "requirement": REQUIREMENT, "why": "a pushed revision"}
    files = write_launch(s, loaded, tmp_path / "out" / "sheet.md", launch)
    sh, sky_file, sbatch = files[:3]
    assert len(files) == 3  # a VCS requirement: no wheel built

    sky = yaml.safe_load(sky_file.read_text())
    blocks = tmp_path / "blocks"
    blocks.mkdir()
    (blocks / "setup.sh").write_text(sky["setup"])
    (blocks / "run.sh").write_text(sky["run"])
    for f in (sh, sbatch, blocks / "setup.sh", blocks / "run.sh"):
        p = subprocess.run(["bash", "-n", str(f)], capture_output=True, text=True)
        assert p.returncode == 0, (f.name, p.stderr)
    # every comment line stays a comment: the name's line break is written escaped
    for text in (sh.read_text(), sbatch.read_text(), sky_file.read_text()):
        assert "touch INJ6" not in "\n".join(x for x in text.splitlines() if not x.lstrip().startswith("#"))

    bin_ = _stubs(tmp_path / "stubs")
    venv = tmp_path / "venv"  # an existing venv: the sbatch script only activates it
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "activate").write_text(f'PATH={bin_}:"$PATH"\n')
    (venv / "bin" / "pilotrun").symlink_to(bin_ / "pilotrun")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    log = tmp_path / "stub.log"
    env = {"PATH": f"{bin_}:{os.environ['PATH']}", "HOME": str(tmp_path / "user"), "STUB_LOG": str(log),
           "PILOTRUN_VENV": str(venv), "LANG": "C.UTF-8"}
    for f, extra in ((sh, {}), (sbatch, {}), (blocks / "setup.sh", {}), (blocks / "run.sh", {})):
        p = subprocess.run(["bash", str(f)], cwd=cwd, env={**env, **extra}, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, (f.name, p.stdout, p.stderr)
    assert _injected(tmp_path) == []

    calls = _calls(log)
    sweeps = [c for c in calls if c[0] == "pilotrun" and c[2] == "sweep"]
    assert len(sweeps) == 3  # commands.sh, sbatch, the SkyPilot run block
    local_home = str(tmp_path / "user" / "pilotrun-local")
    for c, want_home, want_cwd in zip(sweeps, (str(home), str(home), local_home), (camp, camp, cwd)):
        assert c[1] == str(want_cwd.resolve())
        assert c[3:] == ["campaign.yaml", "--id", launch["sweep_id"], "--home", want_home, "--set", SET]
    # the SkyPilot mirror: restored from the bucket first, copied back at the end, the home as one argument
    mirror = [c[3:] for c in calls if c[0] == "pilotrun" and c[2] == "_mirror-home"]
    assert mirror[0] == ["/pilotrun-home", local_home, "--restore"]
    assert mirror[-1] == [local_home, "/pilotrun-home", "--journal"]
    pip = [c[2:] for c in calls if c[0] == "pip"]
    assert pip == [["install", "torch==2.9.1"], ["install", "transformers==4.57.0", REQUIREMENT]]
    assert launch["sweep_id"].isascii()  # a non-ASCII name: an id `sweep --id` and a bucket take


def test_the_quoting_helpers_round_trip_through_bash():
    """Each helper's output, read back by bash, is the value itself: the one quoting path the files use."""
    from pilotrun.sheet.shell import comment, default, export, under_home, word

    values = ["plain", "a b", "it's", "$(x) `y` ${z} $((1))", "}{", "é ü ∂", "line\nbreak", "", "-n"]
    script = []
    for i, v in enumerate(values):
        script += [f"printf '%s\\0' {word(v)}", default("X", "UNSET_VAR", v), 'printf "%s\\0" "$X"',
                   export("Y", v), 'printf "%s\\0" "$Y"']
    script += [f"printf '%s\\0' {under_home('a b/$(c)')}", f"# {comment(NAME)}"]
    p = subprocess.run(["bash", "-c", "\n".join(script)], capture_output=True, env={"HOME": "/h o"})
    got = p.stdout.decode().split("\0")[:-1]
    assert got == [v for v in values for _ in range(3)] + ["/h o/a b/$(c)"]
    assert "\n" not in comment(NAME) and comment("a\u202eb") == "a\\u202eb"
    with pytest.raises(ValueError):
        default("X; touch y", "Z", "v")
