"""Fresh CPU outputs backed by transparent huge pages.

Why: an op that returns a fresh [B, L] fp32 tensor at RL sizes (2,048 x 4,096 = 32 MiB) spends most
of its time page-faulting the new memory in, 4 KiB at a time (8,192 faults). On Linux with
transparent huge pages in `madvise` mode (the common default), advising the buffer's 2 MiB-aligned
interior as MADV_HUGEPAGE before the first write lets the kernel fault it in as 2 MiB pages:
measured 17 ms -> 7 ms for a 32 MiB int64 -> fp32 copy on the 2-core dev machine (bench/RESULTS.md).
PyTorch offers the same process-wide (`THP_MEM_ALLOC_ENABLE=1`, read once at start-up); this does it
for mempo's own outputs only.

Policy:
* Only CPU tensors of at least `MIN_BYTES`; only the 2 MiB-aligned pages wholly inside the
  tensor's own storage are advised (memory no other allocation shares); only on Linux.
* The advice is a hint: if the kernel refuses it (THP disabled, not Linux, no libc) the tensor is
  an ordinary `torch.empty` result. Values are never affected, only how pages are backed.
* `MEMPO_HUGE_PAGES=0` turns it off (read on every call).
"""
from __future__ import annotations

import ctypes
import os
import sys
from typing import Optional

import torch

HUGE_PAGE = 2 << 20
MIN_BYTES = 4 << 20
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
    return os.environ.get("MEMPO_HUGE_PAGES", "1") not in ("0", "", "false", "False")


def empty_output(shape: tuple[int, ...], dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> torch.Tensor:
    """`torch.empty(shape, dtype, device)`; large CPU buffers are advised as huge pages before use.

    Returns the tensor (uninitialised, like torch.empty). Whether the advice took is not reported:
    it changes speed only.
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
