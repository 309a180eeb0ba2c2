"""Records read from data files (JSONL, JSON, CSV, Parquet), whole or in chunks: below tasks and data."""
