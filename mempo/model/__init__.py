"""The policy model: the from-scratch tokenizer and small Qwen2 (`builtin`), model directories (`export`)."""
