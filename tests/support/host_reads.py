"""Count what a call reads back from tensors to the host (tests/ops/test_advantage.py, issue 45).

On CUDA every such read waits for the device (a host synchronisation, and an error inside CUDA-graph
capture); on CPU it costs nothing, but counting the reads on CPU keeps their number from growing
unnoticed. `HostTraffic` is a `torch.overrides.TorchFunctionMode` that sees every torch call made
while it is active (the op's, its launchers', the Triton interpreter's) and records:

* reads: a tensor value to Python (`item`, `tolist`, `bool` / `int` / `float` / `index` of a
  tensor, `numpy`, `cpu` / `.to` of a device tensor to the CPU, `repr`, `torch.equal`), and ops
  whose result size depends on the values (`nonzero`, `unique`, `masked_select`, `bincount`,
  `argwhere`, one-argument `where`, `repeat_interleave` with tensor repeats, indexing with a bool
  tensor): on CUDA each of them synchronises.
* uploads: tensors made from host data (`torch.tensor`, `torch.as_tensor` of a non-tensor); each
  is one host-to-device copy once it moves to the device.

Each record is (function name, innermost mempo source line), so a failing count says where.
"""
from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

_T = torch.Tensor
_VALUE_READS = {_T.item, _T.tolist, _T.__bool__, _T.__int__, _T.__float__, _T.__index__, _T.__complex__, _T.numpy,
                _T.__repr__, _T.__format__, _T.__array__, torch.equal, _T.equal, torch.allclose, _T.allclose}
_SIZED_BY_VALUES = {torch.nonzero, _T.nonzero, torch.unique, _T.unique, torch.unique_consecutive,
                    _T.unique_consecutive, torch.masked_select, _T.masked_select, torch.bincount, _T.bincount,
                    torch.argwhere, _T.argwhere}
_INDEXING = {_T.__getitem__, _T.__setitem__, _T.index_put_, _T.index_put}
_MOVES = {_T.cpu, _T.to, _T.cuda}
_FROM_HOST = {torch.tensor, torch.as_tensor}


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


def _target(args, kwargs) -> torch.device | None:
    for value in (*args[1:], kwargs.get("device")):
        if isinstance(value, (torch.device, str)):
            try:
                return torch.device(value)
            except RuntimeError:
                continue
        if isinstance(value, torch.Tensor):
            return value.device
    return None


def _where() -> str:
    """The innermost frame in mempo's own code (else the caller), as path:line."""
    frames = [f for f in traceback.extract_stack() if not f.filename.endswith(("host_reads.py", "overrides.py"))]
    mine = [f for f in frames if "/mempo/" in f.filename and "/tests/" not in f.filename]
    frame = (mine or frames)[-1]
    return f"{frame.filename.rsplit('/', 2)[-2]}/{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


class HostTraffic(TorchFunctionMode):
    """``with HostTraffic() as traffic: op(...)``; then `traffic.reads` and `traffic.uploads` list
    (function name, source line) per event."""

    def __init__(self):
        super().__init__()
        self.reads: list[tuple[str, str]] = []
        self.uploads: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__qualname__", getattr(func, "__name__", repr(func)))
        if func in _VALUE_READS or func in _SIZED_BY_VALUES:
            self.reads.append((name, _where()))
        elif func is torch.where and len(args) + len(kwargs) == 1:
            self.reads.append((name + "(condition)", _where()))
        elif func in (torch.repeat_interleave, _T.repeat_interleave) and "output_size" not in kwargs \
                and len(args) > 1 and isinstance(args[1], torch.Tensor):
            self.reads.append((name, _where()))
        elif func in _INDEXING and len(args) > 1 and _has_bool_index(args[1]):
            self.reads.append((name + "[bool]", _where()))
        elif func in _MOVES and isinstance(args[0], torch.Tensor) and args[0].device.type != "cpu":
            target = torch.device("cpu") if func is _T.cpu else _target(args, kwargs)
            if target is not None and target.type == "cpu":
                self.reads.append((name, _where()))
        elif func in _FROM_HOST and args and not isinstance(args[0], torch.Tensor):
            self.uploads.append((name, _where()))
        return func(*args, **kwargs)
