"""``mempo_sync``: verl's V1 sync trainer plus the pooled memory advantage on the ``<mem>`` spans.

    trainer.use_v1=true  trainer.v1.trainer_mode=mempo_sync  algorithm.adv_estimator=grpo
    +algorithm.mempo.memory_weight=1.0  (+algorithm.mempo.epsilon, memory_std_floor)

``_compute_advantage`` runs verl's own (session-aware GRPO over the outcome ``rm_scores``, KL in
reward and rollout correction as configured), then reads each row's ``extra_fields`` (the
``mempo_mem_rewards`` / ``mempo_mem_spans`` a mempo agent loop wrote, `fields`) from TransferQueue,
z-scores the memory rewards per group (``uid``; `mempo.ops.advantage.memory_advantage`) and adds
``memory_weight`` times them on the spans (inside ``response_mask``); ``advantages`` and
``returns`` are written back. With GRPO's outcome part this is `mempo.ops.mempo_advantage`
(`mempo train`'s advantage stage without ``skip_zero_variance_groups``, which verl does not have).

verl chooses behaviour by the trainer's attribute ``trainer_mode`` (``"sync"`` gives the plain replay
buffer, no refill and no re-issued prompts), so on this class the attribute always reads ``"sync"``
while the configuration keeps ``trainer.v1.trainer_mode=mempo_sync``: the agent-loop workers get the
same configuration and check that mempo's trainer consumes their rows
(`mempo.integrations.verl.run_config.consumer_problem`). ``"sync"`` itself is never re-registered.
"""
from __future__ import annotations

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.workers.utils.padding import response_to_nested

from mempo.integrations.verl.estimator import memory_config
from mempo.integrations.verl.fields import memory_inputs
from mempo.integrations.verl.version import check_verl_version
from mempo.ops.advantage import memory_advantage

__all__ = ["MemPOTrainerSync", "TRAINER_NAME", "add_memory_advantage"]

TRAINER_NAME = "mempo_sync"


def add_memory_advantage(advantages: torch.Tensor, response_mask: torch.Tensor, uid: np.ndarray,
                         extra_fields: list, config) -> torch.Tensor:
    """``advantages + memory_weight * A_mem`` for a padded batch.

    advantages: float [B, L] (verl's outcome advantage); response_mask: [B, L]; uid: [B] group labels;
    extra_fields: [B] per-row dicts (`memory_inputs`); config: the ``algorithm`` node
    (``norm_adv_by_std_in_grpo``, ``mempo.{epsilon, memory_weight, memory_std_floor, memory_pooling}``;
    pooling "group" only: ValueError otherwise). Returns a new float32 [B, L] tensor.
    """
    norm, eps, weight, floor, pooling = memory_config(config)
    if pooling != "group":
        raise ValueError(f"algorithm.mempo.memory_pooling={pooling!r}: the mempo_sync trainer pools per group "
                         "only (the agent loop records no stages)")
    rewards, offsets, spans = memory_inputs(extra_fields)
    if rewards.numel() == 0:
        return advantages.float()
    memory = memory_advantage(rewards, offsets, spans, uid, response_mask, epsilon=eps, norm_adv_by_std=norm,
                              std_floor=floor)
    return (advantages.float() + weight * memory.to(advantages.device)).float()


def _as_list(values) -> list:
    """A TransferQueue non-tensor field as a list (a NonTensorStack, or the list tensordict returns)."""
    return values.tolist() if hasattr(values, "tolist") else list(values)


@register_trainer(TRAINER_NAME)
class MemPOTrainerSync(PPOTrainerSync):
    """verl's `PPOTrainerSync` whose advantage adds MemPO's memory part (module docstring)."""

    def __init__(self, config, *args, **kwargs):
        check_verl_version()
        estimator = getattr(config.algorithm.adv_estimator, "value", config.algorithm.adv_estimator)
        if estimator != "grpo":
            raise ValueError(f"algorithm.adv_estimator={estimator!r}: the {TRAINER_NAME} trainer adds the memory "
                             "advantage to verl's GRPO; set algorithm.adv_estimator=grpo")
        memory_config(config.algorithm)  # a bad algorithm.mempo value fails here, not at the first step
        super().__init__(config, *args, **kwargs)

    @property
    def trainer_mode(self) -> str:
        """verl's behaviour switch: always the sync trainer's (module docstring)."""
        return "sync"

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        """verl's constructor assigns the configured name; the behaviour stays "sync"."""
        if value != TRAINER_NAME:
            raise ValueError(f"trainer.v1.trainer_mode={value!r} built the {TRAINER_NAME} trainer")

    def _compute_advantage(self, batch, metrics: dict):
        batch = super()._compute_advantage(batch, metrics)
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["uid", "response_mask", "advantages", "extra_fields"])
        nested_mask = data["response_mask"]
        mask = nested_mask.to_padded_tensor(0)
        advantages = data["advantages"].to_padded_tensor(0.0)
        uid = np.array(_as_list(data["uid"]), dtype=object)
        extra_fields = _as_list(data["extra_fields"])
        total = add_memory_advantage(advantages, mask, uid, extra_fields, self.config.algorithm)
        on_spans = (total != advantages) & mask.bool()
        metrics["mempo/memory_tokens"] = float(on_spans.sum())
        metrics["mempo/scored_rounds"] = float(sum(len((f or {}).get("mempo_mem_rewards", [])) for f in extra_fields))
        nested = response_to_nested(total, nested_mask)
        fields = TensorDict({"advantages": nested, "returns": response_to_nested(total, nested_mask)},
                            batch_size=len(batch))
        return tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
