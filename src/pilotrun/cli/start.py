"""demo, init, validate, train, all."""

from __future__ import annotations

from pathlib import Path

import click

from pilotrun.cli.common import campaign_argument, common_options, emit, home_for, live_renderer, load, set_option
from pilotrun.cli.main import cli
from pilotrun.errors import BadInput


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default="pilotrun-demo", show_default=True,
              help="folder to write the demo campaign and its data into")
@common_options
def demo(out, home, as_json):
    """Write the embedded demo campaign (tiny Llama from a config, byte tokenizer, synthetic data) and run `all`."""
    from pilotrun.demo.synth import write_demo
    from pilotrun.rehearsal.all import run_all

    path = write_demo(out)
    click.echo(f"demo campaign written to {path}", err=True)
    loaded = load(str(path))
    results = run_all(loaded, home_for(home, str(path)), on_result=live_renderer(as_json))
    return emit(results, as_json, rendered=True)


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False), default=".")
@click.option("--task", type=click.Choice(["causal-lm", "seq-cls"]), default="causal-lm", show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing campaign.yaml")
@common_options(home=False)
def init(folder, task, force, home, as_json):
    """Write a commented starter campaign.yaml for a task into FOLDER."""
    from pilotrun.campaign.templates import starter
    from pilotrun.journal.files import atomic_write_text
    from pilotrun.verdicts import StageResult

    path = Path(folder) / "campaign.yaml"
    if path.exists() and not force:
        raise BadInput("campaign.yaml already exists", where=str(path), fix="pass --force to overwrite it")
    atomic_write_text(path, starter(task))
    return emit(StageResult("init", "ok", f"wrote {path}", [f"edit it, then run `pilotrun validate {path}`"],
                            {"path": str(path)}), as_json)


@cli.command()
@campaign_argument
@set_option
@common_options(home=False)
def validate(campaign, sets, home, as_json):
    """Schema, files and consistency; prints the batch arithmetic. Runs nothing."""
    from pilotrun.rehearsal.data_checks.validate import validate as run_validate

    return emit(run_validate(load(campaign, sets), home=home), as_json)


@cli.command()
@campaign_argument
@set_option
@click.option("--seed", type=int, default=None, help="seed of this run (overrides the campaign's seed)")
@click.option("--supersedes", default=None, metavar="RUN_ID", help="the earlier run this one replaces")
@common_options
def train(campaign, sets, seed, supersedes, home, as_json):
    """One run through the training loop, with a new run id."""
    from pilotrun.rehearsal.training.train import train_run

    sets = tuple(sets) + ((f"seed={seed}",) if seed is not None else ())
    from pilotrun.report.progress import stage_progress

    loaded = load(campaign, sets)
    with stage_progress("train"):
        result = train_run(loaded, home_for(home, campaign), supersedes=supersedes)
    return emit(result, as_json)


@cli.command(name="all")
@campaign_argument
@set_option
@common_options
def all_(campaign, sets, home, as_json):
    """The full rehearsal, every stage in order, with one summary table."""
    from pilotrun.rehearsal.all import run_all

    results = run_all(load(campaign, sets), home_for(home, campaign), on_result=live_renderer(as_json))
    return emit(results, as_json, rendered=True)
