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
(`mempo.ops._dispatch`); both are deterministic (no atomics; sequential index_add on CPU).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Optional, Sequence

import numpy as np
import torch

from mempo.ops._alloc import empty_output
from mempo.ops._dispatch import resolve_backend

__all__ = [
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


# --------------------------------------------------------------------------------------------
# Inputs
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


def group_ids(index: Any, num_items: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, int]:
    """Map any group labels to dense ids 0..G-1.

    index: length-`num_items` int tensor, numpy array (ints, strings or objects), or list of
    hashables. Returns (int64 tensor [num_items] on `device`, G).
    """
    if isinstance(num_items, bool) or not isinstance(num_items, Integral) or num_items < 0:
        raise ValueError(f"num_items must be an integer >= 0, got {num_items!r}")
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.numel() != num_items:
            raise ValueError(f"index must have shape ({num_items},), got {tuple(index.shape)}")
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(f"index tensor must hold integer group ids, got dtype {index.dtype}")
        uniq, inverse = torch.unique(index, return_inverse=True)
        return inverse.to(device=device, dtype=torch.int64), int(uniq.numel())
    if not isinstance(index, np.ndarray) or index.dtype == object:
        # Hashable labels of any type (tuples too): dense ids by first appearance.
        labels = list(index)
        if len(labels) != num_items or (isinstance(index, np.ndarray) and index.ndim != 1):
            raise ValueError(f"index must have {num_items} entries (one per trajectory), got {len(labels)}")
        lookup: dict = {}
        dense = np.fromiter((lookup.setdefault(x, len(lookup)) for x in labels), dtype=np.int64, count=num_items)
        return torch.from_numpy(dense).to(device), len(lookup)
    if index.ndim != 1 or index.shape[0] != num_items:
        raise ValueError(f"index must have {num_items} entries (one per trajectory), got shape {index.shape}")
    if index.dtype.kind in "fc" and np.isnan(index).any():
        raise ValueError(f"index[{int(np.flatnonzero(np.isnan(index))[0])}] is NaN: group labels must be comparable")
    uniq, inverse = np.unique(index, return_inverse=True)
    return torch.from_numpy(inverse.astype(np.int64).reshape(-1)).to(device), int(uniq.shape[0])


def _as_float_vector(x: Any, name: str, n: Optional[int] = None) -> torch.Tensor:
    """`x` as a finite fp64 vector (a list of Python floats is read as fp64, not torch's fp32 default)."""
    t = x if isinstance(x, torch.Tensor) else torch.as_tensor(np.asarray(x))
    if t.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(t.shape)}")
    if n is not None and t.numel() != n:
        raise ValueError(f"{name} must have {n} entries, got {t.numel()}")
    if not (t.dtype.is_floating_point or t.dtype in (torch.int32, torch.int64, torch.bool)):
        raise ValueError(f"{name} must be a float (or int) tensor, got dtype {t.dtype}")
    t = t.to(torch.float64)
    if t.numel() and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).nonzero()[0])
        raise ValueError(f"{name}[{bad}] is not finite ({t[bad].item()}); {name} must be finite numbers")
    return t


def _check_mask(response_mask: torch.Tensor, num_rows: int) -> torch.Tensor:
    if not isinstance(response_mask, torch.Tensor) or response_mask.dim() != 2:
        raise ValueError("response_mask must be a 2-D tensor (batch, response_length)")
    if response_mask.shape[0] != num_rows:
        raise ValueError(f"response_mask has {response_mask.shape[0]} rows, expected {num_rows} (one per trajectory)")
    if response_mask.dtype.is_complex:
        raise ValueError(f"response_mask must be a bool, integer or float tensor, got dtype {response_mask.dtype}")
    if response_mask.dtype.is_floating_point and response_mask.numel():
        # One min/max pass (float masks only): NaN fails both comparisons, +-inf and huge weights one.
        low, high = torch.aminmax(response_mask)
        if not (float(low) >= -_MASK_LIMIT and float(high) <= _MASK_LIMIT):
            bad = ~torch.isfinite(response_mask) | (response_mask.abs() > _MASK_LIMIT)
            b, t = (int(i) for i in bad.nonzero()[0])
            raise ValueError(f"response_mask[{b}, {t}] = {response_mask[b, t].item()} is not a mask weight: "
                             f"entries must be finite, with |entry| <= 2^63 (0/1 masks are the norm)")
    if response_mask.stride(-1) != 1:
        response_mask = response_mask.contiguous()
    return response_mask


