"""resume: does a saved state really resume? Save at update K, continue in a NEW process, compare.

Runs of the one loop on the same small training set: a reference of 2K updates whose full state is saved at
update K where the loop saves its checkpoints (``Hooks(at_checkpoint=...)``, ``save_state``), as a run that is
preempted later resumes from its last checkpoint, and which goes on to 2K in the same call of the loop; and a
fresh interpreter (``python -m pilotrun _resume-worker``) that loads that state (``load_state``) and continues
to 2K, writing its per-update history to JSON. Update by update after K: the update counter, the lr, the ids of
the examples of each micro-batch and the epoch, and the loss — identical in fp32 on the CPU, within LOSS_RTOL
otherwise. The training set is cut so that an epoch is shorter than K, so the comparison crosses epoch
boundaries before and after the resume.

A second run of the same campaign tells a reference that is not reproducible (something drawn outside the
campaign seed) from a state defect: in this process it runs update 1 again (a new model's weights, the first
micro-batch, dropout), and when the resumed run differs, on to K, so that a difference before K is never
blamed on the state; on ranks it runs to K in the reference's launch.

Test switch: ``PILOTRUN_TEST_SKIP_STATE=scheduler[,sampler...]`` leaves those components out of the
saved state (read by this stage only), to plant the defects this check exists to catch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pilotrun.campaign.arithmetic import data_parallel_ranks, per_rank_update
from pilotrun.campaign.load import load_campaign
from pilotrun.campaign.prepare import prepare, require_weights
from pilotrun.console.progress import head, note, spend
from pilotrun.engine import fresh
from pilotrun.engine.control import store_control_predictions
from pilotrun.engine.distributed import check_strategy, default_device, under_launcher
from pilotrun.engine.launcher import Ranks
from pilotrun.engine.loop import Hooks, make_state, train
from pilotrun.engine.precision import campaign_compute_dtype
from pilotrun.engine.state import COMPONENTS, load_state
from pilotrun.errors import BadInput
from pilotrun.journal.files import atomic_write_json, write_dir_atomically
from pilotrun.journal.runs import RunRecorder
from pilotrun.journal.store import Journal
from pilotrun import jsonsafe
from pilotrun.rehearsal.mechanics.resume_ranks import run_joined, run_sharded, saving_at, work_sharded
from pilotrun.tasks.base import BUILTIN_TASKS
from pilotrun.verdicts import StageResult

SKIP_ENV = "PILOTRUN_TEST_SKIP_STATE"
DEFAULT_AT = 4
LOSS_RTOL = 1e-3  # bf16/fp16 or an accelerator: kernels may pick other reduction orders in a new process
KEEP = ("update", "lr", "loss", "ids", "epoch", "examples_seen", "finite")


def skipped_components() -> tuple[str, ...]:
    names = tuple(n.strip() for n in os.environ.get(SKIP_ENV, "").split(",") if n.strip())
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise BadInput(f"{SKIP_ENV} names unknown state components {unknown}", where=SKIP_ENV,
                       fix=f"use some of {', '.join(COMPONENTS)} (a test switch), or unset it")
    return names


def small_train_set(n_available: int, per_update: int, at: int) -> tuple[int, int]:
    """(examples, updates per epoch): epochs shorter than K, plus half an update left over each epoch."""
    per_epoch = max(2, (3 * at) // 4)
    n = min(n_available, per_update * per_epoch + per_update // 2)
    return n, max(1, n // per_update)


def _history(res) -> list[dict]:
    return [{k: h[k] for k in KEEP} for h in res.history]


def _run(prep, train_ex, total: int, device, hooks: Hooks):
    import torch

    c = prep.c
    model = prep.task.build_model()
    model.to(device)
    torch.manual_seed(c.seed)
    state = make_state(model, c.train, n_train=len(train_ex), seed=c.seed, total_updates=total, device=device)
    res = train(state, prep.task, train_ex, [], c.train, hooks=hooks)
    return state, res


def _again(prep, train_ex, total: int, to: int, device, why: str) -> list[dict]:
    """The second run of the same campaign, to update ``to``: is the reference reproducible?"""
    head(f"second run, to update {to} ({why})")
    return _history(_run(prep, train_ex, total, device, Hooks(stop_at=to))[1])


def _in_process(prep, train_ex, total: int, at: int, device, ckpt, skip, rec) -> dict:
    """The reference here, its state saved at K and its artifact written; the second run to update 1."""
    head(f"reference run ({total} updates, its state saved at update {at})")
    ref_state, ref = _run(prep, train_ex, total, device, saving_at(at, ckpt, skip))
    again = _again(prep, train_ex, total, 1, device, "is the reference reproducible?")
    artifact = write_dir_atomically(rec.dir / "artifact", lambda tmp: prep.task.save_artifact(ref_state.model, tmp))
    store_control_predictions(rec, prep, ref_state.model)
    return {"ref": {"status": ref.status, "reason": ref.reason, "history": _history(ref)},
            "again": again, "artifact": artifact, "update": ref_state.update,
            "examples_seen": ref_state.examples_seen}


def resume_worker(spec_path: str | Path) -> int:
    """The fresh process: load the saved state and continue to the end; history to spec["out"]."""
    import transformers  # noqa: F401 - the fresh process's imports are its start-up (the parent's account)

    spec = jsonsafe.loads(Path(spec_path).read_text())
    if spec.get("ranks", 1) > 1:  # the shards of an FSDP model load into as many new ranks as wrote them
        work_sharded(spec)
        return 0
    prep = prepare(load_campaign(spec["config"]), splits=("train",))
    c = prep.c
    train_ex = prep.train[: spec["n_train"]]
    model = prep.task.build_model()
    device = default_device()
    model.to(device)
    state = make_state(model, c.train, n_train=len(train_ex), seed=c.seed, total_updates=spec["total"], device=device)

    note("loading the saved state", log=True, spent="model")
    restored = load_state(state, spec["state"])
    spend("work")  # the updates from here (the loop's first note comes after its first update)
    res = train(state, prep.task, train_ex, [], c.train)
    atomic_write_json(spec["out"], {"restored": restored, "status": res.status, "reason": res.reason,
                                    "pid": os.getpid(), "history": _history(res)})
    return 0


def _fmt_pair(a: float, b: float) -> tuple[str, str]:
    """Two numbers with just enough digits to show that they differ."""
    for p in range(1, 12):
        x, y = f"{a:.{p}e}", f"{b:.{p}e}"
        if x != y:
            return x, y
    return repr(a), repr(b)


def _short(rid: str) -> str:
    return Path(rid).name


def _loss_equal(a: float, b: float, exact: bool) -> bool:
    return a == b if exact else abs(a - b) <= LOSS_RTOL * max(abs(a), abs(b), 1e-12)


def task_random_state(task) -> list[str]:
    """The random generators a task object keeps as its own attributes (``self.rng = np.random.default_rng()``,
    a ``random.Random``, a ``torch.Generator``): a saved state holds the global RNGs, not these."""
    import random

    import numpy as np

    kinds = [(random.Random, "random.Random"), (np.random.Generator, "numpy Generator"),
             (np.random.RandomState, "numpy RandomState")]
    try:
        import torch

        kinds.append((torch.Generator, "torch.Generator"))
    except ImportError:  # pragma: no cover - torch is a dependency; a task may still be plain Python
        pass
    found = []
    for name, value in sorted(vars(task).items()):
        kind = next((k for t, k in kinds if isinstance(value, t)), None)
        if kind:
            found.append(f"self.{name} ({kind})")
    return found


def custom_task_note(c, task) -> str | None:
    """For a custom Python task, the candidate a loss difference also implicates: its own random state."""
    if c.task in BUILTIN_TASKS:
        return None
    found = task_random_state(task)
    what = (", ".join(found) if found else
            "any generator it keeps and draws from in encode, collate or loss (augmentation, sampling, masking)")
    return (f"the custom task {c.task}'s own random state ({what}): the saved state holds torch's, Python's and "
            "numpy's global RNGs, not a task's own generators — draw from the global RNGs, or derive the "
            "generator from the example and the update")


def first_difference(ref: list[dict], resumed: list[dict], at: int, exact: bool,
                     task_note: str | None = None) -> str | None:
    """The first update after ``at`` where the resumed run leaves the reference, and what it implicates;
    ``task_note`` names a custom task's own random state as one more candidate for a loss difference."""
    expected = ref[at:]
    for i, r in enumerate(expected):
        u = r["update"]
        if i >= len(resumed):
            return (f"the resumed run ended after {len(resumed)} updates, the reference ran to update "
                    f"{ref[-1]['update']}: counters (update, budget) not restored")
        s = resumed[i]
        if s["update"] != u or s["examples_seen"] != r["examples_seen"]:
            return (f"update counter at the {i + 1}th update after resuming is {s['update']} ({s['examples_seen']} "
                    f"examples seen), reference {u} ({r['examples_seen']}): counters not restored")
        if s["lr"] != r["lr"]:
            got, want = _fmt_pair(s["lr"], r["lr"])
            return f"lr at update {u} is {got}, reference {want}: scheduler state not restored"
        if s["ids"] != r["ids"] or s["epoch"] != r["epoch"]:
            got = [_short(x) for mb in s["ids"] for x in mb]
            want = [_short(x) for mb in r["ids"] for x in mb]
            return (f"examples of update {u} differ from the reference (epoch {s['epoch']}: {', '.join(got[:3])} ...; "
                    f"reference epoch {r['epoch']}: {', '.join(want[:3])} ...): sampler position not restored")
        if not _loss_equal(s["loss"], r["loss"], exact):
            got, want = _fmt_pair(s["loss"], r["loss"])
            what = ("model weights or RNG state (dropout) not restored" if i == 0 else
                    "optimizer state (moments, step count) or the grad scaler not restored")
            if task_note:
                what += f"; or {task_note}"
            return f"loss at update {u} is {got}, reference {want}: {what}"
    return None


