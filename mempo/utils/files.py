"""Reading files without trusting them: a FIFO, device, socket or directory named where a small file
is expected is refused at once (opening a FIFO for reading would wait for a writer, ``/dev/zero``
would read without end), and the refusals of torch's weights-only unpickler said in one line.
Imports only the standard library.
"""
from __future__ import annotations

import os
import re
import stat
from typing import BinaryIO, Optional

from mempo.utils.types import PathLike

__all__ = ["NotRegularFileError", "open_regular", "read_regular", "refused_global", "plain_text"]

_REFUSED_GLOBAL = re.compile(r"Unsupported global: GLOBAL ([\w.]+)")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class NotRegularFileError(OSError):
    """A path that names something other than a regular file (after symlinks)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: PathLike) -> BinaryIO:
    """`path` opened for binary reading when it is a regular file (symlinks followed);
    NotRegularFileError ("<path>: a FIFO, not a regular file") otherwise, without blocking:
    the file is opened non-blocking and checked with fstat before anything is read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _kind(mode)
            raise NotRegularFileError(f"{os.fspath(path)}: {kind}" + ("" if kind.startswith("not") else
                                                                        ", not a regular file"))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: PathLike, limit: int) -> bytes:
    """The bytes of regular file `path` (`open_regular`); OSError naming it when it holds more than
    `limit` bytes (a small file is expected: nothing larger is read into memory)."""
    with open_regular(path) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{os.fspath(path)}: larger than {limit} bytes, more than this file can hold")
    return data


def refused_global(error: BaseException) -> Optional[str]:
    """The dotted name of the global torch's weights-only unpickler refused, read off its error
    (``torch.load(weights_only=True)`` of a pickle that names code), or None for any other error."""
    found = _REFUSED_GLOBAL.search(str(error))
    return found.group(1) if found else None


def plain_text(error: BaseException, limit: int = 300) -> str:
    """An error's message on one line, at most `limit` characters, without terminal colour codes
    (torch's weights-only advice carries them)."""
    return " ".join(_ANSI.sub("", str(error)).split())[:limit]
