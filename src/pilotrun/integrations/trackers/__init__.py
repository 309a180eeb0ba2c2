"""The journal in the team's tracker: MLflow (``mlflow_tracker.py``) and Weights & Biases
(``wandb_tracker.py``).

What a run, a sweep and a campaign become is tracker-neutral (``content.py``); ``export.py`` sends what the
journal holds (the ``export`` verb), ``live.py`` sends runs as ``train``/``sweep``/``all`` record them. Both
read the journal and nothing else, keep each tracker id in it (``journal/tracked.py``), and neither package is
imported until a tracker is asked for.
"""

TRACKERS = ("mlflow", "wandb")