def not_reproducible(difference: str, at: int) -> str:
    """A second run of the campaign differs from the reference before update K: no saved state is involved."""
    what = difference.rsplit(": ", 1)[0]
    return (f"the reference run itself is not reproducible: a second run of the same campaign, which loads no "
            f"state, already differs from it before update {at} ({what}); something is drawn without the "
            "campaign seed (new weights, dropout, data order) — seed it (torch.manual_seed(campaign seed) before "
            "building the model) and run resume again")


@dataclass
class _Setting:
    """What the check runs: the cut training set, the reference's length, the ranks and how exact a match must be."""

    n: int  # training examples
    per_epoch: int  # updates per epoch
    per_update: int
    ranks: int
    at: int
    total: int  # the reference's updates: 2 × at
    device: object
    exact: bool  # fp32 on the CPU: identical values; else a loss within LOSS_RTOL

    def words(self, t) -> str:
        return (f"{self.n} training examples ({self.per_epoch} updates per epoch of {self.per_update}), reference "
                f"{self.total} updates, its state saved at update {self.at}, resumed in a new process"
                + (f" ({self.ranks} FSDP ranks, each loading its own shards)" if self.ranks > 1 and t.strategy == "fsdp"
                   else f" ({self.ranks} {t.strategy.upper()} ranks of the world torchrun made)" if self.ranks > 1
                   else "")
                + f"; {t.precision} on {self.device.type}: "
                + ("identical values required" if self.exact else f"loss within {LOSS_RTOL:g} relative"))


