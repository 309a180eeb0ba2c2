"""verify: reload a run's artifact in a fresh process and reproduce its control predictions.

A new interpreter (``python -m pilotrun _verify-worker``) first checks every file of the run folder against
``manifest.json`` (sha256), that every file of ``artifact/`` is listed there, and refuses pickle-based weights —
in the process that loads, so nothing changes between the check and the load, and the folder is hashed once (the
caller hashes nothing; a refusal comes back in the worker's output file and is said as one before loading). Then
it loads each artifact folder the way a user would — config, safetensors weights and tokenizer through
transformers (the adapter through peft) — in the dtype the run trained in — and predicts the control inputs
stored at the end of training. The logits at the stored top-k ids must be within the tolerance of the dtype the
run computed in (``logit_tolerance``), and the ids equal, except where the training-time logits of the two ids
were themselves within that tolerance (a near tie: the dtype's rounding may pick either, so a flip there is said,
never failed).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from pilotrun.campaign.load import load_campaign
from pilotrun.console.progress import head, note, spend, spending
from pilotrun.engine import fresh
from pilotrun.engine.control import CONTROL_FILE, load_control, predictions_and_logits
from pilotrun.engine.precision import EPS, autocast, campaign_compute_dtype
from pilotrun.errors import BadInput, from_os_error
from pilotrun.journal.checkpoints import reference, resolve
from pilotrun.journal.files import MANIFEST, atomic_write_json, listed_files, verify_manifest
from pilotrun.journal.runs import missing_run_folder
from pilotrun.journal.store import Journal
from pilotrun import jsonsafe
from pilotrun.tasks import make_task
from pilotrun.tasks.base import Example
from pilotrun.signals import unless_stopping
from pilotrun.verdicts import StageResult

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
FP32_ATOL = 1e-4  # fp32 on CPU reproduces to ~1e-6; 1e-4 leaves room for a GPU-trained run
ULPS = 8  # a reload computes in another order (threads, memory layout): a few roundings at the logits' scale


def logit_tolerance(dtype: str, scale: float) -> float:
    """How far a reloaded logit may be from the stored one when the run computed in ``dtype``: ULPS spacings of
    that dtype's numbers at the largest stored logit's magnitude (bf16 holds logits of order 10 to ~0.06)."""
    return max(FP32_ATOL, ULPS * EPS.get(dtype, EPS["float32"]) * max(1.0, scale))


def preflight(run_dir: Path) -> list[str]:
    """Reasons to refuse loading: pickle-based weights, files that differ from or are missing in the manifest."""
    art = run_dir / "artifact"
    refused = []
    files = sorted(p for p in art.rglob("*") if p.is_file()) if art.is_dir() else []
    for p in files:
        if p.suffix.lower() in PICKLE_SUFFIXES:
            refused.append(f"{p.relative_to(run_dir)}: pickle-based weights refused — unpickling runs arbitrary "
                           "code, so pilotrun loads weights only from safetensors (re-save with "
                           "save_pretrained(dir, safe_serialization=True) in a trusted session)")
    problems = verify_manifest(run_dir)
    if (run_dir / MANIFEST).is_file():
        listed = listed_files(run_dir)
        if listed is None:  # damaged or edited by hand: nothing can be checked against it
            raise BadInput(f"{MANIFEST} cannot be read: {problems[0].split(': ', 1)[-1]}", where=str(run_dir / MANIFEST),
                           fix="restore the run folder (or its manifest.json) from an archive of the run; pilotrun "
                               "never rewrites a manifest over files it cannot vouch for")
        problems += [f"{p.relative_to(run_dir)}: not listed in manifest.json" for p in files
                     if str(p.relative_to(run_dir)) not in listed]
    final = run_dir / "checkpoints" / "final"
    if reference(final) is not None:  # the checkpoint final stands for is missing or swapped: said as such (its
        # files were hashed above, as files of the run: not a second time)
        problems += [p for p in resolve(final, files=False)[1] if p.startswith(f"{final / MANIFEST}: ")]
    return refused + [f"{p} — refused, nothing was loaded" for p in problems]


def verify(home, run_id: str) -> StageResult:
    """In a fresh process: check hashes (``preflight``), then reload and predict; then compare here. The checks
    that need no hashing (the artifact folder, the stored control predictions) are made here, before a process
    starts."""
    journal = Journal(home, create=False)
    run = journal.require_run(run_id)
    run_id = run["run_id"]
    run_dir = journal.run_dir(run_id)
    if not run_dir.is_dir():
        raise missing_run_folder(journal, run_id)
    if not (run_dir / "artifact").is_dir():
        raise BadInput(f"run {run_id} (kind {run['kind']}) has no artifact folder in {run_dir}", where="RUN_ID",
                       fix="verify a run that saved an artifact (train, resume, sweep runs); see `pilotrun runs`")
    control = journal.predictions(run_id, "control")
    if not control:
        raise BadInput(f"run {run_id} stored no control predictions", where="RUN_ID",
                       fix="verify a run written by `pilotrun train` (control predictions are stored at its end)")

    head("reloading the artifact in a new process", spent="startup")  # until the worker's first note
    with tempfile.TemporaryDirectory(prefix="pilotrun-verify-") as tmp:
        out = Path(tmp) / "reloaded.json"
        (Path(tmp) / "control.json").write_text(json.dumps(control))
        proc = fresh.run(["_verify-worker", str(run_dir), str(Path(tmp) / "control.json"), str(out)], timeout=3600)
        if proc.returncode != 0 or not out.is_file():
            tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-5:])
            return StageResult("verify", "fail", f"run {run_id}: the artifact does not reload",
                               [f"the fresh process failed (exit {proc.returncode}): {tail}"], {"run_id": run_id})
        reloaded = jsonsafe.loads(out.read_text())
    if "bad_input" in reloaded:  # the manifest cannot be read: the worker's BadInput, said here as this verb's
        raise BadInput(**reloaded["bad_input"])
    if "refused" in reloaded:
        refused = reloaded["refused"]
        return StageResult("verify", "fail", f"run {run_id}: refused before loading: {refused[0].split(' — ')[0]}",
                           refused, {"run_id": run_id, "refused": refused})
    return compare(run_id, control, reloaded)


def compare(run_id: str, control: dict, reloaded: dict) -> StageResult:
    """The verdict on the worker's output ``reloaded`` (its ``preflight`` passed: ``checked``)."""
    msgs = [f"every file matches manifest.json (sha256); no pickle-based weights; fresh process pid "
            f"{reloaded['pid']}"] if reloaded.get("checked") else []
    rows, failed = [], []
    for name, res in reloaded["artifacts"].items():
        if res.get("skipped"):
            msgs.append(f"artifact/{name}: not loaded — {res['skipped']}")
            continue
        ties = res.get("ties") or {}
        wrong = [rid for rid, c in control.items() if res["pred"].get(rid) != c["pred"] and rid not in ties]
        tol = res["atol"]
        diff = res.get("max_logit_diff")
        row = {"artifact": name, "examples": len(control), "ids_equal": not wrong,
               "max_logit_diff": diff, "tolerance": tol, "dtype": res.get("compute_dtype"),
               "near_ties": sum(len(v) for v in ties.values()), "tokenizer": res["tokenizer"]}
        rows.append(row)
        if wrong:
            rid = wrong[0]
            at = _first_difference(res["pred"].get(rid) or [], control[rid]["pred"])
            failed.append(f"artifact/{name}: predicted ids of {rid} differ from the end of training at target "
                          f"{at}: {(res['pred'].get(rid) or [])[at:at + 6]} against {control[rid]['pred'][at:at + 6]} "
                          f"({len(wrong)} of {len(control)} control examples differ beyond a near tie): the saved "
                          "artifact is not the trained model")
        if diff is not None and diff > tol:
            failed.append(f"artifact/{name}: logits differ from training by up to {diff:.2e} (tolerance {tol:.1e} "
                          f"for {res.get('compute_dtype')})")
        if ties:
            flips = [t for v in ties.values() for t in v]
            worst = max(t["gap"] for t in flips)
            msgs.append(f"artifact/{name}: {len(flips)} target position(s) of {len(ties)} control example(s) predict "
                        f"the other id of a near tie (training-time logits at most {worst:.2e} apart, each within "
                        f"{res.get('compute_dtype')}'s tolerance {tol:.1e} of its value): its rounding picks either id")
        if res["tokenizer"] != "same":
            failed.append(f"artifact/{name}: {res['tokenizer']}")
        if not wrong and (diff is None or diff <= tol) and res["tokenizer"] == "same":
            logit_text = f"logits within {diff:.1e} (tolerance {tol:.1e}, {res.get('compute_dtype')})" \
                if diff is not None else \
                "no logits for this task (ids only)"
            msgs.append(f"artifact/{name}: loaded as a user would ({res['loaded']}); {len(control)} control "
                        f"predictions reproduced, {logit_text}; tokenizer encodes the control inputs identically")
    if not rows:
        failed.append("no artifact folder could be loaded")
    verdict = "fail" if failed else "ok"
    summary = (f"run {run_id}: {failed[0].split(':')[0]} does not reproduce" if failed
               else f"run {run_id}: the artifact reloads and reproduces its control predictions")
    return StageResult("verify", verdict, summary, msgs + failed, {"run_id": run_id, "artifacts": rows},
                       columns=["artifact", "examples", "ids_equal", "max_logit_diff", "tolerance", "dtype"],
                       rows=rows)


