"""The one training loop, its state, the resumable sampler, precision and distributed set-up."""
