"""fit: when the pilot exceeds a memory limit, variants that fit, least change to the experiment first.

(a) a smaller train.micro_batch with train.accumulation raised so examples per update stay the same
    (largest that fits, by bisection over the divisors); (b) a smaller train.eval_batch when the peak
    is the evaluation; (c) model.gradient_checkpointing; (d) mixed precision; and, only as a row
    that says how many examples lose target tokens, a shorter data.max_length. The first variant that
    fits and keeps the experiment ends the search (``all_variants`` tries every one).

Each variant is measured with the probes through ``run_update`` / ``evaluate`` (``fit_probe``), and
its first updates' losses through ``train`` are compared with the control's: checkpointing and
micro-batch must match in fp32 to FP32_RTOL, mixed precision to MIXED_RTOL (fit_rules). Accumulation is never
offered for memory the weights and optimizer state take: it only divides activations.
"""

from __future__ import annotations

from pilotrun.campaign.arithmetic import batch_arithmetic, examples_per_update
from pilotrun.campaign.prepare import prepare, require_weights
from pilotrun.console.progress import head
from pilotrun.engine.distributed import default_device
from pilotrun.probe.recorder import describe_inputs, figure, peak_of
from pilotrun.sizes import fmt_bytes
from pilotrun.rehearsal.memory import fit_variants
from pilotrun.rehearsal.memory.fit_probe import first_losses, losses_match, probe, variant_prep
from pilotrun.rehearsal.memory.fit_rules import LOSS_UPDATES, accumulation_for
from pilotrun.verdicts import StageResult

COLUMNS = ["variant", "change", "batch", "probes", "peak", "fits", "step_s", "vs_control", "same_experiment"]


def batch_line(a: dict) -> str:
    return (f"{a['micro_batch']} × {a['accumulation']} × {a['ranks']} = {a['examples_per_update']} per update; "
            f"{a['updates']} updates; {a['examples_seen']} examples")


def _same_batch(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("examples_per_update", "updates", "examples_seen"))


class _Fit:
    """The state of one fit: the control, its measurements and the variant rows."""

    def __init__(self, loaded, prep, limit: int, effective: int, device, all_variants: bool = False):
        self.loaded, self.prep, self.limit, self.effective, self.device = loaded, prep, limit, effective, device
        self.all_variants = all_variants
        self.control_arith = batch_arithmetic(prep.c.train, len(prep.train))
        self._control_losses = None
        self._encoded: dict = {}
        self.rows: list[dict] = []

    def variant(self, overrides: dict):
        """The variant prepared: data.* keys re-encode every example through the task; others reuse them."""
        loaded = self.loaded.with_overrides(overrides)
        if any(k.startswith("data.") for k in overrides):
            key = tuple(sorted(overrides.items()))
            if key not in self._encoded:
                self._encoded[key] = prepare(loaded, splits=("train", "validation"))
            return self._encoded[key]
        return variant_prep(self.prep, loaded)

    def measure(self, overrides: dict, kind: str) -> dict:
        return probe(self.variant(overrides), kind, limit=self.limit, device=self.device)

    def done(self) -> bool:
        """Least change first: the first variant that fits and keeps the experiment ends the search."""
        return not self.all_variants and any(r["fits"] and not r["changes_experiment"] for r in self.rows)

    def control_losses(self) -> dict:
        if self._control_losses is None:
            head(f"the control's first {LOSS_UPDATES} losses")
            self._control_losses = first_losses(self.prep, LOSS_UPDATES, self.device)
        return self._control_losses

    def add(self, label: str, overrides: dict, measured: dict | None, tried: list, bound: int | None,
            rtol: float | None, why_not: str | None = None) -> dict:
        """One variant row; ``rtol`` None means the training is untouched (eval-only) and needs no loss check."""
        row = {"variant": label, "change": overrides, "overrides": overrides, "probes": len(tried),
               "probe_bound": bound, "tried": tried, "fits": bool(measured and measured["fits"]),
               "counters": measured, "peak": fmt_bytes(peak_of(measured)) if measured else "",
               "step_s": None, "vs_control": None, "changes_experiment": why_not is not None}
        if bound is not None:
            row["probes"] = f"{len(tried)} (bound {bound})"
        prep = self.variant(overrides) if overrides else self.prep
        arith = batch_arithmetic(prep.c.train, len(prep.train))
        row["batch"] = batch_line(arith)
        if not _same_batch(arith, self.control_arith) and why_not is None:
            why_not = f"the batch arithmetic differs from the control's ({batch_line(self.control_arith)})"
        if why_not is None and row["fits"] and rtol is not None:
            control, mine = self.control_losses(), first_losses(prep, LOSS_UPDATES, self.device)
            ok, gap = losses_match(control["losses"], mine["losses"], rtol)
            row.update(step_s=mine["step_s"], losses=mine["losses"], control_losses=control["losses"],
                       loss_gap=gap)
            if control["step_s"] and mine["step_s"]:
                row["vs_control"] = f"{mine['step_s'] / control['step_s']:.2f}×"
            if not ok:
                why_not = (f"its first {LOSS_UPDATES} losses differ from the control's by up to {gap:.2e} "
                           f"(relative; the bound is {rtol:g})")
            else:
                row["same_experiment"] = (f"yes: first {LOSS_UPDATES} losses within {gap:.1e} of the control's "
                                          f"(bound {rtol:g})")
        elif why_not is None and rtol is None:
            row["same_experiment"] = "yes: training is unchanged"
        if why_not is not None:
            row["same_experiment"] = f"changes the experiment: {why_not}"
            row["changes_experiment"] = True
        elif "same_experiment" not in row:
            row["same_experiment"] = "not checked: it does not fit"
        self.rows.append(row)
        return row


