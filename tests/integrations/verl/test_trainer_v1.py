"""The "mempo_sync" V1 trainer: its registration, the sync-mode alias, its refusals and the memory term.
(Its `_compute_advantage` on agent-loop rows through a TransferQueue stand-in: test_agent_loop.py.)"""
import numpy as np
import pytest
import torch

pytest.importorskip("transfer_queue", reason="the V1 trainer needs TransferQueue (pip install .[verl])")
pytestmark = pytest.mark.verl

from omegaconf import OmegaConf, open_dict  # noqa: E402
from verl.trainer.ppo.v1 import trainer_base  # noqa: E402
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync  # noqa: E402

from mempo.integrations.verl import trainer_v1  # noqa: E402
from mempo.ops.advantage import grpo_outcome_advantage, mempo_advantage  # noqa: E402


def _config(tmp_path, **algorithm):
    from support.verl_standin import verl_config

    config = verl_config(tmp_path / "agents.yaml", prompt_length=16, response_length=16)
    with open_dict(config):
        config.trainer.v1.trainer_mode = trainer_v1.TRAINER_NAME
        for key, value in algorithm.items():
            OmegaConf.update(config, f"algorithm.{key}", value, force_add=True)
    return config


def test_registered_and_runs_with_verls_sync_semantics(tmp_path, monkeypatch):
    assert trainer_base.get_trainer_cls("mempo_sync") is trainer_v1.MemPOTrainerSync
    assert trainer_base.get_trainer_cls("sync") is not trainer_v1.MemPOTrainerSync  # never re-registered

    def base_init(self, config):  # verl's constructor up to the replay buffer (the rest needs a cluster)
        self.config = config
        self.trainer_mode = config.trainer.v1.trainer_mode
        self.replay_buffer = self._build_replay_buffer()

    monkeypatch.setattr(trainer_base.PPOTrainer, "__init__", base_init)
    config = _config(tmp_path)
    trainer = trainer_v1.MemPOTrainerSync(config)
    assert trainer.trainer_mode == "sync"
    # the configuration the agent-loop workers get still names mempo's trainer, so a loop can tell
    assert config.trainer.v1.trainer_mode == trainer.config.trainer.v1.trainer_mode == "mempo_sync"
    assert type(trainer.replay_buffer) is ReplayBuffer and not isinstance(trainer.replay_buffer, ReplayBufferAsync)


def test_refuses_other_estimators_and_bad_memory_options_at_construction(tmp_path):
    with pytest.raises(ValueError, match="algorithm.adv_estimator='gae'.*set algorithm.adv_estimator=grpo"):
        trainer_v1.MemPOTrainerSync(_config(tmp_path, adv_estimator="gae"))
    with pytest.raises(ValueError, match="memory_pooling must be one of"):
        trainer_v1.MemPOTrainerSync(_config(tmp_path, mempo={"memory_pooling": "round"}))


def test_memory_term_equals_mempo_advantage_minus_grpo():
    g = torch.Generator().manual_seed(0)
    uid = np.array(["a"] * 3 + ["b"] * 3, dtype=object)
    mask = (torch.rand(6, 12, generator=g) > 0.1).long()
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    rows = [{"mempo_mem_rewards": [0.1 * i, -0.05 * i], "mempo_mem_spans": [[0, 3], [5, 8]]} for i in range(6)]
    rows[2] = {"mempo_mem_rewards": [], "mempo_mem_spans": []}
    rows[4] = None  # a row from another agent loop: no memory term
    outcome = grpo_outcome_advantage(scores, uid, mask)
    config = {"mempo": {"memory_weight": 0.3}}
    got = trainer_v1.add_memory_advantage(outcome, mask, uid, rows, config)
    rewards = torch.tensor([v for r in rows if r for v in r["mempo_mem_rewards"]])
    offsets = torch.tensor([0] + list(np.cumsum([len(r["mempo_mem_rewards"]) if r else 0 for r in rows])))
    spans = torch.tensor([s for r in rows if r for s in r["mempo_mem_spans"]])
    want, _ = mempo_advantage(scores, uid, mask, rewards, offsets, spans, memory_weight=0.3)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert torch.equal(got[4], outcome[4]) and torch.equal(got[2], outcome[2])
    with pytest.raises(ValueError, match="pools per group only"):
        trainer_v1.add_memory_advantage(outcome, mask, uid, rows, {"mempo": {"memory_pooling": "group_round"}})
