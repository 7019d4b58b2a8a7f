"""mempo.algo.pooling: the stage of each scored round per pooling, and the memory advantage it gives."""
import numpy as np
import pytest
import torch

from mempo.algo.advantages import advantage_inputs, token_advantages
from mempo.algo.pooling import MEMORY_POOLINGS, memory_stages, round_stages
from mempo.config import AlgorithmConfig
from mempo.ops.reference.advantage import mempo_advantage_reference
from mempo.protocol.reward import memory_keeps, objectives_seen
from support.pooling_batch import GOLDS, TOK, batch, episode


def test_round_stages_per_pooling():
    first, second, third = batch()
    assert round_stages(first, "group", TOK) == [0, 0]
    assert round_stages(first, "group_round", TOK) == [1, 2]
    assert round_stages(first, "group_seen", TOK) == [1, 2]
    assert round_stages(second, "group_round", TOK) == [1, 3]  # round 2 has no <mem>: not scored
    assert round_stages(second, "group_seen", TOK) == [0, 2]
    assert round_stages(third, "group_seen", TOK) == [1]
    with pytest.raises(ValueError, match="memory pooling must be one of"):
        round_stages(first, "round", TOK)
    no_golds = episode("q", 2, [("a", "search", "Paris"), ("b", "answer", None)], golds=None)
    with pytest.raises(ValueError, match="'group_seen' needs the golds of trajectory q/2"):
        round_stages(no_golds, "group_seen", TOK)
    assert round_stages(no_golds, "group_round", TOK) == [1]


def test_seen_count_follows_the_memory_keeps_rule():
    """A round has seen no objective exactly when `memory_keeps` finds nothing needed (None)."""
    for t in batch():
        seen = round_stages(t, "group_seen", TOK)
        keeps = t.memory_keeps(TOK)
        assert [s == 0 for s in seen] == [k is None for k in keeps]
    assert objectives_seen("paris was read, then rome", GOLDS) == 2
    assert objectives_seen("parisian", GOLDS) == 0  # whole words only, as memory_keeps
    assert memory_keeps("x", "parisian", GOLDS) is None


def test_memory_stages_follow_the_csr_order_of_advantage_inputs():
    trajectories = batch()
    rewards = [[0.1, 0.5], None, [0.3]]
    inputs = advantage_inputs(trajectories, memory_rewards=rewards, require_memory_rewards=False)
    stages = memory_stages(trajectories, "group_round", TOK, memory_rewards=rewards)
    assert stages.dtype == torch.int64 and stages.tolist() == [1, 2, 1]
    assert stages.numel() == inputs.mem_rewards.numel()
    assert memory_stages(trajectories, "group_seen", TOK).tolist() == [1, 2, 0, 2, 1]
    assert memory_stages(trajectories, "group", TOK) is None
    with pytest.raises(ValueError, match="2 memory-reward lists for 3 trajectories"):
        memory_stages(trajectories, "group_seen", TOK, memory_rewards=rewards[:2])


def test_a_round_the_reward_does_not_score_has_no_stage():
    """scoring.scored_objectives: retrieved gives None to a round read nothing before (second's round 1):
    it leaves the CSR inputs and the stages alike, so the two stay aligned."""
    trajectories = batch()
    rewards = [[0.1, 0.5], [None, 0.2], [0.3]]
    inputs = advantage_inputs(trajectories, memory_rewards=rewards)
    for pooling, want in (("group_seen", [1, 2, 2, 1]), ("group_round", [1, 2, 3, 1])):
        stages = memory_stages(trajectories, pooling, TOK, memory_rewards=rewards)
        assert stages.tolist() == want and stages.numel() == inputs.mem_rewards.numel()
    token_advantages(inputs, mem_stages=memory_stages(trajectories, "group_seen", TOK, memory_rewards=rewards))


@pytest.mark.parametrize("pooling", MEMORY_POOLINGS)
@pytest.mark.parametrize("floor", [0.0, 0.05])
def test_token_advantages_pool_by_stage(pooling, floor):
    trajectories = batch()
    rewards = [[0.1, 0.5], [0.2, 0.25], [0.3]]
    inputs = advantage_inputs(trajectories, memory_rewards=rewards)
    stages = memory_stages(trajectories, pooling, TOK, memory_rewards=rewards)
    got = token_advantages(inputs, mem_stages=stages, memory_std_floor=floor).advantages
    want = mempo_advantage_reference(inputs.scores.tolist(), list(inputs.index), inputs.response_mask.tolist(),
                                     inputs.mem_rewards.tolist(), inputs.mem_offsets.tolist(),
                                     inputs.mem_spans.tolist(), mem_stages=None if stages is None else stages.tolist(),
                                     memory_std_floor=floor)
    torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    on_mem = got[0, trajectories[0].rounds[1].mem_span[0]] - got[0, 0]  # row 0, round 1: memory part alone
    if pooling == "group":  # one pool of four values in group q
        assert abs(float(on_mem)) > 0.1
    elif pooling == "group_round":  # pool (q, 1) = {0.1, 0.2}: 0.1 is below its mean
        assert float(on_mem) < 0
    else:  # pool (q, 1) = {0.1} alone: a pool of one gives 0
        assert float(on_mem) == 0


def test_defaults_are_the_papers():
    a = AlgorithmConfig()
    assert a.memory_pooling == "group" and a.memory_std_floor == 0.0
    trajectories = batch()
    rewards = [[0.1, 0.5], [0.2, 0.25], [0.3]]
    inputs = advantage_inputs(trajectories, memory_rewards=rewards)
    stages = memory_stages(trajectories, a.memory_pooling, TOK, memory_rewards=rewards)
    assert torch.equal(token_advantages(inputs, mem_stages=stages, memory_std_floor=a.memory_std_floor).advantages,
                       token_advantages(inputs).advantages)
    assert np.array_equal(inputs.index, np.array(["q", "q", "r"], dtype=object))
