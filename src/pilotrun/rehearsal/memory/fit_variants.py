"""The variants ``fit`` tries, the control's ledger it starts from, and writing the chosen one back."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from pilotrun.campaign.load import PATH_KEYS, apply_overrides, load_campaign
from pilotrun.console.progress import head
from pilotrun.errors import BadInput
from pilotrun.engine.precision import campaign_compute_dtype
from pilotrun.journal.files import atomic_write_text, refuse_stream
from pilotrun.journal.store import Journal
from pilotrun.probe.recorder import describe_inputs, peak_of
from pilotrun.sizes import fmt_bytes
from pilotrun.probe.trace import trace
from pilotrun.rehearsal.memory.fit_probe import largest_fitting, probe
from pilotrun.rehearsal.memory.fit_rules import (EVAL_BOUND, FP32_RTOL, MIXED_RTOL, TRAIN_BOUND, accumulation_for,
                                      micro_batch_candidates, probe_bound)

LENGTH_STEP = 8  # max_length candidates are multiples of this


def _bisect(job, candidates: list, overrides_for, kind: str, prep_for=None):
    """Largest fitting candidate; returns (best, its row or the smallest tried row, [(candidate, fits)])."""
    rows = {}
    bound = probe_bound(len(candidates))

    def fits(x):
        said = ", ".join(f"{k.split('.')[-1]} {v}" for k, v in overrides_for(x).items())
        head(f"probe {len(rows) + 1} (≤{bound}): {said}", done=len(rows), total=bound, at_most=True)
        prep = prep_for(x) if prep_for else job.variant(overrides_for(x))
        rows[x] = probe(prep, kind, limit=job.limit, device=job.device)
        return rows[x]["fits"]

    best, tried = largest_fitting(candidates, fits)
    shown = best if best is not None else min(rows) if rows else None
    return best, rows.get(shown), tried


def _probe_one(job, ov: dict, kind: str) -> dict:
    head("probe: " + ", ".join(f"{k.split('.')[-1]} {v}" for k, v in ov.items()))
    return probe(job.variant(ov), kind, limit=job.limit, device=job.device)


def _held_state(job) -> str:
    """Weights, gradients and optimizer state on the device, from the fake-tensor estimate (they do not
    depend on the micro-batch), for the message that accumulation cannot shrink them."""
    rows = {r["phase"]: r for r in trace(job.loaded, device=job.device.type, prep=job.prep)["rows"]}
    s = rows["steady_step"]
    return (f"parameters {fmt_bytes(s['parameters'])}, gradients {fmt_bytes(s['gradients'])} and optimizer state "
            f"{fmt_bytes(s['optimizer_state'])} (estimated)")


def try_variants(job, over: dict) -> list[str]:
    """Run the variants that apply to the phase over the limit, least change first; returns messages."""
    t = job.prep.c.train
    name = over["phase"]
    rtol = FP32_RTOL if campaign_compute_dtype(job.prep.c) == "float32" else MIXED_RTOL
    messages = []
    kind = "eval" if name in EVAL_BOUND else "train"
    if name in TRAIN_BOUND:
        cands = micro_batch_candidates(t, job.effective)
        if cands:
            def mb(x):
                return {"train.micro_batch": x, "train.accumulation": accumulation_for(t, x, job.effective)}

            best, row, tried = _bisect(job, cands, mb, "train")
            job.add("a: micro-batch", mb(best if best is not None else cands[0]), row, tried,
                    probe_bound(len(cands)), rtol)
            if job.done():
                return messages
            if best is None:
                messages.append(f"even train.micro_batch=1 exceeds the limit: {_held_state(job)} stay whatever "
                                "the micro-batch; accumulation does not shrink them")
        else:
            messages.append("train.micro_batch is already 1: no smaller micro-batch to compensate with accumulation")
    elif name in EVAL_BOUND:
        cands = list(range(1, t.eval_batch))
        if cands:
            best, row, tried = _bisect(job, cands, lambda x: {"train.eval_batch": x}, "eval")
            job.add("b: eval batch", {"train.eval_batch": best or 1}, row, tried, probe_bound(len(cands)), None)
            if job.done():
                return messages
    else:
        messages.append(f"phase {name} holds the weights and optimizer state, not activations: "
                        f"{_held_state(job)}; a smaller micro-batch or more accumulation cannot fix it. Options "
                        "that change the experiment or the rental: model.adapter (LoRA), train.precision=bf16-true, "
                        "train.strategy=fsdp over more GPUs, or a GPU with more memory")
        ov = {"train.precision": "bf16-true"}
        if t.precision != "bf16-true":
            job.add("d: precision", ov, _probe_one(job, ov, "train"), [1],
                    None, MIXED_RTOL, why_not="weights held and updated in bf16 (train.precision=bf16-true)")
        return messages
    if name in TRAIN_BOUND and not job.prep.c.model.gradient_checkpointing:
        ov = {"model.gradient_checkpointing": True}
        job.add("c: checkpointing", ov, _probe_one(job, ov, "train"), [1],
                None, rtol)
        if job.done():
            return messages
    if t.precision == "fp32":
        ov = {"train.precision": _mixed_precision(job.device)}
        job.add("d: precision", ov, _probe_one(job, ov, kind), [1], None,
                MIXED_RTOL)
        if job.done():
            return messages
    _shorter_max_length(job, over, kind, rtol)
    return messages


def _mixed_precision(device) -> str:
    import torch

    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16-mixed"
    return "bf16-mixed"


def _shorter_max_length(job, over: dict, kind: str, rtol: float) -> None:
    """The longest data.max_length that fits, with how many examples lose target tokens to it."""
    seq_len = int((over.get("inputs") or {}).get("seq_len") or 0)
    cands = list(range(LENGTH_STEP, seq_len, LENGTH_STEP))
    if not cands:
        return

    def ov(x):
        return {"data.max_length": x}

    best, row, tried = _bisect(job, cands, ov, kind, prep_for=lambda x: job.variant(ov(x)))
    length = best if best is not None else cands[0]
    cut, total = _targets_cut(job, job.variant(ov(length)))
    why = (f"data.max_length={length} cuts the target tokens of {cut} of {total} examples" if cut else None)
    row_out = job.add("e: max_length", ov(length), row, tried, probe_bound(len(cands)), rtol, why_not=why)
    row_out["targets_cut"] = cut


def _targets_cut(job, shorter) -> tuple[int, int]:
    """Examples (train and validation) that keep fewer target tokens than under the control's max_length,
    both encoded by the task's one encode path."""
    cut = total = 0
    for split in ("train", "validation"):
        for a, b in zip(job.prep.examples.get(split, []), shorter.examples.get(split, [])):
            total += 1
            cut += b.n_targets < a.n_targets
    return cut, total


