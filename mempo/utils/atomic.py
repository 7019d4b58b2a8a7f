"""Durable, atomic file-system writes (readers see the old content or the new, never a torn file),
the checks of output paths every command that writes a directory makes, and the test-only
fault-injection hook `fault_point`. Imports only the standard library and `mempo.errors`.

Nothing a user did not name is deleted: a directory `atomic_directory` writes carries a marker file
(`WRITTEN_MARKER`, listing what was written), and only an empty directory or one that carries the
marker and holds nothing else is ever replaced; a file is never replaced by a directory
(`check_directory_target`). A directory a command writes into (`claim_directory`, the demo's
``--out``) carries the command's marker; files are written into a folder `check_output_folder`
accepts.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import stat
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from mempo.errors import MempoError
from mempo.utils.types import PathLike

__all__ = ["FAULT_ENV", "fault_point", "fsync_dir", "write_bytes_durably", "replace_file_atomically",
           "atomic_directory", "TEMP_PREFIX", "WRITTEN_MARKER", "OutputPathError", "check_output_folder",
           "check_directory_target", "claim_directory"]

FAULT_ENV = "MEMPO_FAULT_INJECT"
TEMP_PREFIX = ".tmp-"
#: The file mempo puts in every directory it writes whole (`atomic_directory`: ``{"written_by",
#: "entries"}``, every path under the directory) or writes into (`claim_directory`: ``{"written_by"}``).
WRITTEN_MARKER = ".mempo-written"
_MARKER_MAX_BYTES = 1 << 20  # a marker lists a model directory's files: a few kB
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


def _remove_stale(folder: Path, *prefixes: str, owned_only: Sequence[str] = ()) -> None:
    """Remove what crashed writers left in `folder` (temporary entries named with `prefixes`; one
    writer per target is assumed, as everywhere in mempo: rank 0 writes). An entry named with one of
    `owned_only` is removed only when `atomic_directory` could replace it (`_not_replaceable`); an
    older mempo hid a replaced user's file under such a name, and it stays."""
    if not folder.is_dir():
        return
    for entry in folder.iterdir():
        if entry.name.startswith(tuple(owned_only)):
            if entry.is_dir() and not entry.is_symlink() and _not_replaceable(entry) is None:
                shutil.rmtree(entry, ignore_errors=True)
        elif entry.name.startswith(prefixes):
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
def atomic_directory(path: PathLike, phase: Optional[str] = None, *, field: str = "") -> Iterator[Path]:
    """Yield a fresh temporary directory next to `path` (``.tmp-<name>-<pid>``) that becomes `path`
    when the block ends without an error (`WRITTEN_MARKER` added, listing every entry; every file
    fsynced; then renamed).

    `path` must be absent, an empty directory or a directory this function wrote that holds
    nothing else (`check_directory_target`, checked before the block and again before the rename;
    `OutputPathError` naming `field` otherwise): a file, a link or anything mempo did not write is
    never replaced. An existing `path` is first renamed aside (``.tmp-old-<name>-<pid>``) and removed
    after the rename; a crash between those two renames leaves `path` absent (never a torn
    directory), which every writer here treats as "not written yet". On an error the temporary
    directory is removed; one left by a crash is removed by the next write of the same target.
    phase: a `fault_point` reached after the block, before anything is renamed."""
    path = check_directory_target(path, field)
    path.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(path.parent, f"{TEMP_PREFIX}{path.name}-", owned_only=[f"{TEMP_PREFIX}old-{path.name}-"])
    temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{os.getpid()}")
    temp.mkdir()
    try:
        yield temp
        _write_marker(temp, {"written_by": "mempo", "entries": _entries(temp)})
        _fsync_tree(temp)
        if phase is not None:
            fault_point(phase)
        old = None
        if os.path.lexists(path):
            check_directory_target(path, field)  # the block may have run for minutes
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


# ------------------------------------------------------------------------------------------------
# output paths: what a command may write, checked before any slow work
# ------------------------------------------------------------------------------------------------
class OutputPathError(MempoError, ValueError):
    """An output path mempo will not write: it cannot be made, or writing it would destroy what
    mempo did not write. ``field``: the option or config field that named it ("" when none)."""

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}" if field else reason)


def _entries(root: Path) -> list[str]:
    """Every path under `root` (files, links, folders; relative, '/'-separated), the marker left out."""
    found = []
    for folder, dirs, files in os.walk(root):
        base = Path(folder).relative_to(root)
        found += [(base / name).as_posix() for name in dirs + files]
    return sorted(name for name in found if name != WRITTEN_MARKER)


def _write_marker(directory: Path, content: dict) -> None:
    (directory / WRITTEN_MARKER).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def _read_marker(directory: Path) -> Optional[dict]:
    """The marker of `directory` as a mapping; None when there is none or it is not one of mempo's
    (not a regular file, too large, not a JSON object with a ``written_by`` string)."""
    marker = directory / WRITTEN_MARKER
    try:
        if not stat.S_ISREG(os.lstat(marker).st_mode):  # never open a FIFO or a device
            return None
        with open(marker, "rb") as handle:
            raw = handle.read(_MARKER_MAX_BYTES + 1)
        content = json.loads(raw.decode("utf-8")) if len(raw) <= _MARKER_MAX_BYTES else None
    except (OSError, ValueError):
        return None
    return content if isinstance(content, dict) and isinstance(content.get("written_by"), str) else None


