"""The ``pilotrun`` console script. Exit codes in one place: 0 ok, 1 failing verdict, 2 bad input, 3 internal."""

from __future__ import annotations

import gc
import importlib
import os
import sys
import tempfile
import traceback

import click

from pilotrun import __version__, signals, startup
from pilotrun.cli.common import home_source
from pilotrun.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, BadInput, from_os_error, not_utf8
from pilotrun.signals import exit_code_of, interruption
# The verbs' work is imported inside each command: `pilotrun --help` imports this module (lazy on purpose).

# Each module registers its verbs on ``cli`` when imported; heavy imports stay inside the verbs.
COMMAND_MODULES = (
    "pilotrun.cli.start",
    "pilotrun.cli.journal",
    "pilotrun.cli.sweep_report",
    "pilotrun.cli.estimate_fit",
    "pilotrun.cli.mechanics",
    "pilotrun.cli.data_checks",
    "pilotrun.cli.sheet_env",
    "pilotrun.cli.pilot",
)


# --help lists the verbs in the order of a rehearsal, then the journal's
VERB_ORDER = ("demo", "init", "import", "validate", "inspect", "leakage", "split", "overfit", "estimate", "pilot", "fit",
              "resume", "verify", "train", "sweep", "sheet", "all", "report", "export", "runs", "show", "note", "archive",
              "env")


class RehearsalOrder(click.Group):
    def list_commands(self, ctx):
        known = [v for v in VERB_ORDER if v in self.commands]
        return known + sorted(set(self.commands) - set(known))

    def invoke(self, ctx):
        """The verb, run; bad input in a home taken from $PILOTRUN_HOME names the variable. Read here, where the
        verb's click context (``meta``, shared with this one) still says where its home came from."""
        try:
            return super().invoke(ctx)
        except BadInput as e:
            _blame_home_variable(e, home_source(ctx))
            raise


@click.group(cls=RehearsalOrder,
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="pilotrun")
@click.option("--verbose", is_flag=True, help="show transformers' load reports and progress bars")
def cli(verbose: bool):
    """pilotrun rehearses a fine-tuning campaign on a small pilot, so the GPU rental is chosen from
    measurements and the real campaign runs once. Start with `pilotrun demo` or `pilotrun init`."""
    _own_variables()
    if verbose:
        os.environ["PILOTRUN_VERBOSE"] = "1"  # tasks/loading.quiet_transformers; fresh processes inherit it


MIN_WIDTH = 40
"""The narrowest output pilotrun lays out (a table falls back to one ``column  value`` block per row there)."""


def _own_variables() -> None:
    """pilotrun's own settings in the environment, checked as its options are (empty reads as unset): a value the
    readers cannot use was dropped without a word (``PILOTRUN_WIDTH=wide``, ``PILOTRUN_HEARTBEAT_S=nan``: the log
    went unwrapped, its beats every 30 s), or taken as said (``PILOTRUN_WIDTH=1`` printed a character a line,
    ``PILOTRUN_HEARTBEAT_S=-5`` a beat every 50 ms)."""
    import math

    width = os.environ.get("PILOTRUN_WIDTH", "").strip()
    if width and not (width.isdigit() and int(width) >= MIN_WIDTH):
        raise BadInput(f"PILOTRUN_WIDTH={width!r} is not a width of at least {MIN_WIDTH} columns",
                       where="$PILOTRUN_WIDTH", fix="set it to the columns output is laid out at (e.g. 100), or unset "
                                                    "it for the terminal's width")
    beat = os.environ.get("PILOTRUN_HEARTBEAT_S", "").strip()
    try:
        seconds = float(beat) if beat else 1.0
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise BadInput(f"PILOTRUN_HEARTBEAT_S={beat!r} is not a finite number of seconds above 0",
                       where="$PILOTRUN_HEARTBEAT_S", fix="set the seconds between a log's progress lines (e.g. 30, "
                                                          "the default), or unset it")


for _name in COMMAND_MODULES:
    importlib.import_module(_name)


def _refuse_empty(ctx: click.Context, param: click.Parameter, value):
    """A value given as "" or blanks on the command line (an unset shell variable: ``--out "$OUT"``) is refused.
    Left through, "" reads as no value (``--gpu-memory ""`` estimated with no limit, ``import --out ""`` wrote
    beside the source) or as the current folder (``split --out ""``, ``show --tensorboard ""`` wrote there).
    So is a value, from the command line or the environment ($PILOTRUN_HOME), holding bytes that are not UTF-8 (a
    Latin-1 terminal, a file name in another encoding): ``note`` and ``--set name=…`` were exit 3 writing it, and a
    campaign path holding one passed ``validate``, then ``train`` was exit 3 after building its model."""
    from click.core import ParameterSource

    values = value if isinstance(value, (tuple, list)) else (value,)
    if ctx.get_parameter_source(param.name) is ParameterSource.COMMANDLINE:
        if any(isinstance(v, str) and not v.strip() for v in values):
            raise click.BadParameter("it is empty: give a value, or leave it out")
    bad = next((b for b in map(not_utf8, (v for v in values if isinstance(v, str))) if b), None)
    if bad:
        env = ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT and param.envvar
        raise click.BadParameter(f"it holds {bad}, which is not UTF-8 (a terminal or a file name in another "
                                 "encoding); pilotrun keeps what it is given as UTF-8 text: give the value in UTF-8, "
                                 "or rename the file with a UTF-8 name",
                                 param_hint=f"${env} (for {param.opts[0]})" if env else None)
    return value


for _command in cli.commands.values():  # every verb's options and arguments but its flags
    for _param in _command.params:
        if not getattr(_param, "is_flag", False):
            assert _param.callback is None, f"{_command.name} {_param.name}: _refuse_empty would replace its callback"
            _param.callback = _refuse_empty


