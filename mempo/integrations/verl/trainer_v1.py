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

Forced ``<mem>`` ids carry the engine's own log-probs in ``rollout_log_probs`` (the agent loop asks for
them, `mempo.integrations.verl.server_scoring.forced_prefix_logprobs`). Where it cannot (sampling at a
temperature other than 1: the engines' prompt log-probs are at temperature 1), the rows list them in
``mempo_forced_spans``; ``_compute_old_log_prob`` then gives them the trainer's log-prob (log-ratio 0:
IS weight 1, never rejected by rollout rejection sampling, nothing added to sequence-level sums) and
verl's rollout-vs-actor and ``rollout_corr/*`` metrics are recomputed without them.

verl chooses behaviour by the trainer's attribute ``trainer_mode`` (``"sync"`` gives the plain replay
buffer, no refill and no re-issued prompts), so on this class the attribute always reads ``"sync"``
while the configuration keeps ``trainer.v1.trainer_mode=mempo_sync``: the agent-loop workers get the
same configuration and check that mempo's trainer consumes their rows
(`mempo.integrations.verl.run_config.consumer_problem`). ``"sync"`` itself is never re-registered.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch
import transfer_queue as tq
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.workers.utils.padding import response_to_nested

from mempo.integrations.verl.estimator import memory_config
from mempo.integrations.verl.fields import forced_mask, memory_inputs
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

    # -- forced <mem> ids without an engine log-prob --------------------------------------------------
    def _bypass(self) -> bool:
        correction = self.config.algorithm.get("rollout_correction", None)
        return bool(correction and correction.get("bypass_mode", False))

    def _forced_fields(self, batch) -> Optional[tuple]:
        """(data, padded mask [B, L], forced [B, L] bool) for the rows' ``mempo_forced_spans`` when the
        batch has rollout log-probs and some trained forced id has none from the engine; else None."""
        if not self.config.actor_rollout_ref.rollout.get("calculate_log_probs", False) or self._bypass():
            return None
        data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                               select_fields=["rollout_log_probs", "old_log_probs", "response_mask", "responses",
                                              "extra_fields"])
        if "rollout_log_probs" not in data.keys() or "extra_fields" not in data.keys():
            return None
        mask = data["response_mask"].to_padded_tensor(0)
        forced = forced_mask(_as_list(data["extra_fields"]), tuple(mask.shape)) & mask.bool()
        return (data, mask, forced) if forced.any() else None

    def _compute_old_log_prob(self, batch, metrics: dict):
        """verl's old log-probs, then the forced ids the agent loop got no engine log-prob for
        (``mempo_forced_spans``: sampled at a temperature other than 1) take the trainer's: their
        rollout-correction log-ratio is 0 (IS weight 1, never rejected) and verl's rollout-vs-actor
        diagnostics are recomputed without them (``mempo/forced_ids_excluded`` counts them)."""
        batch = super()._compute_old_log_prob(batch, metrics)
        found = self._forced_fields(batch)
        metrics["mempo/forced_ids_excluded"] = 0.0 if found is None else float(found[2].sum())
        if found is None:
            return batch
        data, mask, forced = found
        rollout = data["rollout_log_probs"].to_padded_tensor(0.0)
        old = data["old_log_probs"].to_padded_tensor(0.0)
        rollout = torch.where(forced, old, rollout)
        tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                        fields=TensorDict({"rollout_log_probs": response_to_nested(rollout, data["response_mask"])},
                                          batch_size=len(batch)))
        kept = DataProto(batch=TensorDict({"rollout_log_probs": rollout, "old_log_probs": old,
                                           "response_mask": (mask.bool() & ~forced).long(),
                                           "responses": data["responses"].to_padded_tensor(0)},
                                          batch_size=len(batch)))
        metrics.update(calculate_debug_metrics(kept))
        return batch

    def _correction_metrics_without_forced(self, batch) -> dict:
        """verl's rollout-correction metrics (``rollout_corr/*``) over the loss tokens less the excluded
        forced ids (verl computes them over all of them), or {} when none is excluded."""
        correction = self.config.algorithm.get("rollout_correction", None)
        found = self._forced_fields(batch) if correction is not None else None
        if found is None:
            return {}
        data, mask, forced = found
        kept = (mask.bool() & ~forced).to(mask.dtype)
        if not kept.any():
            return {}
        _, _, metrics = compute_rollout_correction_and_rejection_mask(
            old_log_prob=data["old_log_probs"].to_padded_tensor(0.0),
            rollout_log_prob=data["rollout_log_probs"].to_padded_tensor(0.0), response_mask=kept,
            rollout_is=correction.get("rollout_is", None),
            rollout_is_threshold=correction.get("rollout_is_threshold", 2.0),
            rollout_is_batch_normalize=correction.get("rollout_is_batch_normalize", False),
            rollout_rs=correction.get("rollout_rs", None),
            rollout_rs_threshold=correction.get("rollout_rs_threshold", None))
        return metrics

    def _compute_advantage(self, batch, metrics: dict):
        corrected = self._correction_metrics_without_forced(batch)
        batch = super()._compute_advantage(batch, metrics)
        metrics.update(corrected)  # in place of verl's, which counted the excluded forced ids
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
