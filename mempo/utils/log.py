"""The one user-facing log line: ``mempo: <message>`` on stderr, flushed."""
from __future__ import annotations

import sys

__all__ = ["log"]


def log(message: str) -> None:
    """Print ``mempo: <message>`` to stderr and flush (progress notes of the commands and the trainer)."""
    print(f"mempo: {message}", file=sys.stderr, flush=True)