def _over(rows: list[dict]) -> dict | None:
    return next((r for r in rows if r["verdict"] in ("over-budget", "oom")), None)


def fit(loaded, home, memory_limit: int, *, write: str | None = None, effective_batch: int | None = None,
        all_variants: bool = False, pilot_rows: list[dict] | None = None, device=None) -> StageResult:
    """The fit stage. ``pilot_rows`` (the control's ledger) default to the pilot's, run or reused.
    The search stops at the first variant that fits and keeps the experiment unless ``all_variants``."""
    if write:
        fit_variants.check_write(loaded, write)
    require_weights(loaded)
    device = device or default_device()
    prep = prepare(loaded, splits=("train", "validation"))
    t = prep.c.train
    control_effective = examples_per_update(t)
    effective = effective_batch or control_effective
    accumulation_for(t, 1, effective)  # the effective batch must be reachable on these ranks at all
    measured_here = pilot_rows is None
    if pilot_rows is None:
        head("the control's ledger (the latest pilot of this config, else a new one)")
        pilot_rows, pilot_run = fit_variants.control_ledger(loaded, home, memory_limit, prep)
    else:
        pilot_run = None
    over = _over(pilot_rows)
    unmeasured = next((r for r in pilot_rows if r["verdict"] in ("error", "nan")), None)
    data = {"limit": memory_limit, "pilot_run": pilot_run, "control_batch": batch_line(batch_arithmetic(
        t, len(prep.train))), "device": str(device)}
    messages = [f"control: {data['control_batch']}"]
    if pilot_run is None and measured_here:
        messages.append("the control was measured with fit's probes (training and evaluation phases): no pilot "
                        "stage is installed to run or reuse")
    if effective != control_effective:
        messages.append(f"--effective-batch {effective}: variants keep {effective} examples per update instead of "
                        f"the control's {control_effective}, which changes the experiment")
    if unmeasured is not None and over is None:
        # a phase that ended in an error or a non-finite loss measured nothing whole: no "fits" on it
        data["unmeasured"] = unmeasured["phase"]
        where = f"the pilot run {pilot_run}" if pilot_run else "fit's own probes"
        messages.insert(0, f"phase {unmeasured['phase']} of the control ended {unmeasured['verdict']} in {where}: "
                           f"{unmeasured.get('note') or ''}; fix it (`pilotrun pilot CAMPAIGN` names it) and run fit again")
        return StageResult("fit", "fail", f"the control could not be measured: phase {unmeasured['phase']} ended "
                           f"{unmeasured['verdict']}, so whether it fits {fmt_bytes(memory_limit)} is unknown",
                           messages, data)
    if over is None:
        worst = max(pilot_rows, key=lambda r: peak_of(r) or 0)
        return StageResult("fit", "ok", f"the control fits {fmt_bytes(memory_limit)}: peak {fmt_bytes(peak_of(worst))} "
                           f"({figure(worst)}) at phase {worst['phase']}; nothing to change", messages, data)
    messages.insert(0, f"the control exceeds {fmt_bytes(memory_limit)} at phase {over['phase']} "
                       f"({describe_inputs(over.get('inputs') or {})}): {over['verdict']}, "
                       f"peak {fmt_bytes(peak_of(over))} ({figure(over)})")
    data["over_phase"], data["over_inputs"] = over["phase"], over.get("inputs")
    job = _Fit(loaded, prep, memory_limit, effective, device, all_variants)
    messages += fit_variants.try_variants(job, over)
    chosen = next((r for r in job.rows if r["fits"] and not r["changes_experiment"]), None)
    data["variants"] = job.rows
    data["chosen"] = chosen["variant"] if chosen else None
    rows = [{k: r.get(k) for k in COLUMNS} for r in job.rows]
    for r in rows:
        r["change"] = ", ".join(f"{k}={v}" for k, v in r["change"].items()) or "(none)"
        r["fits"] = "yes" if r["fits"] else "no"
    if chosen is None:
        fitting = [r for r in job.rows if r["fits"]]
        verdict = "warn" if fitting else "fail"
        summary = ("only variants that change the experiment fit" if fitting
                   else f"no variant fits {fmt_bytes(memory_limit)}")
        return StageResult("fit", verdict, summary, messages, data, COLUMNS, rows)
    summary = f"variant {chosen['variant']} fits and keeps the experiment: " + ", ".join(
        f"{k}={v}" for k, v in chosen["overrides"].items())
    if write:
        path = fit_variants.write_campaign(loaded, chosen, write, over, memory_limit)
        messages.append(f"wrote {path}")
        data["written"] = str(path)
    return StageResult("fit", "ok", summary, messages, data, COLUMNS, rows)