def resume(loaded, home, *, at: int | None = None, prep=None) -> StageResult:
    """A reference of 2K updates, its state saved at K, against a new process resuming from K; also saves the
    reference's artifact."""
    require_weights(loaded)
    at = DEFAULT_AT if at is None else at
    if at < 2:
        raise BadInput(f"--at {at}: the resume point must be at least update 2", where="--at",
                       fix="pass --at 2 or more (the reference then runs 2 × K updates)")
    skip = skipped_components()
    prep = prep or prepare(loaded, splits=("train", "validation"))
    c, t = prep.c, prep.c.train
    launcher = _launcher(t)
    s = _setting(prep, at, launcher)
    msgs = [s.words(t)] + ([f"test switch {SKIP_ENV}: left out of the saved state: {', '.join(skip)}"] if skip else [])
    if launcher is not None and launcher.follower:  # rank 0 owns the run; this rank takes part in its runs
        return _joined(launcher)
    journal = Journal(home)
    with RunRecorder(journal, loaded, kind="resume") as rec:
        spec = {"config": str(rec.dir / "config.yaml"), "state": str(rec.dir / "checkpoints" / f"update-{at:06d}"),
                "n_train": s.n, "total": s.total, "out": str(rec.dir / "resumed_history.json"), "ranks": s.ranks,
                "keep": list(KEEP), "strategy": t.strategy}
        ref, worker, joined_failed = _reference(prep, s, spec, skip, rec, launcher)
        for h in ref["ref"]["history"]:
            rec.log("train", h["update"], {"loss": h["loss"], "lr": h["lr"]}, examples_seen=h["examples_seen"])
        atomic_write_json(rec.dir / "resume_spec.json", spec)
        atomic_write_json(rec.dir / "reference_history.json", ref["ref"]["history"])
        proc = None
        if launcher is None and ref["ref"]["status"] == "completed":  # no fresh process for a reference that
            # cannot be compared with (under torchrun the fresh processes ran in run_joined)
            worker, proc = _fresh_process(rec, spec, at)
        if (worker and len(ref["again"]) < at and ref["ref"]["status"] == "completed"
                and first_difference(ref["ref"]["history"], worker["history"], at, s.exact)):
            ref["again"] = _again(prep, prep.train[:s.n], s.total, at, s.device,
                                  "the resumed run differs: is the reference reproducible to there?")
        headline, problem = _judged(rec, ref, worker, proc, joined_failed, s, custom_task_note(c, prep.task))
        rec.seal(["", f"A resume check: the artifact is the reference run's model after {s.total} updates."])
        rec.progress(ref["update"], ref["examples_seen"])
        rec.finish(ref["ref"]["status"], {"verdict": "fail" if problem else "ok", "problem": problem, "at": at,
                                          "total": s.total, "n_train": s.n, "skipped": list(skip),
                                          "artifact": ref["artifact"], "ranks": s.ranks})
    if launcher is not None:
        launcher.share("fail" if problem else "ok")
    return _verdict(rec.run_id, ref["ref"]["history"], worker, s, skip, msgs, headline, problem)