# --- the control's ledger ------------------------------------------------------------------------

def _reverdict(rows: list[dict], limit: int) -> list[dict]:
    """The pilot's rows judged against this limit (the pilot may have run with another or none)."""
    out = []
    for r in rows:
        r = dict(r)
        if r["verdict"] in ("ok", "over-budget"):
            peak = peak_of(r)
            r["verdict"] = "over-budget" if peak is not None and peak > limit else "ok"
        out.append(r)
    return out


def control_ledger(loaded, home, limit: int, prep=None) -> tuple[list[dict], str | None]:
    """The control's phase rows: the latest completed pilot of this exact config, or a new pilot run.

    Without the pilot stage (``pilotrun.rehearsal.memory.pilot``) the control is measured with fit's own probes
    (training and evaluation phases only), and the run id is None."""
    journal = Journal(Path(home))
    sha = loaded.config_sha256()
    for run in reversed(journal.list_runs(kind="pilot")):
        if run.get("config_sha256") == sha and run.get("status") == "completed":
            rows = journal.phase_rows(run["run_id"])
            if rows:
                return _reverdict(rows, limit), run["run_id"]
    try:
        from pilotrun.rehearsal.memory.pilot import pilot  # lazy: inside the fallback that catches its failure
    except ImportError:
        from pilotrun.campaign.prepare import prepare  # lazy: inside the fallback that catches its failure

        prep = prep or prepare(loaded, splits=("train", "validation"))
        rows = [probe(prep, kind, limit=limit) for kind in ("train", "eval")]
        return _reverdict(rows, limit), None
    result = pilot(loaded, home, memory_limit=limit)
    run_id = result.data.get("run_id")
    if not run_id:
        raise BadInput(f"the pilot did not record a run: {result.summary}", where="pilot",
                       fix="run `pilotrun pilot CAMPAIGN` and fix what it reports")
    return _reverdict(journal.phase_rows(run_id), limit), run_id


# --- writing the chosen variant -----------------------------------------------------------------

def check_write(loaded, path) -> Path:
    """Where ``--write`` puts the chosen variant's campaign file, refused before anything is measured: a campaign
    file to start from, and a new file (not an existing one, not a device or a pipe)."""
    refuse_stream(path, "--write", "the campaign's paths are written relative to its folder, and every verb reads "
                                   "it back from there")
    path = Path(path).resolve()
    if loaded.source is None:
        raise BadInput("the campaign has no file to start from", where="--write", fix="run fit on a campaign file")
    if path.exists():
        raise BadInput(f"{path} exists; fit writes a new file and never overwrites", where="--write",
                       fix="name a file that does not exist yet")
    return path


def write_campaign(loaded, chosen: dict, path, over: dict, limit: int) -> Path:
    """The campaign file with the chosen variant's keys changed, and a comment saying what and why."""
    import yaml

    path = check_write(loaded, path)
    raw = yaml.safe_load(Path(loaded.source).read_text(encoding="utf-8")) or {}
    if path.parent != Path(loaded.source).resolve().parent:
        resolved = loaded.resolved_dict()
        for key in PATH_KEYS:  # relative paths are relative to the file: keep them pointing at the same files
            section, leaf = key.split(".")
            value = resolved[section][leaf]
            if value and value != "byte" and leaf in (raw.get(section) or {}):
                raw[section][leaf] = value
    before = loaded.resolved_dict()
    raw = apply_overrides(raw, chosen["overrides"], where="--write")
    changes = []
    for key, value in chosen["overrides"].items():
        section, leaf = key.split(".")
        changes.append(f"{key}: {before[section][leaf]} -> {value}")
    counters = chosen.get("counters") or {}
    header = [f"# written by `pilotrun fit` from {loaded.source} on {_dt.date.today().isoformat()}",
              f"# changed: {'; '.join(changes)}",
              f"# why: the control exceeded the memory limit {fmt_bytes(limit)} at phase {over['phase']} "
              f"({describe_inputs(over.get('inputs') or {})}), peak {fmt_bytes(peak_of(over))}; this variant "
              f"peaks at {fmt_bytes(peak_of(counters)) if counters else '?'} ({counters.get('counter', '')})",
              f"# same experiment: {chosen['same_experiment']}",
              f"# batch: {chosen['batch']} (as the control)"]
    atomic_write_text(path, "\n".join(header) + "\n" + yaml.safe_dump(raw, sort_keys=False))
    load_campaign(path)  # the file must load as it is
    return path
