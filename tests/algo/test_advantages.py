"""mempo.algo.advantages: the advantage inputs, the zero-variance policy and the token advantages,
against hand-computed cases."""
import math
import random

import numpy as np
import pytest
import torch

from mempo.algo.advantages import (AdvantageInputs, TokenAdvantages, advantage_inputs, group_has_variance,
                                   token_advantages)
from mempo.ops import mempo_advantage
from support.rollout_fixtures import trajectory

EPS = 1e-6
Z = 0.5 / (math.sqrt(0.5) + EPS)  # (1 - 0.5) / (std([1, 0]) + eps): an outcome of group "a" (unbiased std)
ZM = 0.1 / (math.sqrt(0.02) + EPS)  # (0.3 - 0.2) / (std([0.3, 0.1]) + eps): a memory value of group "b"


def test_group_has_variance():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.7])
    index = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    got = group_has_variance(scores, index)
    assert got.dtype == torch.bool
    assert got.tolist() == [False, False, True, True, False, False, False]  # group of one: False
    assert group_has_variance([0.0, 1.0], [0, 0]).tolist() == [True, True]
    with pytest.raises(ValueError, match="finite"):
        group_has_variance([0.0, math.inf], [0, 0])


def _batch():
    """Rows 0 and 3 form group "a" (scores 1, 0: variance); rows 1 and 2 group "b" (0.5, 0.5: none).
    One scored round each in rows 0-2; row 3 has no response token."""
    response = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    return AdvantageInputs(scores=torch.tensor([1.0, 0.5, 0.5, 0.0]),
                           index=np.array(["a", "b", "b", "a"], dtype=object), response_mask=response,
                           mem_rewards=torch.tensor([0.9, 0.3, 0.1]),
                           mem_offsets=torch.tensor([0, 1, 2, 3, 3]), mem_spans=torch.tensor([[1, 3], [1, 3], [0, 2]]))


def test_zero_variance_policy_keeps_only_memory_spans():
    got = token_advantages(_batch(), skip_zero_variance_groups=True)
    assert isinstance(got, TokenAdvantages)
    assert got.has_variance.tolist() == [True, False, False, True]
    assert got.memory_mask.tolist() == [[False, True, True, False, False], [False, True, True, False, False],
                                        [False, True, False, False, False], [False] * 5]  # span & response mask
    assert got.loss_mask.tolist() == [[True, True, True, True, False], [False, True, True, False, False],
                                      [False, True, False, False, False], [False] * 5]
    # group "a": A_out = +-0.5 / std([1, 0]) = +-Z; its pool holds one reward: A_mem = 0
    # group "b": A_out = 0, dropped; its pool [0.3, 0.1] gives A_mem = +-ZM on the <mem> tokens
    want = torch.tensor([[Z, Z, Z, Z, 0], [0, ZM, ZM, 0, 0], [0, -ZM, 0, 0, 0], [0, 0, 0, 0, 0]])
    torch.testing.assert_close(got.advantages, want, atol=1e-6, rtol=0)
    assert got.advantages.dtype == torch.float32 and got.loss_mask.dtype == torch.bool
    assert (got.advantages[~got.loss_mask] == 0).all()


def test_without_the_policy_every_response_token_is_in_the_loss():
    inputs = _batch()
    got = token_advantages(inputs, memory_weight=2.0)
    assert torch.equal(got.loss_mask, inputs.response_mask.bool())
    want = torch.tensor([[Z, Z, Z, Z, 0], [0, 2 * ZM, 2 * ZM, 0, 0], [0, -2 * ZM, 0, 0, 0], [0, 0, 0, 0, 0]])
    torch.testing.assert_close(got.advantages, want, atol=1e-6, rtol=0)
    direct, _ = mempo_advantage(*inputs, memory_weight=2.0)
    assert torch.equal(got.advantages, direct)  # the op's values, nothing added


def test_policy_is_a_no_op_when_every_group_has_variance():
    inputs = _batch()._replace(scores=torch.tensor([1.0, 0.5, 0.0, 0.0]))
    assert torch.equal(token_advantages(inputs, skip_zero_variance_groups=True).advantages,
                       token_advantages(inputs).advantages)


