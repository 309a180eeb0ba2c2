"""leakage: what crosses the splits (shared units, exact and near duplicates, period order)."""

from __future__ import annotations

from dataclasses import asdict

from pilotrun.campaign.consistency import check_consistency
from pilotrun.data.leakage import leakage_checks
from pilotrun.errors import BadInput
from pilotrun.verdicts import StageResult, worst

DEFAULT_THRESHOLD = 0.8


def leakage(loaded, threshold: float = DEFAULT_THRESHOLD) -> StageResult:
    if not 0.0 < threshold <= 1.0:
        raise BadInput(f"near-duplicate threshold {threshold} is not in (0, 1]", where="--near-threshold",
                       fix="give an estimated Jaccard similarity such as 0.8")
    check_consistency(loaded.campaign, loaded.base_dir)
    checks, counts = leakage_checks(loaded, threshold)
    verdict = worst(c.verdict for c in checks)
    d = loaded.campaign.data
    unit = f"units of data.group_by '{d.group_by}'" if d.group_by else "records (no data.group_by: each is a unit)"
    if len(counts) < 2:
        summary = "one split only: nothing to compare"
    elif not checks:
        summary = f"nothing crosses {' / '.join(counts)}: compared {unit}"
    else:
        summary = (f"{sum(c.verdict == 'fail' for c in checks)} failing, {sum(c.verdict == 'warn' for c in checks)} "
                   f"warnings across {' / '.join(counts)} ({unit})")
    rows = [{"split": s, **v} for s, v in counts.items()]
    return StageResult("leakage", verdict, summary, [c.line() for c in checks],
                       {"checks": [asdict(c) for c in checks], "splits": counts, "threshold": threshold,
                        "unit": d.group_by}, ["split", "records", "units"], rows)