def _rows_of_csr(offsets: torch.Tensor, num_items: int) -> torch.Tensor:
    """Row id of each of `num_items` CSR items: item i belongs to row b when offsets[b] <= i < offsets[b+1]."""
    items = torch.arange(num_items, device=offsets.device)
    return torch.searchsorted(offsets, items, right=True) - 1


def _check_round_counts(num_rewards: int, mem_offsets: Any, mem_spans: Any) -> None:
    """The three CSR inputs must agree on R; name the one that disagrees with the other two."""
    offsets, spans = torch.as_tensor(mem_offsets), torch.as_tensor(mem_spans)
    if offsets.dim() != 1 or offsets.numel() < 1 or spans.dim() not in (1, 2) or (spans.dim() == 1 and spans.numel()):
        return  # malformed shapes: _check_spans says what is wrong
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


def _check_spans(mem_offsets: Any, mem_spans: Any, num_rows: int, num_rounds: int, length: int,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Validate CSR spans; return (offsets [B+1], start [R], end [R]) as int64 on `device`."""
    offsets = torch.as_tensor(mem_offsets)
    spans = torch.as_tensor(mem_spans)
    if offsets.dtype.is_floating_point or offsets.dim() != 1 or offsets.numel() != num_rows + 1:
        raise ValueError(f"mem_offsets must be an integer vector of B+1 = {num_rows + 1} CSR offsets, "
                         f"got shape {tuple(offsets.shape)} dtype {offsets.dtype}")
    offsets = offsets.to(device=device, dtype=torch.int64)
    if spans.numel() == 0:
        spans = spans.reshape(0, 2)
    if spans.dtype.is_floating_point or spans.dim() != 2 or spans.shape != (num_rounds, 2):
        raise ValueError(f"mem_spans must be an integer tensor of shape ({num_rounds}, 2) (start, end), "
                         f"got shape {tuple(spans.shape)} dtype {spans.dtype}")
    spans = spans.to(device=device, dtype=torch.int64)
    if int(offsets[0]) != 0 or int(offsets[-1]) != num_rounds or bool((offsets[1:] < offsets[:-1]).any()):
        raise ValueError(f"mem_offsets must start at 0, be non-decreasing and end at len(mem_rewards) = {num_rounds}")
    start, end = spans[:, 0].contiguous(), spans[:, 1].contiguous()
    bad = (start < 0) | (end < start) | (end > length)
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise ValueError(f"mem_spans[{r}] = ({int(start[r])}, {int(end[r])}) is not a span inside [0, {length}]")
    if num_rounds > 1:
        # Overlap check without sorting per row: encode (row, position) as row * (L + 1) + position,
        # sort the spans by encoded start, and compare each non-empty span's start with the largest
        # encoded end seen before it (a running max stays inside the row: rows are L + 1 apart).
        row = _rows_of_csr(offsets, num_rounds)
        key_start = row * (length + 1) + start
        key_end = row * (length + 1) + end
        order = torch.argsort(key_start, stable=True)
        ks, ke = key_start.index_select(0, order), key_end.index_select(0, order)
        widest_end, widest_at = torch.cummax(ke, 0)
        clash = (ks[1:] < widest_end[:-1]) & (ke[1:] > ks[1:])
        if bool(clash.any()):
            k = int(clash.nonzero()[0])
            first, second = int(order[int(widest_at[k])]), int(order[k + 1])
            raise ValueError(f"mem_spans[{first}] and mem_spans[{second}] overlap in trajectory {int(row[second])}; "
                             "<mem> spans of one trajectory must be disjoint")
    return offsets, start, end


# --------------------------------------------------------------------------------------------
# Grouped z-score
# --------------------------------------------------------------------------------------------
def _group_zscore_torch(values: torch.Tensor, group: torch.Tensor, num_groups: int, epsilon: float,
                        norm_by_std: bool, singleton_zero: bool, std_floor: float = 0.0) -> torch.Tensor:
    zeros = torch.zeros(num_groups, dtype=torch.float64, device=values.device)
    # 1. Per-group scale a = the largest |value| (1 for an all-zero group): the statistics are taken of
    #    y = x / a, in [-1, 1], so no sum or square overflows, not even for fp64 values near 1e308.
    scale = zeros.scatter_reduce(0, group, values.abs(), reduce="amax", include_self=True)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    item_scale = scale.index_select(0, group)  # index_select: plain advanced indexing is slow on CPU
    y = values / item_scale
    # 2. Per-group count, mean and unbiased std of y (index_add_ is sequential, hence deterministic,
    #    on CPU; two passes, as in the kernel).
    count = torch.bincount(group, minlength=num_groups)
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


def group_zscore(values: torch.Tensor, group: torch.Tensor, num_groups: int, *, epsilon: float = 1e-6,
                 norm_by_std: bool = True, singleton: str = "passthrough", std_floor: float = 0.0,
                 backend: str = "auto") -> torch.Tensor:
    """Normalise `values` within groups: ``z = (x - mean) / (max(std, std_floor) + epsilon)`` with
    the group's mean and unbiased (N-1) std, or ``x - mean`` when not `norm_by_std` (the floor then
    plays no part); all-equal values give 0.

    values: [n] float or int (any dtype, finite); group: [n] int dense group ids in [0, num_groups).
    singleton: "passthrough" (a group of one keeps its value, mean 0 / std 1) or "zero".
    std_floor: a finite number in [0, 3.4e38] (0, the default: no floor, ``(x - mean) / (std +
    epsilon)``); a group whose spread is below it is divided by the floor, so near-constant groups
    stay near 0 instead of becoming unit-size. Groups of one are not affected (`singleton` rules).
    Statistics in fp64; returns [n] fp32 on values' device, saturated at +-VALUE_LIMIT.
    """
    if singleton not in ("passthrough", "zero"):
        raise ValueError(f"singleton must be 'passthrough' or 'zero', got {singleton!r}")
    epsilon, norm_by_std = _check_epsilon(epsilon), _check_flag("norm_by_std", norm_by_std)
    std_floor = _check_std_floor("std_floor", std_floor)
    if isinstance(num_groups, bool) or not isinstance(num_groups, Integral) or num_groups < 0:
        raise ValueError(f"num_groups must be an integer >= 0, got {num_groups!r}")
    values = _as_float_vector(values, "values").contiguous()
    if not isinstance(group, torch.Tensor) or group.dtype.is_floating_point or group.dtype.is_complex \
            or group.dtype == torch.bool or tuple(group.shape) != tuple(values.shape):
        raise ValueError(f"group must be an integer tensor of shape {tuple(values.shape)} (one id per value)")
    group = group.to(device=values.device, dtype=torch.int64).contiguous()
    if values.numel() and (int(group.min()) < 0 or int(group.max()) >= num_groups):
        raise ValueError(f"group ids must lie in [0, num_groups = {num_groups}), got ids in "
                         f"[{int(group.min())}, {int(group.max())}]")
    return _group_zscore(values, group, num_groups, epsilon, norm_by_std, singleton == "zero", backend, std_floor)


def _group_zscore(values: torch.Tensor, group: torch.Tensor, num_groups: int, epsilon: float, norm_by_std: bool,
                  singleton_zero: bool, backend: str, std_floor: float = 0.0) -> torch.Tensor:
    """`group_zscore` on checked inputs: values fp64 [n], group int64 dense ids [n] on values' device."""
    if values.numel() == 0:
        return values.to(torch.float32)
    if resolve_backend(backend, values) == "torch":
        return _group_zscore_torch(values, group, num_groups, epsilon, norm_by_std, singleton_zero, std_floor)
    # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
    from mempo.kernels import group_zscore as kernel

    perm = torch.argsort(group, stable=True)
    group_offsets = torch.zeros(num_groups + 1, dtype=torch.int64, device=values.device)
    group_offsets[1:] = torch.cumsum(torch.bincount(group, minlength=num_groups), 0)
    out = torch.empty(values.shape, dtype=torch.float32, device=values.device)
    return kernel.group_zscore(values, perm, group_offsets, out, epsilon, norm_by_std, singleton_zero,
                               value_limit=VALUE_LIMIT, std_floor=std_floor)


