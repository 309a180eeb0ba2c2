"""The pilot's phases, declared once (``registry``), their worst-case inputs (``worst``) and the one driver
(``driver``) that runs them with real probes (pilot, fit) or on fake tensors (estimate)."""

from pilotrun.phases.registry import PHASES, REGISTRY, Phase, names, phases_of

__all__ = ["PHASES", "REGISTRY", "Phase", "names", "phases_of"]
