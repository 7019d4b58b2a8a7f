"""A progress display for one stage: a `rich` bar when rich is installed and stderr is a terminal,
else a plain stderr line every `interval` seconds and one at the end. Standard library only at import."""
from __future__ import annotations

import importlib.util
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, Optional

__all__ = ["progress", "rank_zero"]


def rank_zero() -> bool:
    """Rank 0 of an initialised torch.distributed, or the only process (torch is not imported here)."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank() == 0
    return True


class _PlainProgress:
    """Fallback progress: a stderr line at most every `interval` seconds and one at the end."""

    def __init__(self, name: str, total: Optional[int], interval: float):
        self.name, self.total, self.interval = name, total, interval
        self.done = 0
        self._start = self._last = time.perf_counter()

    def advance(self, amount: int = 1) -> None:
        self.done += amount
        now = time.perf_counter()
        if now - self._last >= self.interval:
            self._last = now
            self._print(now)

    def _print(self, now: float) -> None:
        of_total = f"/{self.total} ({100.0 * self.done / self.total:.0f}%)" if self.total else ""
        print(f"[{self.name}] {self.done}{of_total} {now - self._start:.1f}s", file=sys.stderr, flush=True)

    def finish(self) -> None:
        self._print(time.perf_counter())


class _RichProgress:
    def __init__(self, name: str, total: Optional[int]):
        from rich.progress import Progress  # reason: optional dependency (the demo extra)

        self._progress = Progress(transient=False)
        self._progress.start()
        self._task = self._progress.add_task(name, total=total)

    def advance(self, amount: int = 1) -> None:
        self._progress.advance(self._task, amount)

    def finish(self) -> None:
        self._progress.stop()


@contextmanager
def progress(stage_name: str, total: Optional[int] = None, *, enabled: Optional[bool] = None,
             interval: float = 10.0) -> Iterator[Any]:
    """A progress display for one stage; yields an object with ``advance(amount=1)``.

    rich bar when rich is installed and stderr is a terminal; otherwise plain stderr lines every
    `interval` seconds and at the end. enabled: default rank 0 only; disabled yields a no-op.
    """
    enabled = rank_zero() if enabled is None else enabled
    if not enabled:
        yield _NoProgress()
        return
    use_rich = importlib.util.find_spec("rich") is not None and sys.stderr.isatty()
    bar = _RichProgress(stage_name, total) if use_rich else _PlainProgress(stage_name, total, interval)
    try:
        yield bar
    finally:
        bar.finish()


class _NoProgress:
    def advance(self, amount: int = 1) -> None:
        """Ignore progress (a disabled display)."""
