"""Memory: pilot (every phase measured on the worst case), estimate (fake tensors), fit (variants that fit)."""
