"""demo, init, import, validate, train, all."""

from __future__ import annotations

from pathlib import Path

import click

from pilotrun.cli.common import (campaign_argument, common_options, emit, fresh_processes_ready, home_for, live_renderer,
                                 load, set_option, track_option, tracking)
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
from pilotrun.errors import BadInput
from pilotrun.verdicts import StageResult
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


def budget_options(f):
    """`all`'s and `demo`'s bounds on the long stages (rehearsal/all.py Budgets)."""
    for decorator in reversed((
            click.option("--quick", is_flag=True, help="small budgets: overfit 4 examples ≤ 120 updates, resume at "
                                                       "update 2, train ≤ 8 updates (the options below override)"),
            click.option("--examples", type=click.IntRange(min=1), default=None, show_default="8",
                         help="overfit: training examples to memorise"),
            click.option("--max-updates", type=click.IntRange(min=1), default=None,
                         show_default="150, fewer when its time budget holds fewer",
                         help="overfit: the most updates the memorising run may take"),
            click.option("--at", type=click.IntRange(min=2), default=None, show_default="4",
                         help="resume: stop at this update and resume (the reference runs 2 × K)"),
            click.option("--train-updates", type=click.IntRange(min=1), default=None,
                         show_default="the campaign's train.updates", help="train: the most updates its run takes"))):
        f = decorator(f)
    return f


def _budgets(quick, examples, max_updates, at, train_updates):
    from dataclasses import replace

    from pilotrun.rehearsal.all import Budgets

    base = Budgets.quick() if quick else Budgets()
    given = {"examples": examples, "max_updates": max_updates, "at": at, "train_updates": train_updates}
    return replace(base, **{k: v for k, v in given.items() if v is not None},
                   **({"sized": False} if max_updates is not None else {}))


def _run_all(loaded, home, as_json, budgets) -> int:
    from pilotrun.rehearsal.all import run_all

    results = run_all(loaded, home, on_result=live_renderer(as_json), budgets=budgets)
    return emit(results, as_json, rendered=True, notes=budgets.lines(loaded, results))


@cli.command()
@click.option("--out", type=click.Path(file_okay=False), default="pilotrun-demo", show_default=True,
              help="folder to write the demo campaign and its data into")
@budget_options
@common_options
def demo(out, quick, examples, max_updates, at, train_updates, home, as_json):
    """Write the embedded demo campaign (tiny Llama from a config, byte tokenizer, synthetic data) and run `all`."""
    from pilotrun.demo.synth import write_demo

    path = write_demo(out)
    click.echo(f"demo campaign written to {path}", err=True)
    return _run_all(load(str(path)), home_for(home, str(path)), as_json,
                    _budgets(quick, examples, max_updates, at, train_updates))


@cli.command()
@click.argument("folder", type=click.Path(file_okay=False), default=".")
@click.option("--task", type=click.Choice(["causal-lm", "seq-cls", "preference"]), default="causal-lm",
              show_default=True)
@click.option("--force", is_flag=True, help="overwrite an existing campaign.yaml")
@common_options(home=False)
def init(folder, task, force, home, as_json):
    """Write a commented starter campaign.yaml for a task into FOLDER."""
    import os

    from pilotrun.campaign.templates import starter
    from pilotrun.journal.files import output_kind, write_output

    path = Path(folder) / "campaign.yaml"
    # a link counts as there even when it names nothing yet; with --force it is written through (the file it names
    # is replaced, the link stays), as every output file is; a folder or a device there is never replaced
    if os.path.lexists(path) and not force:
        raise BadInput("campaign.yaml already exists", where=str(path), fix="pass --force to overwrite it")
    kind = output_kind(path)
    if kind != "file":
        what = "a folder" if kind == "folder" else "not a file (a device, a pipe or the terminal)"
        raise BadInput(f"{path} is {what}; init writes the campaign there as a file", where=str(path),
                       fix=f"give init another FOLDER, or move {path} away")
    write_output(path, starter(task), str(path))
    return emit(StageResult("init", "ok", f"wrote {path}", [f"edit it, then run `pilotrun validate {path}`"],
                            {"path": str(path)}), as_json)


@cli.command(name="import")
@click.argument("source", type=click.Path(dir_okay=False))
@click.option("--from", "fmt", type=click.Choice(["axolotl", "hf"]), default=None,
              help="the source's format (default: detected from its keys, and said)")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="campaign file to write (default: campaign.yaml beside SOURCE)")
@click.option("--force", is_flag=True, help="overwrite an existing --out file")
@common_options(home=False)
def import_(source, fmt, out, force, home, as_json):
    """A campaign from an Axolotl YAML or a TrainingArguments / TRL SFTConfig dict (JSON or YAML): every
    setting carried, or named with what leaving it out does to the rehearsal. A pickled training_args.bin is
    refused, never loaded."""
    from pilotrun.campaign.importers import import_config

    imp = import_config(source, fmt, out, force=force)
    tool = {"axolotl": "Axolotl", "hf": "TrainingArguments/SFTConfig"}[imp.fmt]
    lines = [f"format: {tool}" + (" (detected; --from says it)" if imp.detected else ""),
             f"keys checked against: {'; '.join(imp.schemas)}",
             f"carried: {len(imp.carried)} settings (each commented with its source key in {imp.out.name})"]
    if imp.not_carried:
        lines.append(f"not carried ({len(imp.not_carried)}; also at the top of {imp.out.name}):")
        lines += [f"  {n.key}: {n.reason}" for n in imp.not_carried]
    if imp.to_set:
        lines.append("to set before `validate` passes: " + ", ".join(imp.to_set))
    lines.append(f"next: pilotrun validate {imp.out}")
    return emit(StageResult("import", "ok", f"wrote {imp.out} from {imp.source.name}", lines, imp.as_dict()),
                as_json)


@cli.command()
@campaign_argument
@set_option
@common_options(home=False)
def validate(campaign, sets, home, as_json):
    """Schema, files and consistency; prints the batch arithmetic. Runs nothing."""
    # lazy: looked up when called: tests replace it
    from pilotrun.rehearsal.data_checks.validate import validate as run_validate

    return emit(run_validate(load(campaign, sets), home=home), as_json)


@cli.command()
@campaign_argument
@set_option
@click.option("--seed", type=int, default=None, help="seed of this run (overrides the campaign's seed)")
@click.option("--supersedes", default=None, metavar="RUN_ID", help="the earlier run this one replaces")
@track_option
@common_options
def train(campaign, sets, seed, supersedes, track, home, as_json):
    """One run through the training loop, with a new run id."""
    from pilotrun.rehearsal.training.train import train_run

    sets = tuple(sets) + ((f"seed={seed}",) if seed is not None else ())

    loaded = load(campaign, sets)
    home = home_for(home, campaign)
    with tracking(loaded, home, track, campaign):
        with stage_progress("train"):
            result = train_run(loaded, home, supersedes=supersedes)
        return emit(result, as_json)


@cli.command(name="all")
@campaign_argument
@set_option
@budget_options
@track_option
@common_options
def all_(campaign, sets, quick, examples, max_updates, at, train_updates, track, home, as_json):
    """The full rehearsal, every stage in order, with one summary table (each stage's time, the budgets used)."""
    fresh_processes_ready()  # before the campaign is loaded: nothing of the run in the zygote
    loaded, home = load(campaign, sets), home_for(home, campaign)
    with tracking(loaded, home, track, campaign, campaign_run=True):
        return _run_all(loaded, home, as_json, _budgets(quick, examples, max_updates, at, train_updates))