def _launcher(t):
    """Under torchrun (several nodes) this process is one rank of a world that must be the campaign's
    (train.nproc): its ``Ranks``; else None. FSDP's strategy is checked first."""
    if t.strategy == "fsdp":
        check_strategy(t)
    if not under_launcher():
        return None

    return Ranks(data_parallel_ranks(t))


def _setting(prep, at: int, launcher) -> _Setting:
    t = prep.c.train
    # FSDP's state exists only across its ranks; under torchrun every run is on the world it made
    ranks = data_parallel_ranks(t) if t.strategy == "fsdp" or launcher is not None else 1
    per_update = per_rank_update(t) * ranks
    n, per_epoch = small_train_set(len(prep.train), per_update, at)
    if n < per_update:
        raise BadInput(f"{len(prep.train)} training examples are fewer than one update of {per_update}",
                       where="train.micro_batch", fix="lower train.micro_batch or train.accumulation")
    device = default_device()
    return _Setting(n, per_epoch, per_update, ranks, at, 2 * at, device,
                    exact=campaign_compute_dtype(prep.c) == "float32" and device.type == "cpu")


def _joined(launcher) -> StageResult:
    """A rank other than 0 under torchrun: takes part in rank 0's runs, then ends with rank 0's verdict."""
    job, spec = launcher.share()
    run_joined(job, spec)
    verdict = launcher.share()  # rank 0's, so that every node's torchrun ends as the check did
    return StageResult("resume", verdict, f"rank {launcher.rank}: joined resume run {job['run_id']}"
                       + ("" if verdict == "ok" else f" ({verdict}: rank 0 says why)"),
                       data={"run_id": job["run_id"], "rank": launcher.rank})


def _reference(prep, s: _Setting, spec: dict, skip, rec, launcher) -> tuple[dict, dict | None, str | None]:
    """The reference run (its state saved at K) and the second run: on the torchrun world (whose fresh processes
    also resume: their outcome and why any failed come back), on FSDP ranks spawned here, or in this process.
    ``(ref, worker, joined_failed)``."""
    job = dict(spec, at=s.at, skip=list(skip), run_dir=str(rec.dir), home=str(rec.journal.home),
               run_id=rec.run_id, out=str(rec.dir / "ranks_outcome.json"))
    if launcher is not None:
        launcher.share((job, spec))
        ref, worker, workers = run_joined(job, spec)
        joined_failed = next((f"rank {r}'s fresh process failed (exit {code}): " + " | ".join(tail)
                              for r, (code, tail) in enumerate(workers) if code != 0), None)
        return ref, worker, joined_failed
    if s.ranks > 1:
        return run_sharded(job, s.ranks), None, None
    return _in_process(prep, prep.train[:s.n], s.total, s.at, s.device, Path(spec["state"]), skip, rec), None, None


