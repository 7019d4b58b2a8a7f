"""Training metrics (``metrics.jsonl``, TensorBoard, W&B) and stage timings. Imports only the standard
library at import time (TensorBoard and W&B load when asked for)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Optional

from mempo.utils.progress import rank_zero
from mempo.utils.types import PathLike

__all__ = ["MetricsLogger", "StageTimer", "read_metrics", "METRICS_FILE"]

METRICS_FILE = "metrics.jsonl"
_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _plain_value(value: Any) -> Any:
    """A JSON-ready value: numbers as int/float (non-finite -> None), strings and bools unchanged."""
    if hasattr(value, "item") and callable(value.item):
        value = value.item()
    if isinstance(value, (bool, str)) or value is None:
        return value
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"metric values must be numbers, bools or strings, got {type(value).__name__}") from None
    return number if math.isfinite(number) else None


def read_metrics(path: PathLike) -> list[dict]:
    """The well-formed records of a metrics.jsonl file (a torn last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                records.append(record)
    return records


def _truncate_after(path: Path, resume_step: int) -> None:
    """Keep only the records with ``step <= resume_step`` (temporary file + `os.replace`), so after
    resuming from the step-N checkpoint the file matches an uninterrupted run."""
    kept = [r for r in read_metrics(path) if r["step"] <= resume_step] if path.exists() else []
    temp = path.with_name(f".{path.name}.tmp")
    with open(temp, "w", encoding="utf-8") as handle:
        for record in kept:
            handle.write(json.dumps(record) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temp, path)


class MetricsLogger:
    """One JSON line per step to ``out_dir/metrics.jsonl``, plus optional TensorBoard / W&B.

    A record is ``{"step": int, "time": unix seconds, <name>: value, ...}``; values may be Python /
    numpy numbers, 0-dim tensors, bools or strings; non-finite floats are written as ``null``
    (strict JSON). Each line is flushed when written (a crashed run keeps every finished line).

    out_dir: run directory (created). resume_step: the step of the checkpoint being resumed: the
    file keeps only its well-formed lines with ``step <= resume_step`` and TensorBoard purges later
    events; None starts a new run (an existing file is truncated, with a warning).
    tensorboard: scalars under ``out_dir/tensorboard`` when the `tensorboard` package is installed
    (otherwise a one-time warning). wandb: a missing package raises ImportError; the run id is kept
    in ``out_dir/wandb_run_id`` so a resumed run continues the same W&B run. run_name /
    wandb_project / config: W&B only (config: a plain dict). enabled: default rank 0 of
    torch.distributed (or the only process); a disabled logger accepts every call, writes nothing.
    """

    def __init__(self, out_dir: PathLike, tensorboard: bool = True, wandb: bool = False, *,
                 resume_step: Optional[int] = None, run_name: Optional[str] = None,
                 wandb_project: Optional[str] = None, config: Optional[Mapping[str, Any]] = None,
                 enabled: Optional[bool] = None):
        self.out_dir = Path(out_dir)
        self.enabled = rank_zero() if enabled is None else enabled
        self.path = self.out_dir / METRICS_FILE
        self._file = None
        self._tensorboard = None
        self._wandb_run = None
        if not self.enabled:
            return
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume_step is not None:
            _truncate_after(self.path, int(resume_step))
        elif self.path.exists() and self.path.stat().st_size > 0:
            warnings.warn(f"{self.path}: starting a new run, truncating the existing metrics file", RuntimeWarning,
                          stacklevel=2)
            self.path.write_text("", encoding="utf-8")
        self._file = open(self.path, "a", encoding="utf-8")
        if tensorboard:
            self._tensorboard = self._open_tensorboard(resume_step)
        if wandb:
            self._wandb_run = self._open_wandb(resume_step, run_name, wandb_project, config)

    def _open_tensorboard(self, resume_step: Optional[int]):
        if importlib.util.find_spec("tensorboard") is None:
            _warn_once("tensorboard", "tensorboard is not installed: no TensorBoard event files are written "
                                      "(pip install tensorboard); metrics.jsonl is still written")
            return None
        from torch.utils.tensorboard import SummaryWriter  # reason: optional (tensorboard, when installed)

        purge = None if resume_step is None else int(resume_step) + 1
        return SummaryWriter(log_dir=str(self.out_dir / "tensorboard"), purge_step=purge)

    def _open_wandb(self, resume_step, run_name, project, config):
        try:
            import wandb  # reason: optional dependency (wandb=True only)
        except ImportError as error:
            raise ImportError("wandb=True needs the wandb package (pip install wandb)") from error
        id_file = self.out_dir / "wandb_run_id"
        resuming = resume_step is not None and id_file.exists()
        run_id = id_file.read_text().strip() if resuming else wandb.util.generate_id()
        id_file.write_text(run_id + "\n")
        return wandb.init(project=project, name=run_name, id=run_id, resume="allow", dir=str(self.out_dir),
                          config=dict(config) if config else None)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict:
        """Write one record for `step`; returns it (also when disabled, nothing is written then)."""
        record = {"step": int(step), "time": time.time()}
        for name, value in metrics.items():
            if name in record:
                raise ValueError(f"metric name {name!r} is reserved")
            record[str(name)] = _plain_value(value)
        if not self.enabled:
            return record
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        numbers = {k: v for k, v in record.items() if k not in ("step", "time") and isinstance(v, (int, float))
                   and not isinstance(v, bool)}
        if self._tensorboard is not None:
            for name, value in numbers.items():
                self._tensorboard.add_scalar(name, value, global_step=int(step))
            self._tensorboard.flush()
        if self._wandb_run is not None:
            self._wandb_run.log(numbers, step=int(step))
        return record

    def close(self) -> None:
        """Flush and close every sink (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> "MetricsLogger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class StageTimer:
    """Wall-clock seconds per named stage, summed over repeated entries.

    ``with timer("rollout"): ...`` (or ``timer.stage("rollout")``). synchronize: called before reading
    the clock on entry and exit (e.g. ``torch.cuda.synchronize`` to time GPU work).
    """

    def __init__(self, synchronize: Optional[Callable[[], None]] = None):
        self._synchronize = synchronize
        self._seconds: dict[str, float] = {}

    def _now(self) -> float:
        if self._synchronize is not None:
            self._synchronize()
        return time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body under `name` (seconds are added even when the body raises)."""
        start = self._now()
        try:
            yield
        finally:
            self._seconds[name] = self._seconds.get(name, 0.0) + (self._now() - start)

    __call__ = stage

    def seconds(self) -> dict[str, float]:
        """Stage name -> total seconds, in first-entry order."""
        return dict(self._seconds)

    def metrics(self, prefix: str = "time/") -> dict[str, float]:
        """``{prefix + name: seconds}`` for a metrics record."""
        return {prefix + name: value for name, value in self._seconds.items()}

    def reset(self) -> None:
        """Forget all stages (call once per step)."""
        self._seconds.clear()
