"""The ``pilotrun`` console script. Exit codes in one place: 0 ok, 1 failing verdict, 2 bad input, 3 internal."""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import traceback

import click

from pilotrun import __version__
from pilotrun.errors import EXIT_BAD_INPUT, EXIT_INTERNAL, BadInput

# Each module registers its verbs on ``cli`` when imported; heavy imports stay inside the verbs.
COMMAND_MODULES = (
    "pilotrun.cli.cmd_core",
    "pilotrun.cli.cmd_journal",
    "pilotrun.cli.cmd_sweep",
    "pilotrun.cli.cmd_memory",
    "pilotrun.cli.cmd_mechanics",
    "pilotrun.cli.cmd_data",
    "pilotrun.cli.cmd_sheet",
    "pilotrun.cli.cmd_pilot",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="pilotrun")
@click.option("--verbose", is_flag=True, help="show transformers' load reports and progress bars")
def cli(verbose: bool):
    """pilotrun rehearses a fine-tuning campaign on a small pilot, so the GPU rental is chosen from
    measurements and the real campaign runs once. Start with `pilotrun demo` or `pilotrun init`."""
    if verbose:
        os.environ["PILOTRUN_VERBOSE"] = "1"  # tasks/loading.quiet_transformers; fresh processes inherit it


for _name in COMMAND_MODULES:
    importlib.import_module(_name)


def _internal_error(exc: BaseException) -> int:
    fd, path = tempfile.mkstemp(prefix="pilotrun-error-", suffix=".txt")
    with os.fdopen(fd, "w") as f:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=f)
    click.echo(f"pilotrun: internal error: {type(exc).__name__}: {exc}\n"
               f"  the traceback is in {path}; please attach it (and `pilotrun env`) to a bug report", err=True)
    if os.environ.get("PILOTRUN_DEBUG"):
        traceback.print_exception(type(exc), exc, exc.__traceback__)
    return EXIT_INTERNAL


def run(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (tests call this; ``main`` exits with it)."""
    try:
        rv = cli.main(args=argv, prog_name="pilotrun", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort:
        click.echo("pilotrun: aborted", err=True)
        return 130
    except click.UsageError as e:
        e.show()
        return EXIT_BAD_INPUT
    except click.ClickException as e:
        e.show()
        return EXIT_BAD_INPUT
    except BadInput as e:
        click.echo(f"pilotrun: error: {e}", err=True)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        click.echo("pilotrun: interrupted", err=True)
        return 130
    except Exception as e:  # anything else is our bug, not the user's input
        return _internal_error(e)
    return int(rv or 0)


def main() -> None:
    code = run()
    if "torch.distributed" in sys.modules:  # one rank of a torchrun launch: see exit_rank
        from pilotrun.engine.distributed import exit_rank, is_initialized

        if is_initialized():
            exit_rank(code)
    sys.exit(code)
