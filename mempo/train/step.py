"""One MemPO training step, as named stages (ALGORITHM.md sections 3-6).

    rollout -> rewards -> memory_rewards -> advantages -> old_and_ref_log_probs -> update -> sync_weights

Each stage is a small function of a `StepContext` (what lives across steps: config, actor, reference
actor, backend, tokenizer, tools) and the previous stage's output; `train_step` runs them in order
under a `StageTimer` (``time/<stage>`` seconds in the metrics).

Conventions
-----------
* Rollout seeding: every step builds its `RolloutEngine` over the ``rollout`` section with engine
  seed `mempo.seeds.training_rollout_seed` (rollout.seed, step) (the engine mixes in its call
  counter, always 0 here), so the samples of step s depend only on (weights, episodes, seed, s): a
  resumed run re-samples exactly.
* Generation memory: right after the rollout (inside its timer) a colocated engine may free its GPU
  memory for the trainer's stages (`release_generation_memory`); `sync_weights` loads the new
  weights back into it at the end of the step.
* Distributed: each rank rolls out its own questions (``episodes`` is this rank's share); GRPO groups
  never straddle ranks, so advantages are rank-local and exact. Reported means are over this rank.
* The algorithm's stages are `mempo.algo`: scoring contexts (`contexts.scoring_requests`), teacher
  scoring (`mempo.scoring.score`: P per context), memory rewards (`memory_reward`), token advantages
  and loss mask in *response* coordinates ``[B, Lr]`` with the zero-variance policy
  (``algorithm.skip_zero_variance_groups``; `advantages.token_advantages`).
* Training rows (`build_batch`), by ``rollout.context_policy``:
  - full: one row per trajectory, ``prompt_ids + response_ids``; loss on the response mask; the
    advantage of response token j sits at column ``P + j``.
  - memory: one row per round (`round_training_inputs`): the exact context the round was generated
    from + the round's own ids ``response_ids[start:end]``; loss on the round's response mask; the
    advantage of the round's k-th id is ``A[b, start + k]`` (the same token in response coordinates),
    so each round carries its own memory advantage on its ``<mem>`` span and the outcome elsewhere.
  Rows are right-padded (pad id, attention 0); all ``[N, L]`` tensors are token-aligned as `Actor`
  expects.
* Tool calls: ``rollout/tool_calls`` and ``rollout/tool_errors`` are this rank's counts for the
  step (a failed call, e.g. an unreachable retriever, is an ``<information>Error: ...`` result
  the policy sees; `mempo.env.tools`).
* Old log-probs are the current policy's (computed before the update, eval mode), so the first PPO
  epoch's ratio is 1; reference log-probs come from the frozen reference actor (skipped when
  ``actor.kl_coef == 0``).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from mempo.algo.advantages import TokenAdvantages, advantage_inputs, token_advantages
from mempo.algo.contexts import scoring_requests
from mempo.algo.memory_reward import attach_memory_rewards
from mempo.config import MempoConfig
from mempo.rollout.backends.hf import load_weights_into
from mempo.rollout.loop import RolloutEngine, RolloutStats
from mempo.rollout.trajectory import Trajectory, round_training_inputs
from mempo.scoring import score
from mempo.seeds import training_rollout_seed
from mempo.train import metric_names as names
from mempo.train.logging import StageTimer

__all__ = ["StepContext", "StepResult", "TrainBatch", "rollout", "rewards", "memory_rewards",
           "advantages", "build_batch", "old_and_ref_log_probs", "update", "sync_weights",
           "release_generation_memory", "train_step", "STAGES"]

STAGES = ("rollout", "rewards", "memory_rewards", "advantages", "old_and_ref_log_probs", "update", "sync_weights")


@dataclass
class StepContext:
    """What a step needs. actor: the trained `Actor`; ref_actor: frozen reference (None when
    kl_coef is 0); backend: the generation backend (`mempo.rollout.backends.factory.build_backend`;
    shares or syncs the actor's weights); tools: the agent's tools; rollout_model: an unsharded copy
    of the policy under torch.distributed (teacher scoring and HF generation run on it, synced
    every step; None: the actor's own module). Nothing here holds the episodes' gold answers: they
    reach only the reward (`compute_score`, after a trajectory ends) and the memory reward's
    teacher scoring, never a generation request."""

    cfg: MempoConfig
    actor: Any
    ref_actor: Optional[Any]
    backend: Any
    tokenizer: Any
    tools: Mapping[str, Callable]
    rollout_model: Optional[Any] = None
    distributed: bool = False

    @property
    def scoring_model(self):
        return self.rollout_model if self.rollout_model is not None else self.actor.module


@dataclass
class TrainBatch:
    """Training rows (token-aligned `[N, L]`): ids, attention, loss mask, advantages; ``row_traj``:
    the trajectory of each row; ``row_round``: its round (-1 for full-policy rows)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    row_traj: list[int]
    row_round: list[int]

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "response_mask": self.response_mask}


@dataclass
class StepResult:
    """`train_step` output: metrics, the trajectories, response-coordinate token advantages
    ``[B, Lr]`` and loss mask, and the training batch."""

    metrics: dict[str, float]
    trajectories: list
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    batch: TrainBatch
    extras: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------
def rollout(ctx: StepContext, episodes: Sequence[Any], step: int) -> tuple[list[Trajectory], RolloutStats]:
    """G trajectories of every episode (`RolloutEngine`), grouped by episode, and the engine's
    `mempo.rollout.loop.RolloutStats` (tool calls and failed tool calls among them)."""
    engine = RolloutEngine(ctx.backend, ctx.tokenizer, ctx.tools, config=ctx.cfg.rollout,
                           seed=training_rollout_seed(ctx.cfg.rollout.seed, step))
    trajectories = engine.run(list(episodes))
    return trajectories, engine.stats


def rewards(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Outcome metrics (the scores are already in each trajectory's ``outcome``)."""
    n = max(len(trajectories), 1)
    mean = lambda key, default=0.0: sum(float(t.outcome.get(key, default)) for t in trajectories) / n  # noqa: E731
    return {
        names.REWARD: mean("score"), names.EM: mean("em"), names.F1: mean("f1"),
        names.FORMAT_RATE: sum(1.0 for t in trajectories if t.outcome.get("format_ok")) / n,
        "rollout/turns": sum(len(t.rounds) for t in trajectories) / n,
        "rollout/response_length": sum(len(t.response_ids) for t in trajectories) / n,
        "rollout/generated_tokens": sum(t.num_generated_tokens for t in trajectories) / n,
        "rollout/answered_rate": sum(1.0 for t in trajectories if t.finish_reason == "answer") / n,
    }


def memory_rewards(ctx: StepContext, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Teacher scoring of every scored round with the current policy (P of both contexts); attaches
    each trajectory's ``memory_rewards`` (P(mem_ctx) - P(full_ctx))."""
    s = ctx.cfg.scoring
    requests = scoring_requests(trajectories, ctx.tokenizer)
    results = score(ctx.scoring_model, requests, method=s.method, threshold=s.threshold, token_budget=s.token_budget)
    attach_memory_rewards(trajectories, results)
    p_mem = [v for r in results for v in r.p_mem]
    p_full = [v for r in results for v in r.p_full]
    rewards_ = [v for t in trajectories for v in t.memory_rewards]
    k = max(len(rewards_), 1)
    keeps = [v for t in trajectories for v in t.memory_keeps(ctx.tokenizer) if v is not None]
    metrics = {names.MEM_REWARD: sum(rewards_) / k, names.P_MEM: sum(p_mem) / k, names.P_FULL: sum(p_full) / k,
               "memory/scored_rounds": float(len(rewards_))}
    if keeps:  # only where some <mem> came after a retrieved gold
        metrics[names.MEM_KEEPS] = sum(keeps) / len(keeps)
    return metrics


def advantages(ctx: StepContext, trajectories: Sequence[Trajectory]) -> tuple[TokenAdvantages, dict[str, float]]:
    """Token advantages and loss mask in response coordinates ``[B, Lr]`` (`token_advantages` with the
    ``algorithm`` section), and their metrics."""
    a = ctx.cfg.algorithm
    result = token_advantages(advantage_inputs(trajectories), epsilon=a.epsilon, norm_adv_by_std=a.norm_adv_by_std,
                              memory_weight=a.memory_weight, skip_zero_variance_groups=a.skip_zero_variance_groups)
    adv, loss_mask = result.advantages, result.loss_mask
    on_mem = adv[result.memory_mask]
    metrics = {"adv/mean": float(adv[loss_mask].mean()) if loss_mask.any() else 0.0,
               "adv/abs_mean_mem": float(on_mem.abs().mean()) if on_mem.numel() else 0.0,
               "adv/groups_with_variance": float(result.has_variance.float().mean()) if len(trajectories) else 0.0,
               "adv/loss_tokens": float(loss_mask.sum())}
    return result, metrics


def build_batch(ctx: StepContext, trajectories: Sequence[Trajectory], adv: torch.Tensor,
                loss_mask: torch.Tensor) -> TrainBatch:
    """Training rows for the configured context policy (module conventions)."""
    rows: list[tuple[list[int], list[int], list[float]]] = []
    row_traj, row_round = [], []
    policy = ctx.cfg.rollout.context_policy
    for b, t in enumerate(trajectories):
        n = len(t.response_ids)
        mask_b, adv_b = loss_mask[b, :n].long().tolist(), adv[b, :n].tolist()
        if policy == "full":
            p = len(t.prompt_ids)
            rows.append((t.sequence_ids, [0] * p + mask_b, [0.0] * p + adv_b))
            row_traj.append(b)
            row_round.append(-1)
        else:
            for r, inp in zip(t.rounds, round_training_inputs(t)):
                c = inp.context_len
                rows.append((inp.input_ids, [0] * c + mask_b[r.start:r.end], [0.0] * c + adv_b[r.start:r.end]))
                row_traj.append(b)
                row_round.append(r.index)
    width = max(len(ids) for ids, _, _ in rows)
    pad = getattr(ctx.tokenizer, "pad_token_id", None) or 0
    n_rows = len(rows)
    input_ids = torch.full((n_rows, width), int(pad), dtype=torch.long)
    attention = torch.zeros((n_rows, width), dtype=torch.long)
    response_mask = torch.zeros((n_rows, width), dtype=torch.bool)
    advantages_ = torch.zeros((n_rows, width), dtype=torch.float32)
    for i, (ids, mask, values) in enumerate(rows):
        k = len(ids)
        input_ids[i, :k] = torch.tensor(ids, dtype=torch.long)
        attention[i, :k] = 1
        response_mask[i, :k] = torch.tensor(mask, dtype=torch.bool)
        advantages_[i, :k] = torch.tensor(values, dtype=torch.float32)
    return TrainBatch(input_ids, attention, response_mask, advantages_, row_traj, row_round)


def old_and_ref_log_probs(ctx: StepContext, batch: TrainBatch) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Current-policy and reference log-probs of the batch's loss tokens (token-aligned fp32)."""
    temperature = ctx.cfg.rollout.temperature
    old = ctx.actor.compute_log_probs(batch.input_ids, batch.attention_mask, response_mask=batch.response_mask,
                                      temperature=temperature).log_probs
    ref = None
    if ctx.ref_actor is not None and ctx.cfg.actor.kl_coef > 0:
        ref = ctx.ref_actor.compute_log_probs(batch.input_ids, batch.attention_mask,
                                              response_mask=batch.response_mask, temperature=temperature).log_probs
    return old, ref


def update(ctx: StepContext, batch: TrainBatch, old: torch.Tensor, ref: Optional[torch.Tensor]) -> dict[str, float]:
    """PPO-clip + KL update (`Actor.update`); returns its metrics under ``actor/``."""
    if not batch.response_mask.any():
        return {"actor/skipped_empty": 1.0}
    metrics = ctx.actor.update(batch.as_dict(), batch.advantages, old_log_probs=old, ref_log_probs=ref,
                               temperature=ctx.cfg.rollout.temperature)
    return {f"{names.ACTOR_PREFIX}{k}": float(v) for k, v in metrics.items()}


def sync_weights(ctx: StepContext) -> None:
    """Make generation use the updated weights: nothing to copy when the backend generates with the
    actor's own module (one process, HF); otherwise the full state dict is gathered (every rank,
    under torch.distributed), copied into the unsharded `rollout_model` when there is one, and
    handed to the backend (an HF backend on that copy skips tensors it already holds; SGLang loads
    them through its update session)."""
    backend_model = getattr(ctx.backend, "model", None)
    if ctx.rollout_model is None and backend_model is ctx.actor.module:
        ctx.backend.sync_weights(None)
        return
    full = get_model_state_dict(ctx.actor.module, options=StateDictOptions(full_state_dict=True))
    full = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v) for k, v in full.items()}
    if ctx.rollout_model is not None and ctx.rollout_model is not backend_model:
        load_weights_into(ctx.rollout_model, full)
    ctx.backend.sync_weights(full)


def release_generation_memory(ctx: StepContext) -> None:
    """Let a colocated engine free its GPU memory while the trainer's stages run (SGLang in-process:
    `SGLangBackend.release_memory`); a no-op for backends without the hook."""
    release = getattr(ctx.backend, "release_memory", None)
    if callable(release):
        release()


# ------------------------------------------------------------------------------------------------
def train_step(ctx: StepContext, episodes: Sequence[Any], step: int, timer: Optional[StageTimer] = None) -> StepResult:
    """Run the stages in order on this rank's `episodes` (module docstring); returns a StepResult."""
    timer = timer or StageTimer()
    timer.reset()
    began = time.perf_counter()
    metrics: dict[str, float] = {}
    with timer("rollout"):
        trajectories, stats = rollout(ctx, episodes, step)
        release_generation_memory(ctx)
    with timer("rewards"):
        metrics.update(rewards(trajectories))
        metrics.update({"rollout/tool_calls": float(stats.tool_calls), "rollout/tool_errors": float(stats.tool_errors)})
    with timer("memory_rewards"):
        metrics.update(memory_rewards(ctx, trajectories))
    with timer("advantages"):
        token_adv, adv_metrics = advantages(ctx, trajectories)
        metrics.update(adv_metrics)
        batch = build_batch(ctx, trajectories, token_adv.advantages, token_adv.loss_mask)
    with timer("old_and_ref_log_probs"):
        old, ref = old_and_ref_log_probs(ctx, batch)
    with timer("update"):
        metrics.update(update(ctx, batch, old, ref))
    with timer("sync_weights"):
        sync_weights(ctx)
    seconds = time.perf_counter() - began
    tokens = float(batch.attention_mask.sum())
    metrics.update({"train/rows": float(batch.input_ids.shape[0]), names.TOKENS: tokens,
                    "perf/tokens_per_s": tokens / seconds if seconds > 0 else 0.0, names.STEP_SECONDS: seconds})
    metrics.update(timer.metrics("time/"))
    return StepResult(metrics, list(trajectories), token_adv.advantages, token_adv.loss_mask, batch)
