"""Small utilities with no mempo dependencies: atomic writes, jsonl, registries."""
