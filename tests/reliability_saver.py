"""A process that saves checkpoints of a tiny real model in a loop, for tests that SIGKILL it mid-save.

Run as ``python reliability_saver.py CAMPAIGN`` it builds the training state once (a tiny Llama from
the campaign, one real update so the optimizer holds moments), prints ``ready`` and then serves
commands on stdin, one per line, answering on stdout:

- ``fork ROOT LOG MODE STEP``: fork a saver (answers its pid). The saver numbers its checkpoints on
  from the newest in ROOT (as a restarted job would) and, forever: nudges the weights, saves
  ``ROOT/update-N`` and, when MODE is ``overwrite``, re-saves ``ROOT/latest`` over the previous one,
  then appends ``N`` to LOG (so LOG lists only saves that returned). STEP ``-`` waits for the test's
  kill; otherwise, after one full round, ``PILOTRUN_TEST_KILL_SAVE_AT=STEP`` is set so that the next
  save (of ``update-N``, or of ``latest`` when STEP ends in ``@latest``) kills itself at that step.
- ``reap PID``: wait for that saver and answer how it ended (``signal 9`` for a SIGKILL).
- ``quit``.

``python reliability_saver.py CAMPAIGN --save ROOT LOG`` saves in the started process itself, no fork.

Forking one prepared process keeps each kill at milliseconds instead of an interpreter start; torch
runs with one thread, so no OpenMP pool is live across the fork.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path


def _next_index(root: Path) -> int:
    done = [int(p.name.split("-")[1]) for p in root.glob("update-*") if p.name.split("-")[1].isdigit()]
    return max(done) + 1 if done else 1


def _saver(state, root: Path, log: Path, mode: str, step: str) -> None:
    import torch

    from pilotrun.engine.state import save_state
    from pilotrun.journal.files import KILL_ENV

    kill_step, _, kill_target = step.partition("@")
    i = _next_index(root)
    rounds = 0
    while True:
        if kill_step != "-" and rounds == 1:
            if kill_target != "latest":
                os.environ[KILL_ENV] = kill_step
        with torch.no_grad():
            for p in state.model.parameters():
                p.add_(1e-3)
        state.update = i
        save_state(state, root / f"update-{i:06d}")
        if mode == "overwrite":
            if kill_step != "-" and rounds == 1 and kill_target == "latest":
                os.environ[KILL_ENV] = kill_step
            save_state(state, root / "latest")
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, f"{i}\n".encode())
        os.close(fd)
        i += 1
        rounds += 1
        if rounds > (3 if kill_step != "-" else 5000):  # a planted kill point that was never reached
            return


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent ends, so a killed test run leaves no saver behind."""
    import ctypes
    import signal

    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG


def main(campaign: str, direct: list[str] | None = None) -> None:
    import torch

    _die_with_parent()

    torch.set_num_threads(1)
    from pilotrun.campaign import load_campaign
    from pilotrun.engine.loop import make_state, run_update
    from pilotrun.campaign.prepare import prepare

    prep = prepare(load_campaign(campaign), splits=("train",))
    torch.manual_seed(0)
    state = make_state(prep.task.build_model(), prep.c.train, n_train=len(prep.train), seed=0, total_updates=10**6)
    run_update(state, prep.task, [[prep.train[j] for j in mb] for mb in state.sampler.next_update()],
               max_grad_norm=1.0)
    print("ready", flush=True)
    if direct:  # ``--save ROOT LOG``: save in this very process (no fork) until killed
        _saver(state, Path(direct[0]), Path(direct[1]), "unique", "-")
        return
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "fork":
            root, log, mode, step = Path(cmd[1]), Path(cmd[2]), cmd[3], cmd[4]
            pid = os.fork()
            if pid == 0:
                _die_with_parent()
                code = 0
                try:
                    _saver(state, root, log, mode, step)
                except BaseException:
                    (root.parent / f"saver-{os.getpid()}.err").write_text(traceback.format_exc())
                    code = 1
                os._exit(code)
            print(pid, flush=True)
        elif cmd[0] == "reap":
            _, status = os.waitpid(int(cmd[1]), 0)
            how = f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}"
            print(how, flush=True)
        elif cmd[0] == "quit":
            return


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[3:5] if sys.argv[2:3] == ["--save"] else None)
