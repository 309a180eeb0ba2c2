"""The suite's own order (tests/conftest.py): the longest test files are collected first, so that ``make test``'s
workers, handed a whole file at a time in that order, end together; and an optional library is found without
being imported at collection."""

from __future__ import annotations

import sys
from pathlib import Path

import conftest

TESTS = Path(__file__).resolve().parent


def test_every_file_named_longest_first_is_a_test_file():
    """A name that is not a file (renamed, removed, misspelt) would quietly run its file last again."""
    files = {p.name for p in TESTS.rglob("test_*.py")}
    assert [n for n in conftest.LONGEST_FIRST if n not in files] == []
    assert len(set(conftest.LONGEST_FIRST)) == len(conftest.LONGEST_FIRST)


def test_this_session_collected_the_longest_files_first_and_each_file_whole(request):
    order = []
    for item in request.session.items:
        if not order or order[-1] != item.path:
            order.append(item.path)
    assert len(order) == len(set(order)), "a file's tests were split apart"
    names = [p.name for p in order]
    listed = [n for n in conftest.LONGEST_FIRST if n in names]  # those this selection holds
    assert names[:len(listed)] == listed


def test_a_missing_library_skips_and_a_found_one_is_not_imported():
    missing = conftest.needs("pilotrun_no_such_library")
    assert missing.args == (True,) and "pilotrun_no_such_library" in missing.kwargs["reason"]
    assert conftest.needs("pilotrun_no_such_library.sub").args == (True,)  # its parent package missing
    said = conftest.needs("pilotrun_no_such_library", "pip install it").kwargs["reason"]
    assert said == "pip install it"
    assert conftest.needs("json").args == (False,)
    # found, not imported: a module of the standard library no test imports
    assert "this" not in sys.modules
    assert conftest.needs("this").args == (False,) and "this" not in sys.modules
