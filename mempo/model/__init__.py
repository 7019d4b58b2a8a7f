"""The policy model: how mempo runs it (`adapter`: decoder/head split, attention implementation,
cache keyword, packing, per-token log-probs, teacher scoring's and SFT's selected rows), builds and
loads it (`loading`), the from-scratch tokenizer and small Qwen2 (`builtin`), model directories
(`export`)."""
