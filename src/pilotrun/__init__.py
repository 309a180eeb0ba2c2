"""pilotrun: rehearse a PyTorch fine-tuning campaign on a small pilot before renting GPUs.

Heavy modules (torch, transformers) are imported lazily so that ``pilotrun --help`` and
``pilotrun validate`` answer quickly.
"""

__version__ = "0.1.0"

__all__ = ["__version__", "Task", "phase", "own_run"]


def __getattr__(name):
    # lazy: the public names come on first use, so `import pilotrun` (and --help) loads none of their modules
    if name == "Task":
        from pilotrun.tasks.base import Task

        return Task
    if name == "phase":
        from pilotrun.probe.recorder import phase

        return phase
    if name == "own_run":
        from pilotrun.probe.recorder import own_run

        return own_run
    raise AttributeError(f"module 'pilotrun' has no attribute {name!r}")
