"""Backend choice shared by every op in `mempo.ops` (`resolve_backend`). Every launcher in
`mempo.kernels` launches inside `mempo.kernels._launch.launch_device` (Triton launches on the
current CUDA device, not on the tensors')."""
from __future__ import annotations

import os

import torch

BACKENDS = ("auto", "triton", "torch")


def interpreting() -> bool:
    """True when Triton kernels run on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_backend(backend: str, *tensors: torch.Tensor) -> str:
    """Return "triton" or "torch" for this call; raise ValueError naming a bad backend.

    "auto": Triton when every tensor argument is on a CUDA device, the vectorised torch path
    otherwise (CPU tensors, e.g. inside verl's CPU-only Ray actor). "triton" forces the kernel; on
    CPU tensors only under Triton's interpreter (``TRITON_INTERPRET=1`` set before `mempo.kernels`
    is first imported), which the test suite uses. "torch" forces the torch path on any device.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        if backend == "triton" and not interpreting():
            cpu = [t for t in tensors if isinstance(t, torch.Tensor) and t.device.type != "cuda"]
            if cpu:
                raise ValueError(
                    "backend='triton' needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
                    f"interpreter); got a tensor on {cpu[0].device}"
                )
        return backend
    on_cuda = all(t.device.type == "cuda" for t in tensors if isinstance(t, torch.Tensor))
    return "triton" if on_cuda and any(isinstance(t, torch.Tensor) for t in tensors) else "torch"

