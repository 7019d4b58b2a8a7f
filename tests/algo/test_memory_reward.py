"""mempo.algo.memory_reward: mem_reward = P(mem_ctx) - P(full_ctx), one list per trajectory."""
import math

import pytest

from mempo.algo.memory_reward import memory_rewards, memory_rewards_of
from mempo.records.scoring import ScoringResult
from support.rollout_fixtures import trajectory


def test_memory_reward_is_p_mem_minus_p_full():
    result = ScoringResult(p_full=[0.25, 0.0, 0.5], p_mem=[0.75, 0.5, 0.125], num_kept_full=[2, 0, 1],
                           num_kept_mem=[2, 1, 1])
    assert memory_rewards(result) == [0.5, 0.5, -0.375]
    assert memory_rewards(ScoringResult()) == []
    with pytest.raises(ValueError, match="p_mem"):
        memory_rewards(ScoringResult(p_full=[0.1], p_mem=[]))


def test_memory_rewards_of():
    scored, unscored = trajectory(), trajectory(second_mem=None)
    before = scored.to_dict()
    got = memory_rewards_of([scored, unscored], [ScoringResult(p_full=[0.25], p_mem=[0.125]), ScoringResult()])
    assert got == [[-0.125], []]
    assert scored.to_dict() == before  # the trajectories are not changed
    with pytest.raises(ValueError, match="1 scoring results for 2"):
        memory_rewards_of([scored, unscored], [ScoringResult()])
    with pytest.raises(ValueError, match="has 1 scored rounds but got 0"):
        memory_rewards_of([scored], [ScoringResult()])
    with pytest.raises(ValueError, match="finite"):
        memory_rewards_of([scored], [ScoringResult(p_full=[0.0], p_mem=[math.nan])])
    with pytest.raises(TypeError, match="ScoringResult"):
        memory_rewards_of([scored], [{"mem_reward": [0.1]}])  # no other spelling is read
