"""Small utilities with no mempo dependencies: atomic writes, jsonl, registries, the log line, the
progress display, tokenizer helpers, `PathLike` and machine facts."""
