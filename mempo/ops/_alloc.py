"""Fresh CPU outputs backed by transparent huge pages (`empty_output`).

A fresh [B, L] fp32 output at RL sizes (2,048 x 4,096 = 32 MiB) spends most of its time
page-faulting in 4 KiB pages; advising its 2 MiB-aligned interior as MADV_HUGEPAGE before the first
write lets Linux (THP in `madvise` mode, the common default) fault it in as 2 MiB pages (timings:
bench/RESULTS.md, "Advantage pipeline"). PyTorch offers the same process-wide
(`THP_MEM_ALLOC_ENABLE=1`); this does it for mempo's own outputs only. Values are never affected.
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = 4 << 20  # only CPU tensors at least this large are advised
_MADV_HUGEPAGE = 14

_madvise: Optional[object] = None
_madvise_loaded = False


def _load_madvise():
    global _madvise, _madvise_loaded
    if not _madvise_loaded:
        _madvise_loaded = True
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
                _madvise = fn
            except (OSError, AttributeError):
                _madvise = None
    return _madvise


def huge_pages_enabled() -> bool:
    """False when ``MEMPO_HUGE_PAGES`` is 0 / empty / false (read on every call)."""
    return os.environ.get("MEMPO_HUGE_PAGES", "1") not in ("0", "", "false", "False")


def empty_output(shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.empty(shape, dtype, device)`; large CPU buffers are advised as huge pages before use.

    Returns the tensor (uninitialised, like torch.empty). Only Linux, only CPU tensors of at least
    `MIN_BYTES`, only the 2 MiB-aligned pages wholly inside the tensor's own storage (memory no other
    allocation shares). The advice is a hint: if the kernel refuses it (THP disabled, no libc) the
    tensor is an ordinary `torch.empty` result; whether it took is not reported.
    """
    out = torch.empty(shape, dtype=dtype, device=device)
    nbytes = out.numel() * out.element_size()
    if out.device.type != "cpu" or nbytes < MIN_BYTES or not huge_pages_enabled():
        return out
    madvise = _load_madvise()
    if madvise is None:
        return out
    begin = out.data_ptr()
    first = (begin + HUGE_PAGE - 1) // HUGE_PAGE * HUGE_PAGE
    last = (begin + nbytes) // HUGE_PAGE * HUGE_PAGE
    if last > first:
        madvise(first, last - first, _MADV_HUGEPAGE)  # a refusal (EINVAL with THP off) is fine: a hint
    return out
