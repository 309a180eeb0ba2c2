"""Training runs: train, sweep, compare, the time check, validation predictions."""
