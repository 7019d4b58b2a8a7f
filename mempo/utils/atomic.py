"""Durable, atomic file-system writes (readers see the old content or the new, never a torn file),
and the test-only fault-injection hook `fault_point`. Imports only the standard library.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
from pathlib import Path
from typing import Callable, Iterator, Optional, Union

from mempo.utils.types import PathLike

__all__ = ["FAULT_ENV", "fault_point", "fsync_dir", "write_bytes_durably", "replace_file_atomically",
           "atomic_directory", "TEMP_PREFIX"]

FAULT_ENV = "MEMPO_FAULT_INJECT"
TEMP_PREFIX = ".tmp-"
_reached: dict[str, int] = {}


def fault_point(phase: str, handle=None) -> None:
    """Kill this process here when ``MEMPO_FAULT_INJECT`` names `phase` (tests only: the variable is
    unset in any real run, and the hook then costs one dictionary lookup).

    ``MEMPO_FAULT_INJECT=<phase>[@<n>]`` makes the n-th time (default the first) this process reaches
    `phase` kill it with SIGKILL, as ``kill -9`` would. With `handle` (a file being written) the file
    is first flushed and cut to half its size, a torn write. Phases: ``tokenizer`` (the trainer's
    ``<out>/tokenizer``), ``config`` (``<out>/config.yaml``), ``final-model`` (``<out>/model`` of
    `mempo train`), and in `mempo.train.checkpoint`: ``model``, ``optimizer``, ``rng``, ``state``
    (the files, torn), ``manifest`` (torn), ``rename`` (before the checkpoint directory is renamed
    into place), ``latest`` (the pointer's temporary file, torn).
    """
    wanted = os.environ.get(FAULT_ENV)
    if not wanted:
        return
    name, _, count = wanted.partition("@")
    if name.strip() != phase:
        return
    _reached[phase] = _reached.get(phase, 0) + 1
    if _reached[phase] != (int(count) if count.strip() else 1):
        return
    if handle is not None:  # a torn write: half of what was written reaches the disk
        handle.flush()
        size = handle.tell()
        handle.truncate(size // 2)
        handle.flush()
        os.fsync(handle.fileno())
    os.kill(os.getpid(), signal.SIGKILL)


def fsync_dir(path: PathLike) -> None:
    """fsync a directory (its entries: created, renamed, removed files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: PathLike, write: Callable, phase: Optional[str] = None) -> None:
    """Create `path`, let ``write(handle)`` fill it, flush and fsync (a `fault_point` `phase` after
    the write, before the fsync)."""
    with open(path, "wb") as handle:
        write(handle)
        if phase is not None:
            fault_point(phase, handle)
        handle.flush()
        os.fsync(handle.fileno())


def replace_file_atomically(path: PathLike, data: Union[bytes, str], phase: Optional[str] = None) -> None:
    """Replace `path` with `data` (str: UTF-8) atomically and durably: a temporary file next to
    `path`, fsynced, `os.replace` d over it, then the folder fsynced. Stale temporary files of a
    crashed earlier write are removed first."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    _remove_stale(path.parent, f"{TEMP_PREFIX}{path.name}.")
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}.{os.getpid()}")
    try:
        write_bytes_durably(temp, lambda handle: handle.write(payload), phase)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _remove_stale(folder: Path, *prefixes: str) -> None:
    """Remove what crashed writers left in `folder` (temporary entries named with `prefixes`; one
    writer per target is assumed, as everywhere in mempo: rank 0 writes)."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name.startswith(prefixes):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)


def _fsync_tree(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(folder)


@contextlib.contextmanager
def atomic_directory(path: PathLike, phase: Optional[str] = None) -> Iterator[Path]:
    """Yield a fresh temporary directory next to `path` (``.tmp-<name>-<pid>``) that becomes `path`
    when the block ends without an error (every file fsynced, then renamed).

    A `path` that already exists is first renamed aside (``.tmp-old-<name>-<pid>``) and removed
    after the rename; a crash between those two renames leaves `path` absent (never a torn
    directory), which every writer here treats as "not written yet". On an error the temporary
    directory is removed; one left by a crash is removed by the next write of the same target.
    phase: a `fault_point` reached after the block, before anything is renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path.parent, f"{TEMP_PREFIX}{path.name}-", f"{TEMP_PREFIX}old-{path.name}-")
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{os.getpid()}")
    temp.mkdir()
    try:
        yield temp
        _fsync_tree(temp)
        if phase is not None:
            fault_point(phase)
        old = None
        if path.exists():
            old = path.with_name(f"{TEMP_PREFIX}old-{path.name}-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
        os.replace(temp, path)
        fsync_dir(path.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(temp, ignore_errors=True)
        raise
