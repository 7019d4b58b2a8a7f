"""Token advantages of a batch of trajectories, with the zero-variance group policy.

Per group g (the G samples of one question), with outcome scores s and the pooled memory rewards m
of all scored rounds of all its trajectories (`mempo.ops.mempo_advantage`):

    A_out(b)    = (s_b - mean_g(s)) / (std_g(s) + eps)        on every response token of b
    A_mem(b, r) = (m_br - mean_p(m)) / (max(std_p(m), floor) + eps)  on the tokens of round r's <mem> span
    A           = A_out + memory_weight * A_mem               0 off the loss mask

The memory pool p of round r is its group g (the default, the paper's) or, with ``mem_stages``,
the pair (g, stage of r) (`mempo.algo.pooling`); floor = ``memory_std_floor`` (0 by default: none).
Unbiased std; ``norm_adv_by_std=False`` only centres. A group of one, or a pool of at most one
memory reward, follows `mempo.ops.advantage` (finite, never NaN).

Zero-variance groups (all scores equal, a group of one included: A_out carries no relative signal).
With ``skip_zero_variance_groups`` a trajectory of such a group keeps in the loss only its tokens
of scored ``<mem>`` spans, whose advantage is the memory part alone (``A - A_out``; A_out is 0 up to
rounding there); its other response tokens leave the loss (and its normalisers, and the KL and
entropy terms over the same mask). Without it every response token is in the loss.

Coordinates: response coordinates ``[B, L]`` (L = longest response or ``pad_to``); one row per
trajectory; ``mem_spans`` in CSR form over the rows (`AdvantageInputs`).
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import torch

from mempo.ops.advantage import group_ids, mempo_advantage
from mempo.records.trajectory import Trajectory

__all__ = ["AdvantageInputs", "TokenAdvantages", "advantage_inputs", "group_has_variance", "token_advantages"]


class AdvantageInputs(NamedTuple):
    """A batch in the CSR form of `mempo.ops.mempo_advantage` (positional order = its arguments).

    scores: float32 [B] outcome scores. index: [B] group labels (numpy object array of uids, an int
    tensor, or a list of hashables). response_mask: int64 / bool / float [B, L] (1 on the tokens that
    carry loss). mem_rewards: float32 [R]; mem_offsets: int64 [B+1] (rounds of row b are
    ``mem_offsets[b]:mem_offsets[b+1]``); mem_spans: int64 [R, 2] (start, end) in response
    coordinates. The three mem_* fields are all None for a batch without memory inputs (plain GRPO).
    """

    scores: torch.Tensor
    index: Any
    response_mask: torch.Tensor
    mem_rewards: Optional[torch.Tensor] = None
    mem_offsets: Optional[torch.Tensor] = None
    mem_spans: Optional[torch.Tensor] = None


class TokenAdvantages(NamedTuple):
    """`token_advantages` output, all on the device of ``response_mask``.

    advantages: float32 [B, L], 0 where ``loss_mask`` is False. loss_mask: bool [B, L], the tokens
    that carry the policy loss. memory_mask: bool [B, L], response tokens inside a scored ``<mem>``
    span. has_variance: bool [B], True where the row's group has at least two distinct scores.
    """

    advantages: torch.Tensor
    loss_mask: torch.Tensor
    memory_mask: torch.Tensor
    has_variance: torch.Tensor


def advantage_inputs(trajectories: Sequence[Trajectory], *,
                     memory_rewards: Optional[Sequence[Optional[Sequence[Optional[float]]]]] = None,
                     pad_to: Optional[int] = None, require_memory_rewards: bool = True) -> AdvantageInputs:
    """The `AdvantageInputs` of a batch of scored trajectories (one row each, in order).

    scores: each trajectory's outcome score (``Trajectory.score``); memory_rewards: per trajectory
    its memory rewards, one entry per scored round in round order (`mempo.scoring.
    compute_memory_rewards`), or None for a trajectory (or the whole batch) without them; an entry
    None is a round the reward's definition does not score: it and its ``<mem>`` span are left out
    of the memory inputs, so it gets no memory advantage and joins no pool. index: numpy
    object array of the trajectories' ``uid`` (verl's ``uid``); response_mask int64, right-padded
    with 0. A trajectory with scored rounds but no memory rewards raises ValueError, unless
    ``require_memory_rewards=False`` (its scored rounds are then left out: plain GRPO for it).
    """
    if memory_rewards is None:
        memory_rewards = [None] * len(trajectories)
    if len(memory_rewards) != len(trajectories):
        raise ValueError(f"{len(memory_rewards)} memory-reward lists for {len(trajectories)} trajectories")
    batch = len(trajectories)
    longest = max((len(t.response_ids) for t in trajectories), default=0)
    width = longest if pad_to is None else int(pad_to)
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest response ({longest})")
    scores = torch.tensor([t.score for t in trajectories], dtype=torch.float32)
    index = np.array([t.uid for t in trajectories], dtype=object)
    response_mask = torch.zeros((batch, width), dtype=torch.int64)
    rewards: list[float] = []
    spans: list[tuple[int, int]] = []
    offsets = [0]
    for row, (trajectory, row_rewards) in enumerate(zip(trajectories, memory_rewards)):
        if trajectory.response_mask:
            response_mask[row, :len(trajectory.response_mask)] = torch.tensor(trajectory.response_mask)
        scored = trajectory.scored_rounds()
        if row_rewards is None:
            if scored and require_memory_rewards:
                raise ValueError(f"trajectory {row} ({trajectory.uid}/{trajectory.sample_index}) has no memory "
                                 "rewards; run the teacher scoring and pass memory_rewards")
        else:
            if len(row_rewards) != len(scored):
                raise ValueError(f"trajectory {row}: {len(row_rewards)} memory rewards for "
                                 f"{len(scored)} scored rounds")
            for reward, round_ in zip(row_rewards, scored):
                if reward is not None:  # None: a round the definition does not score (no memory advantage)
                    rewards.append(float(reward))
                    spans.append(round_.mem_span)
        offsets.append(len(rewards))
    mem_rewards = torch.tensor(rewards, dtype=torch.float32)
    mem_offsets = torch.tensor(offsets, dtype=torch.int64)
    mem_spans = torch.tensor(spans, dtype=torch.int64).reshape(-1, 2)
    return AdvantageInputs(scores, index, response_mask, mem_rewards, mem_offsets, mem_spans)


def group_has_variance(scores: Any, index: Any) -> torch.Tensor:
    """bool [B]: True where the trajectory's group has at least two distinct scores (exact comparison).

    scores: [B] outcome scores (tensor / array / list of floats, finite: ValueError otherwise);
    index: the group label of each trajectory (`mempo.ops.advantage.group_ids`). A group whose
    scores are all equal, a group of one included, gives False. On the device of `scores` (CPU for
    a non-tensor).
    """
    values = torch.as_tensor(scores).detach().reshape(-1).to(torch.float64).cpu()
    if not torch.isfinite(values).all():
        raise ValueError("scores must be finite")
    group, num_groups = group_ids(index, values.numel(), device="cpu")
    high = torch.full((num_groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amax")
    low = torch.full((num_groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, group, values, "amin")
    has_variance = high > low
    device = scores.device if isinstance(scores, torch.Tensor) else "cpu"
    return has_variance[group].to(device)


def _span_mask(mem_offsets: Optional[torch.Tensor], mem_spans: Optional[torch.Tensor],
               response_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, L]: True on the response tokens of every ``<mem>`` span (spans checked by mempo_advantage)."""
    rows, length = response_mask.shape
    device = response_mask.device
    if mem_offsets is None or mem_spans is None or mem_spans.numel() == 0:
        return torch.zeros((rows, length), dtype=torch.bool, device=device)
    offsets = torch.as_tensor(mem_offsets, dtype=torch.int64, device=device)
    spans = torch.as_tensor(mem_spans, dtype=torch.int64, device=device).reshape(-1, 2)
    span_rows = torch.repeat_interleave(torch.arange(rows, device=device), offsets.diff())
    edges = torch.zeros((rows, length + 1), dtype=torch.int32, device=device)  # +1 at a start, -1 at an end
    edges.index_put_((span_rows, spans[:, 0]), torch.ones_like(span_rows, dtype=torch.int32), accumulate=True)
    edges.index_put_((span_rows, spans[:, 1]), torch.full_like(span_rows, -1, dtype=torch.int32), accumulate=True)
    return (edges.cumsum(dim=1)[:, :length] > 0) & response_mask.bool()


