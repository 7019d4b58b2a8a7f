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


@pytest.mark.parametrize("epochs, mini_batches", [(1, 1), (1, 2), (2, 1)])
def test_old_log_probs_only_where_a_later_optimiser_step_needs_them(epochs, mini_batches):
    """One optimiser step per PPO step: no forward pass for old log-probs (None: `Actor.update` takes
    the ratio against its own detached log-probs), and the update equals the one made with them."""
    pytest.importorskip("transformers")
    from mempo.config import ActorConfig
    from mempo.train.actor import Actor
    from mempo.train.step import TrainBatch, old_and_ref_log_probs, update
    from support.dist_worker import make_batch, make_model

    actor_cfg = ActorConfig(lr=1e-3, kl_coef=0.0, ppo_epochs=epochs, ppo_mini_batches=mini_batches)
    cfg = dataclasses.replace(MempoConfig(), actor=actor_cfg)
    data, adv = make_batch()
    batch = TrainBatch(data["input_ids"], data["attention_mask"], data["response_mask"], adv,
                       row_traj=list(range(len(adv))), row_round=[-1] * len(adv))
    actors = [Actor(make_model(0), actor_cfg) for _ in range(2)]
    ctx = StepContext(cfg=cfg, actor=actors[0], ref_actor=None, backend=None, tokenizer=TOK, tools={})
    old, ref = old_and_ref_log_probs(ctx, batch)
    assert ref is None and (old is None) == (epochs == 1 and mini_batches == 1)
    if old is None:  # the same update as with the current policy's log-probs computed first
        explicit = actors[1].compute_log_probs(batch.input_ids, batch.attention_mask, response_mask=batch.response_mask,
                                               temperature=cfg.rollout.temperature).log_probs
        update(ctx, batch, None, None)
        update(dataclasses.replace(ctx, actor=actors[1]), batch, explicit, None)
        for a, b in zip(actors[0].module.parameters(), actors[1].module.parameters()):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("overrides, level", [
    ([], None),                                                       # HF with the actor's fp32 weights: a no-op
    (["rollout.backend=sglang"], "token"),                            # another engine: on by default
    (["actor.param_dtype=bfloat16"], "token"),                        # half-precision compute
    (["model.dtype=bfloat16"], "token"),
    (["actor.rollout_is=sequence"], "sequence"),
    (["rollout.backend=sglang", "actor.rollout_is=off"], None),
])
def test_rollout_correction_is_on_where_rollout_and_training_differ(overrides, level):
    from mempo.config import load_config
    from mempo.train.step import rollout_is_level

    assert rollout_is_level(load_config(None, overrides)) == level


def test_a_backend_without_log_probs_is_refused_by_name():
    from mempo.config import ConfigError, load_config
    from mempo.rollout.backends import ScriptedBackend
    from mempo.train.step import TrainBatch, check_rollout_logprobs, rollout_correction

    from support.rollout_fixtures import chat_tokenizer

    scripted = ScriptedBackend(lambda request: [1], chat_tokenizer())
    check_rollout_logprobs(load_config(None, []), scripted)  # auto on HF fp32: nothing to correct
    cfg = load_config(None, ["actor.rollout_is=token"])
    with pytest.raises(ConfigError, match=r"^actor\.rollout_is: 'token' corrects for the rollout policy .* "
                                          r"ScriptedBackend backend does not give; set actor.rollout_is: off"):
        check_rollout_logprobs(cfg, scripted)
    batch = TrainBatch(torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long),
                       torch.tensor([[False, True, True]]), torch.zeros(1, 3), [0], [-1])
    ctx = StepContext(cfg=cfg, actor=None, ref_actor=None, backend=scripted, tokenizer=TOK, tools={})
    with pytest.raises(ConfigError, match=r"^actor\.rollout_is: 'token' needs the sampled ids' log-probs, but the "
                                          r"backend returned none"):
        rollout_correction(ctx, batch)
    assert rollout_correction(dataclasses.replace(ctx, cfg=load_config(None, [])), batch) is None
