"""Peak bytes of the tensors a call allocates, counted on CPU (tests/ops/test_logprob.py, issue 45).

CPU has no allocator statistics like `torch.cuda.max_memory_allocated`, so `LiveBytes` is a
`TorchDispatchMode` that sees every aten op the call runs (its own, the GEMM, the Triton
interpreter's torch calls) and tracks the storages of their outputs: a storage is live while some
tensor on it that the mode has seen is alive (weak references; CPython frees a tensor as soon as its
last reference goes), and its bytes count from its first appearance. Storages of the tensors named
`preexisting` (the call's inputs, whose views the call takes) are never counted. `peak` is the
largest sum of live bytes after any op; `largest` the largest single storage.
"""
from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """with LiveBytes(inputs...) as live: call(); then live.peak, live.largest (bytes)."""

    def __init__(self, *preexisting: torch.Tensor):
        super().__init__()
        self._skip = {t.untyped_storage().data_ptr() for t in preexisting if isinstance(t, torch.Tensor)}
        self._live: dict[int, tuple[int, list]] = {}  # storage data_ptr -> (bytes, weak refs to its tensors)
        self.peak = 0
        self.largest = 0

    def _purge(self) -> None:
        for key in [k for k, (_, refs) in self._live.items() if all(r() is None for r in refs)]:
            del self._live[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._purge()
        for t in tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
                continue
            storage = t.untyped_storage()
            key = storage.data_ptr()
            if key in self._skip or storage.nbytes() == 0:
                continue
            if key not in self._live:
                self._live[key] = (storage.nbytes(), [])
                self.largest = max(self.largest, storage.nbytes())
            self._live[key][1].append(weakref.ref(t))
        self.peak = max(self.peak, sum(n for n, _ in self._live.values()))
        return out
