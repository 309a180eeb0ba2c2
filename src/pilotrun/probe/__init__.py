"""Memory probes per device kind, the phase recorder and size parsing.

``make_probe(device)`` → a probe with ``start()`` / ``stop() -> dict``; ``phase(name, inputs=...)`` wraps a
block of a user's loop and writes one phase ledger row (SPEC.md "Phase ledger row").
"""
