"""The memory reward of every scored round, from teacher scoring's P values.

P comes from `mempo.scoring` (`ScoringResult.p_mem` / ``p_full``; 0 when no gold token passes the
threshold). Rewards are Python floats, one list per trajectory with one value per scored round, in
round order; the trajectories are not changed.
"""
from __future__ import annotations

import math
from typing import Sequence

from mempo.records.scoring import ScoringResult
from mempo.records.trajectory import Trajectory

__all__ = ["memory_rewards", "memory_rewards_of"]


def memory_rewards(result: ScoringResult) -> list[float]:
    """``p_mem[r] - p_full[r]`` for every scored round of one scoring result (ValueError when the
    two lists differ in length)."""
    if len(result.p_mem) != len(result.p_full):
        raise ValueError(f"a scoring result has {len(result.p_mem)} p_mem values but {len(result.p_full)} p_full")
    # mem_reward[r] = P(answer | mem_ctx[r]) - P(answer | full_ctx[r])
    return [float(p_mem) - float(p_full) for p_mem, p_full in zip(result.p_mem, result.p_full)]


def memory_rewards_of(trajectories: Sequence[Trajectory], results: Sequence[ScoringResult]) -> list[list[float]]:
    """The memory rewards of each trajectory (``results[i]`` belongs to ``trajectories[i]``): a list
    per trajectory, one finite float per scored round. TypeError for a result that is not a
    `ScoringResult`; ValueError on a count mismatch or a non-finite reward."""
    if len(results) != len(trajectories):
        raise ValueError(f"{len(results)} scoring results for {len(trajectories)} trajectories")
    out = []
    for i, (trajectory, result) in enumerate(zip(trajectories, results)):
        if not isinstance(result, ScoringResult):
            raise TypeError(f"scoring result {i} is a {type(result).__name__}, "
                            "not a mempo.records.scoring.ScoringResult")
        rewards = memory_rewards(result)
        expected = len(trajectory.scored_rounds())
        if len(rewards) != expected:
            raise ValueError(f"trajectory {i} ({trajectory.uid}/{trajectory.sample_index}) has {expected} scored "
                             f"rounds but got {len(rewards)} memory rewards")
        if not all(math.isfinite(v) for v in rewards):
            raise ValueError(f"trajectory {i}: memory rewards must be finite, got {rewards}")
        out.append(rewards)
    return out
