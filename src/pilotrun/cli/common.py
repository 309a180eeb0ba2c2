"""Options every verb shares (--home, --json), campaign loading, and rendering of stage results."""

from __future__ import annotations

import functools
import json
import sys

import click

from pilotrun.errors import EXIT_OK


def common_options(f):
    """--home DIR and --json, on every verb."""

    @click.option("--home", type=click.Path(file_okay=False), default=None, envvar="PILOTRUN_HOME",
                  help="journal folder (default: .pilotrun/ beside the campaign file; env PILOTRUN_HOME)")
    @click.option("--json", "as_json", is_flag=True, help="machine-readable result on stdout; human output on stderr")
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)

    return wrapper


campaign_argument = click.argument("campaign", type=click.Path(dir_okay=False))


def load(campaign: str, sets: tuple[str, ...] = ()):
    from pilotrun.campaign.load import load_campaign, parse_set

    return load_campaign(campaign, parse_set(sets) if sets else None)


def home_for(home: str | None, campaign: str | None = None):
    from pilotrun.journal.store import resolve_home

    return resolve_home(home, campaign)


def console(as_json: bool):
    from rich.console import Console

    return Console(file=sys.stderr if as_json else sys.stdout, highlight=False, soft_wrap=False)


def live_renderer(as_json: bool):
    """A callback that renders each stage result as soon as it is ready."""
    from pilotrun.report.terminal import render_result

    con = console(as_json)
    return lambda r: render_result(r, con)


def emit(results, as_json: bool, *, extra: dict | None = None, rendered: bool = False) -> int:
    """Render stage results (human on stdout, or JSON on stdout and human on stderr); return the exit code.

    Several results (``all``) end with one summary table.
    """
    from pilotrun.report.terminal import render_result, render_summary
    from pilotrun.verdicts import exit_code

    results = results if isinstance(results, list) else [results]
    con = console(as_json)
    if not rendered:
        for r in results:
            render_result(r, con)
    if len(results) > 1:
        render_summary(results, con)
    if as_json:
        payload = results[0].to_json() if len(results) == 1 else {"stages": [r.to_json() for r in results]}
        if extra:
            payload.update(extra)
        click.echo(json.dumps(payload, indent=2, default=str))
    return exit_code(results)


def emit_data(data, as_json: bool, render) -> int:
    """For journal verbs: JSON of the data, or a human rendering of it."""
    if as_json:
        click.echo(json.dumps(data, indent=2, default=str))
        render(console(True), data)
    else:
        render(console(False), data)
    return EXIT_OK
