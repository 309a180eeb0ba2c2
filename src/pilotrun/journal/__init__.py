"""The journal: SQLite store, run ids, run folders with manifests, atomic writes."""

from pilotrun.journal.store import Journal, resolve_home

__all__ = ["Journal", "resolve_home"]
