"""The "mempo" advantage estimator and the legacy trainer's `compute_advantage` that feeds it.

    algorithm.adv_estimator=mempo +algorithm.mempo.memory_weight=1.0 ...   (trainer.use_v1=false)

Importing this module registers `compute_mempo_advantage` under "mempo" (verl's `register_adv_est`).
Conventions: shapes [B, L] are verl's response tokens. Memory inputs reach `compute_advantage` in
either form: the lists a mempo agent loop writes (``non_tensor_batch["mempo_mem_rewards"]`` /
``["mempo_mem_spans"]``, one list per row, `mempo.integrations.verl.fields`), or tensors padded to
[B, K] per trajectory (`MEMORY_KEYS`, `pack_memory_fields`) for a batch built elsewhere; mempo's
own ops use the CSR form (`unpack_memory_fields` converts). It imports only verl submodules and
mempo modules that import no verl (it may run while ``verl/__init__`` is executing).
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from verl.trainer.ppo import core_algos

from mempo.algo.advantages import AdvantageInputs, token_advantages
from mempo.algo.pooling import MEMORY_POOLINGS
from mempo.integrations.verl.fields import memory_inputs

__all__ = [
    "MEMORY_KEYS",
    "STAGES_KEY",
    "compute_mempo_advantage",
    "compute_advantage",
    "pack_memory_fields",
    "unpack_memory_fields",
    "memory_config",
]

# batch["mempo_mem_rewards"]  float [B, K]    memory reward of each scored round (K = max rounds)
# batch["mempo_mem_spans"]    int64 [B, K, 2] (start, end) of the round's <mem> span, response coords
# batch["mempo_mem_valid"]    bool  [B, K]    which of the K slots hold a scored round
MEMORY_KEYS = ("mempo_mem_rewards", "mempo_mem_spans", "mempo_mem_valid")
# batch["mempo_mem_stages"]   int64 [B, K]    the stage of each scored round (only for a pooling other
#                                             than "group"; `mempo.algo.pooling.memory_stages`)
STAGES_KEY = "mempo_mem_stages"
_warned_missing_memory = False


def pack_memory_fields(mem_rewards: torch.Tensor, mem_offsets: torch.Tensor, mem_spans: torch.Tensor,
                       num_slots: Optional[int] = None, mem_stages: Optional[torch.Tensor] = None
                       ) -> dict[str, torch.Tensor]:
    """CSR memory inputs -> the padded batch fields of `MEMORY_KEYS` (and `STAGES_KEY` when
    `mem_stages` is given).

    mem_rewards [R] float, mem_offsets [B+1] int64, mem_spans [R, 2] int64 (mem_stages [R] int64)
    -> tensors of shape [B, K], [B, K, 2], [B, K] ([B, K]) with K = num_slots or the largest number
    of rounds per trajectory.

    Recipe: compute the rewards with `mempo.scoring.compute_memory_rewards` (the ``scoring``
    section's definition), then `mempo.algo.advantages.advantage_inputs` (which leaves out the rounds
    the definition does not score), and pack its ``mem_rewards, mem_offsets, mem_spans``.
    """
    offsets = torch.as_tensor(mem_offsets, dtype=torch.int64)
    rewards = torch.as_tensor(mem_rewards, dtype=torch.float32)
    spans = torch.as_tensor(mem_spans, dtype=torch.int64).reshape(-1, 2)
    counts = offsets.diff()
    num_rows = counts.numel()
    widest = int(counts.max()) if num_rows else 0
    k = widest if num_slots is None else int(num_slots)
    if k < widest:
        raise ValueError(f"num_slots={k} is smaller than the largest number of scored rounds ({widest})")
    valid = torch.arange(k)[None, :] < counts[:, None]
    out_rewards = torch.zeros(num_rows, k, dtype=torch.float32)
    out_spans = torch.zeros(num_rows, k, 2, dtype=torch.int64)
    out_rewards[valid] = rewards
    out_spans[valid] = spans
    fields = {"mempo_mem_rewards": out_rewards, "mempo_mem_spans": out_spans, "mempo_mem_valid": valid}
    if mem_stages is not None:
        stages = torch.as_tensor(mem_stages, dtype=torch.int64).reshape(-1)
        if stages.numel() != rewards.numel():
            raise ValueError(f"mem_stages has {stages.numel()} entries for {rewards.numel()} scored rounds")
        fields[STAGES_KEY] = torch.zeros(num_rows, k, dtype=torch.int64)
        fields[STAGES_KEY][valid] = stages
    return fields


def unpack_memory_fields(mem_rewards: torch.Tensor, mem_spans: torch.Tensor, mem_valid: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded batch fields -> CSR (mem_rewards [R], mem_offsets [B+1], mem_spans [R, 2])."""
    valid = mem_valid.bool()
    offsets = torch.zeros(valid.shape[0] + 1, dtype=torch.int64, device=valid.device)
    offsets[1:] = torch.cumsum(valid.sum(1), 0)
    return mem_rewards[valid], offsets, mem_spans[valid]


