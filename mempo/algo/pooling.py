"""Memory pools: which scored rounds of a group are z-scored together for the memory advantage.

    group         one pool per group (all scored rounds of the G samples; the paper's, the default)
    group_round   one pool per (group, round index): a `<mem>` competes with those written at the same round
    group_seen    one pool per (group, objectives seen): with those written after as many golds were read

"Objectives seen" before round r: the objectives with an alias in the ``<information>`` texts of the
rounds before r (`mempo.protocol.reward.objectives_seen` of `Trajectory.read_before_scored`), the rule
by which `Trajectory.memory_keeps` decides what a `<mem>` must keep. It reads the golds, so it is
computed here, on the reward side, from the finished trajectory; no generation request sees it.
The stage of each scored round goes to `mempo.ops.mempo_advantage` as ``mem_stages``; the outcome
advantage keeps the group.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from mempo.protocol.reward import objectives_seen
from mempo.records.trajectory import Trajectory

__all__ = ["MEMORY_POOLINGS", "memory_stages", "round_stages"]

MEMORY_POOLINGS = ("group", "group_round", "group_seen")


def round_stages(trajectory: Trajectory, pooling: str, tokenizer: Any) -> list[int]:
    """The stage of each scored round of one trajectory (`Trajectory.scored_rounds`, in order).

    pooling "group": all 0; "group_round": ``Round.index``; "group_seen": the number of objectives
    whose gold was read before the round (needs ``trajectory.golds``: ValueError without them).
    tokenizer: decodes the ``<information>`` ids ("group_seen" only).
    """
    if pooling not in MEMORY_POOLINGS:
        raise ValueError(f"memory pooling must be one of {MEMORY_POOLINGS}, got {pooling!r}")
    scored = trajectory.scored_rounds()
    if pooling == "group":
        return [0] * len(scored)
    if pooling == "group_round":
        return [r.index for r in scored]
    if trajectory.golds is None:
        raise ValueError(f"memory pooling 'group_seen' needs the golds of trajectory "
                         f"{trajectory.uid}/{trajectory.sample_index}, which has none")
    return [objectives_seen(seen, trajectory.golds) for seen in trajectory.read_before_scored(tokenizer)]


def memory_stages(trajectories: Sequence[Trajectory], pooling: str, tokenizer: Any, *,
                  memory_rewards: Optional[Sequence[Optional[Sequence[Optional[float]]]]] = None
                  ) -> Optional[torch.Tensor]:
    """The ``mem_stages`` of a batch: int64 [R], one per scored round in the CSR order of
    `mempo.algo.advantages.advantage_inputs` with the same `memory_rewards` (the rounds of a
    trajectory whose entry is None are left out there, so here too, and so is a round whose own entry
    is None, a round the reward's definition does not score; None for the whole argument: every
    trajectory's scored rounds); None for pooling "group" (one pool per group needs no stages)."""
    if pooling not in MEMORY_POOLINGS:
        raise ValueError(f"memory pooling must be one of {MEMORY_POOLINGS}, got {pooling!r}")
    if pooling == "group":
        return None
    every_round = memory_rewards is None
    if every_round:
        memory_rewards = [None] * len(trajectories)
    if len(memory_rewards) != len(trajectories):
        raise ValueError(f"{len(memory_rewards)} memory-reward lists for {len(trajectories)} trajectories")
    stages: list[int] = []
    for trajectory, rewards in zip(trajectories, memory_rewards):
        if every_round:
            stages.extend(round_stages(trajectory, pooling, tokenizer))
        elif rewards is not None:  # a round whose reward is None (not scored by the definition) is left out
            stages.extend(s for s, reward in zip(round_stages(trajectory, pooling, tokenizer), rewards)
                          if reward is not None)
    return torch.tensor(stages, dtype=torch.int64)
