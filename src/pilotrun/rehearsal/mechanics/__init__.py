"""Mechanics: overfit (can it learn), resume (does a restart continue exactly), verify (does the artifact reload)."""
