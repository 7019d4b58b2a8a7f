"""mempo: MemPO (Self-Memory Policy Optimization) for long-horizon LLM agents.

`import mempo` is cheap: it pulls in nothing heavier than torch on first use of `mempo.ops`.
"""
__version__ = "0.1.0"
