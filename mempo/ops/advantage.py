"""MemPO advantages: GRPO outcome advantage, pooled memory advantage, and their per-token sum.

Numeric conventions (shared by the torch path, the Triton kernels and the loop references):
group statistics (mean, unbiased N-1 std, floored at `std_floor` for the memory pools when asked)
are taken in fp64 of each group's values divided by the group's largest magnitude, so no sum or
square overflows; outputs are fp32 [B, L], never NaN
(degenerate groups give 0; values saturate at +-`VALUE_LIMIT`). `index` labels the group of each
of the B trajectories (ints, strings, verl's `uid` object array, any hashables: only equality
matters). Scored rounds come in CSR form: `mem_offsets` int64 [B+1] (rounds of trajectory b are
rows ``mem_offsets[b]:mem_offsets[b+1]``), `mem_rewards` [R], `mem_spans` int64 [R, 2] of
response-token (start, end). CUDA runs the Triton kernels, CPU vectorised torch
(`mempo.ops._dispatch`); both are deterministic (values are never accumulated atomically;
sequential index_add on CPU).

Host reads. Groups are found on the device (a stable sort of the labels; statistics over
B-entry buffers), so the number of groups is never read back. Shapes, dtypes and scalars are
checked on the host; the input *values* (finite scores and rewards, float mask entries, CSR offsets,
spans, overlaps, stages) in one fused check, whose result is settled by `validate`:

* ``"host"`` (the default): read once per call (one device-to-host read: at the end of the Triton
  path, whose kernels read in bounds whatever the values; before any indexing on the torch path); an
  invalid value raises ValueError naming the argument and the entry (the error path reads what it
  needs).
* ``"device"``: asserted on the device (`torch._assert_async`), nothing read back. With `index` an
  integer tensor on the mask's device (labels of any values) and every other input there too, the
  Triton path (CUDA's default) then makes no host synchronisation at all and can be captured in a
  CUDA graph. An invalid value is a device-side assert on CUDA (the CUDA context is lost; the
  message names what is checked, not which entry), a ValueError naming the entry on CPU.

Host labels (lists, numpy arrays, verl's uid object array) are mapped to ids on the host and
copied to the device once (pinned, non-blocking on CUDA): the only host-bound work of the call. The
torch path (CPU's default) also reads how many spans each power-of-two length class of its scatter
holds (one read when there are spans).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from mempo.ops._alloc import empty_output
from mempo.ops._dispatch import resolve_backend

__all__ = [
    "VALIDATE",
    "VALUE_LIMIT",
    "csr_offsets_from_rows",
    "group_ids",
    "group_zscore",
    "grpo_outcome_advantage",
    "memory_advantage",
    "mempo_advantage",
]


# Advantage values saturate at +-VALUE_LIMIT before the per-token sum. A z-score never comes near it
# (|z| <= sqrt(n - 1)); only raw scores beyond 1e18 with norm_adv_by_std=False, or such a
# memory_weight, reach it. With |mask entry| <= _MASK_LIMIT every token value stays below 2e37 (fp32).
VALUE_LIMIT = 1e18
_MASK_LIMIT = 2.0 ** 63  # largest |response_mask| entry: int64's range
# epsilon must be a positive normal fp32, so that it is nonzero in the kernels too
_EPS_RANGE = (float(torch.finfo(torch.float32).tiny), float(torch.finfo(torch.float32).max))
_STAGE_LIMIT = 2 ** 31  # mem_stages lie in [0, 2^31): (group, stage) pairs then fit one int64 key
VALIDATE = ("host", "device")  # how the fused value check is settled (module docstring)

# The fused value check: one bit per kind of invalid input value, OR-ed into one int32 word by the
# Triton kernels (the torch path reduces the same conditions to one bool).
_BAD_MASK = 1 << 0       # a float response_mask entry not finite or beyond 2^63
_BAD_VALUES = 1 << 1     # a score (or group_zscore value) not finite
_BAD_REWARDS = 1 << 2    # a memory reward not finite
_BAD_OFFSETS = 1 << 3    # mem_offsets not 0 .. R, non-decreasing
_BAD_SPANS = 1 << 4      # a span outside 0 <= start <= end <= L
_BAD_OVERLAP = 1 << 5    # two spans of one trajectory cover one token
_BAD_STAGES = 1 << 6     # a stage outside [0, 2^31)
_BAD_GROUPS = 1 << 7     # a group_zscore group id outside [0, num_groups)
_DEVICE_ASSERT = ("mempo advantage op: an input value is invalid (validate='device' checks on the device: scores / "
                  "values and mem_rewards finite, float response_mask entries finite with |entry| <= 2^63, "
                  "mem_offsets from 0 to len(mem_rewards) non-decreasing, mem_spans inside [0, L] and disjoint per "
                  "trajectory, mem_stages in [0, 2^31), group ids in range); call with validate='host' for the "
                  "argument and entry")


# --------------------------------------------------------------------------------------------
# Inputs: scalars, shapes and dtypes (host metadata only; values go to the fused check)
# --------------------------------------------------------------------------------------------
def _is_real(value: Any) -> bool:
    """A real number: Python or numpy ints and floats; never a bool (numpy's bool is no Real)."""
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_epsilon(epsilon: Any) -> float:
    low, high = _EPS_RANGE
    if not _is_real(epsilon) or not low <= float(epsilon) <= high:  # NaN fails the comparison too
        raise ValueError(f"epsilon must be a finite number in [{low:.8g}, {high:.8g}] (a positive normal "
                         f"float32), got {epsilon!r}")
    return float(epsilon)


def _check_std_floor(name: str, std_floor: Any) -> float:
    high = _EPS_RANGE[1]
    if not _is_real(std_floor) or not 0.0 <= float(std_floor) <= high:  # NaN fails the comparison too
        raise ValueError(f"{name} must be a finite number in [0, {high:.8g}] (0: no floor; a float32 in the "
                         f"kernels), got {std_floor!r}")
    return float(std_floor)


def _check_memory_weight(memory_weight: Any) -> float:
    if not _is_real(memory_weight) or not (math.isfinite(float(memory_weight)) and float(memory_weight) >= 0):
        raise ValueError(f"memory_weight must be a finite number >= 0, got {memory_weight!r}")
    return float(memory_weight)


def _check_flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a bool (True or False), got {value!r}")
    return bool(value)


def _check_validate(validate: Any) -> str:
    if not isinstance(validate, str) or validate not in VALIDATE:
        raise ValueError(f"validate must be one of {VALIDATE} ('host': one read per call, a ValueError naming the "
                         f"entry; 'device': asserted on the device, no host read), got {validate!r}")
    return validate


def _host_label_ids(index: Any, num_items: int) -> tuple[np.ndarray, int]:
    """Dense ids 0..G-1 (int64 numpy [num_items]) and G of host labels (not a tensor): a numpy array
    (ints, floats, strings or objects) or a sequence of hashables. Reads nothing from a device."""
    if not isinstance(index, np.ndarray) or index.dtype == object:
        # Hashable labels of any type (tuples too): dense ids by first appearance.
        labels = list(index)
        if len(labels) != num_items or (isinstance(index, np.ndarray) and index.ndim != 1):
            raise ValueError(f"index must have {num_items} entries (one per trajectory), got {len(labels)}")
        lookup: dict = {}
        dense = np.fromiter((lookup.setdefault(x, len(lookup)) for x in labels), dtype=np.int64, count=num_items)
        return dense, len(lookup)
    if index.ndim != 1 or index.shape[0] != num_items:
        raise ValueError(f"index must have {num_items} entries (one per trajectory), got shape {index.shape}")
    if index.dtype.kind in "fc" and np.isnan(index).any():
        raise ValueError(f"index[{int(np.flatnonzero(np.isnan(index))[0])}] is NaN: group labels must be comparable")
    uniq, inverse = np.unique(index, return_inverse=True)
    return inverse.astype(np.int64).reshape(-1), int(uniq.shape[0])


def _check_index_tensor(index: torch.Tensor, num_items: int) -> None:
    if index.dim() != 1 or index.numel() != num_items:
        raise ValueError(f"index must have shape ({num_items},), got {tuple(index.shape)}")
    if index.dtype.is_floating_point or index.dtype.is_complex or index.dtype == torch.bool:
        raise ValueError(f"index tensor must hold integer group ids, got dtype {index.dtype}")


def group_ids(index: Any, num_items: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """Map any group labels to dense ids 0..G-1 (a host helper: G is read back for a tensor index;
    the advantage ops group on the device instead and never need it).

    index: length-`num_items` int tensor, numpy array (ints, strings or objects), or list of
    hashables. Returns (int64 tensor [num_items] on `device`, G).
    """
    if isinstance(num_items, bool) or not isinstance(num_items, Integral) or num_items < 0:
        raise ValueError(f"num_items must be an integer >= 0, got {num_items!r}")
    if isinstance(index, torch.Tensor):
        _check_index_tensor(index, num_items)
        uniq, inverse = torch.unique(index, return_inverse=True)
        return inverse.to(device=device, dtype=torch.int64), int(uniq.numel())
    dense, count = _host_label_ids(index, num_items)
    return torch.from_numpy(dense).to(device), count


def _upload(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A host array on `device`: one copy, from pinned memory and non-blocking on CUDA (no host sync)."""
    host = torch.as_tensor(array)
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _labels(index: Any, num_items: int, device: torch.device) -> torch.Tensor:
    """Group labels as int64 [num_items] on `device`: an integer tensor as it is (any values: only
    equality matters), host labels as their dense ids (`group_ids`), copied once."""
    if isinstance(index, torch.Tensor):
        _check_index_tensor(index, num_items)
        return index.to(device=device, dtype=torch.int64).contiguous()
    dense, _ = _host_label_ids(index, num_items)
    return _upload(dense, device)


def _float_vector(x: Any, name: str, n: Optional[int], device: torch.device) -> torch.Tensor:
    """`x` as a 1-D tensor on `device` of its own float / int32 / int64 / bool dtype (a list of Python
    floats is read as fp64, not torch's fp32 default); shape and dtype checked, values in the fused check."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if n is not None and t.numel() != n:
        raise ValueError(f"{name} must have {n} entries, got {t.numel()}")
    if not (t.dtype.is_floating_point or t.dtype in (torch.int32, torch.int64, torch.bool)):
        raise ValueError(f"{name} must be a float (or int) tensor, got dtype {t.dtype}")
    return t.to(device)


def _check_mask(response_mask: torch.Tensor, num_rows: int) -> torch.Tensor:
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        raise ValueError("response_mask must be a 2-D tensor (batch, response_length)")
    if response_mask.shape[0] != num_rows:
        raise ValueError(f"response_mask has {response_mask.shape[0]} rows, expected {num_rows} (one per trajectory)")
    if response_mask.dtype.is_complex:
        raise ValueError(f"response_mask must be a bool, integer or float tensor, got dtype {response_mask.dtype}")
    if response_mask.stride(-1) != 1:
        response_mask = response_mask.contiguous()
    return response_mask


def _check_round_counts(num_rewards: int, mem_offsets: Any, mem_spans: Any) -> None:
    """The three CSR inputs must agree on R; name the one that disagrees with the other two (reads
    mem_offsets[-1]: called when a disagreement is known, or on the error path of the fused check)."""
    offsets, spans = torch.as_tensor(mem_offsets), torch.as_tensor(mem_spans)
    if offsets.dim() != 1 or offsets.numel() < 1 or spans.dim() not in (1, 2) or (spans.dim() == 1 and spans.numel()):
        return  # malformed shapes: _memory_inputs says what is wrong
    by_offsets, by_spans = int(offsets[-1]), int(spans.shape[0])
    if by_offsets == by_spans != num_rewards:
        raise ValueError(f"mem_rewards has {num_rewards} entries, but mem_offsets and mem_spans describe "
                         f"{by_offsets} scored rounds: give one memory reward per scored round")
    if num_rewards == by_offsets != by_spans:
        raise ValueError(f"mem_spans has {by_spans} rows, but mem_rewards and mem_offsets describe {num_rewards} "
                         "scored rounds: give one (start, end) span per scored round")
    if num_rewards == by_spans != by_offsets:
        raise ValueError(f"mem_offsets ends at {by_offsets}, but mem_rewards and mem_spans hold {num_rewards} "
                         "scored rounds: mem_offsets[-1] must equal len(mem_rewards)")
    if len({num_rewards, by_offsets, by_spans}) == 3:
        raise ValueError(f"mem_rewards ({num_rewards} entries), mem_offsets (ending at {by_offsets}) and mem_spans "
                         f"({by_spans} rows) disagree on the number of scored rounds")


@dataclass(frozen=True)
class _Memory:
    """The scored rounds on the mask's device: rewards [R] (own dtype), offsets int64 [B+1], spans
    int64 [R, 2] contiguous, stages int64 [R] or None. Shapes checked; values not yet."""

    rewards: torch.Tensor
    offsets: torch.Tensor
    spans: torch.Tensor
    stages: Optional[torch.Tensor]


def _memory_inputs(mem_rewards: Any, mem_offsets: Any, mem_spans: Any, mem_stages: Any, num_rows: int,
                   device: torch.device) -> _Memory:
    rewards = _float_vector(mem_rewards, "mem_rewards", None, device)
    num_rounds = rewards.numel()
    offsets, spans = torch.as_tensor(mem_offsets), torch.as_tensor(mem_spans)
    well_formed = offsets.dim() == 1 and offsets.numel() >= 1 and (
        spans.dim() == 2 or (spans.dim() == 1 and spans.numel() == 0))
    if well_formed and spans.shape[0] != num_rounds:
        _check_round_counts(num_rounds, offsets, spans)  # raises, naming the argument that disagrees
    if offsets.dtype.is_floating_point or offsets.dim() != 1 or offsets.numel() != num_rows + 1:
        raise ValueError(f"mem_offsets must be an integer vector of B+1 = {num_rows + 1} CSR offsets, "
                         f"got shape {tuple(offsets.shape)} dtype {offsets.dtype}")
    if spans.numel() == 0:
        spans = spans.reshape(0, 2)
    if spans.dtype.is_floating_point or spans.dim() != 2 or spans.shape != (num_rounds, 2):
        raise ValueError(f"mem_spans must be an integer tensor of shape ({num_rounds}, 2) (start, end), "
                         f"got shape {tuple(spans.shape)} dtype {spans.dtype}")
    stages = None
    if mem_stages is not None:
        stages = torch.as_tensor(mem_stages)
        if stages.dtype.is_floating_point or stages.dtype.is_complex or stages.dtype == torch.bool \
                or stages.dim() != 1 or stages.numel() != num_rounds:
            raise ValueError(f"mem_stages must be an integer vector of {num_rounds} entries (one stage per scored "
                             f"round), got shape {tuple(stages.shape)} dtype {stages.dtype}")
        stages = stages.to(device=device, dtype=torch.int64).contiguous()
    return _Memory(rewards, offsets.to(device=device, dtype=torch.int64).contiguous(),
                   spans.to(device=device, dtype=torch.int64).contiguous(), stages)


# --------------------------------------------------------------------------------------------
# The fused value check: settled once; its error path names the argument and entry
# --------------------------------------------------------------------------------------------
def _settle(bad: Optional[torch.Tensor], validate: str, diagnose: Callable[[], None]) -> None:
    """Settle the fused check. bad: a one-element bool or int tensor, nonzero when some input value
    is invalid (None: nothing to check). "host": one read; "device": `torch._assert_async`."""
    if bad is None:
        return
    if validate == "host":
        if bad.item():  # the one host read of the call
            diagnose()
            raise ValueError(f"an input value is invalid (validation flags {int(bad):#x})")
        return
    ok = bad.logical_not()
    if ok.device.type != "cpu":
        torch._assert_async(ok, _DEVICE_ASSERT)  # a device-side assert: no host read, capturable
        return
    try:
        torch._assert_async(ok, _DEVICE_ASSERT)  # on CPU it raises at once: name the entry then
    except RuntimeError:
        diagnose()
        raise


def _rows_of_csr(offsets: torch.Tensor, num_items: int) -> torch.Tensor:
    """Row id of each of `num_items` CSR items: item i belongs to row b when offsets[b] <= i < offsets[b+1]."""
    items = torch.arange(num_items, device=offsets.device)
    return torch.searchsorted(offsets, items, right=True) - 1


def _span_clashes(row: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                  length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Overlapping spans without sorting per row: encode (row, position) as row * (L + 1) + position,
    sort the spans by encoded start, and compare each non-empty span's start with the largest encoded
    end seen before it (a running max stays inside the row: rows are L + 1 apart). row: each span's
    trajectory (`_rows_of_csr`). Returns (clash [R - 1] bool, order, widest_at); clash[k] flags
    sorted span k + 1."""
    key_start = row * (length + 1) + start
    key_end = row * (length + 1) + end
    order = torch.argsort(key_start, stable=True)
    ks, ke = key_start.index_select(0, order), key_end.index_select(0, order)
    widest_end, widest_at = torch.cummax(ke, 0)
    clash = (ks[1:] < widest_end[:-1]) & (ke[1:] > ks[1:])
    return clash, order, widest_at


def _bad_values_torch(*, mask: Optional[torch.Tensor] = None, values: Optional[torch.Tensor] = None,
                      memory: Optional[_Memory] = None, length: int = 0, round_rows: Optional[torch.Tensor] = None,
                      group: Optional[tuple[torch.Tensor, int]] = None) -> Optional[torch.Tensor]:
    """The fused check on the torch path: a bool scalar on the inputs' device, True when some input
    value is invalid (None: nothing to check). round_rows: `_rows_of_csr` of the memory's offsets.
    Reads nothing."""
    parts = []
    if mask is not None and mask.dtype.is_floating_point and mask.numel():
        bounds = torch.stack(torch.aminmax(mask)).double()  # one pass; NaN propagates
        parts.append(~(bounds.abs() <= _MASK_LIMIT).all())
    for vector in (values, None if memory is None else memory.rewards):
        if vector is not None and vector.dtype.is_floating_point and vector.numel():
            parts.append(~torch.isfinite(vector).all())
    if memory is not None:
        offsets, num_rounds = memory.offsets, memory.rewards.numel()
        parts.append((offsets[0] != 0) | (offsets[-1] != num_rounds) | (offsets[1:] < offsets[:-1]).any())
        start, end = memory.spans[:, 0], memory.spans[:, 1]
        parts.append(((start < 0) | (end < start) | (end > length)).any())
        if num_rounds > 1:
            parts.append(_span_clashes(round_rows, start, end, length)[0].any())
        if memory.stages is not None:
            parts.append(((memory.stages < 0) | (memory.stages >= _STAGE_LIMIT)).any())
    if group is not None:
        ids, num_groups = group
        parts.append(((ids < 0) | (ids >= num_groups)).any())
    return torch.stack(parts).any() if parts else None


def _raise_if_not_finite(values: torch.Tensor, name: str) -> None:
    if values.dtype.is_floating_point and values.numel() and not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).nonzero()[0])
        raise ValueError(f"{name}[{bad}] is not finite ({values[bad].item()}); {name} must be finite numbers")


def _diagnose_mask(mask: torch.Tensor) -> None:
    if mask.dtype.is_floating_point and mask.numel():
        bad = ~torch.isfinite(mask) | (mask.abs() > _MASK_LIMIT)
        if bool(bad.any()):
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"response_mask[{b}, {t}] = {mask[b, t].item()} is not a mask weight: "
                             f"entries must be finite, with |entry| <= 2^63 (0/1 masks are the norm)")


def _diagnose_memory(memory: _Memory, length: int) -> None:
    num_rounds, offsets = memory.rewards.numel(), memory.offsets
    _raise_if_not_finite(memory.rewards, "mem_rewards")
    _check_round_counts(num_rounds, offsets, memory.spans)
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_rounds or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"mem_offsets must start at 0, be non-decreasing and end at len(mem_rewards) = {num_rounds}")
    start, end = memory.spans[:, 0], memory.spans[:, 1]
    bad = (start < 0) | (end < start) | (end > length)
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise ValueError(f"mem_spans[{r}] = ({int(start[r])}, {int(end[r])}) is not a span inside [0, {length}]")
    if num_rounds > 1:
        row = _rows_of_csr(offsets, num_rounds)
        clash, order, widest_at = _span_clashes(row, start, end, length)
        if bool(clash.any()):
            k = int(clash.nonzero()[0])
            first, second = int(order[int(widest_at[k])]), int(order[k + 1])
            raise ValueError(f"mem_spans[{first}] and mem_spans[{second}] overlap in trajectory {int(row[second])}; "
                             "<mem> spans of one trajectory must be disjoint")
    stages = memory.stages
    if stages is not None and num_rounds:
        wrong = (stages < 0) | (stages >= _STAGE_LIMIT)
        if bool(wrong.any()):
            bad_at = int(wrong.nonzero()[0])
            raise ValueError(f"mem_stages[{bad_at}] = {int(stages[bad_at])}: stages must lie in [0, 2^31)")


def _diagnose(*, mask: Optional[torch.Tensor] = None, values: Optional[tuple[torch.Tensor, str]] = None,
              memory: Optional[_Memory] = None, length: int = 0,
              group: Optional[tuple[torch.Tensor, int]] = None) -> None:
    """The error path of the fused check: raise the ValueError naming the first invalid input value, in
    the order the arguments are documented (reads whatever it needs; never runs on valid inputs)."""
    if mask is not None:
        _diagnose_mask(mask)
    if values is not None:
        _raise_if_not_finite(*values)
    if memory is not None:
        _diagnose_memory(memory, length)
    if group is not None:
        ids, num_groups = group
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_groups):
            raise ValueError(f"group ids must lie in [0, num_groups = {num_groups}), got ids in "
                             f"[{int(ids.min())}, {int(ids.max())}]")


# --------------------------------------------------------------------------------------------
# Grouped z-score: torch path
# --------------------------------------------------------------------------------------------
def _dense_ids(keys: torch.Tensor) -> torch.Tensor:
    """Group id of each of n int64 keys, in [0, n): the position of its group's first item in the
    stable sort of the keys (equal keys, equal ids; the ids the Triton z-score kernel writes). Reads nothing."""
    num = keys.numel()
    perm = torch.argsort(keys, stable=True)
    ordered = keys.index_select(0, perm)
    position = torch.arange(num, device=keys.device)
    head = torch.ones(num, dtype=torch.bool, device=keys.device)
    head[1:] = ordered[1:] != ordered[:-1]
    head_position = torch.where(head, position, torch.zeros_like(position)).cummax(0).values
    return torch.empty_like(position).index_copy_(0, perm, head_position)


def _group_zscore_torch(values: torch.Tensor, group: torch.Tensor, num_groups: int, epsilon: float,
                        norm_by_std: bool, singleton_zero: bool, std_floor: float = 0.0) -> torch.Tensor:
    """values fp64 [n], group int64 ids in [0, num_groups) (unused ids are empty groups): fp32 [n]."""
    if values.numel() == 0:
        return values.to(torch.float32)
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=values.device)
    # 1. Per-group scale a = the largest |value| (1 for an all-zero group): the statistics are taken of
    #    y = x / a, in [-1, 1], so no sum or square overflows, not even for fp64 values near 1e308.
    scale = zeros.scatter_reduce(0, group, values.abs(), reduce="amax", include_self=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    item_scale = scale.index_select(0, group)  # index_select: plain advanced indexing is slow on CPU
    y = values / item_scale
    # 2. Per-group count, mean and unbiased std of y (index_add_ is sequential, hence deterministic,
    #    on CPU; two passes, as in the kernel). Counts as fp64 sums of ones (exact below 2^53; bincount's
    #    size is data-dependent, and an int64 index_add is many times slower on CPU).
    count = zeros.index_add(0, group, torch.ones_like(values))
    mean = zeros.index_add(0, group, y) / count.clamp(min=1)
    centred = y - mean.index_select(0, group)
    std = torch.sqrt(zeros.index_add(0, group, centred * centred) / (count - 1).clamp(min=1))
    # 3. (x - mean) / (max(std, floor) + eps) = (y - mean_y) / (max(std_y, floor / a) + eps / a); a
    #    zero denominator (eps / a underflowed, floor 0) only comes with std_y = 0, i.e. every centred
    #    value 0: the result is 0. floor / a may overflow to inf (a tiny group): then the result is 0.
    if norm_by_std:
        denom = (torch.maximum(std, std_floor / scale) if std_floor > 0 else std) + epsilon / scale
        out = centred / torch.where(denom > 0, denom, torch.ones_like(denom)).index_select(0, group)
    else:
        out = centred * item_scale
    # 4. Groups of one: verl's mean 0 / std 1, i.e. x / (1 + eps) (x when only centring); memory pools 0.
    single = (count == 1).index_select(0, group)
    if singleton_zero:
        out = torch.where(single, torch.zeros_like(out), out)
    else:
        out = torch.where(single, values / (1.0 + epsilon) if norm_by_std else values, out)
    return out.clamp_(-VALUE_LIMIT, VALUE_LIMIT).to(torch.float32)


def _weighted(normed: torch.Tensor, weight: float) -> torch.Tensor:
    """fp32 values times `weight`: an fp64 product, saturated like every value (a huge weight must
    not overflow fp32); weight 1 changes nothing."""
    return (normed.double() * weight).clamp_(-VALUE_LIMIT, VALUE_LIMIT).to(torch.float32)


def _kernel_values(values: torch.Tensor) -> torch.Tensor:
    """Values as the z-score kernel loads them: their own float / int dtype (widened to fp64 in the
    kernel), bool as fp64."""
    return (values.double() if values.dtype == torch.bool else values).contiguous()


def group_zscore(values: torch.Tensor, group: torch.Tensor, num_groups: int, *, epsilon: float = 1e-6,
                 norm_by_std: bool = True, singleton: str = "passthrough", std_floor: float = 0.0,
                 backend: str = "auto", validate: str = "host") -> torch.Tensor:
    """Normalise `values` within groups: ``z = (x - mean) / (max(std, std_floor) + epsilon)`` with
    the group's mean and unbiased (N-1) std, or ``x - mean`` when not `norm_by_std` (the floor then
    plays no part); all-equal values give 0.

    values: [n] float or int (any dtype, finite); group: [n] int dense group ids in [0, num_groups).
    singleton: "passthrough" (a group of one keeps its value, mean 0 / std 1) or "zero".
    std_floor: a finite number in [0, 3.4e38] (0, the default: no floor, ``(x - mean) / (std +
    epsilon)``); a group whose spread is below it is divided by the floor, so near-constant groups
    stay near 0 instead of becoming unit-size. Groups of one are not affected (`singleton` rules).
    validate: "host" or "device" (module docstring; the values' finiteness and the ids' range are
    the value checks). Statistics in fp64; returns [n] fp32 on values' device, saturated at +-VALUE_LIMIT.
    """
    if singleton not in ("passthrough", "zero"):
        raise ValueError(f"singleton must be 'passthrough' or 'zero', got {singleton!r}")
    epsilon, norm_by_std = _check_epsilon(epsilon), _check_flag("norm_by_std", norm_by_std)
    std_floor = _check_std_floor("std_floor", std_floor)
    validate = _check_validate(validate)
    if isinstance(num_groups, bool) or not isinstance(num_groups, Integral) or num_groups < 0:
        raise ValueError(f"num_groups must be an integer >= 0, got {num_groups!r}")
    on = values.device if isinstance(values, torch.Tensor) else torch.device("cpu")
    values = _float_vector(values, "values", None, on).contiguous()
    if not isinstance(group, torch.Tensor) or group.dtype.is_floating_point or group.dtype.is_complex \
            or group.dtype == torch.bool or tuple(group.shape) != tuple(values.shape):
        raise ValueError(f"group must be an integer tensor of shape {tuple(values.shape)} (one id per value)")
    group = group.to(device=values.device, dtype=torch.int64).contiguous()
    if values.numel() == 0:
        return values.to(torch.float32)
    singleton_zero = singleton == "zero"
    diagnose = lambda: _diagnose(values=(values, "values"), group=(group, num_groups))  # noqa: E731
    if resolve_backend(backend, values) == "torch":
        _settle(_bad_values_torch(values=values, group=(group, num_groups)), validate, diagnose)
        return _group_zscore_torch(values.double(), group, num_groups, epsilon, norm_by_std, singleton_zero,
                                   std_floor)
    # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
    from mempo.kernels import group_zscore as zscore_kernel

    flags = torch.zeros(1, dtype=torch.int32, device=values.device)
    out = torch.empty(values.shape, dtype=torch.float32, device=values.device)
    zscore_kernel.group_zscore(_kernel_values(values), group, torch.argsort(group, stable=True), out, None, flags,
                               epsilon, norm_by_std, singleton_zero, value_limit=VALUE_LIMIT, std_floor=std_floor,
                               key_limit=min(num_groups, 2 ** 63 - 1), finite_bit=_BAD_VALUES, range_bit=_BAD_GROUPS)
    _settle(flags, validate, diagnose)
    return out


# --------------------------------------------------------------------------------------------
# Span scatter fused with the row broadcast: torch path
# --------------------------------------------------------------------------------------------
def _span_pieces(start: torch.Tensor, end: torch.Tensor, span_row: torch.Tensor,
                 length: int) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Cut every span into power-of-two pieces: [(width, flat first position, span id, trajectory
    row)] per width, each tensor int64 [pieces of that width]; span_row: each span's trajectory.

    A span of length n = sum of 2^k over the set bits of n becomes one piece per set bit, the wider
    pieces first. Pieces of one width never overlap (spans are disjoint), so each width class can be
    gathered and written back as whole rows of an unfolded view: work ~ covered tokens, no padding,
    and no cell is written twice (safe under any parallel schedule). At most log2(L) + 1 classes,
    sized with one host read whatever the spans (the pieces per width; the span ids of a width then
    come from `nonzero_static`). Every op here is [R]-sized: no [bits, R] table (parallel regions).
    """
    lengths = end - start
    if lengths.numel() == 0:
        return []
    first = span_row * length + start
    has_bit = [(lengths & (1 << bit)) != 0 for bit in range(max(length, 1).bit_length())]
    counts = torch.stack([selected.sum() for selected in has_bit]).tolist()
    pieces = []
    for bit, (selected, count) in enumerate(zip(has_bit, counts)):
        if count:
            span_id = torch.nonzero_static(selected, size=count).squeeze(1)
            higher_bits = (lengths.index_select(0, span_id) >> (bit + 1)) << (bit + 1)
            pieces.append((1 << bit, first.index_select(0, span_id) + higher_bits, span_id,
                           span_row.index_select(0, span_id)))
    return pieces


def _span_scatter_torch(row_value: torch.Tensor, span_value: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                        offsets: torch.Tensor, mask: torch.Tensor,
                        span_row: Optional[torch.Tensor] = None) -> torch.Tensor:
    """row_value fp32 [B], span_value fp32 [S], start / end int64 [S], offsets int64 [B+1] (CSR of the
    spans), mask [B, L]; span_row: each span's trajectory (computed from offsets when None)."""
    num_rows, length = mask.shape
    if span_row is None:
        span_row = _rows_of_csr(offsets, start.numel())
    # 1. The mask as fp32 (a vectorised cast; mixing an int mask into a multiply is far slower),
    #    into a fresh buffer faulted in as huge pages where the OS allows (see mempo.ops._alloc).
    out = empty_output((num_rows, length), torch.float32, mask.device)
    out.copy_(mask)
    flat = out.view(-1)
    # 2. Gather the mask under every span piece ([pieces, width] rows of an unfolded view).
    pieces = []
    for width, piece_first, span_id, piece_row in _span_pieces(start, end, span_row, length):
        windows = flat.unfold(0, width, 1)
        pieces.append((windows, piece_first, span_id, piece_row, windows.index_select(0, piece_first)))
    # 3. Outcome value times the mask everywhere.
    out.mul_(row_value[:, None])
    # 4. Span tokens: mask * outcome + mask * span value (the same two roundings as a separate
    #    memory advantage added on top), written once per token: pieces are disjoint.
    for windows, piece_first, span_id, piece_row, piece_mask in pieces:
        value = piece_mask * row_value.index_select(0, piece_row)[:, None]
        value += piece_mask * span_value.index_select(0, span_id)[:, None]
        windows.index_put_((piece_first,), value)
    return out


# --------------------------------------------------------------------------------------------
# The pipeline: outcome z-score, memory pools, scatter
# --------------------------------------------------------------------------------------------
def _advantage_torch(scores: Optional[torch.Tensor], labels: torch.Tensor, mask: torch.Tensor,
                     memory: Optional[_Memory], epsilon: float, norm_by_std: bool, memory_weight: float,
                     std_floor: float, validate: str, diagnose: Callable[[], None]) -> torch.Tensor:
    num_rows, length = mask.shape
    round_rows = None if memory is None else _rows_of_csr(memory.offsets, memory.rewards.numel())
    # The check settles before anything indexes with the inputs (the scatter gathers by span).
    _settle(_bad_values_torch(mask=mask, values=scores, memory=memory, length=length, round_rows=round_rows),
            validate, diagnose)
    group = _dense_ids(labels)
    if scores is None:
        row_value = torch.zeros(num_rows, dtype=torch.float32, device=mask.device)
    else:
        row_value = _group_zscore_torch(scores.double(), group, num_rows, epsilon, norm_by_std, False)
    if memory is None:
        empty = torch.zeros(0, dtype=torch.float32, device=mask.device)
        no_spans = torch.zeros(num_rows + 1, dtype=torch.int64, device=mask.device)
        return _span_scatter_torch(row_value, empty, empty.long(), empty.long(), no_spans, mask)
    num_rounds = memory.rewards.numel()
    round_group = group.index_select(0, round_rows)
    if memory.stages is None:  # one pool per group
        pool, num_pools = round_group, num_rows
    else:  # one pool per (group, stage): one int64 key per pair, dense ids of the keys
        pool, num_pools = _dense_ids(round_group * _STAGE_LIMIT + memory.stages), num_rounds
    normed = _group_zscore_torch(memory.rewards.double(), pool, num_pools, epsilon, norm_by_std, True, std_floor)
    span_value = normed if memory_weight == 1.0 else _weighted(normed, memory_weight)
    start, end = memory.spans[:, 0].contiguous(), memory.spans[:, 1].contiguous()
    return _span_scatter_torch(row_value, span_value, start, end, memory.offsets, mask, round_rows)


def _advantage_triton(scores: Optional[torch.Tensor], labels: torch.Tensor, mask: torch.Tensor,
                      memory: Optional[_Memory], epsilon: float, norm_by_std: bool, memory_weight: float,
                      std_floor: float, validate: str, diagnose: Callable[[], None]) -> torch.Tensor:
    """Sorts, three kernels and the scatter; every kernel reads in bounds whatever the values, so the
    fused check settles last (one read, or one device assert). No host read besides."""
    # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
    from mempo.kernels import group_zscore as zscore_kernel
    from mempo.kernels import round_keys as keys_kernel
    from mempo.kernels import span_scatter as scatter_kernel

    num_rows, length = mask.shape
    device = mask.device
    flags = torch.zeros(1, dtype=torch.int32, device=device)
    row_value = gid = None
    if scores is not None:
        # 1. Outcome: z-score per group of labels; each trajectory's group id (for the memory pools).
        row_value = torch.empty(num_rows, dtype=torch.float32, device=device)
        gid = torch.empty(num_rows, dtype=torch.int64, device=device)
        zscore_kernel.group_zscore(_kernel_values(scores), labels, torch.argsort(labels, stable=True), row_value, gid,
                                   flags, epsilon, norm_by_std, False, value_limit=VALUE_LIMIT, finite_bit=_BAD_VALUES)
    span_value = spans = offsets = None
    if memory is not None:
        if gid is None and memory.stages is not None:  # a (group, stage) key needs ids below 2^32
            gid = torch.empty(num_rows, dtype=torch.int64, device=device)
            zscore_kernel.group_zscore(None, labels, torch.argsort(labels, stable=True), None, gid, flags, epsilon,
                                       norm_by_std, False)
        # 2. Pool key of every round (checking offsets, spans and stages), 3. z-score per pool, times the weight.
        num_rounds = memory.rewards.numel()
        keys = torch.empty(num_rounds, dtype=torch.int64, device=device)
        keys_kernel.round_keys(memory.offsets, memory.spans, memory.stages, labels if gid is None else gid, keys,
                               flags, length, _STAGE_LIMIT, offsets_bit=_BAD_OFFSETS, spans_bit=_BAD_SPANS,
                               stages_bit=_BAD_STAGES)
        span_value = torch.empty(num_rounds, dtype=torch.float32, device=device)
        zscore_kernel.group_zscore(_kernel_values(memory.rewards), keys, torch.argsort(keys, stable=True), span_value,
                                   None, flags, epsilon, norm_by_std, True, value_limit=VALUE_LIMIT,
                                   std_floor=std_floor, weight=memory_weight, finite_bit=_BAD_REWARDS)
        spans, offsets = memory.spans, memory.offsets
    # 4. Outcome + memory values times the mask (checking overlaps and float mask entries).
    out = torch.empty((num_rows, length), dtype=torch.float32, device=device)
    scatter_kernel.span_scatter(row_value, span_value, spans, offsets, mask, out, flags, overlap_bit=_BAD_OVERLAP,
                                mask_bit=_BAD_MASK, mask_limit=_MASK_LIMIT)
    _settle(flags, validate, diagnose)
    return out


def _advantage(scores: Optional[torch.Tensor], labels: torch.Tensor, mask: torch.Tensor, memory: Optional[_Memory],
               epsilon: float, norm_by_std: bool, memory_weight: float, std_floor: float, backend: str,
               validate: str) -> torch.Tensor:
    """[B, L] fp32 token advantages of checked inputs, all on the mask's device (scores None: memory only)."""
    length = mask.shape[1]
    values = None if scores is None else (scores, "scores")
    diagnose = lambda: _diagnose(mask=mask, values=values, memory=memory, length=length)  # noqa: E731
    path = _advantage_torch if resolve_backend(backend, mask) == "torch" else _advantage_triton
    return path(scores, labels, mask, memory, epsilon, norm_by_std, memory_weight, std_floor, validate, diagnose)


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------
@torch.no_grad()
def grpo_outcome_advantage(scores: torch.Tensor, index: Any, response_mask: torch.Tensor, epsilon: float = 1e-6,
                           norm_adv_by_std: bool = True, *, backend: str = "auto",
                           validate: str = "host") -> torch.Tensor:
    """GRPO outcome advantage, numerically verl's `compute_grpo_outcome_advantage`.

    Per group of scores: ``A = (s - mean) / (std + epsilon)`` (unbiased std), or ``s - mean`` when
    not `norm_adv_by_std` (Dr.GRPO). A group of one uses mean 0 and std 1, so ``A = s / (1 +
    epsilon)`` (verl's choice). Broadcast as ``A * response_mask``.
    scores: [B] float (one outcome score per trajectory); index: B group labels (an integer tensor on
    the mask's device: grouped there, no host read); response_mask: [B, L] (bool / int / float);
    validate: "host" or "device" (module docstring). Returns advantages [B, L] fp32 on the mask's device.
    """
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    validate = _check_validate(validate)
    mask = _check_mask(response_mask, len(scores))
    scores = _float_vector(scores, "scores", mask.shape[0], mask.device)
    labels = _labels(index, mask.shape[0], mask.device)
    return _advantage(scores, labels, mask, None, epsilon, norm_adv_by_std, 1.0, 0.0, backend, validate)


@torch.no_grad()
def memory_advantage(mem_rewards: torch.Tensor, mem_offsets: torch.Tensor, mem_spans: torch.Tensor, index: Any,
                     response_mask: torch.Tensor, epsilon: float = 1e-6, norm_adv_by_std: bool = True, *,
                     mem_stages: Optional[torch.Tensor] = None, std_floor: float = 0.0,
                     backend: str = "auto", validate: str = "host") -> torch.Tensor:
    """Memory advantage alone: pooled z-scored memory rewards written on their `<mem>` spans.

    Pools: per group, the rewards of all scored rounds of all its trajectories form one pool (the
    default, the paper's); with `mem_stages`, per (group, stage) pair, so a round competes only with
    rounds of its group at the same stage. Each pool is z-scored like the outcome, with the std
    floored: ``(m - mean) / (max(std, std_floor) + epsilon)`` (`group_zscore`); a pool of zero or
    one values gives 0 (one value carries no relative signal). Each value is written on the tokens
    ``[start, end)`` of its round's `<mem>` span times the mask. Spans must satisfy ``0 <= start <=
    end <= L`` and not overlap within a trajectory (ValueError); empty spans contribute nothing.

    mem_rewards: [R] float, one per scored round; mem_offsets: [B+1] int CSR offsets (rounds of
    trajectory b are rows mem_offsets[b]:mem_offsets[b+1]); mem_spans: [R, 2] int (start, end) in
    response-token coordinates; index: B group labels; response_mask: [B, L]; mem_stages: None or
    [R] int in [0, 2^31), the stage of each scored round (e.g. its round index); std_floor: a finite
    number >= 0 (0: no floor); validate: "host" or "device" (module docstring). Returns [B, L] fp32,
    zero outside spans.
    """
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    std_floor = _check_std_floor("std_floor", std_floor)
    validate = _check_validate(validate)
    mask = _check_mask(response_mask, len(mem_offsets) - 1)
    labels = _labels(index, mask.shape[0], mask.device)
    memory = _memory_inputs(mem_rewards, mem_offsets, mem_spans, mem_stages, mask.shape[0], mask.device)
    return _advantage(None, labels, mask, memory, epsilon, norm_adv_by_std, 1.0, std_floor, backend, validate)


@torch.no_grad()
def mempo_advantage(scores: torch.Tensor, index: Any, response_mask: torch.Tensor,
                    mem_rewards: Optional[torch.Tensor] = None, mem_offsets: Optional[torch.Tensor] = None,
                    mem_spans: Optional[torch.Tensor] = None, *, epsilon: float = 1e-6,
                    norm_adv_by_std: bool = True, memory_weight: float = 1.0,
                    mem_stages: Optional[torch.Tensor] = None, memory_std_floor: float = 0.0,
                    backend: str = "auto", validate: str = "host") -> tuple[torch.Tensor, torch.Tensor]:
    """MemPO token advantage: outcome + memory_weight x memory, in verl's shapes.

    scores: [B] float outcome scores; index: B group labels (an integer tensor on the mask's device:
    grouped there, no host read; verl's uid object array: mapped on the host, copied once);
    response_mask: [B, L]; mem_rewards [R], mem_offsets [B+1], mem_spans [R, 2]: the scored rounds in
    CSR form (all three or none; with none the result is plain GRPO). mem_stages: None (the default:
    one memory pool per group) or [R] int in [0, 2^31), one pool per (group, stage)
    (`memory_advantage`); memory_std_floor: the memory pools' std floor (`group_zscore`'s
    ``std_floor``; 0: none). Both concern the memory part only: the outcome advantage is z-scored per
    group without a floor. validate: "host" (one read per call) or "device" (no read: with every
    tensor, `index` included, on one CUDA device the call is sync-free and CUDA-graph capturable;
    module docstring). Returns (advantages, returns), both the same [B, L] fp32 tensor, as verl's
    GRPO estimator does: ``A = A_out + memory_weight * A_mem`` per token.
    Raises ValueError naming the argument: `epsilon` outside [1.2e-38, 3.4e38], `memory_weight`
    negative or not finite, `memory_std_floor` negative or not finite, `mem_stages` not [R] ints in
    range (or given without memory inputs), `norm_adv_by_std` not a bool, `validate` not "host" /
    "device", scores or memory rewards not finite, a float mask with a non-finite entry or one beyond
    2^63 in magnitude, offsets / spans not a valid CSR of disjoint spans, NaN labels in a float
    `index` array (value errors: with validate="device" a device-side assert on CUDA).
    """
    given = [x is not None for x in (mem_rewards, mem_offsets, mem_spans)]
    if any(given) and not all(given):
        raise ValueError("mem_rewards, mem_offsets and mem_spans must be given together (or none of them)")
    if mem_stages is not None and not all(given):
        raise ValueError("mem_stages needs the memory inputs (mem_rewards, mem_offsets, mem_spans)")
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    memory_weight = _check_memory_weight(memory_weight)
    memory_std_floor = _check_std_floor("memory_std_floor", memory_std_floor)
    validate = _check_validate(validate)
    mask = _check_mask(response_mask, len(scores))
    scores = _float_vector(scores, "scores", mask.shape[0], mask.device)
    labels = _labels(index, mask.shape[0], mask.device)
    memory = None
    if all(given):
        memory = _memory_inputs(mem_rewards, mem_offsets, mem_spans, mem_stages, mask.shape[0], mask.device)
    advantages = _advantage(scores, labels, mask, memory, epsilon, norm_adv_by_std, memory_weight, memory_std_floor,
                            backend, validate)
    return advantages, advantages


def csr_offsets_from_rows(round_rows: Sequence[int] | torch.Tensor, num_rows: int) -> torch.Tensor:
    """CSR offsets [num_rows+1] for scored rounds listed by trajectory row (rows must be sorted)."""
    if isinstance(num_rows, bool) or not isinstance(num_rows, Integral) or num_rows < 0:
        raise ValueError(f"num_rows must be an integer >= 0, got {num_rows!r}")
    rows = torch.as_tensor(round_rows, dtype=torch.int64)
    if rows.numel() and (bool((rows[1:] < rows[:-1]).any()) or int(rows.min()) < 0 or int(rows.max()) >= num_rows):
        raise ValueError(f"round_rows must be sorted trajectory rows in [0, {num_rows})")
    offsets = torch.zeros(num_rows + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(torch.bincount(rows, minlength=num_rows), 0)
    return offsets
