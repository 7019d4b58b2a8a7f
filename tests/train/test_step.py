"""mempo.train.step.advantages: the `algorithm` section's memory pooling and std floor reach the op."""
import dataclasses

import pytest
import torch

from mempo.algo.advantages import advantage_inputs, token_advantages
from mempo.algo.pooling import memory_stages
from mempo.config import AlgorithmConfig, MempoConfig
from mempo.train.step import StepContext, advantages
from support.pooling_batch import TOK, batch

REWARDS = [[0.1, 0.5], [0.2, 0.25], [0.3]]


def _ctx(**algorithm):
    cfg = dataclasses.replace(MempoConfig(), algorithm=AlgorithmConfig(**algorithm))
    return StepContext(cfg=cfg, actor=None, ref_actor=None, backend=None, tokenizer=TOK, tools={})


@pytest.mark.parametrize("pooling", ["group", "group_round", "group_seen"])
@pytest.mark.parametrize("floor", [0.0, 0.5])  # 0.5: above the spread of every pool
def test_step_advantages_read_pooling_and_floor(pooling, floor):
    trajectories = batch()
    result, metrics = advantages(_ctx(memory_pooling=pooling, memory_std_floor=floor), trajectories, REWARDS)
    stages = memory_stages(trajectories, pooling, TOK, memory_rewards=REWARDS)
    want = token_advantages(advantage_inputs(trajectories, memory_rewards=REWARDS), skip_zero_variance_groups=True,
                            mem_stages=stages, memory_std_floor=floor)
    assert torch.equal(result.advantages, want.advantages)
    default, _ = advantages(_ctx(), trajectories, REWARDS)
    assert torch.equal(result.advantages, default.advantages) == (pooling == "group" and floor == 0.0)
    assert metrics["adv/abs_mean_mem"] >= 0
