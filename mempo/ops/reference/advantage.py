"""Plain-loop references for the advantage ops (tests and benchmarks only; never on a hot path).

They follow the rules of `mempo.ops.advantage` literally, one Python float at a time (float64), so
they read as the specification (saturation at +-VALUE_LIMIT included). They do not validate their
inputs.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Hashable, Sequence

import torch

from mempo.ops.advantage import csr_offsets_from_rows

VALUE_LIMIT = 1e18  # = mempo.ops.advantage.VALUE_LIMIT (not imported: the reference stands alone)


def _saturate(value: float) -> float:
    return max(-VALUE_LIMIT, min(VALUE_LIMIT, value))


def group_zscore_reference(
    values: Sequence[float],
    groups: Sequence[Hashable],
    epsilon: float = 1e-6,
    norm_by_std: bool = True,
    singleton: str = "passthrough",
    std_floor: float = 0.0,
) -> list[float]:
    """z-score of each value inside its group: (x - mean) / (max(std, std_floor) + eps), unbiased
    std (std_floor 0: no floor; not used when only centring).

    singleton="passthrough": a group of one uses mean 0, std 1 (verl's GRPO convention).
    singleton="zero": a group of one gives 0 (the memory-reward convention).
    """
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(values)
    for rows in members.values():
        if len(rows) == 1:  # mean 0 and std 1: x / (1 + eps), or x when only centring; or 0
            x = float(values[rows[0]])
            if singleton != "zero":
                out[rows[0]] = _saturate(x / (1.0 + epsilon) if norm_by_std else x)
            continue
        # Statistics of y = x / a, a = the group's largest |x| (no square of 1e300 overflows):
        # (x - mean) / (max(std, floor) + eps) = (y - mean_y) / (max(std_y, floor / a) + eps / a).
        a = max(abs(float(values[i])) for i in rows) or 1.0
        ys = [float(values[i]) / a for i in rows]
        mean = sum(ys) / len(ys)
        std = math.sqrt(sum((y - mean) ** 2 for y in ys) / (len(ys) - 1))
        denom = max(std, std_floor / a) + epsilon / a  # floor / a may be inf (a tiny group): then z = 0
        for i, y in zip(rows, ys):
            centered = y - mean
            if norm_by_std:
                value = centered / denom if denom > 0 else 0.0  # denom 0 only when every centred value is 0
            else:
                value = centered * a
            out[i] = _saturate(value)
    return out


def grpo_outcome_advantage_reference(scores, index, response_mask, epsilon=1e-6, norm_adv_by_std=True):
    """Loop GRPO: per-group z-score of `scores` broadcast over `response_mask` rows.

    scores: B floats; index: B hashables; response_mask: B rows of L numbers. Returns B rows of L floats.
    """
    adv = group_zscore_reference(scores, index, epsilon, norm_adv_by_std, singleton="passthrough")
    return [[adv[b] * float(m) for m in row] for b, row in enumerate(response_mask)]


def memory_advantage_reference(mem_rewards, mem_offsets, mem_spans, index, response_mask,
                               epsilon=1e-6, norm_adv_by_std=True, mem_stages=None, std_floor=0.0):
    """Loop memory advantage: pool the memory rewards by group (or by (group, stage) when
    `mem_stages` gives each round a stage), z-score each pool with the std floored at `std_floor`
    (a pool of 0 or 1 values gives zeros), and write each value on its round's `<mem>` span tokens.

    mem_rewards: R floats; mem_offsets: B+1 CSR offsets (rounds of trajectory b are
    mem_offsets[b]:mem_offsets[b+1]); mem_spans: R (start, end) pairs in response-token coordinates;
    mem_stages: None or R ints. Returns B rows of L floats (0 outside spans, times response_mask).
    """
    num_traj = len(mem_offsets) - 1
    round_pool = []
    for b in range(num_traj):
        for r in range(mem_offsets[b], mem_offsets[b + 1]):
            round_pool.append(index[b] if mem_stages is None else (index[b], int(mem_stages[r])))
    normed = group_zscore_reference(mem_rewards, round_pool, epsilon, norm_adv_by_std, singleton="zero",
                                    std_floor=std_floor)
    out = [[0.0] * len(row) for row in response_mask]
    for b in range(num_traj):
        for r in range(mem_offsets[b], mem_offsets[b + 1]):
            start, end = mem_spans[r]
            for t in range(start, end):
                out[b][t] += normed[r]
    return [[v * float(m) for v, m in zip(row, mask_row)] for row, mask_row in zip(out, response_mask)]


def mempo_advantage_reference(scores, index, response_mask, mem_rewards=None, mem_offsets=None, mem_spans=None,
                              epsilon=1e-6, norm_adv_by_std=True, memory_weight=1.0, mem_stages=None,
                              memory_std_floor=0.0):
    """Loop composition: outcome advantage plus memory_weight x memory advantage, per token (the
    memory pools by (group, stage) when `mem_stages` is given, their std floored at `memory_std_floor`)."""
    out = grpo_outcome_advantage_reference(scores, index, response_mask, epsilon, norm_adv_by_std)
    if mem_rewards is None:
        return out
    # memory_weight x (memory value): saturated per span value (the mask factor is <= 1 for 0/1 masks)
    mem_values = memory_advantage_reference(mem_rewards, mem_offsets, mem_spans, index,
                                            [[1.0] * len(row) for row in response_mask], epsilon, norm_adv_by_std,
                                            mem_stages, memory_std_floor)
    return [[o + _saturate(memory_weight * v) * float(m) for o, v, m in zip(orow, vrow, mrow)]
            for orow, vrow, mrow in zip(out, mem_values, response_mask)]


def random_memory_batch(seed, num_groups, group_size, length, max_rounds=4, singleton_groups=0, binary_scores=True,
                        layout="random", mem_len=64):
    """Seeded random inputs for the advantage ops (tests and benchmarks share them).

    Returns (scores [B], index (B str labels), response_mask [B, L] int64, mem_rewards [R],
    mem_offsets [B+1], mem_spans [R, 2]) with num_groups x group_size grouped trajectories plus
    `singleton_groups` groups of one.
    layout="random": each trajectory has 0..max_rounds disjoint sorted spans at random cuts (stress).
    layout="rounds": the response is split into max_rounds equal rounds; rounds 2.. each open with a
    scored `<mem>` span of `mem_len` tokens (the shape of a real MemPO batch).
    """
    if layout not in ("random", "rounds"):
        raise ValueError(f"layout must be 'random' or 'rounds', got {layout!r}")
    g = torch.Generator().manual_seed(seed)
    index = []
    for q in range(num_groups):
        index += [f"q{q}"] * group_size
    for s in range(singleton_groups):
        index.append(f"single{s}")
    batch = len(index)
    if binary_scores:
        scores = torch.randint(0, 2, (batch,), generator=g).float()
    else:
        scores = torch.randn(batch, generator=g)
    mask = (torch.rand(batch, length, generator=g) > 0.15).long()
    rows, spans = [], []
    round_len = length // max(max_rounds, 1)
    for b in range(batch):
        if layout == "rounds":
            for r in range(1, max_rounds):
                rows.append(b)
                spans.append((r * round_len, r * round_len + min(mem_len, round_len)))
            continue
        num_rounds = int(torch.randint(0, max_rounds + 1, (1,), generator=g))
        cuts = sorted(torch.randint(0, length + 1, (2 * num_rounds,), generator=g).tolist())
        for r in range(num_rounds):
            rows.append(b)
            spans.append((cuts[2 * r], cuts[2 * r + 1]))
    offsets = csr_offsets_from_rows(rows, batch)
    rewards = torch.rand(len(spans), generator=g) - 0.5
    spans_t = torch.tensor(spans, dtype=torch.int64).reshape(-1, 2)
    return scores, index, mask, rewards, offsets, spans_t