def _internal_error(exc: BaseException) -> tuple[int, str]:
    fd, path = tempfile.mkstemp(prefix="pilotrun-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=f)
    click.echo(f"pilotrun: internal error: {type(exc).__name__}: {exc}\n"
               f"  the traceback is in {path}; please attach it (and `pilotrun env`) to a bug report", err=True)
    if os.environ.get("PILOTRUN_DEBUG"):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    return EXIT_INTERNAL, path


def _wants_json(argv: list[str]) -> bool:
    args = argv[:argv.index("--")] if "--" in argv else argv
    return "--json" in args


def _verb_of(argv: list[str]) -> str | None:
    return next((a for a in argv if a in cli.commands), None)


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; ``main`` exits with it). Under --json an
    error is also written to stdout as the envelope (cli/envelope.py) with ``ok`` false."""
    argv = list(sys.argv[1:] if argv is None else argv)
    error = None
    try:
        rv = cli.main(args=argv, prog_name="pilotrun", standalone_mode=False)
        return int(rv or 0)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except BrokenPipeError:
        return _broken_pipe()
    except click.Abort as e:
        if isinstance(e.__cause__, KeyboardInterrupt):  # click wraps Ctrl-C and our signals (pilotrun.signals)
            code, error = _interrupted(e.__cause__)
        else:
            click.echo("pilotrun: aborted", err=True)
            code, error = 130, {"kind": "interrupted", "message": "aborted"}
    except click.ClickException as e:  # usage errors included
        e.show()
        code, error = EXIT_BAD_INPUT, {"kind": "usage", "message": e.format_message(), "where": None, "file": None,
                                       "line": None, "key": _usage_key(e), "fix": "see `pilotrun --help`"}
    except BadInput as e:
        click.echo(f"pilotrun: error: {e}", err=True)
        from pilotrun.cli.envelope import error_info

        code, error = EXIT_BAD_INPUT, error_info(e, "bad_input")
    except KeyboardInterrupt as e:
        code, error = _interrupted(e)
    except Exception as e:  # anything else is our bug, not the user's input
        stopped = interruption(e)  # unless it is part of a stop: after a signal, or a peer rank lost
        refused = from_os_error(e)  # or the system's refusal of a path: no space, a name too long, read-only ...
        if stopped is not None:
            code, error = _interrupted(stopped)
        elif refused is not None:
            click.echo(f"pilotrun: error: {refused}", err=True)
            from pilotrun.cli.envelope import error_info

            code, error = EXIT_BAD_INPUT, error_info(refused, "bad_input")
        else:
            code, path = _internal_error(e)
            error = {"kind": "internal", "message": f"{type(e).__name__}: {e}", "traceback": path}
    if _wants_json(argv):
        from pilotrun.cli.envelope import envelope, write

        try:
            write(envelope(exit_code=code, verb=_verb_of(argv), summary=error["message"].splitlines()[0]
                           if error.get("message") else "", error=error))
        except BrokenPipeError:
            return _broken_pipe()
    return code


def _interrupted(e: KeyboardInterrupt) -> tuple[int, dict]:
    """Ctrl-C, or a signal (pilotrun.signals.Preempted): exit 128 + its number, the reason the run recorded."""
    from pilotrun.journal.runs import INTERRUPTED

    e = interruption(e) or e  # a bare KeyboardInterrupt a library raised for our signal names that signal
    reason = getattr(e, "reason", INTERRUPTED)
    click.echo(f"pilotrun: interrupted: {reason}", err=True)
    return exit_code_of(e), {"kind": "interrupted", "message": reason}


def _blame_home_variable(e: BadInput, source: str | None) -> None:
    """A home that came from $PILOTRUN_HOME (``source`` "env"), not --home: the message names the variable."""
    if source != "env" or not isinstance(e.where, str):
        return
    home = os.environ.get("PILOTRUN_HOME", "")
    if e.where == "--home" or (home and (e.where.startswith(home) or home.startswith(e.where))):
        e.where = f"$PILOTRUN_HOME={home}"
        e.fix = (e.fix or "") + " (the home came from the environment variable PILOTRUN_HOME: fix or unset it, " \
                                "or pass --home)"
        e.args = (f"{e.where}: {e.detail}\n  fix: {e.fix}",)


def _usage_key(e: click.ClickException) -> str | None:
    param = getattr(e, "param", None)
    if param is not None:
        return (param.opts[0] if getattr(param, "opts", None) else param.name)
    return getattr(e, "option_name", None)


def _broken_pipe() -> int:
    """The reader of our output went away (``pilotrun runs | head``): not a failed check. Point stdout at
    /dev/null so the interpreter's final flush does not complain either."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def main() -> None:
    startup.mark()  # the time plan's start-up term: this process is pilotrun's own
    try:
        signals.install()  # SIGTERM and SIGHUP end a run 'interrupted' as Ctrl-C does
    except BadInput as e:
        click.echo(f"pilotrun: error: {e}", err=True)
        sys.exit(EXIT_BAD_INPUT)
    code = run()
    if "torch.distributed" in sys.modules:  # one rank of a torchrun launch: see exit_rank
        from pilotrun.engine.distributed import exit_rank, is_initialized

        try:
            ranked = is_initialized()
        except Exception:  # noqa: BLE001 - torch's import was cut short (a signal mid-import): no process group
            ranked = False
        if ranked:
            exit_rank(code)
    # The work is done and written: the interpreter's collections at exit need not walk every object left
    # (~10⁶ once torch and transformers are imported: ~0.5 s of CPU on 2 cores). Freed by reference count
    # as before; only the cyclic collector's passes skip them.
    gc.freeze()
    sys.exit(code)