def _listing(names: Sequence[str], most: int = 4) -> str:
    shown = ", ".join(sorted(names)[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _not_replaceable(directory: Path, shown: Optional[PathLike] = None) -> Optional[str]:
    """Why `atomic_directory` may not replace the existing directory `directory` (None: it may:
    empty, or carrying an `atomic_directory` marker and holding only what the marker lists).
    shown: how the reason names the directory (default `directory`)."""
    shown = directory if shown is None else shown
    try:
        names = os.listdir(directory)
    except OSError as error:
        return f"{shown} cannot be read ({error.strerror or error})"
    if not names:
        return None
    marker = _read_marker(directory)
    listed = marker.get("entries") if marker is not None else None
    if not isinstance(listed, list):
        return (f"{shown} is a directory mempo did not write (no {WRITTEN_MARKER} marker; it holds "
                f"{_listing(names)}); give a new or empty directory, or move it away yourself")
    listed = set(listed)
    for folder, dirs, files in os.walk(directory):
        base = Path(folder).relative_to(directory)
        for name in dirs + files:
            relative = (base / name).as_posix()
            if relative != WRITTEN_MARKER and relative not in listed:
                return (f"{shown} holds {relative}, which mempo did not write there; move it away or give "
                        f"another directory")
    return None


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip(os.sep) + os.sep)


def _check_makeable(path: Path, field: str) -> None:
    """`OutputPathError` unless the nearest existing folder above `path` is a directory."""
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise OutputPathError(field, f"{path}: cannot be made, {parent} is not a directory")


def check_output_folder(path: PathLike, field: str = "", files: Sequence[str] = ()) -> Path:
    """A folder that files are written into: `path` must be a directory or not exist yet (then the
    nearest existing folder above it must be a directory, so it can be made), and none of `files`
    (names inside it) a directory. Returns `path`; `OutputPathError` naming `field` otherwise. Made
    before any slow work, so a path that cannot be written fails at once."""
    path = Path(path)
    if os.path.lexists(path) and not path.is_dir():
        raise OutputPathError(field, f"{path} exists and is not a directory")
    _check_makeable(path, field)
    for name in files:
        target = path / name
        if target.is_dir():
            raise OutputPathError(field, f"{target} is a directory; a file is written there")
    return path


def check_directory_target(path: PathLike, field: str = "", *, keep: Sequence[PathLike] = ()) -> Path:
    """Check that `atomic_directory` may write the directory `path` whole, replacing what is there;
    returns it absolute. `OutputPathError` naming `field` when `path` is the working directory or
    above it, is a file or a link (never replaced by a directory), cannot be made (a file above it),
    is a non-empty directory that mempo did not write (`WRITTEN_MARKER`) or holds anything its
    marker does not list (a run directory, a checkpoint, a user's file), or is, holds or lies inside
    one of `keep` (what the command reads, e.g. the checkpoint being exported)."""
    absolute = Path(os.path.abspath(path))
    real, cwd = os.path.realpath(absolute), os.path.realpath(os.getcwd())
    if _inside(cwd, real):
        raise OutputPathError(field, f"{path} is the working directory{'' if cwd == real else ' or above it'}; "
                                     "give the directory to write by name")
    _check_makeable(Path(path), field)
    for kept in keep:
        other = os.path.realpath(os.path.abspath(kept))
        if _inside(real, other) or _inside(other, real):
            how = "is" if real == other else "lies inside" if _inside(real, other) else "holds"
            raise OutputPathError(field, f"{path} {how} {kept}, which this command reads; give another directory")
    if absolute.is_symlink():
        raise OutputPathError(field, f"{path} is a symbolic link; give the directory itself (a link is never replaced)")
    if os.path.lexists(absolute) and not absolute.is_dir():
        raise OutputPathError(field, f"{path} exists and is not a directory (a file is never replaced by a directory)")
    if absolute.is_dir():
        reason = _not_replaceable(absolute, path)
        if reason is not None:
            raise OutputPathError(field, reason)
    return absolute


def claim_directory(path: PathLike, field: str, owner: str) -> Path:
    """Make `path` the directory `owner` (e.g. ``"mempo demo"``) writes into and rewrites on every
    run: it must not exist yet, be empty, or carry `owner`'s `WRITTEN_MARKER` (a directory an
    earlier run of `owner` claimed); anything else is an `OutputPathError` naming `field`. Creates
    the directory and its marker; returns `path`."""
    path = check_output_folder(path, field)
    if path.is_dir() and os.listdir(path):
        marker = _read_marker(path)
        if marker is None or marker.get("written_by") != owner or "entries" in marker:
            raise OutputPathError(field, f"{path} is a non-empty directory that {owner} did not write (no "
                                         f"{WRITTEN_MARKER} marker of it; it holds {_listing(os.listdir(path))}); "
                                         f"give a new or empty directory")
        return path
    try:
        path.mkdir(parents=True, exist_ok=True)
        _write_marker(path, {"written_by": owner})
    except OSError as error:
        raise OutputPathError(field, f"cannot create {path}: {error.strerror or error}") from None
    return path
