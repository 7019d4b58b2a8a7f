"""One MemPO training step, as named stages (ALGORITHM.md sections 3-6); each returns what it makes
and the next takes it:

    rollout                episodes             -> trajectories (no outcome), tool-call counts
    rewards                trajectories         -> scored trajectories (new records, outcome filled)
    memory_rewards         scored               -> memory rewards, one list per trajectory
    advantages             scored, mem rewards  -> token advantages [B, Lr] -> batch (advantages inside)
    old_and_ref_log_probs  batch                -> old / reference log-probs
    update                 batch, old, ref      -> actor metrics;   then sync_weights

`StepContext` holds what lives across steps; `train_step` runs the stages in order under a
`StageTimer` (``time/<stage>`` seconds). Rollout seeding: the engine seed of step s is
`mempo.seeds.training_rollout_seed` (rollout.seed, s), so a resumed run re-samples exactly.
Distributed: each rank rolls out its own questions; GRPO groups never straddle ranks, so
advantages are rank-local and exact; the metrics are the run's (`mempo.train.run_metrics`). No
rank keeps a whole copy of the policy: generation with the HF backend runs inside `Actor.unsharded`
(the sharded actor gathered once for the rollout stage, in the all-gather dtype, freed after it: HF
generation stops at a different step on each rank, so per-forward gathers cannot follow it);
teacher scoring runs on the shards, the ranks in lockstep (`Actor.sharded_inference`); a separate
engine (SGLang) gets the weights streamed in buckets (`sync_weights`).
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence

import torch

from mempo.algo.advantages import TokenAdvantages, advantage_inputs, token_advantages
from mempo.algo.pooling import memory_stages
from mempo.algo.outcome import score_outcomes
from mempo.config import ConfigError, MempoConfig
from mempo.records.trajectory import Trajectory, round_training_inputs
from mempo.rollout.loop import RolloutEngine, RolloutStats, protocol_tags
from mempo.scoring import compute_memory_rewards
from mempo.seeds import training_rollout_seed
from mempo.train import metric_names as names
from mempo.train.actor import RolloutCorrection
from mempo.train.logging import StageTimer
from mempo.train.run_metrics import reduce_run_metrics
from mempo.utils.buckets import plan_buckets

__all__ = ["StepContext", "StepResult", "TrainBatch", "rollout", "rewards", "reward_metrics", "memory_rewards",
           "memory_keeps_metrics", "advantages", "build_batch", "old_and_ref_log_probs", "rollout_is_level",
           "check_rollout_logprobs", "rollout_correction", "update", "sync_weights",
           "generation_weights", "streamed_weights", "release_generation_memory", "train_step", "STAGES"]

STAGES = ("rollout", "rewards", "memory_rewards", "advantages", "old_and_ref_log_probs", "update", "sync_weights")


@dataclass
class StepContext:
    """What a step needs. actor: the trained `Actor`; ref_actor: frozen reference (None when
    kl_coef is 0); backend: the generation backend (`mempo.rollout.backends.factory.build_backend`;
    shares or syncs the actor's weights); tools: the agent's tools. Nothing holds an unsharded copy
    of the policy: HF generation gathers the actor for the rollout (`generation_weights`), teacher
    scoring runs on its shards (`memory_rewards`). Nothing here holds the episodes' gold answers: they
    reach only the rewards stage (`compute_score`, after the rollout) and the memory reward's
    teacher scoring, never a generation request."""

    cfg: MempoConfig
    actor: Any
    ref_actor: Optional[Any]
    backend: Any
    tokenizer: Any
    tools: Any  # a `mempo.tools.Toolset` (or `Tool` s, as RolloutEngine takes them)
    sync_bucket_bytes: int = 256 << 20

    @property
    def scoring_model(self):
        """The HF module generation and evaluation run on (the actor's own; under torch.distributed
        use it inside `generation_weights`; teacher scoring runs on the shards, `memory_rewards`)."""
        return self.actor.module


@dataclass
class TrainBatch:
    """Training rows (token-aligned `[N, L]`, made by `build_batch`): ids, attention, loss mask
    (``response_mask``), advantages; ``row_traj``: the trajectory of each row; ``row_round``: its
    round (-1 for full-policy rows); ``rollout_log_probs`` float32 / ``rollout_sampled`` bool: the
    backend's log-prob of each sampled token and which tokens it sampled (None when a trajectory of
    the batch has none: `Trajectory.rollout_logprobs`)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    row_traj: list[int]
    row_round: list[int]
    rollout_log_probs: Optional[torch.Tensor] = None
    rollout_sampled: Optional[torch.Tensor] = None

    def as_dict(self) -> dict[str, torch.Tensor]:
        """The four ``[N, L]`` tensors by name."""
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask,
                "response_mask": self.response_mask, "advantages": self.advantages}


