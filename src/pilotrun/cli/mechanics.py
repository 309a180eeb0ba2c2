"""overfit, resume, verify, archive — and the hidden worker verbs that resume and verify start in a fresh process."""

from __future__ import annotations

import click

from pilotrun.cli.common import (campaign_argument, common_options, emit, emit_data, fresh_processes_ready, home_for,
                                 load, set_option)
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


@cli.command()
@campaign_argument
@click.option("--examples", type=click.IntRange(min=1), default=8, show_default=True,
              help="training examples to memorise")
@click.option("--max-updates", type=click.IntRange(min=1), default=None,
              show_default="as many as 120 s hold at a pilot's seconds per update, 40..150",
              help="the most updates the memorising run may take (it stops as soon as it memorises)")
@set_option
@common_options
def overfit(campaign, examples, max_updates, sets, home, as_json):
    """Accumulation arithmetic on the task's own loss, then can the loop memorise N examples."""
    from pilotrun.rehearsal.mechanics.overfit import overfit as run_overfit

    loaded = load(campaign, sets)
    with stage_progress("overfit"):
        result = run_overfit(loaded, home_for(home, campaign), examples=examples, max_updates=max_updates or 150,
                             sized=max_updates is None)
    return emit(result, as_json)


@cli.command()
@campaign_argument
@click.option("--at", type=click.IntRange(min=2), default=None,
              show_default="4", help="stop at this update and resume in a new process (the reference runs 2 × K)")
@set_option
@common_options
def resume(campaign, at, sets, home, as_json):
    """Stop at update K, resume in a fresh process, compare with an uninterrupted run of 2K updates."""
    fresh_processes_ready()  # before the campaign is loaded: nothing of the run in the zygote
    from pilotrun.rehearsal.mechanics.resume import resume as run_resume

    loaded = load(campaign, sets)
    with stage_progress("resume"):
        result = run_resume(loaded, home_for(home, campaign), at=at)
    return emit(result, as_json)


@cli.command()
@click.argument("run_id")
@common_options
def verify(run_id, home, as_json):
    """Reload a run's artifact in a fresh process (hashes checked first) and reproduce its control predictions."""
    fresh_processes_ready()
    from pilotrun.rehearsal.mechanics.verify import verify as run_verify

    with stage_progress("verify"):
        result = run_verify(home_for(home), run_id)
    return emit(result, as_json)


@cli.command()
@click.argument("run_id")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="the .tar.gz to write")
@common_options
def archive(run_id, out, home, as_json):
    """Pack a run's folder (artifact, config, revisions, metrics, control predictions, README) into a .tar.gz."""
    from pilotrun.journal.archive import pack
    from pilotrun.journal.store import Journal

    with stage_progress("archive"):  # gzip packs ~30 MiB/s: a run with a few GB of checkpoints takes minutes
        data = pack(Journal(home_for(home), create=False), run_id, out)
    said = f"run {data['run_id']}: {len(data['files'])} files packed into {data['path']}" + (
        f" ({data['bytes']} bytes)" if data["bytes"] is not None else "")
    if data["problems"]:  # packed as they are (a backup keeps what there is), said as verify says it
        said += (f"; WARN: {len(data['problems'])} file(s) no longer match the run's manifest, so `pilotrun verify` "
                 "refuses this archive's run: " + "; ".join(data["problems"][:5]) + ("; …" if len(data["problems"]) > 5
                                                                                     else ""))
    return emit_data(data, as_json, lambda con, d: con.print(said, markup=False), summary=said,
                     verdict="warn" if data["problems"] else "ok")


@cli.command(name="_resume-worker", hidden=True)
@click.argument("spec", type=click.Path(exists=True, dir_okay=False))
def resume_worker(spec):
    """Internal: the fresh process of `resume` (loads the saved state, continues, writes its history)."""
    from pilotrun.rehearsal.mechanics.resume import resume_worker as work

    return work(spec)


@cli.command(name="_verify-worker", hidden=True)
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("control", type=click.Path(exists=True, dir_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
def verify_worker(run_dir, control, out):
    """Internal: the fresh process of `verify` (loads the artifact, predicts the control inputs)."""
    from pilotrun.rehearsal.mechanics.verify import verify_worker as work

    return work(run_dir, control, out)
