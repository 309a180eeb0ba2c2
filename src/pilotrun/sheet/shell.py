"""The one quoting path for what the launch files hand to a shell (``STEM.commands.sh``, ``STEM.sbatch``, the
SkyPilot task's ``setup`` and ``run`` blocks): every value that comes from the user, the file system or the
journal (paths, names, ``--set`` items, package pins, environment values) goes through here, never into an
f-string between double quotes, where ``$(…)`` and backticks still run.

- ``word``: one literal argument (POSIX single quotes; ``'`` written as ``'"'"'``), so a folder named
  ``camp $(touch X) ü`` is that folder and nothing runs.
- ``default``: ``NAME=${ENV:-'value'}``: the environment's value when set, else the literal; later lines
  read ``"$NAME"``, whose expansion is never evaluated again.
- ``export``: ``export NAME='value'`` (an allocator setting, a variable the job needs).
- ``under_home``: a path below the job's own ``$HOME``, the only expansion a value may ask for.
- ``comment``: user text in a ``#`` line (shell or YAML), kept on that one line: a line break or another
  control character is written escaped, so a name cannot end the comment and start a command.

The YAML around the SkyPilot blocks is written by PyYAML's safe dumper, which quotes what YAML needs; the
shell inside them is quoted here like the files'.
"""

from __future__ import annotations

import re
import shlex

from pilotrun.console.safe import escape_controls

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def word(value) -> str:
    """``value`` as one literal shell word."""
    return shlex.quote(str(value))


def words(values) -> str:
    return " ".join(word(v) for v in values)


def _name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"not a shell variable name: {name!r}")
    return name


def default(name: str, env: str, value) -> str:
    """``NAME=${ENV:-'value'}``: the variable ``env`` when the job's environment sets it, else ``value``."""
    return f"{_name(name)}=${{{_name(env)}:-{word(value)}}}"


def export(name: str, value) -> str:
    return f"export {_name(name)}={word(value)}"


def under_home(relative: str) -> str:
    """``"$HOME"/'relative'``: a path below the home of whoever runs the job."""
    return f'"$HOME"/{word(relative)}'


def comment(text) -> str:
    """``text`` for a ``#`` line: one line, control characters (line breaks included) escaped."""
    return escape_controls(str(text)).replace("\n", "\\n").replace("\t", " ")