def memory_config(config: Any) -> tuple[bool, float, float, float, str]:
    """(norm_adv_by_std, epsilon, memory_weight, memory_std_floor, memory_pooling) of the OmegaConf
    `algorithm` node, as in mempo's `algorithm` section: ``norm_adv_by_std_in_grpo`` (default True),
    ``mempo.epsilon`` (1e-6), ``mempo.memory_weight`` (1.0), ``mempo.memory_std_floor`` (0.0: no
    floor), ``mempo.memory_pooling`` ("group"; "group_round" and "group_seen" need the batch's
    ``mempo_mem_stages``: verl knows neither round indices nor golds, so the stages must be computed
    where the trajectories are)."""
    if config is None:
        return True, 1e-6, 1.0, 0.0, "group"
    get = config.get if hasattr(config, "get") else lambda key, default=None: getattr(config, key, default)
    sub = get("mempo", None) or {}
    sub_get = sub.get if hasattr(sub, "get") else lambda key, default=None: getattr(sub, key, default)
    pooling = sub_get("memory_pooling", "group")
    if pooling not in MEMORY_POOLINGS:
        raise ValueError(f"algorithm.mempo.memory_pooling must be one of {MEMORY_POOLINGS}, got {pooling!r}")
    return (bool(get("norm_adv_by_std_in_grpo", True)), float(sub_get("epsilon", 1e-6)),
            float(sub_get("memory_weight", 1.0)), sub_get("memory_std_floor", 0.0), pooling)


