"""Tasks: the Task protocol, the built-in causal-lm, seq-cls and preference tasks, and custom tasks by import path."""

from __future__ import annotations

import importlib

from pilotrun.errors import BadInput
from pilotrun.tasks import loading
from pilotrun.tasks.base import IGNORE, REQUIRED_METHODS, Example, Task
from pilotrun.tasks.causal_lm import CausalLMTask
from pilotrun.tasks.preference import PreferenceTask
from pilotrun.tasks.seq_cls import SeqClsTask
from pilotrun.tasks.shapes import config_vocabulary

__all__ = ["IGNORE", "Example", "Task", "make_task"]


def make_task(loaded, *, shared_tokenizer: bool = False):
    """The task of a campaign: built-in by name, or ``package.module:Class`` constructed with the campaign. A built-in
    task whose tokenizer folder holds no tokenizer (config.json alone) gets the config's vocabulary in its stead
    (``tasks/shapes.py``): it builds the model and pads batches, and refuses to tokenize. ``shared_tokenizer``: a
    built-in task gets the process's one tokenizer of its folder (``tasks.loading.shared_tokenizer``), for a task
    that only builds the model (the estimator's fake builds)."""
    name = loaded.campaign.task
    builtin = {"causal-lm": CausalLMTask, "seq-cls": SeqClsTask, "preference": PreferenceTask}.get(name)
    if builtin is not None:
        tokenizer = config_vocabulary(loaded.campaign)
        if tokenizer is None and shared_tokenizer:
            tokenizer = loading.shared_tokenizer(loaded.campaign)
        return builtin(loaded, tokenizer)
    if ":" not in name:
        raise BadInput(f"unknown task '{name}'", where="task",
                       fix="use causal-lm, seq-cls, preference or a Python task as package.module:Class")
    module_name, _, cls_name = name.partition(":")
    try:
        module = _import_task_module(module_name, getattr(loaded, "base_dir", None))
    except ImportError as e:
        raise BadInput(f"cannot import '{module_name}': {e}", where="task",
                       fix="put the module next to the campaign file, install it, or add its folder to "
                           "PYTHONPATH") from None
    cls = getattr(module, cls_name, None)
    if cls is None:
        raise BadInput(f"module '{module_name}' has no '{cls_name}'", where="task", fix="name the Task class")
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise BadInput(f"task class {name} lacks {', '.join(missing)}", where="task",
                       fix="implement the pilotrun.Task protocol (see README, 'Custom tasks')")
    return cls(loaded)


def _import_task_module(module_name: str, base_dir):
    """Import from the path, else from the campaign's folder (so a task file beside the campaign works)."""
    import os
    import sys

    try:
        return importlib.import_module(module_name)
    except ImportError:
        if base_dir is None or str(base_dir) in sys.path:
            raise
    sys.path.append(str(base_dir))
    module = importlib.import_module(module_name)
    # the fresh processes of resume/verify load the run's config.yaml (another folder): they inherit this
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(base_dir)) if p)
    return module
