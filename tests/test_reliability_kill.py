"""Killed mid-save: a real process saving checkpoints is SIGKILLed at every step of the save and at
random moments; each time the newest complete checkpoint loads and matches its manifest, a partial
one never sits under a final name, and nothing partial is ever taken for complete."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import simple_records, tiny_causal_campaign

from pilotrun.campaign import load_campaign
from pilotrun.engine.loop import make_state
from pilotrun.engine.state import COMPONENTS, is_complete, latest_checkpoint, load_state, problems
from pilotrun.journal.files import KILL_ENV
from pilotrun.campaign.prepare import prepare

SAVER = Path(__file__).with_name("reliability_saver.py")
# every step of save_state at which a kill point exists (fp32 on the CPU: no grad scaler to save)
STEPS = ("model", "optimizer", "scheduler", "rng", "sampler", "counters", "manifest", "committed")


class Zygote:
    """The saver process (tests/reliability_saver.py): forks savers for the test to kill."""

    def __init__(self, campaign: Path, cwd: Path):
        env = {k: v for k, v in os.environ.items() if k != KILL_ENV}
        self.proc = subprocess.Popen([sys.executable, str(SAVER), str(campaign)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=open(cwd / "saver.stderr", "wb"), text=True,
                                     cwd=cwd, env=env)
        line = self.proc.stdout.readline().strip()
        assert line == "ready", (line, (cwd / "saver.stderr").read_text()[-3000:])

    def ask(self, *words) -> str:
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self) -> None:
        try:
            self.proc.stdin.write("quit\n")
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The campaign, a saver process and a fresh state in this process to load checkpoints into."""
    folder = tmp_path_factory.mktemp("kill")
    campaign = tiny_causal_campaign(folder, simple_records(8))
    zygote = Zygote(campaign, folder)
    prep = prepare(load_campaign(campaign), splits=("train",))
    state = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10**6)
    yield folder, zygote, state
    zygote.close()


def _reported(log: Path) -> list[int]:
    return [int(x) for x in log.read_text().split()] if log.is_file() else []


def _wait_for_saves(log: Path, n: int, err_dir: Path) -> None:
    deadline = time.monotonic() + 60
    while len(_reported(log)) < n:
        errors = list(err_dir.glob("saver-*.err"))
        assert not errors, errors[0].read_text()
        assert time.monotonic() < deadline, "the saver wrote no checkpoint"
        time.sleep(0.002)


def _check(root: Path, log: Path, state, overwrite: bool) -> Path:
    """What must hold after any kill. Afterwards all but the newest two numbered checkpoints and the
    hidden leftovers are removed (as a retention policy would), so each check reads a few folders."""
    import shutil

    from safetensors.torch import load_file

    reported = _reported(log)
    visible = sorted(p for p in root.iterdir() if not p.name.startswith("."))
    for p in visible:  # nothing partial under a final name
        assert is_complete(p), f"{p.name} is visible but not complete: {problems(p)}"
    numbered = [p for p in visible if p.name.startswith("update-")]
    kept = {int(p.name.split("-")[1]) for p in numbered}
    assert max(reported) in kept  # the last save that returned is still there (and complete, above)
    latest = latest_checkpoint(root)
    assert latest is not None and not latest.name.startswith(".")
    if overwrite:  # the overwritten name always holds a complete copy, the old or the new one
        assert (root / "latest").is_dir() and is_complete(root / "latest")
    newest = max(numbered)
    assert int(newest.name.split("-")[1]) >= max(reported)
    hidden = [p for p in root.iterdir() if p.name.startswith(".")]
    for p in hidden:
        if not (p / "manifest.json").is_file():
            assert not is_complete(p)  # a folder cut short is never complete
    restored = load_state(state, newest)  # verifies every hash first, then loads
    assert set(restored) == set(COMPONENTS) - {"scaler"}
    weights = load_file(str(newest / "model.safetensors"))
    for name, p in state.model.state_dict().items():
        assert torch.equal(p, weights[name]), name
    assert state.update == int(newest.name.split("-")[1])
    for p in numbered[:-2] + hidden:
        shutil.rmtree(p)
    return newest


def _kill_at(zygote, root, log, mode, step, state):
    pid = int(zygote.ask("fork", root, log, mode, step))
    assert zygote.ask("reap", pid) == "signal 9"  # it killed itself at that step
    if step not in ("committed", "committed@latest"):  # the kill left a partial folder, hidden
        assert [p for p in root.iterdir() if ".tmp-" in p.name]
    return _check(root, log, state, mode == "overwrite")


def test_killed_at_every_step_of_a_save(setup, tmp_path):
    folder, zygote, state = setup
    root, log = tmp_path / "ckpts", tmp_path / "saved.log"
    root.mkdir()
    for step in STEPS:  # a new checkpoint name
        _kill_at(zygote, root, log, "unique", step, state)
    for step in ("model", "manifest", "committed"):  # re-saving over a complete checkpoint of the same name
        _kill_at(zygote, root, log, "overwrite", f"{step}@latest", state)
    assert not list(folder.glob("saver-*.err"))


def _random_kills(setup, tmp_path, n: int, max_delay_s: float):
    folder, zygote, state = setup
    root, log = tmp_path / "ckpts", tmp_path / "saved.log"
    root.mkdir()
    rng = random.Random(11)
    landed = {"mid-save": 0, "after the manifest": 0, "between saves": 0}  # where the kills fell
    for _ in range(n):
        pid = int(zygote.ask("fork", root, log, "overwrite", "-"))
        _wait_for_saves(log, len(_reported(log)) + 1, folder)
        time.sleep(rng.uniform(0, max_delay_s))
        os.kill(pid, signal.SIGKILL)
        assert zygote.ask("reap", pid) == "signal 9"
        tmp = [p for p in root.iterdir() if ".tmp-" in p.name]
        landed["mid-save" if tmp and not (tmp[0] / "manifest.json").exists() else
               "after the manifest" if tmp else "between saves"] += 1
        _check(root, log, state, overwrite=True)
    return root, landed


def test_killed_at_random_moments(setup, tmp_path):
    _, landed = _random_kills(setup, tmp_path, n=10, max_delay_s=0.06)
    print("kills landed:", landed)
    assert len(_reported(tmp_path / "saved.log")) >= 10  # each saver got at least one save in before its kill


@pytest.mark.slow
def test_killed_at_random_moments_many_times(setup, tmp_path):
    _, landed = _random_kills(setup, tmp_path, n=150, max_delay_s=0.08)
    print("kills landed:", landed)
    assert landed["mid-save"] > 0  # with 150 kills some fall inside a save (saving is most of the saver's time)


def test_killed_fresh_interpreter_keeps_its_last_checkpoint(tmp_path):
    """The same guarantee without the fork: a newly started interpreter saving, killed by the test."""
    campaign = tiny_causal_campaign(tmp_path, simple_records(8))
    root, log = tmp_path / "ckpts", tmp_path / "saved.log"
    root.mkdir()
    proc = subprocess.Popen([sys.executable, str(SAVER), str(campaign), "--save", str(root), str(log)],
                            stdout=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stdout.readline().strip() == "ready"
        _wait_for_saves(log, 3, tmp_path)
        time.sleep(random.Random(5).uniform(0, 0.03))
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    prep = prepare(load_campaign(campaign), splits=("train",))
    state = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10)
    _check(root, log, state, overwrite=False)