@dataclass
class StepResult:
    """`train_step` output, each value as its stage made it: metrics; the scored trajectories; their
    memory rewards (one list per trajectory, one entry per scored round, None where the definition
    does not score it); the token advantages in
    response coordinates ``[B, Lr]`` (`TokenAdvantages`: advantages, loss mask, ...); the training
    batch (row coordinates, advantages inside)."""

    metrics: dict[str, float]
    trajectories: list[Trajectory]
    memory_rewards: list[list[Optional[float]]]
    token_advantages: TokenAdvantages
    batch: TrainBatch


# ------------------------------------------------------------------------------------------------
# stages
# ------------------------------------------------------------------------------------------------
def rollout(ctx: StepContext, episodes: Sequence[Any], step: int) -> tuple[list[Trajectory], RolloutStats]:
    """G trajectories of every episode (`RolloutEngine`, seeded per step), grouped by episode, without
    outcome, and the engine's `mempo.rollout.loop.RolloutStats` (tool calls and failed tool calls).
    No backend context exceeds the model's ``max_position_embeddings`` (a round that would not fit
    ends its trajectory with ``"token_budget"``)."""
    context = getattr(getattr(ctx.scoring_model, "config", None), "max_position_embeddings", None)
    engine = RolloutEngine(ctx.backend, ctx.tokenizer, ctx.tools, config=ctx.cfg.rollout,
                           seed=training_rollout_seed(ctx.cfg.rollout.seed, step),
                           max_context_tokens=int(context) if context else None)  # as evaluation bounds it
    trajectories = engine.run(list(episodes))
    return trajectories, engine.stats


def rewards(ctx: StepContext, trajectories: Sequence[Trajectory]) -> list[Trajectory]:
    """The scored trajectories: new records with the outcome (`mempo.algo.outcome.score_outcomes`,
    ``rollout.score_mode``, ``rollout.outcome_reward``, the run's tags); the golds (and the examples a
    user's reward reads) reach the reward here, after the rollout."""
    r = ctx.cfg.rollout
    return score_outcomes(trajectories, mode=r.score_mode, reward=r.outcome_reward, tags=protocol_tags(r, ctx.tools))


def reward_metrics(scored: Sequence[Trajectory], stats: RolloutStats) -> dict[str, float]:
    """Means over this rank's scored trajectories, and the step's tool-call counts (a failed call,
    e.g. an unreachable retriever, is an ``<information>Error: ...`` result the policy sees)."""
    n = max(len(scored), 1)
    mean = lambda key, default=0.0: sum(float(t.outcome.get(key, default)) for t in scored) / n  # noqa: E731
    return {
        names.REWARD: mean("score"), names.EM: mean("em"), names.F1: mean("f1"),
        names.FORMAT_RATE: sum(1.0 for t in scored if t.outcome.get("format_ok")) / n,
        "rollout/turns": sum(len(t.rounds) for t in scored) / n,
        "rollout/response_length": sum(len(t.response_ids) for t in scored) / n,
        "rollout/generated_tokens": sum(t.num_generated_tokens for t in scored) / n,
        "rollout/answered_rate": sum(1.0 for t in scored if t.finish_reason == "answer") / n,
        "rollout/tool_calls": float(stats.tool_calls), "rollout/tool_errors": float(stats.tool_errors),
    }