def token_advantages(inputs: AdvantageInputs, *, epsilon: float = 1e-6, norm_adv_by_std: bool = True,
                     memory_weight: float = 1.0, skip_zero_variance_groups: bool = False,
                     mem_stages: Optional[torch.Tensor] = None, memory_std_floor: float = 0.0) -> TokenAdvantages:
    """The token advantages and loss mask of a batch: A = A_out + memory_weight * A_mem, 0 off the loss mask.

    inputs: `AdvantageInputs` ([B] rows, [B, L] response mask, CSR memory inputs or None).
    epsilon / norm_adv_by_std / memory_weight: as `mempo.ops.mempo_advantage` (validated there).
    mem_stages: None (one memory pool per group, the default) or int64 [R], the stage of each scored
        round (`mempo.algo.pooling.memory_stages`): one pool per (group, stage). memory_std_floor: the
        floor under the memory pools' std (0: none). Both as `mempo.ops.mempo_advantage`.
    skip_zero_variance_groups: True: rows of a group with one distinct score keep in the loss only
        their scored ``<mem>`` tokens, with the memory part alone (``A - A_out``); False keeps every
        response token, and then ``advantages`` equals `mempo.ops.mempo_advantage`'s on the response
        mask (0 elsewhere). Returns a `TokenAdvantages`; never NaN for finite inputs.
    """
    scores, index, response_mask = inputs.scores, inputs.index, inputs.response_mask
    memory = (inputs.mem_rewards, inputs.mem_offsets, inputs.mem_spans)
    adv, _ = mempo_advantage(scores, index, response_mask, *memory, epsilon=epsilon,
                             norm_adv_by_std=norm_adv_by_std, memory_weight=memory_weight, mem_stages=mem_stages,
                             memory_std_floor=memory_std_floor)
    in_response = response_mask.bool()
    memory_mask = _span_mask(inputs.mem_offsets, inputs.mem_spans, response_mask)
    has_variance = group_has_variance(scores, index)
    loss_mask = in_response
    if skip_zero_variance_groups:
        no_variance = ~has_variance.to(in_response.device).reshape(-1, 1)
        loss_mask = (in_response & ~no_variance) | memory_mask
        if no_variance.any():  # remove the (rounding-level) outcome part from those rows' <mem> tokens
            outcome, _ = mempo_advantage(scores, index, response_mask, epsilon=epsilon,
                                         norm_adv_by_std=norm_adv_by_std)
            adv = torch.where(no_variance & in_response, adv - outcome, adv)
    adv = torch.where(loss_mask, adv, torch.zeros_like(adv))
    return TokenAdvantages(adv, loss_mask, memory_mask, has_variance)