# --------------------------------------------------------------------------------------------
# Span scatter fused with the row broadcast
# --------------------------------------------------------------------------------------------
def _span_pieces(start: torch.Tensor, end: torch.Tensor, offsets: torch.Tensor,
                 length: int) -> list[tuple[int, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Cut every span into power-of-two pieces: [(width, flat first position, span id, trajectory
    row)] per width, each tensor int64 [pieces of that width].

    A span of length n = sum of 2^k over the set bits of n becomes one piece per set bit, the wider
    pieces first. Pieces of one width never overlap (spans are disjoint), so each width class can be
    gathered and written back as whole rows of an unfolded view: work ~ covered tokens, no padding,
    and no cell is written twice (safe under any parallel schedule). At most log2(L) + 1 classes.
    """
    lengths = end - start
    if lengths.numel() == 0:
        return []
    span_row = _rows_of_csr(offsets, lengths.numel())
    first = span_row * length + start
    pieces = []
    for bit in range(int(lengths.max()).bit_length()):
        span_id = ((lengths >> bit) & 1).nonzero().squeeze(1)
        if span_id.numel():
            higher_bits = (lengths.index_select(0, span_id) >> (bit + 1)) << (bit + 1)
            pieces.append((1 << bit, first.index_select(0, span_id) + higher_bits, span_id,
                           span_row.index_select(0, span_id)))
    return pieces


def _span_scatter_torch(row_value: torch.Tensor, span_value: torch.Tensor, start: torch.Tensor, end: torch.Tensor,
                        offsets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    num_rows, length = mask.shape
    # 1. The mask as fp32 (a vectorised cast; mixing an int mask into a multiply is far slower),
    #    into a fresh buffer faulted in as huge pages where the OS allows (see mempo.ops._alloc).
    out = empty_output((num_rows, length), torch.float32, mask.device)
    out.copy_(mask)
    flat = out.view(-1)
    # 2. Gather the mask under every span piece ([pieces, width] rows of an unfolded view).
    pieces = []
    for width, piece_first, span_id, piece_row in _span_pieces(start, end, offsets, length):
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


def _span_scatter(row_value, span_value, start, end, offsets, mask, backend: str) -> torch.Tensor:
    if resolve_backend(backend, row_value, mask) == "torch":
        return _span_scatter_torch(row_value, span_value, start, end, offsets, mask)
    # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
    from mempo.kernels import span_scatter as kernel

    out = torch.empty(mask.shape, dtype=torch.float32, device=mask.device)
    return kernel.span_scatter(row_value.contiguous(), span_value.contiguous(), start, end, offsets, mask, out)


# --------------------------------------------------------------------------------------------
# Public ops
# --------------------------------------------------------------------------------------------
def _outcome_rows(scores, index, num_rows, device, epsilon, norm_adv_by_std, backend) -> tuple[torch.Tensor, torch.Tensor, int]:
    scores = _as_float_vector(scores, "scores", num_rows).to(device)
    group, num_groups = group_ids(index, num_rows, device)
    adv = _group_zscore(scores, group, num_groups, epsilon, norm_adv_by_std, False, backend)
    return adv, group, num_groups


_STAGE_LIMIT = 2 ** 31  # mem_stages lie in [0, 2^31): (group, stage) pairs then fit one int64 key


def _memory_pools(round_group: torch.Tensor, num_groups: int, mem_stages: Any) -> tuple[torch.Tensor, int]:
    """Dense pool ids [R] and their count: the round's group, or (group, stage) when `mem_stages` is given."""
    if mem_stages is None:
        return round_group, num_groups
    stages = torch.as_tensor(mem_stages)
    num_rounds = round_group.numel()
    if stages.dtype.is_floating_point or stages.dtype.is_complex or stages.dtype == torch.bool \
            or stages.dim() != 1 or stages.numel() != num_rounds:
        raise ValueError(f"mem_stages must be an integer vector of {num_rounds} entries (one stage per scored "
                         f"round), got shape {tuple(stages.shape)} dtype {stages.dtype}")
    stages = stages.to(device=round_group.device, dtype=torch.int64)
    if num_rounds and (int(stages.min()) < 0 or int(stages.max()) >= _STAGE_LIMIT):
        bad = int(((stages < 0) | (stages >= _STAGE_LIMIT)).nonzero()[0])
        raise ValueError(f"mem_stages[{bad}] = {int(stages[bad])}: stages must lie in [0, 2^31)")
    # 1. One int64 key per (group, stage) pair; 2. dense ids of the keys (sorted order: deterministic).
    key = round_group * _STAGE_LIMIT + stages
    uniq, pool = torch.unique(key, return_inverse=True)
    return pool.reshape(-1), int(uniq.numel())


def _memory_values(mem_rewards, mem_offsets, mem_spans, group, num_groups, length, device, epsilon,
                   norm_adv_by_std, backend, mem_stages=None, std_floor=0.0):
    num_rows = group.numel()
    rewards = _as_float_vector(mem_rewards, "mem_rewards").to(device)
    _check_round_counts(rewards.numel(), mem_offsets, mem_spans)
    offsets, start, end = _check_spans(mem_offsets, mem_spans, num_rows, rewards.numel(), length, device)
    round_group = group.index_select(0, _rows_of_csr(offsets, rewards.numel()))
    pool, num_pools = _memory_pools(round_group, num_groups, mem_stages)
    normed = _group_zscore(rewards, pool, num_pools, epsilon, norm_adv_by_std, True, backend, std_floor)
    return normed, start, end, offsets


@torch.no_grad()
def grpo_outcome_advantage(scores: torch.Tensor, index: Any, response_mask: torch.Tensor, epsilon: float = 1e-6,
                           norm_adv_by_std: bool = True, *, backend: str = "auto") -> torch.Tensor:
    """GRPO outcome advantage, numerically verl's `compute_grpo_outcome_advantage`.

    Per group of scores: ``A = (s - mean) / (std + epsilon)`` (unbiased std), or ``s - mean`` when
    not `norm_adv_by_std` (Dr.GRPO). A group of one uses mean 0 and std 1, so ``A = s / (1 +
    epsilon)`` (verl's choice). Broadcast as ``A * response_mask``.
    scores: [B] float (one outcome score per trajectory); index: B group labels;
    response_mask: [B, L] (bool / int / float). Returns advantages [B, L] fp32 on the mask's device.
    """
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    mask = _check_mask(response_mask, len(scores))
    adv, _, _ = _outcome_rows(scores, index, mask.shape[0], mask.device, epsilon, norm_adv_by_std, backend)
    empty = torch.zeros(0, dtype=torch.float32, device=mask.device)
    no_spans = torch.zeros(mask.shape[0] + 1, dtype=torch.int64, device=mask.device)
    return _span_scatter(adv, empty, empty.long(), empty.long(), no_spans, mask, backend)


@torch.no_grad()
def memory_advantage(mem_rewards: torch.Tensor, mem_offsets: torch.Tensor, mem_spans: torch.Tensor, index: Any,
                     response_mask: torch.Tensor, epsilon: float = 1e-6, norm_adv_by_std: bool = True, *,
                     mem_stages: Optional[torch.Tensor] = None, std_floor: float = 0.0,
                     backend: str = "auto") -> torch.Tensor:
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
    number >= 0 (0: no floor). Returns [B, L] fp32, zero outside spans.
    """
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    std_floor = _check_std_floor("std_floor", std_floor)
    mask = _check_mask(response_mask, len(mem_offsets) - 1)
    group, num_groups = group_ids(index, mask.shape[0], mask.device)
    normed, start, end, offsets = _memory_values(mem_rewards, mem_offsets, mem_spans, group, num_groups,
                                                 mask.shape[1], mask.device, epsilon, norm_adv_by_std, backend,
                                                 mem_stages, std_floor)
    zeros = torch.zeros(mask.shape[0], dtype=torch.float32, device=mask.device)
    return _span_scatter(zeros, normed, start, end, offsets, mask, backend)


@torch.no_grad()
def mempo_advantage(scores: torch.Tensor, index: Any, response_mask: torch.Tensor,
                    mem_rewards: Optional[torch.Tensor] = None, mem_offsets: Optional[torch.Tensor] = None,
                    mem_spans: Optional[torch.Tensor] = None, *, epsilon: float = 1e-6,
                    norm_adv_by_std: bool = True, memory_weight: float = 1.0,
                    mem_stages: Optional[torch.Tensor] = None, memory_std_floor: float = 0.0,
                    backend: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """MemPO token advantage: outcome + memory_weight x memory, in verl's shapes.

    scores: [B] float outcome scores; index: B group labels; response_mask: [B, L];
    mem_rewards [R], mem_offsets [B+1], mem_spans [R, 2]: the scored rounds in CSR form (all three
    or none; with none the result is plain GRPO). mem_stages: None (the default: one memory pool
    per group) or [R] int in [0, 2^31), one pool per (group, stage) (`memory_advantage`);
    memory_std_floor: the memory pools' std floor (`group_zscore`'s ``std_floor``; 0: none). Both
    concern the memory part only: the outcome advantage is z-scored per group without a floor.
    Returns (advantages, returns), both the same [B, L] fp32 tensor, as verl's GRPO estimator does:
    ``A = A_out + memory_weight * A_mem`` per token.
    Raises ValueError naming the argument: `epsilon` outside [1.2e-38, 3.4e38], `memory_weight`
    negative or not finite, `memory_std_floor` negative or not finite, `mem_stages` not [R] ints in
    range (or given without memory inputs), `norm_adv_by_std` not a bool, scores or memory rewards
    not finite, a float mask with a non-finite entry or one beyond 2^63 in magnitude (one min/max
    pass; bool and integer masks need none), NaN labels in a float `index` array.
    """
    given = [x is not None for x in (mem_rewards, mem_offsets, mem_spans)]
    if any(given) and not all(given):
        raise ValueError("mem_rewards, mem_offsets and mem_spans must be given together (or none of them)")
    if mem_stages is not None and not all(given):
        raise ValueError("mem_stages needs the memory inputs (mem_rewards, mem_offsets, mem_spans)")
    epsilon, norm_adv_by_std = _check_epsilon(epsilon), _check_flag("norm_adv_by_std", norm_adv_by_std)
    memory_weight = _check_memory_weight(memory_weight)
    memory_std_floor = _check_std_floor("memory_std_floor", memory_std_floor)
    mask = _check_mask(response_mask, len(scores))
    adv, group, num_groups = _outcome_rows(scores, index, mask.shape[0], mask.device, epsilon, norm_adv_by_std,
                                           backend)
    if all(given):
        normed, start, end, offsets = _memory_values(mem_rewards, mem_offsets, mem_spans, group, num_groups,
                                                     mask.shape[1], mask.device, epsilon, norm_adv_by_std, backend,
                                                     mem_stages, memory_std_floor)
        # fp64 product, saturated like every value (a huge weight must not overflow fp32)
        span_value = (normed.double() * memory_weight).clamp_(-VALUE_LIMIT, VALUE_LIMIT).to(torch.float32)
    else:
        span_value = torch.zeros(0, dtype=torch.float32, device=mask.device)
        start = end = span_value.long()
        offsets = torch.zeros(mask.shape[0] + 1, dtype=torch.int64, device=mask.device)
    advantages = _span_scatter(adv, span_value, start, end, offsets, mask, backend)
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
