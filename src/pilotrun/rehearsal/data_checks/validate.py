"""validate: schema, files, fields and the task's needs; prints the batch arithmetic. Runs nothing."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import describe
from pilotrun.campaign.arms import plan_arms
from pilotrun.campaign.consistency import check_campaign
from pilotrun.journal.runs import find_pilot
from pilotrun.journal.store import Journal, resolve_home
from pilotrun.sizes import fmt_bytes
from pilotrun.verdicts import StageResult


def pilot_checkpoint_bytes(loaded, home) -> int | None:
    """The size of one checkpoint as the campaign's latest pilot wrote it (its save row), if the journal has one."""
    try:
        h = resolve_home(home, loaded.source)
        if not (h / "journal.sqlite").is_file():
            return None
        journal = Journal(h, create=False)
        pilot, _ = find_pilot(journal, loaded.campaign.name, loaded.config_sha256(), loaded.resolved_dict())
        rows = [r for r in journal.phase_rows(pilot["run_id"]) if r["phase"] == "save"] if pilot else []
        return next((int(r["inputs"]["bytes"]) for r in rows if r["inputs"].get("bytes")), None)
    except Exception:  # noqa: BLE001 - a size for one printed line never fails validate
        return None


def validate(loaded, home=None) -> StageResult:
    c = loaded.campaign
    counts, arith = check_campaign(loaded)
    arith["checkpoints"]["bytes_each"] = pilot_checkpoint_bytes(loaded, home)
    msgs = [f"{split}: {n} records" for split, n in counts.items()] + describe(arith, fmt_bytes)
    warnings = warmup_warnings([("train.warmup", c.train)], arith["updates"])
    if c.model.dtype == "float16" and c.model.adapter is None and c.train.precision == "fp32":
        warnings.append("model.dtype=float16 with train.precision=fp32 trains the float16 weights themselves, with no "
                        "grad scaler: gradients under float16's range vanish and activations over it overflow to inf "
                        "(the loss then NaN); fp16-mixed with model.dtype: float32 keeps float32 weights and scales "
                        "the loss, bf16-true trains bfloat16 weights in float32's range")
    if c.plan.variants or c.plan.control:
        arms = plan_arms(loaded)  # a sweep's refusals (exit 2) before any rental, as `sweep` would give them
        msgs.append(f"plan: control and {len(arms) - 1} variant{'s' if len(arms) != 2 else ''}, "
                    f"{len(c.plan.seeds)} seed(s); every arm encodes validation as the control does")
        warnings += warmup_warnings([(f"{a.arm_id} ({a.label})", a.loaded.c.train) for a in arms
                                     if "train.warmup" in a.own], arith["updates"])
    if c.model.trust_remote_code:
        msgs.append("model.trust_remote_code=true: code in the model folder will run; the journal records it")
    return StageResult("validate", "warn" if warnings else "ok",
                       f"{loaded.source or 'campaign'} is valid" + (f"; {warnings[0]}" if warnings else ""),
                       msgs + warnings, {"records": counts, "arithmetic": arith})


def warmup_warnings(trains: list[tuple[str, object]], updates: int) -> list[str]:
    """A warm-up as long as the budget or longer: the learning rate rises for the whole run (``engine/optim.lr_factor``),
    never reaches train.lr and the schedule's decay never starts, a different experiment from the one written."""
    out = []
    for said, t in trains:
        if t.warmup and t.warmup >= updates:
            end = (f"ends at {updates}/{t.warmup} of train.lr ({t.lr * updates / t.warmup:.3g}, not {t.lr:.3g})"
                   if t.warmup > updates else "reaches train.lr at its last update only")
            decay = "" if t.schedule == "constant" else f"; the {t.schedule} schedule's decay never starts"
            out.append(f"{said}: warm-up {t.warmup} updates ≥ the budget's {updates}: the learning rate rises for "
                       f"the whole run and {end}{decay}")
    return out
