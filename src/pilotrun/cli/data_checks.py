"""inspect, leakage, split: what the loss sees, what crosses the splits, and a split by unit."""

from __future__ import annotations

import click

from pilotrun.cli.common import campaign_argument, common_options, console, emit, load, set_option
from pilotrun.cli.main import cli
from pilotrun.console.progress import stage_progress
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).

_SPLITS = click.Choice(["train", "validation", "test"])


@cli.command()
@campaign_argument
@click.option("-n", "n", type=click.IntRange(min=0), default=3, show_default=True,
              help="examples to render token by token")
@click.option("--split", type=_SPLITS, default="train", show_default=True, help="the split the examples come from")
@set_option
@common_options(home=False)
def inspect(campaign, n, split, sets, home, as_json):
    """N examples exactly as the loss sees them (trained / masked / padding), then the data-set-wide checks."""
    from pilotrun.report.tokens import render_examples
    from pilotrun.rehearsal.data_checks.inspect import inspect as run_inspect

    loaded = load(campaign, sets)
    with stage_progress("inspect"):  # every record of every split goes through task.encode: minutes for millions
        result = run_inspect(loaded, n=n, split=split)
    if n:
        render_examples(result.data["examples"], console(as_json), split)
    return emit(result, as_json)


@cli.command()
@campaign_argument
@click.option("--near-threshold", type=float, default=0.8, show_default=True,
              help="estimated Jaccard similarity (word 3-gram shingles) from which two units count as near duplicates")
@set_option
@common_options(home=False)
def leakage(campaign, near_threshold, sets, home, as_json):
    """Units of data.group_by shared by splits, exact and near duplicates across splits, period order."""
    from pilotrun.rehearsal.data_checks.leakage import leakage as run_leakage

    loaded = load(campaign, sets)
    with stage_progress("leakage"):  # every record of every split hashed and signed: minutes for millions
        result = run_leakage(loaded, near_threshold)
    return emit(result, as_json)


@cli.command()
@click.argument("data", type=click.Path(dir_okay=False))
@click.option("--by", "by", default=None, metavar="FIELD",
              help="the unit no split may share (conversation, patient ...; a list field's whole value is one unit); "
                   "left out: each record is its own unit, exact copies kept together")
@click.option("--period", default=None, metavar="FIELD", help="a time field: earliest periods go to train")
@click.option("--ratios", default="0.8,0.1,0.1", show_default=True, help="train,validation[,test] shares, summing to 1")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="folder for train/validation/test.jsonl")
# the campaign's seed range (campaign.schema.SEED_MAX), written here so that `--help` does not import pydantic
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), default=0, show_default=True,
              help="seed of the unit order (0..4294967295, as the campaign's seed)")
@common_options(home=False)
def split(data, by, period, ratios, out, seed, home, as_json):
    """A deterministic split of DATA by unit (or by period; without --by, by record) into
    OUT/{train,validation,test}.jsonl."""
    from pilotrun.data.split import parse_ratios, split_file

    parsed = parse_ratios(ratios)
    with stage_progress("split"):  # reading, placing and writing millions of records is a minute
        result = split_file(data, by, parsed, out, seed=seed, period=period)
    return emit(result, as_json)
