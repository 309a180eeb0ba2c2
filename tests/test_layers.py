"""Folders that only point down (tests/layering.py): the package passes, and a planted upward folder import, a
stage importing another stage, a folder circle, a module circle, a private helper taken across modules and an
unplaced module each fail, named."""

from __future__ import annotations

import shutil
from pathlib import Path

import layering

SRC = Path(__file__).resolve().parents[1] / "src"


def test_the_package_imports_only_downward_without_circles():
    assert layering.problems(SRC) == []


def test_every_layer_entry_names_code_that_exists():
    """A layer entry left behind by a move would place nothing and hide a module from the rule."""
    mods = layering.modules(SRC)
    for _, prefixes in layering.LAYERS:
        for p in prefixes:
            if p == "pilotrun.rehearsal" and not any(m.startswith(p) for m in mods):
                continue  # the grouped stages: placed before they exist, on purpose (relayout)
            assert any(m == p or m.startswith(p + ".") for m in mods), p


def _copy(tmp_path) -> Path:
    shutil.copytree(SRC / "pilotrun", tmp_path / "pilotrun", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(root: Path, module: str, line: str) -> None:
    path = root / (module.replace(".", "/") + ".py")
    path.write_text(path.read_text() + f"\n\ndef _planted():\n    {line}\n")


def test_a_planted_upward_import_fails_naming_both_modules(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.journal.archive", "from pilotrun.report.terminal import render_result")
    found = layering.problems(root)
    assert found == ["pilotrun.journal.archive (journal) imports pilotrun.report.terminal (report), a layer above it"]


def test_the_sheet_importing_a_stage_fails_as_an_upward_folder_import(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.sheet.options", "from pilotrun.rehearsal.memory.estimate import estimate")
    assert layering.problems(root) == [
        "pilotrun.sheet.options (sheet) imports pilotrun.rehearsal.memory.estimate (stages), a layer above it"]


def test_a_stage_importing_another_stage_fails(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.rehearsal.training.train", "from pilotrun.rehearsal.rental.sheet import sheet_stage")
    assert layering.problems(root) == [
        "pilotrun.rehearsal.training.train (pilotrun.rehearsal.training) imports pilotrun.rehearsal.rental.sheet "
        "(pilotrun.rehearsal.rental), another folder of its layer (stages)"]


def test_a_planted_folder_circle_fails_naming_its_folders(tmp_path):
    """On the ground floor files may lean on each other, but not round a circle: errors.py already speaks
    through console/safe.py, so console/progress.py importing errors closes one (no module circle)."""
    root = _copy(tmp_path)
    _append(root, "pilotrun.console.progress", "from pilotrun.errors import BadInput")
    assert layering.problems(root) == ["folder circle: pilotrun.console -> pilotrun.errors -> pilotrun.console"]


def test_every_folder_sits_in_one_layer():
    """No folder entry is split across layers: each package of src/pilotrun is one entry (or inside one)."""
    mods = layering.modules(SRC)
    for m in mods:
        folder = layering.folder_of(m)
        assert folder is not None, m
        assert m == folder[1] or m.startswith(folder[1] + "."), m
    entries = [p for _, prefixes in layering.LAYERS for p in prefixes]
    assert len(entries) == len(set(entries))
    # a package's modules all share its entry unless a deeper entry names a whole sub-package
    for p in entries:
        for q in entries:
            if q.startswith(p + ".") and "." in p:
                assert (SRC / q.replace(".", "/") / "__init__.py").is_file(), f"{q} splits {p} below package level"


def test_a_planted_circle_fails_naming_its_modules(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.data.labels", "from pilotrun.data.checks import data_checks")
    found = layering.problems(root)
    assert found == ["import circle: pilotrun.data.checks -> pilotrun.data.labels -> pilotrun.data.checks"]


def test_a_private_helper_taken_across_modules_fails(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.rehearsal.mechanics.overfit", "from pilotrun.engine.loop import _RanOut")
    assert layering.problems(root) == ["pilotrun.rehearsal.mechanics.overfit imports the private pilotrun.engine.loop._RanOut"]


def test_a_module_in_no_layer_fails(tmp_path):
    root = _copy(tmp_path)
    (root / "pilotrun" / "extras").mkdir()
    (root / "pilotrun" / "extras" / "__init__.py").write_text("")
    assert layering.problems(root) == ["pilotrun.extras is in no layer: add it to LAYERS"]


def test_a_new_stage_folder_must_be_placed(tmp_path):
    """rehearsal/'s sub-folders are the stages, each its own entry: a new one is not placed by rehearsal/ (all.py)."""
    root = _copy(tmp_path)
    (root / "pilotrun" / "rehearsal" / "tuning").mkdir()
    (root / "pilotrun" / "rehearsal" / "tuning" / "__init__.py").write_text("")
    (root / "pilotrun" / "rehearsal" / "tuning" / "sweep2.py").write_text("")
    assert layering.problems(root) == [
        "pilotrun.rehearsal.tuning is in no layer: add pilotrun.rehearsal.tuning to LAYERS",
        "pilotrun.rehearsal.tuning.sweep2 is in no layer: add pilotrun.rehearsal.tuning to LAYERS"]


def test_relative_imports_are_resolved(tmp_path):
    root = _copy(tmp_path)
    _append(root, "pilotrun.engine.loop", "from ..demo import synth")
    assert layering.problems(root) == [
        "pilotrun.engine.loop (engine) imports pilotrun.demo.synth (demo), a layer above it"]