def _first_difference(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def verify_worker(run_dir: str, control_path: str, out_path: str) -> int:
    """The fresh process: check the run folder (``preflight``), then load each artifact folder and predict the
    control inputs. A refusal, or bad input (a manifest that cannot be read, a file the system will not open), is
    written to ``out_path`` (``refused``, ``bad_input``) with exit 0: the caller says it as it says its own, never
    as a process that failed."""
    import torch

    import transformers  # noqa: F401 - the fresh process's imports are its start-up, not the artifact's load

    spend("work")  # the fresh process's start-up ends here (the parent's account until now)
    run_dir = Path(run_dir)
    note("checking every file of the run against manifest.json (sha256)")
    try:
        refused = preflight(run_dir)
    except (BadInput, OSError) as e:  # an unreadable manifest, a path the system refuses: exit 2 as ever
        bad = e if isinstance(e, BadInput) else from_os_error(e)
        if bad is None:
            raise
        atomic_write_json(out_path, {"pid": os.getpid(), "bad_input": {"message": bad.detail, "where": bad.where,
                                                                       "fix": bad.fix}})
        return 0
    if refused:
        atomic_write_json(out_path, {"pid": os.getpid(), "refused": refused})
        return 0
    control = jsonsafe.loads(Path(control_path).read_text())
    rids = list(control)
    if any("labels" not in c for c in control.values()):
        raise BadInput("the control predictions hold no labels (a run from an older pilotrun)", where=str(run_dir),
                       fix="train the run again to verify it")
    examples = [Example(control[r]["input_ids"], control[r]["labels"], r, meta=control[r].get("meta") or {})
                for r in rids]

    loaded = load_campaign(run_dir / "config.yaml")
    with spending("data"):  # the tokenizer
        task, precision = make_task(loaded), loaded.campaign.train.precision
    stored = load_control(run_dir / CONTROL_FILE) if (run_dir / CONTROL_FILE).is_file() else None

    results = {}
    subs = sorted(p for p in (run_dir / "artifact").iterdir() if p.is_dir())
    for i, sub in enumerate(subs):
        note(f"artifact {i + 1}/{len(subs)}: {sub.name}, {len(examples)} control inputs", done=i, total=len(subs),
             log=True)
        skipped = _cannot_load(sub)
        if skipped:
            results[sub.name] = {"skipped": skipped}
            continue
        with spending("model"):
            model = task.load_artifact(sub)
        model.eval()
        dtype = str(next(model.parameters()).dtype)
        with torch.no_grad(), autocast(precision, "cpu"):  # as the run computed its control predictions
            batch = task.collate(examples)
            preds, logits = predictions_and_logits(task, model, batch, logits=bool(stored))
        pred = dict(zip(rids, preds))
        computed = campaign_compute_dtype(loaded.campaign)
        diff, ties, tol = None, {}, logit_tolerance(computed, 0.0)
        if logits is not None:
            by_rid = dict(zip(stored["rids"], zip(stored["values"], stored["indices"])))
            tol = logit_tolerance(computed, max((float(v.abs().max()) for v in stored["values"] if v.numel()),
                                                default=0.0))
            diff = max(float((lg.gather(-1, by_rid[r][1]) - by_rid[r][0]).abs().max()) if lg.numel() else 0.0
                       for r, lg in zip(rids, logits))
            ties = near_ties(control, pred, by_rid, tol)
        results[sub.name] = {"pred": pred, "max_logit_diff": diff, "dtype": dtype, "compute_dtype": computed,
                             "atol": tol, "ties": ties, "tokenizer": _tokenizer_same(task, sub, examples),
                             "loaded": f"{type(model).__name__}, {dtype}"}
    atomic_write_json(out_path, {"pid": os.getpid(), "checked": True, "artifacts": results})
    return 0


def near_ties(control: dict, pred: dict, stored: dict, tol: float) -> dict:
    """Per control example whose reloaded ids differ from training only at near ties: the two ids' training-time
    logits at most ``2 * tol`` apart (each may move by ``tol``: the reloaded id among the stored top-k), or the
    reloaded id below the stored top-k while those all lie within ``2 * tol`` of the top. Returns the flipped
    positions with their gap; an example with any other difference is left out (it is wrong)."""
    out = {}
    for rid, c in control.items():
        got, want = pred.get(rid), c["pred"]
        if got == want or got is None or len(got) != len(want) or rid not in stored:
            continue
        values, indices = stored[rid]
        flips = []
        for pos, (g, w) in enumerate(zip(got, want)):
            if g == w:
                continue
            if pos >= len(indices) or int(indices[pos][0]) != w:  # the stored top-1 is the trained prediction
                break
            hit = (indices[pos] == g).nonzero()
            gap = float(values[pos][0] - values[pos][int(hit[0]) if len(hit) else -1])  # else at least the k-th's
            if gap > 2 * tol:
                break
            flips.append({"position": pos, "trained": w, "reloaded": g, "gap": gap})
        else:
            out[rid] = flips
    return out


def _cannot_load(sub: Path) -> str | None:
    """Why an adapter cannot be reloaded (the base model folder it names is gone), else None. An adapter on a
    base built from model.config is reloaded onto that config rebuilt under the run's seed."""
    cfg = sub / "adapter_config.json"
    if not cfg.is_file():
        return None
    base = jsonsafe.loads(cfg.read_text()).get("base_model_name_or_path")
    if base and not Path(base).is_dir():
        return f"its base model ({base}) is not a folder on disk"
    return None


def _tokenizer_same(task, sub: Path, examples) -> str:
    """'same' when the artifact's tokenizer encodes the control inputs like the training tokenizer."""
    from transformers import AutoTokenizer

    train_tok = getattr(task, "tokenizer", None)
    if train_tok is None:
        return "same"
    try:
        tok = AutoTokenizer.from_pretrained(str(sub), local_files_only=True)
    except Exception as e:  # a missing or broken tokenizer is the finding, whatever transformers raises
        unless_stopping(e)
        return f"the tokenizer does not load: {type(e).__name__}: {e}"
    if tok.eos_token_id != train_tok.eos_token_id or len(tok) != len(train_tok):
        return (f"the tokenizer differs: {len(tok)} tokens, eos {tok.eos_token_id}; training used {len(train_tok)}, "
                f"eos {train_tok.eos_token_id}")
    for e in examples:
        text = train_tok.decode(e.input_ids)
        if tok(text, add_special_tokens=False)["input_ids"] != train_tok(text, add_special_tokens=False)["input_ids"]:
            return f"the tokenizer encodes control input {e.rid} differently from the training tokenizer"
    return "same"


def verify_latest(loaded, home) -> StageResult:
    """For `all`: verify the most recent completed run of this campaign that saved an artifact.

    Within `all` that is the resume check's reference run (verify comes before train in SPEC order).
    """
    journal = Journal(home)
    runs = [r for r in journal.list_runs(name=loaded.campaign.name)
            if r["status"] == "completed" and (journal.run_dir(r["run_id"]) / "artifact").is_dir()]
    if not runs:
        return StageResult("verify", "warn", "no completed run of this campaign with an artifact yet",
                           ["run `pilotrun train CAMPAIGN`, then `pilotrun verify RUN_ID`"])
    run = runs[-1]
    result = verify(home, run["run_id"])
    result.messages.insert(0, f"verifying run {run['run_id']} (kind {run['kind']}): the most recent completed run "
                              f"of campaign '{loaded.campaign.name}' with an artifact")
    return result