@core_algos.register_adv_est("mempo")
def compute_mempo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: Any = None,
                            epsilon: Optional[float] = None, norm_adv_by_std_in_grpo: Optional[bool] = None,
                            config: Any = None, mem_rewards: Optional[torch.Tensor] = None,
                            mem_spans: Optional[torch.Tensor] = None, mem_valid: Optional[torch.Tensor] = None,
                            mem_stages: Optional[torch.Tensor] = None,
                            **unused: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl estimator contract: (token_level_rewards [B, L], response_mask [B, L], index (uid array),
    config) -> (advantages [B, L], returns [B, L]); memory inputs in the padded form of MEMORY_KEYS
    (and `STAGES_KEY`'s ``mem_stages`` [B, K] for a pooling other than "group": ValueError without).

    The advantages are `mempo.algo.advantages.token_advantages` over every response token (verl
    applies its own masks). verl's `compute_advantage` (ray_trainer.py, v0.6-v0.9) passes a
    registered estimator only the rewards, mask, config and ``index``; with only those, "mempo"
    equals verl's GRPO (outcome advantage, same conventions) and warns once. To bring the memory
    rewards along, call `compute_advantage` below instead of verl's (or `patch_ray_trainer()` once).
    """
    global _warned_missing_memory
    if index is None:
        raise ValueError("the 'mempo' estimator needs the 'uid' group index (non_tensor_batch['uid'])")
    cfg_norm, cfg_eps, memory_weight, std_floor, pooling = memory_config(config)
    if pooling != "group" and mem_stages is None:
        raise ValueError(f"algorithm.mempo.memory_pooling={pooling!r} needs the stage of each scored round in the "
                         f"batch (batch['{STAGES_KEY}'], pack_memory_fields(..., mem_stages=mempo.algo.pooling."
                         "memory_stages(...))); verl's batch has none. Set memory_pooling to 'group' or add them.")
    norm = cfg_norm if norm_adv_by_std_in_grpo is None else bool(norm_adv_by_std_in_grpo)
    eps = cfg_eps if epsilon is None else float(epsilon)
    scores = token_level_rewards.sum(dim=-1)
    if mem_rewards is None or mem_spans is None or mem_valid is None:
        if not _warned_missing_memory:
            warnings.warn("mempo estimator: no memory rewards reached it (verl passes only rewards, mask and "
                          "uid); computing plain GRPO. Use mempo.integrations.verl.compute_advantage to pass "
                          "the batch's mempo_mem_* fields.", RuntimeWarning, stacklevel=2)
            _warned_missing_memory = True
        result = token_advantages(AdvantageInputs(scores, index, response_mask), epsilon=eps, norm_adv_by_std=norm,
                                  memory_std_floor=std_floor)  # the floor is validated even without memory
    else:
        rewards, offsets, spans = unpack_memory_fields(mem_rewards, mem_spans, mem_valid)
        stages = mem_stages[mem_valid.bool()] if pooling != "group" else None
        result = token_advantages(AdvantageInputs(scores, index, response_mask, rewards, offsets, spans),
                                  epsilon=eps, norm_adv_by_std=norm, memory_weight=memory_weight, mem_stages=stages,
                                  memory_std_floor=std_floor)
    return result.advantages, result.advantages


def compute_advantage(data: Any, adv_estimator: Any, gamma: float = 1.0, lam: float = 1.0, num_repeat: int = 1,
                      norm_adv_by_std_in_grpo: bool = True, config: Any = None) -> Any:
    """Drop-in for `verl.trainer.ppo.ray_trainer.compute_advantage` that hands the batch's memory
    fields to the "mempo" estimator; any other estimator goes to verl's own function unchanged.

    data: a verl `DataProto` with batch keys token_level_rewards, response_mask and (optionally)
    MEMORY_KEYS, and non_tensor_batch["uid"]. Sets data.batch["advantages"] and ["returns"].
    """
    name = getattr(adv_estimator, "value", adv_estimator)
    if name != "mempo":
        from verl.trainer.ppo import ray_trainer  # reason: heavy (ray); only for verl's own estimators

        verl_fn = getattr(ray_trainer, "_verl_compute_advantage", ray_trainer.compute_advantage)
        return verl_fn(data, adv_estimator, gamma=gamma, lam=lam, num_repeat=num_repeat,
                       norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config)
    batch = data.batch
    memory = {}
    if "mempo_mem_rewards" in data.non_tensor_batch:  # a mempo agent loop's lists, one per row
        columns = [data.non_tensor_batch.get(key) for key in ("mempo_mem_rewards", "mempo_mem_spans")]
        rows = [{"mempo_mem_rewards": columns[0][i], "mempo_mem_spans": None if columns[1] is None else columns[1][i]}
                for i in range(len(data))]
        rewards, offsets, spans = memory_inputs(rows)
        padded = pack_memory_fields(rewards, offsets, spans)
        memory = dict(mem_rewards=padded["mempo_mem_rewards"], mem_spans=padded["mempo_mem_spans"],
                      mem_valid=padded["mempo_mem_valid"])
    elif all(key in batch.keys() for key in MEMORY_KEYS):
        memory = dict(mem_rewards=batch["mempo_mem_rewards"], mem_spans=batch["mempo_mem_spans"],
                      mem_valid=batch["mempo_mem_valid"])
        if STAGES_KEY in batch.keys():
            memory["mem_stages"] = batch[STAGES_KEY]
    advantages, returns = compute_mempo_advantage(
        token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"],
        index=data.non_tensor_batch.get("uid"), norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo, config=config,
        **memory,
    )
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data

