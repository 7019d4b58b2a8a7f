"""mempo.algo.memory_reward: mem_reward = P(mem_ctx) - P(full_ctx) (the default) and the other definitions."""
import math

import pytest

from mempo.algo.memory_reward import memory_rewards, memory_rewards_of, reward_gap, round_memory_rewards
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


# ------------------------------------------------------------------------------------------------
# the definitions
# ------------------------------------------------------------------------------------------------
def test_reward_gap_in_prob_and_log_space():
    assert reward_gap(0.5, 0.125, -0.7, -2.0) == 0.375  # prob: the paper's P_mem - P_cmp
    assert reward_gap(0.5, 0.125, -0.75, -1.0, "log", 1.0) == 0.25
    assert reward_gap(0.5, 0.125, -0.5, -4.0, "log", 1.0) == 1.0  # clipped at +c
    assert reward_gap(0.5, 0.125, -4.0, -0.5, "log", 2.0) == -2.0  # and at -c
    assert reward_gap(0.0, 0.1, -math.inf, -1.0, "log", 1.5) == -1.5
    assert reward_gap(0.1, 0.0, -1.0, -math.inf, "log", 1.5) == 1.5
    assert reward_gap(0.0, 0.0, -math.inf, -math.inf, "log", 1.5) == 0.0  # never NaN
    with pytest.raises(ValueError, match="reward must be one of"):
        reward_gap(0.5, 0.1, -1.0, -2.0, "ratio")
    with pytest.raises(ValueError, match="log_clip"):
        reward_gap(0.5, 0.1, -1.0, -2.0, "log", 0.0)


def _result(rounds, k):
    """A ScoringResult of `rounds` scored rounds, k objectives, with distinct values per field."""
    def vals(base):
        return [base + 0.01 * r for r in range(rounds)]
    return ScoringResult(
        p_full=vals(0.1), p_mem=vals(0.3), num_kept_full=[3] * rounds, num_kept_mem=[3] * rounds,
        mean_logp_full=vals(-3.0), mean_logp_mem=vals(-1.0),
        objective_p_full=[[0.1, 0.2][:k] for _ in range(rounds)],
        objective_p_mem=[[0.5, 0.7][:k] for _ in range(rounds)],
        objective_mean_logp_full=[[-2.0, -3.0][:k] for _ in range(rounds)],
        objective_mean_logp_mem=[[-1.0, -2.75][:k] for _ in range(rounds)],
        objective_num_kept_full=[[1, 2][:k] for _ in range(rounds)],
        objective_num_kept_mem=[[1, 2][:k] for _ in range(rounds)])


def test_round_memory_rewards_by_definition():
    t = trajectory(golds=(["Paris"], ["Rome"]))  # one scored round, two objectives
    result = _result(1, 2)
    default = round_memory_rewards(t, result, None)
    assert [d.reward for d in default] == memory_rewards(result) == [0.3 - 0.1]  # the paper's, by default
    assert default[0].objectives == [0, 1] and default[0].round_index == 1 and default[0].p_cmp == 0.1
    log = round_memory_rewards(t, result, None, reward="log", log_clip=1.5)
    assert log[0].reward == 1.5  # clip(-1.0 - -3.0)
    # per objective: the mean over the retrieved objectives only
    got = round_memory_rewards(t, result, [[1]], scored_objectives="retrieved")
    assert got[0].objectives == [1] and got[0].reward == pytest.approx(0.7 - 0.2)
    both = round_memory_rewards(t, result, [[1, 0]], scored_objectives="retrieved", reward="log", log_clip=1.0)
    assert both[0].objectives == [0, 1] and both[0].reward == pytest.approx((1.0 + 0.25) / 2)
    assert both[0].objective_logp_cmp == [-2.0, -3.0] and both[0].objective_p_mem == [0.5, 0.7]
    # objective_reduce "min": the worst-kept retrieved fact (1.0 and 0.25 above)
    worst = round_memory_rewards(t, result, [[1, 0]], scored_objectives="retrieved", reward="log", log_clip=1.0,
                                 objective_reduce="min")
    assert worst[0].reward == 0.25
    one = round_memory_rewards(t, result, [[1]], scored_objectives="retrieved", objective_reduce="min")
    assert one[0].reward == pytest.approx(got[0].reward)  # one objective: min == mean
    # none retrieved before the round: not scored (None keeps its place)
    none = round_memory_rewards(t, result, [[]], scored_objectives="retrieved")
    assert none[0].reward is None and none[0].objectives == [] and none[0].p_mem == 0.3
    # "complete": every objective, only once every one was retrieved; else not scored
    done = round_memory_rewards(t, result, [[1, 0]], scored_objectives="complete", reward="log", log_clip=1.0,
                                objective_reduce="min")
    assert done[0].objectives == [0, 1] and done[0].reward == worst[0].reward
    for partial in ([[1]], [[]]):
        pending = round_memory_rewards(t, result, partial, scored_objectives="complete")
        assert pending[0].reward is None and pending[0].objectives == [] and pending[0].objective_p_mem == [0.5, 0.7]


def test_round_memory_rewards_rejects_what_does_not_line_up():
    t = trajectory(golds=(["Paris"], ["Rome"]))
    with pytest.raises(ValueError, match="scored_objectives must be one of"):
        round_memory_rewards(t, _result(1, 2), None, scored_objectives="seen")
    with pytest.raises(ValueError, match="has 1 scored rounds"):
        round_memory_rewards(t, _result(2, 2), None)
    with pytest.raises(ValueError, match="objective_reduce must be one of"):
        round_memory_rewards(t, _result(1, 2), [[0]], scored_objectives="retrieved", objective_reduce="max")
    with pytest.raises(ValueError, match="needs scored_objectives 'retrieved' or 'complete'"):
        round_memory_rewards(t, _result(1, 2), None, objective_reduce="min")  # one gap: nothing to reduce
    with pytest.raises(ValueError, match="per-objective"):
        round_memory_rewards(t, ScoringResult(p_full=[0.1], p_mem=[0.2], mean_logp_full=[-1.0], mean_logp_mem=[-1.0]),
                             [[0]], scored_objectives="retrieved")
    with pytest.raises(ValueError, match="per-objective"):
        round_memory_rewards(t, _result(1, 2), None, scored_objectives="retrieved")
    with pytest.raises(ValueError, match="'complete' needs per-objective"):
        round_memory_rewards(t, _result(1, 2), None, scored_objectives="complete")
