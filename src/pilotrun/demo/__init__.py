"""The embedded demo: a campaign, its synthetic data set and a tiny Llama config, written by code."""