def memory_rewards(ctx: StepContext,
                   trajectories: Sequence[Trajectory]) -> tuple[list[list[Optional[float]]], dict[str, float]]:
    """Teacher scoring of every scored round with the current policy and its memory rewards by the
    ``scoring`` section's definition (`mempo.scoring.compute_memory_rewards`; the paper's
    P(mem_ctx) - P(full_ctx) by default): per trajectory one entry per scored round (None: a round
    the definition does not score); and their means (over the rounds it scores, this rank). Under
    torch.distributed it runs on the actor's shards, every rank in step (`Actor.sharded_inference`):
    no rank holds the whole model for it. Without reference answers (``data.gold_field: null``, every
    trajectory's golds None; the memory weight is then 0) there is nothing to score: every round None."""
    if all(t.golds is None for t in trajectories):
        unscored = [[None] * len(t.scored_rounds()) for t in trajectories]
        return unscored, {names.MEM_REWARD: 0.0, names.P_MEM: 0.0, names.P_FULL: 0.0, "memory/scored_rounds": 0.0,
                          "memory/unscored_rounds": float(sum(len(r) for r in unscored))}
    with ctx.actor.sharded_inference() as (model, lockstep):
        mem_rewards, details = compute_memory_rewards(model, ctx.tokenizer, trajectories, ctx.cfg.scoring,
                                                      lockstep=lockstep)
    rounds = [item for per_trajectory in details for item in per_trajectory if item.reward is not None]
    k = max(len(rounds), 1)
    metrics = {names.MEM_REWARD: sum(item.reward for item in rounds) / k,
               names.P_MEM: sum(item.p_mem for item in rounds) / k,
               names.P_FULL: sum(item.p_cmp for item in rounds) / k,
               "memory/scored_rounds": float(len(rounds)),
               "memory/unscored_rounds": float(sum(len(d) for d in details) - len(rounds))}
    return mem_rewards, metrics


