"""pilot."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, emit, home_for, load, set_option
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


@cli.command()
@campaign_argument
@click.option("--memory-limit", default=None, metavar="SIZE",
              show_default="hardware.memory_per_gpu", help="peak allowed per phase, e.g. 24GiB")
@set_option
@common_options
def pilot(campaign, memory_limit, sets, home, as_json):
    """Every phase once (load, first_step, steady_step, eval_longest, save, export, reload) on the
    worst-case inputs: one ledger row per phase per rank."""
    from pilotrun.rehearsal.memory.pilot import pilot as run_pilot

    loaded = load(campaign, sets)
    with stage_progress("pilot"):
        result = run_pilot(loaded, home_for(home, campaign), memory_limit=memory_limit)
    return emit(result, as_json)
