"""Where a Triton kernel is launched: Triton launches on the *current* CUDA device and its current
stream (triton/runtime/jit.py), not on the tensors' device, so every launcher in `mempo.kernels`
launches inside `launch_device(...)`, which makes the tensors' device current (tensors on cuda:1
while cuda:0 is current would otherwise be an illegal address)."""
from __future__ import annotations

import contextlib

import torch


def launch_device(*tensors: torch.Tensor):
    """Context manager under which a Triton kernel over `tensors` is launched: ``torch.cuda.device``
    of their CUDA device (its current stream is then the one Triton uses), a no-op for CPU tensors
    (the interpreter). Raises ValueError when the tensors are not all on one device."""
    devices = {t.device for t in tensors if isinstance(t, torch.Tensor)}
    if len(devices) > 1:
        raise ValueError(f"a kernel's tensors must be on one device, got {sorted(map(str, devices))}")
    device = next(iter(devices), None)
    if device is None or device.type != "cuda":
        return contextlib.nullcontext()
    return torch.cuda.device(device)
