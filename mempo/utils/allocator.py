"""The C allocator's settings for CPU training (`keep_freed_memory`).

A CPU training step allocates and frees the same large buffers every step (logits
``[tokens, vocab]``, their gradients, activations). glibc's malloc serves a block of 128 KiB or
more (up to a dynamic 32 MiB) with a fresh ``mmap`` and returns it to the kernel on ``free``, and
trims the heap's top beyond 128 KiB: every step then page-faults its buffers in again, zero-filled
by the kernel. Keeping freed memory in the heap removes that work; the arithmetic is unchanged
(torch's CPU allocator aligns every block to 64 bytes either way), so a run's numbers are
bit-identical. Measured: bench/RESULTS.md "CPU allocator".
"""
from __future__ import annotations

import ctypes
import os
import platform
from typing import Optional

__all__ = ["ALLOCATOR_ENV", "allocator_setting", "keep_freed_memory"]

#: Set to "0" to leave the allocator as it is.
ALLOCATOR_ENV = "MEMPO_KEEP_FREED_MEMORY"

# glibc <malloc.h> parameters of mallopt(3)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_MAX = -1, -2, -4
_SETTINGS = (
    (_M_MMAP_MAX, 0, "no mmap'd blocks"),                  # 1. every block from the heap, so it is reused
    (_M_TRIM_THRESHOLD, 2**31 - 1, "trim beyond 2 GiB"),  # 2. the heap's top stays mapped after a free
    (_M_TOP_PAD, 256 << 20, "256 MiB top pad"),            # 3. grow the heap in large steps
)

_applied: Optional[str] = None


def keep_freed_memory() -> str:
    """Make glibc's malloc keep freed memory for reuse in this process (mallopt: no mmap'd blocks,
    the heap trimmed only beyond 2 GiB free, a 256 MiB top pad); returns what was done, for a run's
    log. The process's resident memory then stays near its peak: meant for a training process.

    Does nothing, and says why, where ``MEMPO_KEEP_FREED_MEMORY=0`` is set or the C library is
    not glibc. Calling it again returns the first call's line."""
    global _applied
    if _applied is not None:
        return _applied
    if os.environ.get(ALLOCATOR_ENV, "1").strip() == "0":
        _applied = f"unchanged ({ALLOCATOR_ENV}=0)"
        return _applied
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        _applied = f"unchanged (C library {libc_name or 'unknown'}, not glibc)"
        return _applied
    mallopt = ctypes.CDLL(None).mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = [what for param, value, what in _SETTINGS if mallopt(param, value) == 1]
    _applied = "glibc malloc keeps freed memory (" + ", ".join(done) + ")" if done else \
        "unchanged (glibc mallopt refused every setting)"
    return _applied


def allocator_setting() -> str:
    """What `keep_freed_memory` did in this process, or that it was not called."""
    return _applied if _applied is not None else "as the C library sets it"
