"""Callbacks that record pilotrun phases inside other training loops (HF Trainer, Lightning)."""
