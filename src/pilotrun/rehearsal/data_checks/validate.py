"""validate: schema, files, fields and the task's needs; prints the batch arithmetic. Runs nothing."""

from __future__ import annotations

from pilotrun.campaign.arithmetic import batch_arithmetic, describe
from pilotrun.campaign.consistency import check_consistency, check_records
from pilotrun.verdicts import StageResult


def validate(loaded) -> StageResult:
    c = loaded.campaign
    check_consistency(c, loaded.base_dir)
    counts = check_records(c)
    arith = batch_arithmetic(c.train, counts.get("train", 0))
    msgs = [f"{split}: {n} records" for split, n in counts.items()] + describe(arith)
    if c.plan.variants or c.plan.control:
        from pilotrun.campaign.arms import plan_arms

        arms = plan_arms(loaded)  # a sweep's refusals (exit 2) before any rental, as `sweep` would give them
        msgs.append(f"plan: control and {len(arms) - 1} variant{'s' if len(arms) != 2 else ''}, "
                    f"{len(c.plan.seeds)} seed(s); every arm encodes validation as the control does")
    if c.model.trust_remote_code:
        msgs.append("model.trust_remote_code=true: code in the model folder will run; the journal records it")
    return StageResult("validate", "ok", f"{loaded.source or 'campaign'} is valid", msgs,
                       {"records": counts, "arithmetic": arith})