def memory_keeps_metrics(ctx: StepContext, trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Diagnostic, no part of any reward: the share of scored ``<mem>`` blocks that keep every gold
    already retrieved (`Trajectory.memory_keeps`), and how many blocks that is
    (``memory/keeps_blocks``); the share is absent when no ``<mem>`` came after a retrieved gold."""
    keeps = [v for t in trajectories for v in t.memory_keeps(ctx.tokenizer) if v is not None]
    return ({names.MEM_KEEPS: sum(keeps) / len(keeps)} if keeps else {}) | {"memory/keeps_blocks": float(len(keeps))}


def advantages(ctx: StepContext, scored: Sequence[Trajectory],
               mem_rewards: Sequence[Sequence[Optional[float]]]) -> tuple[TokenAdvantages, dict[str, float]]:
    """Token advantages and loss mask in response coordinates ``[B, Lr]`` (`token_advantages` with the
    ``algorithm`` section and its zero-variance policy), and their metrics."""
    a = ctx.cfg.algorithm
    stages = memory_stages(scored, a.memory_pooling, ctx.tokenizer, memory_rewards=mem_rewards)
    result = token_advantages(advantage_inputs(scored, memory_rewards=mem_rewards), epsilon=a.epsilon,
                              norm_adv_by_std=a.norm_adv_by_std, memory_weight=a.memory_weight,
                              skip_zero_variance_groups=a.skip_zero_variance_groups, mem_stages=stages,
                              memory_std_floor=a.memory_std_floor)
    adv, loss_mask = result.advantages, result.loss_mask
    on_mem = adv[result.memory_mask]
    metrics = {"adv/mean": float(adv[loss_mask].mean()) if loss_mask.any() else 0.0,
               "adv/abs_mean_mem": float(on_mem.abs().mean()) if on_mem.numel() else 0.0,
               "adv/groups_with_variance": float(result.has_variance.float().mean()) if len(scored) else 0.0,
               "adv/loss_tokens": float(loss_mask.sum()), "adv/memory_tokens": float(on_mem.numel())}
    return result, metrics


def build_batch(ctx: StepContext, trajectories: Sequence[Trajectory], token_adv: TokenAdvantages) -> TrainBatch:
    """Training rows ``[N, L]`` for ``rollout.context_policy``, right-padded (pad id, attention 0).

    full: one row per trajectory, ``prompt_ids + response_ids``. memory: one row per round
    (`round_training_inputs`: the exact context the round was generated from + its own ids
    ``response_ids[start:end]``). A row's columns after its context C hold response positions
    ``[lo, hi)``; there ``response_mask[i, C + k] = loss_mask[b, lo + k]`` and ``advantages[i, C + k]
    = A[b, lo + k]`` (so each round carries its own memory advantage on its ``<mem>`` span); 0 / False
    elsewhere. input_ids / attention_mask int64, response_mask bool, advantages float32; the
    trajectories' rollout log-probs and sampled positions in the same columns (when all have them).
    """
    adv, loss_mask = token_adv.advantages.cpu(), token_adv.loss_mask.cpu()
    rows: list[tuple[list[int], int, int, int]] = []  # (ids, context length C, response lo, hi)
    row_traj, row_round = [], []
    policy = ctx.cfg.rollout.context_policy
    for b, t in enumerate(trajectories):
        if policy == "full":
            rows.append((t.sequence_ids, len(t.prompt_ids), 0, len(t.response_ids)))
            row_traj.append(b)
            row_round.append(-1)
        else:
            for r, inp in zip(t.rounds, round_training_inputs(t)):
                rows.append((inp.input_ids, inp.context_len, r.start, r.end))
                row_traj.append(b)
                row_round.append(r.index)
    width = max(len(ids) for ids, _, _, _ in rows)
    pad = getattr(ctx.tokenizer, "pad_token_id", None) or 0
    n_rows = len(rows)
    input_ids = torch.full((n_rows, width), int(pad), dtype=torch.long)
    attention = torch.zeros((n_rows, width), dtype=torch.long)
    response_mask = torch.zeros((n_rows, width), dtype=torch.bool)
    advantages_ = torch.zeros((n_rows, width), dtype=torch.float32)
    with_logprobs = all(t.rollout_logprobs is not None for t in trajectories)
    rollout_logp = torch.zeros((n_rows, width), dtype=torch.float32) if with_logprobs else None
    sampled = torch.zeros((n_rows, width), dtype=torch.bool) if with_logprobs else None
    positions = [t.sampled_positions() for t in trajectories] if with_logprobs else []
    for i, (b, (ids, c, lo, hi)) in enumerate(zip(row_traj, rows)):
        k = len(ids)
        input_ids[i, :k] = torch.tensor(ids, dtype=torch.long)
        attention[i, :k] = 1
        response_mask[i, c:k] = loss_mask[b, lo:hi]
        advantages_[i, c:k] = adv[b, lo:hi]
        if with_logprobs:
            rollout_logp[i, c:k] = torch.tensor(trajectories[b].rollout_logprobs[lo:hi], dtype=torch.float32)
            sampled[i, c:k] = torch.tensor(positions[b][lo:hi], dtype=torch.bool)
    return TrainBatch(input_ids, attention, response_mask, advantages_, row_traj, row_round, rollout_logp, sampled)


def old_and_ref_log_probs(ctx: StepContext,
                          batch: TrainBatch) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Current-policy and reference log-probs of the batch's loss tokens (token-aligned fp32). The old
    log-probs are the current policy's (before the update, eval mode), so the first PPO epoch's ratio
    is 1; with one optimiser step per PPO step (``ppo_epochs`` and ``ppo_mini_batches`` both 1) they
    are None: `Actor.update` then takes the ratio against its own detached log-probs, the same ratio
    1 without a forward pass over the batch. The reference is the frozen reference actor (skipped when
    ``actor.kl_coef == 0``)."""
    temperature = ctx.cfg.rollout.temperature
    old = None
    if ctx.cfg.actor.ppo_epochs > 1 or ctx.cfg.actor.ppo_mini_batches > 1:  # later optimiser steps need them
        old = ctx.actor.compute_log_probs(batch.input_ids, batch.attention_mask, response_mask=batch.response_mask,
                                          temperature=temperature).log_probs
    ref = None
    if ctx.ref_actor is not None and ctx.cfg.actor.kl_coef > 0:
        ref = ctx.ref_actor.compute_log_probs(batch.input_ids, batch.attention_mask,
                                              response_mask=batch.response_mask, temperature=temperature).log_probs
    return old, ref


def rollout_is_level(cfg: MempoConfig) -> Optional[str]:
    """The rollout-correction level ``actor.rollout_is`` applies: "token" / "sequence" as given; "auto":
    None where rollout and training are the same computation (``rollout.backend`` "hf" generating
    with the actor's own weights in float32, ``actor.param_dtype`` or else ``model.dtype``), else
    "token" (SGLang, half-precision compute); "off": None."""
    mode = cfg.actor.rollout_is
    if mode == "off":
        return None
    if mode != "auto":
        return mode
    same = cfg.rollout.backend == "hf" and (cfg.actor.param_dtype or cfg.model.dtype) == "float32"
    return None if same else "token"


def check_rollout_logprobs(cfg: MempoConfig, backend: Any) -> None:
    """ConfigError naming ``actor.rollout_is`` when it applies weights (`rollout_is_level`) and the
    backend gives no log-probs (``returns_logprobs``)."""
    if rollout_is_level(cfg) is not None and not getattr(backend, "returns_logprobs", False):
        raise ConfigError("actor.rollout_is", f"{cfg.actor.rollout_is!r} corrects for the rollout policy with the "
                                              f"sampled ids' log-probs, which the {type(backend).__name__} backend "
                                              "does not give; set actor.rollout_is: off to train without it")


def rollout_correction(ctx: StepContext, batch: TrainBatch) -> Optional[RolloutCorrection]:
    """The batch's `RolloutCorrection` for the update: its rollout log-probs at `rollout_is_level`
    (None: the weights are computed for the metrics only); None with ``actor.rollout_is: off`` or no
    log-probs from the backend. ConfigError naming ``actor.rollout_is`` when the level needs them and
    the backend gave none for a round."""
    level = rollout_is_level(ctx.cfg)
    if ctx.cfg.actor.rollout_is == "off":
        return None
    if batch.rollout_log_probs is None:
        if level is not None:
            raise ConfigError("actor.rollout_is", f"{ctx.cfg.actor.rollout_is!r} needs the sampled ids' log-probs, "
                                                  "but the backend returned none for a generated round; set "
                                                  "actor.rollout_is: off to train without rollout correction")
        return None
    return RolloutCorrection(batch.rollout_log_probs, batch.rollout_sampled, level, ctx.cfg.actor.rollout_is_cap)


def update(ctx: StepContext, batch: TrainBatch, old: Optional[torch.Tensor],
           ref: Optional[torch.Tensor]) -> dict[str, float]:
    """PPO-clip + KL update (`Actor.update`) on the batch with its own advantages and its rollout
    correction (`rollout_correction`); returns its metrics under ``actor/``."""
    if not batch.response_mask.any():
        return {"actor/skipped_empty": 1.0}
    metrics = ctx.actor.update(batch.as_dict(), batch.advantages, old_log_probs=old, ref_log_probs=ref,
                               temperature=ctx.cfg.rollout.temperature, rollout=rollout_correction(ctx, batch))
    return {f"{names.ACTOR_PREFIX}{k}": float(v) for k, v in metrics.items()}


@contextlib.contextmanager
def generation_weights(ctx: StepContext) -> Iterator[None]:
    """The block in which the actor's module holds whole weights on every rank (`Actor.unsharded`,
    collective) under torch.distributed; a no-op in one process."""
    with ctx.actor.unsharded():
        yield


def streamed_weights(module: torch.nn.Module, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The module's whole weights as consecutive buckets ``[(name, full tensor)]`` of at most
    `bucket_bytes` (a larger tensor alone), names of ``module.state_dict()`` in its order; each
    sharded tensor is gathered when its bucket is built (collective: every rank iterates to the
    end), so at most one bucket plus the tensor being gathered is held. Tensors keep their dtype
    and device."""
    state = module.state_dict()
    sizes = {name: tensor.numel() * tensor.element_size() for name, tensor in state.items()}  # global sizes
    for bucket in plan_buckets(sizes, bucket_bytes):
        yield [(name, _whole(state[name]).detach()) for name in bucket]


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a shard (a DTensor, gathered: collective), else the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def sync_weights(ctx: StepContext) -> None:
    """Make generation use the updated weights: nothing to copy when the backend generates with the
    actor's own module (HF; under torch.distributed it is gathered for each rollout); otherwise the
    weights are streamed to the backend as one lazy ``(name, tensor)`` iterable gathered in buckets
    of ``ctx.sync_bucket_bytes`` (`streamed_weights`, collective), never the whole state at once
    (an SGLang server backend writes it on rank 0 one safetensors file at a time)."""
    if getattr(ctx.backend, "model", None) is ctx.actor.module:
        ctx.backend.sync_weights(None)
        return
    stream = (item for bucket in streamed_weights(ctx.actor.module, ctx.sync_bucket_bytes) for item in bucket)
    ctx.backend.sync_weights(stream)  # SGLang in-process: its own buckets, read lazily from this stream
    for _ in stream:  # the gathers are collective: a rank whose backend read nothing (a server's
        pass          # rank > 0) still takes part in every one


def release_generation_memory(ctx: StepContext) -> None:
    """Let a colocated engine free its GPU memory while the trainer's stages run (SGLang in-process:
    `SGLangBackend.release_memory`; `sync_weights` loads the new weights back at the end of the
    step); a no-op for backends without the hook."""
    release = getattr(ctx.backend, "release_memory", None)
    if callable(release):
        release()


# ------------------------------------------------------------------------------------------------
def train_step(ctx: StepContext, episodes: Sequence[Any], step: int, timer: Optional[StageTimer] = None) -> StepResult:
    """Run the stages in order on this rank's `episodes`; each value is made once and passed on."""
    timer = timer or StageTimer()
    timer.reset()
    began = time.perf_counter()
    metrics: dict[str, float] = {}
    with generation_weights(ctx):  # whole weights for generation only, freed after
        with timer("rollout"):
            trajectories, stats = rollout(ctx, episodes, step)
            release_generation_memory(ctx)
    with timer("rewards"):
        scored = rewards(ctx, trajectories)
        metrics.update(reward_metrics(scored, stats))
    with timer("memory_rewards"):
        mem_rewards, mem_metrics = memory_rewards(ctx, scored)
        metrics.update(mem_metrics)
        metrics.update(memory_keeps_metrics(ctx, scored))
    with timer("advantages"):
        token_adv, adv_metrics = advantages(ctx, scored, mem_rewards)
        metrics.update(adv_metrics)
        batch = build_batch(ctx, scored, token_adv)
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
    weights = {"trajectories": len(scored), "scored_rounds": metrics["memory/scored_rounds"],
               "memory_blocks": metrics["memory/keeps_blocks"], "loss_tokens": metrics["adv/loss_tokens"],
               "memory_tokens": metrics["adv/memory_tokens"]}
    metrics = reduce_run_metrics(metrics, weights)  # the run's values under torch.distributed (collective)
    return StepResult(metrics, scored, mem_rewards, token_adv, batch)
