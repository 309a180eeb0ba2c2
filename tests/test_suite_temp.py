"""The suite leaves nothing in the temp directory (issue 50): conftest points TMPDIR at a folder of the run's own and
fails the run naming what is left there at the end. These check that the watch is live and that it names a leak."""

from __future__ import annotations

import os
import tempfile

from conftest import temp_leftovers


def test_the_suite_runs_in_its_watched_temp_directory():
    watched = os.environ.get("PILOTRUN_SUITE_TMPDIR")
    assert watched, "conftest did not start the temp-directory watch"
    assert tempfile.gettempdir() == watched == os.environ["TMPDIR"]


def test_a_planted_leak_is_named_and_pytests_own_base_is_not(tmp_path):
    (tmp_path / "pytest-of-someone").mkdir()
    assert temp_leftovers(tmp_path) == []
    (tmp_path / "pilotrun-ray-host-123-abcd").mkdir()
    (tmp_path / "pytorch-errorfile-x1.pickle").write_bytes(b"")
    (tmp_path / "torchelastic_abc").mkdir()
    assert temp_leftovers(tmp_path) == ["pilotrun-ray-host-123-abcd", "pytorch-errorfile-x1.pickle", "torchelastic_abc"]
