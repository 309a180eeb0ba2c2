"""A pytest plugin: one zygote for the whole session (engine/fresh.py), so the resume and verify checks that
tests run in-process fork their fresh processes from it instead of importing torch and transformers again
in a cold interpreter each time. Register it with ``pytest_plugins = ["zygote_plugin"]`` in conftest.py (or
``-p zygote_plugin`` with tests/ on the path). A test that must take the cold path sets PILOTRUN_FRESH=cold
(tests/test_resume.py's scheduler case does)."""

import pytest


@pytest.fixture(scope="session", autouse=True)
def _pilotrun_zygote():
    from pilotrun.engine import fresh

    fresh.start()
    yield
    fresh.stop()
