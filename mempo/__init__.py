"""mempo: MemPO (Self-Memory Policy Optimization) for long-horizon LLM agents.

`import mempo` imports nothing else; each package says what importing it costs (`mempo.ops`: torch
and numpy; `mempo.config`, `mempo.train`: no torch).
"""
__version__ = "0.1.0"
