"""The honest comparison of a sweep's arms: pure functions over per-run numbers (numpy only).

Per arm: the plan metric at the budget (the last validation) and best-so-far, as mean, std and a
95% interval over seeds; the difference to the control paired by seed, with its 95% interval and a
plain verdict. Every seed is shown; a diverged run is a failure of its arm, counted and named, and
never silently dropped from the table. Runs that did not finish (failed, interrupted) are shown
as missing: they are the machinery's failure, not the arm's.
"""

from __future__ import annotations

import math

import numpy as np

BETTER, WORSE, NO_DIFF = "better", "worse", "no detectable difference at this number of seeds"
ARM_FAILURE = ("diverged",)
FINISHED = ("completed", "diverged", "stopped")

# Two-sided 95% quantiles of Student's t (0.975 quantile), df = 1..30.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with df degrees of freedom."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 values (df >= 1)")
    if df <= len(_T975):
        return _T975[df - 1]
    z = 1.959964  # Cornish-Fisher expansion around the normal quantile; < 1e-3 off for df > 30
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


def summarize(values) -> dict:
    """n, mean, sample std and the 95% t interval of the mean (None where n is too small)."""
    x = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = int(x.size)
    if n == 0:
        return {"n": 0, "mean": None, "std": None, "lo": None, "hi": None}
    mean = float(x.mean())
    if n == 1:
        return {"n": 1, "mean": mean, "std": None, "lo": None, "hi": None}
    std = float(x.std(ddof=1))
    half = t975(n - 1) * std / math.sqrt(n)
    return {"n": n, "mean": mean, "std": std, "lo": mean - half, "hi": mean + half}


def paired_difference(control: dict, variant: dict) -> dict:
    """variant − control over the seeds both have a value for: summary of the per-seed differences."""
    seeds = sorted(s for s in variant if s in control and _ok(variant[s]) and _ok(control[s]))
    diffs = [variant[s] - control[s] for s in seeds]
    return {"seeds": seeds, "diffs": diffs, **summarize(diffs)}


def _ok(v) -> bool:
    return v is not None and math.isfinite(v)


def decide(diff: dict, goal: str) -> str:
    """better | worse | no detectable difference: only an interval that excludes 0 decides."""
    if diff["lo"] is None or diff["hi"] is None or (diff["lo"] <= 0 <= diff["hi"]):
        return NO_DIFF
    lower_is_better = goal == "minimize"
    below = diff["hi"] < 0
    return BETTER if below == lower_is_better else WORSE


def arm_verdict(diff: dict, goal: str, failed: int, n: int, control_failed: int, control_n: int) -> tuple[str, str]:
    """The arm's verdict and why, with its divergences counted against it."""
    if failed > control_failed:
        why = (f"{failed} of {n} seeds diverged (control: {control_failed} of {control_n}); a diverged run is "
               "a failure of its arm")
        return WORSE, why
    if control_failed > failed:
        return BETTER, (f"the control diverged on {control_failed} of {control_n} seeds, this arm on "
                        f"{failed} of {n}")
    verdict = decide(diff, goal)
    if diff["n"] < 2:
        why = f"{diff['n']} paired seed(s): too few for an interval"
    else:
        why = f"paired by seed over {diff['n']} seeds, 95% interval [{diff['lo']:.4g}, {diff['hi']:.4g}]"
    if failed:
        why += f"; {failed} of {n} seeds diverged in both arms and are left out of the pairs"
    return verdict, why


def compare(runs: list[dict], arms: list[str], *, control: str = "control", goal: str = "minimize") -> list[dict]:
    """Per arm, from runs of {run_id, arm, seed, status, at_budget, best}: one comparison row each.

    ``runs`` are the effective runs (one per arm and seed; a superseded run is not among them).
    """
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in arms}

    def values(arm_runs, key):
        return {r["seed"]: r[key] for r in arm_runs if r["status"] in FINISHED and r["status"] not in ARM_FAILURE}

    ctrl_runs = by_arm.get(control, [])
    ctrl_failed = sum(r["status"] in ARM_FAILURE for r in ctrl_runs)
    out = []
    for arm in arms:
        rs = sorted(by_arm[arm], key=lambda r: r["seed"])
        failed = sum(r["status"] in ARM_FAILURE for r in rs)
        missing = [r["seed"] for r in rs if r["status"] not in FINISHED]
        at_budget, best = values(rs, "at_budget"), values(rs, "best")
        row = {"arm": arm, "n": len(rs), "diverged": failed, "stopped": sum(r["status"] == "stopped" for r in rs),
               "missing": missing, "per_seed": [{"seed": r["seed"], "status": r["status"], "run_id": r["run_id"],
                                                 "at_budget": r["at_budget"], "best": r["best"]} for r in rs],
               "at_budget": summarize(at_budget.values()), "best": summarize(best.values())}
        if arm == control:
            row.update(diff=None, diff_best=None, verdict="control", why="the reference arm")
        else:
            row["diff"] = paired_difference(values(ctrl_runs, "at_budget"), at_budget)
            row["diff_best"] = paired_difference(values(ctrl_runs, "best"), best)
            row["verdict"], row["why"] = arm_verdict(row["diff"], goal, failed, len(rs), ctrl_failed,
                                                     len(ctrl_runs))
        out.append(row)
    return out


def _num(v) -> str:
    return "—" if v is None else f"{v:.4g}"


def _interval(s: dict) -> str:
    if s["mean"] is None:
        return "—"
    if s["lo"] is None:
        return f"{s['mean']:.4g} (n=1, no interval)"
    return f"{s['mean']:.4g} [{s['lo']:.4g}, {s['hi']:.4g}]"


def _seed_cell(p: dict) -> str:
    if p["status"] in ("completed",):
        return f"s{p['seed']} {_num(p['at_budget'])}"
    if p["status"] in ("diverged", "stopped"):
        return f"s{p['seed']} {p['status']} ({_num(p['at_budget'])})"
    return f"s{p['seed']} {p['status']}"


TABLE_COLUMNS = ["arm", "overrides", "seeds", "diverged", "at_budget", "std", "best", "vs_control", "verdict", "why"]
TERMINAL_COLUMNS = ["arm", "overrides", "diverged", "at_budget", "vs_control", "verdict"]


def table_rows(comparison: list[dict], labels: dict | None = None) -> list[dict]:
    """Flat, printable rows (terminal table and HTML): every seed listed, failures counted."""
    labels = labels or {}
    rows = []
    for c in comparison:
        d = c["diff"]
        vs = "—" if d is None else (
            f"{d['mean']:+.4g} [{d['lo']:+.4g}, {d['hi']:+.4g}]" if d["lo"] is not None
            else (f"{d['mean']:+.4g} (n={d['n']})" if d["mean"] is not None else "no paired seeds"))
        rows.append({"arm": c["arm"], "overrides": labels.get(c["arm"], ""),
                     "seeds": ", ".join(_seed_cell(p) for p in c["per_seed"]),
                     "diverged": f"{c['diverged']} of {c['n']}",
                     "at_budget": _interval(c["at_budget"]), "std": _num(c["at_budget"]["std"]),
                     "best": _interval(c["best"]), "vs_control": vs,
                     "verdict": c["verdict"], "why": c["why"]})
    return rows
