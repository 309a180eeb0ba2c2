"""Options every verb shares (--home, --json), campaign loading, and rendering of stage results."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys

import click

from pilotrun.console.safe import safe
from pilotrun.errors import EXIT_OK
from pilotrun.journal.files import stdout_taken
from pilotrun.verdicts import exit_code
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).


def common_options(f=None, *, home: bool = True):
    """--home DIR and --json, on every verb. ``home=False``: a verb that writes no journal accepts --home
    (scripts pass it to every verb) but does not offer it in its --help."""

    def decorate(f):
        @click.option("--home", type=click.Path(file_okay=False), default=None, envvar="PILOTRUN_HOME",
                      hidden=not home, show_default="$PILOTRUN_HOME, else .pilotrun/ beside the campaign file",
                      help="journal folder")
        @click.option("--json", "as_json", is_flag=True,
                      help="the JSON envelope on stdout (README \"The JSON envelope\"); human output on stderr")
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            return f(*args, **kwargs)

        return wrapper

    return decorate(f) if f is not None else decorate


HOME_SOURCE = "pilotrun.home_source"  # the key in click's context ``meta``, which a command's contexts share


def home_source(ctx: click.Context | None = None) -> str | None:
    """Where the running verb's --home came from: "option", "env" ($PILOTRUN_HOME) or None (the default, or no
    journal resolved yet). ``ctx``: the command's click context or any context of its chain; the current one
    by default."""
    ctx = ctx or click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(HOME_SOURCE)


def _record_home_source() -> None:
    from click.core import ParameterSource

    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        source = ctx.get_parameter_source("home")
        ctx.meta[HOME_SOURCE] = {ParameterSource.COMMANDLINE: "option", ParameterSource.ENVIRONMENT: "env"}.get(source)


campaign_argument = click.argument("campaign", type=click.Path(dir_okay=False))


def load(campaign: str, sets: tuple[str, ...] = ()):
    from pilotrun.campaign.load import load_campaign, parse_set

    return load_campaign(campaign, parse_set(sets) if sets else None)


def home_for(home: str | None, campaign: str | None = None):
    from pilotrun.journal.store import resolve_home

    _record_home_source()
    return resolve_home(home, campaign)


def console(as_json: bool):
    """Human output: stdout, or stderr under --json or where an output file took stdout (``--out /dev/stdout``), at
    one width: ``PILOTRUN_WIDTH``, else a terminal's own, else ``COLUMNS``, else (a pipe or a file with neither set)
    a width no line reaches, so a log is never wrapped at an arbitrary 80."""
    file = sys.stderr if as_json or stdout_taken() else sys.stdout
    return _console_class()(file=file, highlight=False, soft_wrap=False, width=output_width(file))


def output_width(file) -> int | None:
    """The width human output is laid out at (None: the terminal's own; see ``console``)."""
    import os

    for key in ("PILOTRUN_WIDTH",) + (() if _isatty(file) else ("COLUMNS",)):
        value = os.environ.get(key, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return None if _isatty(file) else UNWRAPPED


@functools.cache
def _console_class():
    from rich.console import Console

    class QuietOnBrokenPipe(Console):
        def on_broken_pipe(self) -> None:  # rich exits 1; cli.main.run turns this into a quiet exit 0
            self.quiet = True
            raise BrokenPipeError

    return QuietOnBrokenPipe


UNWRAPPED = 10_000


def _isatty(file) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


def live_renderer(as_json: bool):
    """A callback that renders each stage result as soon as it is ready."""
    from pilotrun.report.terminal import render_result

    con = console(as_json)
    return lambda r: render_result(safe(r), con)


def _verb() -> str | None:
    ctx = click.get_current_context(silent=True)
    return ctx.info_name if ctx is not None else None


def emit(results, as_json: bool, *, rendered: bool = False, notes: list[str] | None = None) -> int:
    """Render stage results (human on stdout, or the JSON envelope on stdout and human on stderr);
    return the exit code. Several results (``all``) end with one summary table (``notes`` under it; with
    ``--verbose`` where each stage's time went; the JSON has it always, each stage's ``spent``)."""
    from pilotrun.cli.envelope import for_results, write
    from pilotrun.report.terminal import render_result, render_summary

    results = results if isinstance(results, list) else [results]
    con = console(as_json)
    shown = safe(results)  # control characters in record excerpts, names, labels are printed escaped
    if not rendered:
        for r in shown:
            render_result(r, con)
    if len(results) > 1:
        render_summary(shown, con, notes, breakdown=bool(os.environ.get("PILOTRUN_VERBOSE")))
    code = exit_code(results)
    if as_json:
        write(for_results(results, _verb(), code))
    return code


def emit_data(data, as_json: bool, render, summary: str = "", verdict: str = "ok") -> int:
    """For journal verbs: the envelope with ``data`` (and a human rendering on stderr), or the rendering; ``verdict``
    "warn" for a verb that did its work and has something to say about it (exit 0)."""
    from pilotrun.cli.envelope import envelope, write

    render(console(as_json), safe(data))  # notes, run names ... printed with control characters escaped
    if as_json:
        write(envelope(exit_code=EXIT_OK, verb=_verb(), verdict=verdict, summary=summary, data=data))
    return EXIT_OK


set_option = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                          help="override a campaign key (repeatable)")


track_option = click.option("--track", type=click.Choice(["mlflow", "wandb"]), default=None,
                            help="log the runs to this tracker as they go, as the campaign's track key does "
                                 "(README \"Trackers\"); a tracker that fails never stops training")


@contextlib.contextmanager
def tracking(loaded, home, track: str | None, campaign: str, *, campaign_run: bool = False):
    """Live logging around a verb, when ``--track`` or the campaign's ``track`` key asks for it; at the end the
    sweeps it touched (and with ``campaign_run`` the campaign's own run: sheet, launch files, report) are sent
    too, and what happened is said on stderr."""
    cfg = loaded.campaign.track
    to = track or (cfg.to if cfg else None)
    if to is None:
        yield None
        return
    from pilotrun.integrations.trackers.export import make_tracker
    from pilotrun.integrations.trackers.live import LiveTracker
    from pilotrun.journal.observers import observing

    uri = cfg.uri if cfg and cfg.to == to else None
    experiment = cfg.experiment if cfg and cfg.to == to else None
    name = loaded.campaign.name

    def final(ex):
        for sweep_id in list(ex.sweeps):
            ex.sweep(sweep_id)
        if campaign_run:
            ex.campaign(name)

    hint = f"pilotrun export {campaign} --to {to}" + (f" --home {home}" if home_source() == "option" else "")
    live = LiveTracker(lambda: make_tracker(to, home, uri=uri, experiment=experiment), home, export_hint=hint,
                       final=final)
    from pilotrun.integrations.trackers.live import DRAIN_S, DRAIN_STOPPED_S

    drain = DRAIN_STOPPED_S  # an error or Ctrl-C: the journal has the runs; the user is not kept waiting
    try:
        with observing(live):
            yield live
        drain = DRAIN_S
    finally:
        for line in live.close(drain, say=lambda s: click.echo(f"pilotrun: {s}", err=True)):
            click.echo(("pilotrun: warning: " if live.trouble else "") + line, err=True)


def fresh_processes_ready() -> None:
    """A verb whose checks start fresh processes (resume, verify, all), run as the console script: the zygote
    that forks them starts now, importing torch and transformers while the verb goes on (engine/fresh.py).
    Called in a process pilotrun did not start (a test calling ``run``), under torchrun, or with
    ``PILOTRUN_FRESH=cold``, nothing starts: the checks start cold interpreters, as whenever no zygote runs."""
    from pilotrun import startup
    from pilotrun.engine import fresh
    from pilotrun.engine.distributed import under_launcher

    # under torchrun each rank's fresh process is a rank of a new world, started cold (resume_ranks.run_joined)
    if startup.seconds() is not None and os.environ.get(fresh.COLD_ENV) != "cold" and not under_launcher():
        fresh.start()
