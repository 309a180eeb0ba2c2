"""sweep and report."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, emit, home_for, load, track_option, tracking
from pilotrun.cli.main import cli
from pilotrun.console.progress import head, say, stage_progress
from pilotrun.verdicts import StageResult
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


@cli.command()
@campaign_argument
@click.option("--continue", "continue_id", default=None, metavar="SWEEP_ID",
              help="pick an interrupted sweep up: skip finished runs, rerun the others as new runs")
@click.option("--id", "fixed_id", default=None, metavar="SWEEP_ID",
              help="start the sweep under this id, or continue it if the journal has it (what launch files run)")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="override a campaign key (repeatable); part of the frozen plan")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="run each run as a task on this Ray cluster ('auto': the one this machine is attached to); "
                   "the journal stays here")
@track_option
@common_options
def sweep(campaign, continue_id, fixed_id, sets, ray_address, track, home, as_json):
    """The control and each variant of `plan`, for every seed, each its own run; then the comparison."""
    from pilotrun.rehearsal.training.sweep import sweep as run_sweep

    loaded = load(campaign, sets)

    from pilotrun.sheet.plan import fmt_duration

    def on_start(r):
        what = "control" if r["arm"] == "control" else f"variant {r['label']}"
        eta = f" — about {fmt_duration(r['eta_s'])} left for the sweep" if r["eta_s"] else ""
        line = f"run {r['index']}/{r['of']}: {what} seed {r['seed']}"
        head(line, done=r["index"] - 1, total=r["of"], eta_s=r["eta_s"])
        say(line + eta)

    def on_run(r):
        again = f" (supersedes {r['supersedes']})" if r["supersedes"] else ""
        node = r.get("node")
        where = f" on node {node['node_id'][:8]} ({node['host']})" if node else ""
        say(f"run {r['index']}/{r['of']}: {r['arm']} [{r['label']}] seed {r['seed']} → {r['run_id']} "
            f"{r['status']}{again}{where}")

    home = home_for(home, campaign)
    with tracking(loaded, home, track, campaign):
        with stage_progress("sweep"):
            result = run_sweep(loaded, home, continue_id=continue_id, on_run=on_run, sets=tuple(sets),
                               on_start=on_start, ray_address=ray_address, fixed_id=fixed_id)
        return emit(result, as_json)


@cli.command()
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              show_default="HOME/report.html", help="the HTML file to write")
@common_options
def report(out, home, as_json):
    """One self-contained HTML file: loss curves, comparison, the pilot's phase ledger, notes and decisions,
    and the sweep's runs against the pilot (memory bound, predicted vs actual time)."""
    from pathlib import Path

    from pilotrun.journal.store import Journal
    from pilotrun.report.html import write_report

    journal = Journal(home_for(home), create=False)
    with stage_progress("report"):  # a journal of hundreds of runs draws for a minute: each run's plots
        path = write_report(journal, Path(out) if out else journal.home / "report.html")
    return emit(StageResult("report", "ok", f"wrote {path}", ["open it in a browser; it needs no network"],
                            {"path": str(path)}), as_json)