def _fresh_process(rec, spec: dict, at: int):
    """``python -m pilotrun _resume-worker``: loads the state saved at K and continues; ``(its outcome or None,
    the finished process)``."""
    head(f"resumed run (a new process, from update {at})", spent="startup")  # until the worker's first note
    proc = fresh.run(["_resume-worker", str(rec.dir / "resume_spec.json")], timeout=3600)
    return (jsonsafe.loads(Path(spec["out"]).read_text()) if proc.returncode == 0 else None), proc


def _judged(rec, ref: dict, worker: dict | None, proc, joined_failed: str | None, s: _Setting,
            task_note: str | None) -> tuple[str | None, str | None]:
    """``(headline, problem)``: the reference's own failures first (not completed, not reproducible up to K),
    then the resumed process's; the resumed updates are logged when they were compared."""
    ref_h, ref_status, at = ref["ref"]["history"], ref["ref"]["status"], s.at
    problem = first_difference(ref_h[:len(ref["again"])], ref["again"], 0, s.exact)
    if ref_status != "completed":  # diverged or out of memory: it cannot show that a resume is exact
        return (f"the reference run {ref_status}",
                f"the reference run {ref_status} before update {s.total}: {ref['ref']['reason']}; "
                "the resume check needs a run that trains for 2 × K updates")
    if problem:
        return "the reference run itself is not reproducible", not_reproducible(problem, at)
    if worker is None and joined_failed:
        return None, f"the resumed processes failed: {joined_failed}"
    if worker is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return None, f"the resumed process failed (exit {proc.returncode}): " + " | ".join(tail)
    headline, problem = None, first_difference(ref_h, worker["history"], at, s.exact, task_note)
    if worker["status"] != "completed":
        headline = f"the resumed run {worker['status']}"
        problem = f"the resumed process's run {worker['status']}: {worker['reason']}"
    for h in worker["history"]:
        rec.log("resumed", h["update"], {"loss": h["loss"], "lr": h["lr"]}, examples_seen=h["examples_seen"])
    return headline, problem


def _verdict(run_id: str, ref_h: list[dict], worker: dict | None, s: _Setting, skip, msgs: list[str],
             headline: str | None, problem: str | None) -> StageResult:
    rows = _rows(ref_h, worker["history"] if worker else [], s.at)
    epochs = sorted({h["epoch"] for h in ref_h})
    data = {"run_id": run_id, "at": s.at, "total": s.total, "n_train": s.n, "epochs": epochs, "exact": s.exact,
            "restored": worker["restored"] if worker else None, "problem": problem, "skipped": list(skip)}
    columns = ["update", "epoch", "lr", "ref_lr", "loss", "ref_loss", "same_examples"]
    if problem:
        return StageResult("resume", "fail", headline or problem.split(":")[-1].strip() or "resume differs",
                           msgs + [problem, f"run {run_id} (kind resume)"], data, columns=columns, rows=rows)
    msgs = msgs + [f"updates {s.at + 1}..{s.total} in the new process match the reference: counter, lr, examples "
                   f"(epochs {epochs[0]}..{epochs[-1]}) and loss; restored {', '.join(worker['restored'])}",
                   f"run {run_id} (kind resume)"]
    how = "exactly" if s.exact else f"with its loss within {LOSS_RTOL:g} relative"  # bf16, fp16, CUDA: not bitwise
    return StageResult("resume", "ok", f"resumes {how} at update {s.at} in a new process", msgs, data,
                       columns=columns, rows=rows)



def _rows(ref: list[dict], resumed: list[dict], at: int) -> list[dict]:
    rows = []
    for r, s in zip(ref[at:], resumed):
        rows.append({"update": r["update"], "epoch": s["epoch"], "lr": s["lr"], "ref_lr": r["lr"], "loss": s["loss"],
                     "ref_loss": r["loss"], "same_examples": s["ids"] == r["ids"]})
    return rows