def test_without_memory_inputs_it_is_grpo():
    inputs = AdvantageInputs(torch.tensor([1.0, 0.0, 2.0]), [0, 0, 1], torch.ones(3, 4, dtype=torch.int64))
    got = token_advantages(inputs, skip_zero_variance_groups=True)
    assert not got.memory_mask.any()
    assert got.loss_mask.tolist() == [[True] * 4, [True] * 4, [False] * 4]  # row 2: a group of one
    torch.testing.assert_close(got.advantages, torch.tensor([[Z] * 4, [-Z] * 4, [0.0] * 4]), atol=1e-6, rtol=0)


def test_memory_mask_matches_a_loop_on_random_spans():
    rng = random.Random(0)
    for _ in range(20):
        rows, length = rng.randint(1, 6), rng.randint(1, 12)
        response = torch.tensor([[rng.random() < 0.8 for _ in range(length)] for _ in range(rows)], dtype=torch.int64)
        offsets, spans = [0], []
        for _ in range(rows):
            cuts = sorted(rng.sample(range(length + 1), k=2 * rng.randint(0, (length + 1) // 2)))
            spans += [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts), 2)]
            if rng.random() < 0.2:
                spans.append((length, length))  # an empty span at the end
            offsets.append(len(spans))
        inputs = AdvantageInputs(torch.rand(rows), [0] * rows, response, torch.rand(len(spans)),
                                 torch.tensor(offsets), torch.tensor(spans, dtype=torch.int64).reshape(-1, 2))
        want = torch.zeros(rows, length, dtype=torch.bool)
        for row in range(rows):
            for start, end in spans[offsets[row]:offsets[row + 1]]:
                want[row, start:end] = True
        assert torch.equal(token_advantages(inputs).memory_mask, want & response.bool())


def test_advantage_inputs_of_trajectories():
    scored, unscored = trajectory(), trajectory(second_mem=None)
    scored.outcome, unscored.outcome = {"score": 1.0}, {"score": 0.0}
    got = advantage_inputs([scored, unscored], memory_rewards=[[0.25], []], pad_to=12)
    assert got.scores.tolist() == [1.0, 0.0] and list(got.index) == ["q", "q"]
    assert got.response_mask.shape == (2, 12) and got.response_mask[0].tolist() == [1, 1, 1, 0, 0] + [1] * 5 + [0, 0]
    assert got.mem_rewards.tolist() == [0.25] and got.mem_offsets.tolist() == [0, 1, 1]
    assert got.mem_spans.tolist() == [[5, 7]]
    with pytest.raises(ValueError, match="pad_to=4"):
        advantage_inputs([scored], memory_rewards=[[0.25]], pad_to=4)
    with pytest.raises(ValueError, match="no memory rewards"):
        advantage_inputs([scored])
    assert advantage_inputs([scored], require_memory_rewards=False).mem_offsets.tolist() == [0, 0]


def test_a_round_the_definition_does_not_score_gets_no_memory_advantage():
    """A None memory reward (scoring.scored_objectives: retrieved, nothing retrieved before the round)
    leaves the round and its <mem> span out of the memory inputs: the same advantages as a batch where
    that round had no <mem> at all, and no memory-mask tokens on its span."""
    def batch(second_mem):
        a, b = trajectory(second_mem=second_mem), trajectory()
        a.outcome, b.outcome = {"score": 1.0}, {"score": 0.0}
        return a, b

    a, b = batch((5, 7))
    got = advantage_inputs([a, b], memory_rewards=[[None], [0.5]])
    assert got.mem_rewards.tolist() == [0.5] and got.mem_offsets.tolist() == [0, 0, 1]
    assert got.mem_spans.tolist() == [[5, 7]]
    a0, b0 = batch(None)  # a has no scored round at all
    want = advantage_inputs([a0, b0], memory_rewards=[[], [0.5]])
    for skip in (False, True):
        g, w = (token_advantages(got, skip_zero_variance_groups=skip),
                token_advantages(want, skip_zero_variance_groups=skip))
        assert torch.equal(g.advantages, w.advantages) and torch.equal(g.memory_mask, w.memory_mask)
        assert not g.memory_mask[0].any()
    with pytest.raises(ValueError, match="2 memory rewards for 1 scored rounds"):
        advantage_inputs([a, b], memory_rewards=[[None, 0.1], [0.5]])
