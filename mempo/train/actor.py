"""The policy actor: a Hugging Face causal LM, FSDP2-sharded when torch.distributed is initialised,
with chunked response log-probs and a micro-batched PPO-clip + KL update.

Batch layout: one row per trajectory, full sequences (prompt + response) ``[B, L]``: ``input_ids``
int64, ``attention_mask`` (1 = real token, left or right padding), optional ``position_ids``
(default ``cumsum(attention_mask) - 1`` clamped at 0) and ``response_mask`` (bool / 0-1: the
model-generated tokens that carry loss). Every float ``[B, L]`` tensor (log-probs, entropies,
advantages, old / ref log-probs) is fp32 and aligned with the token it scores:
``log_probs[b, t] = log softmax(logits(ids[b, :t]) / temperature)[ids[b, t]]``, 0.0 off the mask.

Supported models: causal LMs whose output is ``lm_head(decoder(...).last_hidden_state)`` with
`get_decoder()` / `get_output_embeddings()` (Qwen2, Qwen3, Llama, Mistral families), run through
`mempo.model.adapter.PolicyLogProbs`; models with logit soft-capping or scaling are not supported.
"""
from __future__ import annotations

import contextlib
import gc
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from mempo.config import ActorConfig, ConfigError
from mempo.model.adapter import DTYPES, PolicyLogProbs, attn_implementation, resolve_packing
from mempo.train.checkpoint import load_model_state, load_optimizer_state, model_state_dict, optimizer_state_dict
from mempo.train.losses import agg_loss, kl_penalty, policy_loss, rollout_is_weights

__all__ = ["Actor", "DistInfo", "LogProbs", "RolloutCorrection", "init_distributed", "shutdown_distributed",
           "plan_micro_batches"]


# ------------------------------------------------------------------------------------------------
# process group
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DistInfo:
    """This process's place: rank, world size, local rank, compute device, and whether a process
    group is active."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    distributed: bool


def _default_device(local_rank: int) -> torch.device:
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def init_distributed(backend: Optional[str] = None) -> DistInfo:
    """Initialise torch.distributed from torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK,
    MASTER_ADDR, MASTER_PORT); a no-op without it; idempotent.

    backend: None picks "cpu:gloo,cuda:nccl" when CUDA is available (CUDA tensors over nccl; the
    CPU tensors of metrics, checkpoint flags and object collectives over gloo: nccl alone refuses
    them, "No backend type associated with device type cpu", the first GPU run), else "gloo".
    Sets the CUDA device to LOCAL_RANK. Returns the DistInfo; with no torchrun variables: rank 0
    of 1, not distributed.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if dist.is_available() and dist.is_initialized():
        return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, _default_device(local_rank), True)
    if "WORLD_SIZE" not in os.environ or "RANK" not in os.environ:
        return DistInfo(0, 1, 0, _default_device(0), False)
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    backend = backend or ("cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo")
    dist.init_process_group(backend=backend)
    return DistInfo(dist.get_rank(), dist.get_world_size(), local_rank, _default_device(local_rank), True)


def shutdown_distributed() -> None:
    """Destroy the default process group if one is active, after a barrier: a rank that tears its
    gloo connections down while a peer still uses them makes the peer abort.

    Drop every reference to FSDP2-sharded modules (actors, their optimisers, results holding the
    model) before calling it: it collects garbage first, so their collective state is released
    while the process group still exists. A sharded module still alive when the group is destroyed
    makes the process abort at exit now and then ("terminate called without an active exception",
    3 of 30 two-rank gloo runs under load; 0 of 30 once released first)."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(tensor: torch.Tensor, op=None) -> torch.Tensor:
    if _distributed():
        dist.all_reduce(tensor, op=op or dist.ReduceOp.SUM)
    return tensor


# ------------------------------------------------------------------------------------------------
# log-probs
# ------------------------------------------------------------------------------------------------
class LogProbs(NamedTuple):
    """`compute_log_probs` result: fp32 `[B, L]` log-probs (token-aligned, 0 off the mask) and
    entropy of the predictive distribution at the same positions (None unless requested)."""

    log_probs: torch.Tensor
    entropy: Optional[torch.Tensor]


class RolloutCorrection(NamedTuple):
    """What `Actor.update` needs to correct for the policy that sampled the batch
    (`mempo.train.losses.rollout_is_weights`): log_probs fp32 `[B, L]` the sampling policy's
    log-prob of each token (token-aligned like the batch); known bool `[B, L]` the tokens it sampled
    (not forced-prefix ids); level "token", "sequence", or None (weights computed for the metrics
    only: rollout and training are the same computation); cap: the truncation."""

    log_probs: torch.Tensor
    known: torch.Tensor
    level: Optional[str]
    cap: float


# ------------------------------------------------------------------------------------------------
# batch preparation
# ------------------------------------------------------------------------------------------------
class _Batch(NamedTuple):
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    first: torch.Tensor  # first real token per row
    last: torch.Tensor   # last real token per row


def _prepare_batch(input_ids, attention_mask, position_ids, loss_mask, device) -> _Batch:
    """The checked batch on `device`; ValueError unless the loss mask marks only real tokens and never
    a row's first real token (it has no context to be scored from)."""
    if input_ids.dim() != 2 or input_ids.shape[0] == 0 or input_ids.shape[1] == 0:
        raise ValueError(f"input_ids must be a non-empty [B, L] tensor, got shape {tuple(input_ids.shape)}")
    attention = (torch.ones_like(input_ids) if attention_mask is None else attention_mask).to(device).bool()
    if attention.shape != input_ids.shape:
        raise ValueError(f"attention_mask must have shape {tuple(input_ids.shape)}, got {tuple(attention.shape)}")
    if not attention.any(dim=-1).all():
        raise ValueError("every row needs at least one real token (attention_mask all 0 in a row)")
    if position_ids is None:
        position_ids = (attention.long().cumsum(-1) - 1).clamp(min=0)
    positions = torch.arange(input_ids.shape[1], device=device).expand_as(attention)
    first = torch.where(attention, positions, input_ids.shape[1]).min(dim=-1).values
    last = torch.where(attention, positions, -1).max(dim=-1).values
    mask = attention.clone() if loss_mask is None else loss_mask.to(device).bool()
    if loss_mask is None:
        mask[torch.arange(mask.shape[0], device=device), first] = False
    if mask.shape != input_ids.shape:
        raise ValueError(f"response_mask must have shape {tuple(input_ids.shape)}, got {tuple(mask.shape)}")
    if (mask & ~attention).any():
        raise ValueError("response_mask marks padding (attention_mask 0) tokens")
    if mask.gather(1, first.unsqueeze(1)).any():
        raise ValueError("response_mask marks a row's first real token, which has no context to be scored from")
    return _Batch(input_ids.to(device), attention, position_ids.to(device), mask, first, last)


def plan_micro_batches(first: list[int], last: list[int], token_budget: Optional[int],
                       packed: bool = False) -> list[list[int]]:
    """Group consecutive rows into micro-batches of at most `token_budget` tokens.

    first / last: each row's first and last real-token column. A micro-batch of rows R costs
    ``len(R) * (max(last) - min(first) + 1)`` padded tokens, or with `packed` its rows' tokens
    ``sum(last - first + 1)`` (no padding is computed); a row that alone exceeds the budget runs
    alone. token_budget None: one micro-batch. Returns lists of row positions (indices into the inputs).
    """
    if token_budget is None:
        return [list(range(len(first)))] if first else []
    plans, current, low, high, tokens = [], [], 0, 0, 0
    for row, (a, b) in enumerate(zip(first, last)):
        new_low, new_high = (min(low, a), max(high, b)) if current else (a, b)
        new_tokens = tokens + b - a + 1
        cost = new_tokens if packed else (len(current) + 1) * (new_high - new_low + 1)
        if current and cost > token_budget:
            plans.append(current)
            current, new_low, new_high, new_tokens = [], a, b, b - a + 1
        current.append(row)
        low, high, tokens = new_low, new_high, new_tokens
    if current:
        plans.append(current)
    return plans


def _slice_rows(batch: _Batch, rows: torch.Tensor, *tensors: Optional[torch.Tensor]):
    """Rows of the batch (and of extra `[B, L]` tensors), columns cut to the rows' real tokens."""
    low, high = int(batch.first[rows].min()), int(batch.last[rows].max()) + 1
    part = _Batch(batch.input_ids[rows, low:high], batch.attention_mask[rows, low:high],
                  batch.position_ids[rows, low:high], batch.loss_mask[rows, low:high],
                  batch.first[rows] - low, batch.last[rows] - low)
    extras = [None if t is None else t[rows, low:high] for t in tensors]
    return part, extras, (low, high)


def _enable_activation_checkpointing(model: nn.Module) -> None:
    """transformers' per-decoder-layer activation checkpointing (non-reentrant), by its 5.x name when
    present, else the 4.x one."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


# ------------------------------------------------------------------------------------------------
# the actor
# ------------------------------------------------------------------------------------------------

def _flash_attn_kernels(implementation: Any) -> bool:
    """Whether `implementation` (an attn_implementation name) runs flash-attn's own kernels."""
    name = str(implementation or "")
    return name.startswith("flash_attention") or "flash-attn" in name or "flash_attn" in name

class Actor:
    """A trainable (or frozen reference) policy around a Hugging Face causal LM.

    Only masked tokens are scored: the lm_head runs ``logprob_chunk_tokens`` rows at a time under
    activation checkpointing (each chunk's ``[rows, V]`` fp32 logits are recomputed in backward), so
    no ``[B, L, V]`` tensor is materialised. Packing (``ActorConfig.packing``,
    `mempo.model.adapter.resolve_packing`; "auto" packs only under flash attention): a micro-batch
    runs padded (``[rows, T]`` + padding mask) or packed (the rows' real tokens as one ``[1, N]``
    sequence); the log-probs are scattered back to ``[rows, T]``, so both modes give the same numbers.

    model: the causal LM (moved to the device; sharded in place when distributed). optim_config:
    `ActorConfig` (optimiser, loss, micro-batching). device_mesh: a 1-D mesh for FSDP2 (None: all
    ranks). trainable: False builds no optimiser and freezes the parameters (a reference policy).
    device: default CUDA LOCAL_RANK when available, else CPU. broadcast_from_rank0 (under
    torch.distributed): only rank 0's `model` holds weights, the others may be built on the meta
    device (`mempo.model.loading.build_causal_lm(on_meta=True)`); every rank shards a meta module,
    and its shards are filled from rank 0's host copy one tensor at a time, so start-up holds one
    whole model (rank 0's, on the host) instead of one per rank and device.
    """

    def __init__(self, model: nn.Module, optim_config: Optional[ActorConfig] = None, device_mesh=None, *,
                 trainable: bool = True, device: Optional[torch.device] = None, broadcast_from_rank0: bool = False):
        self.config = optim_config or ActorConfig()
        self.device = torch.device(device) if device is not None else _default_device(
            int(os.environ.get("LOCAL_RANK", "0")))
        receive = broadcast_from_rank0 and _distributed()
        full = None
        if receive:  # rank 0's weights stay on the host (kept alive here until sent); every module goes meta
            if dist.get_rank() == 0:  # the buffers too: the rotary inv_freq is in no state dict
                full = (model.state_dict(), {name: buffer for name, buffer in model.named_buffers()})
            self.module = model.to("meta")
        elif any(p.is_meta for p in model.parameters()):
            raise ValueError("a model on the meta device needs broadcast_from_rank0=True under torch.distributed "
                             "(rank 0 holds the weights)")
        else:
            self.module = model.to(self.device)
        if self.config.gradient_checkpointing and trainable:
            _enable_activation_checkpointing(self.module)
        if not trainable:
            self.module.requires_grad_(False)
        self.policy = PolicyLogProbs(self.module)
        self.attn_implementation = attn_implementation(self.module)
        self.packed = resolve_packing(self.config.packing, self.attn_implementation)
        self.distributed = _distributed()
        # flash-attn's kernels (flash_attention_2 / _3, the hub's flash-attn) have no fp32 path; an
        # attention function registered under another "flash" name (tests: a varlen reference) may
        if (not self.distributed and _flash_attn_kernels(self.attn_implementation)
                and any(p.dtype == torch.float32 for p in self.module.parameters())):
            raise ConfigError("actor.param_dtype", "mixed precision (fp32 weights, half-precision compute) is FSDP2's, "
                                                   "under torchrun only; one process computes in model.dtype=float32, "
                                                   "which flash attention refuses: set model.dtype=bfloat16 or use "
                                                   "model.attn_implementation=sdpa")
        self._root_ready = False  # FSDP2's root is the first sharded module to run forward (`unsharded`)
        self.rank = dist.get_rank() if self.distributed else 0
        self.world_size = dist.get_world_size() if self.distributed else 1
        if self.distributed:
            self._shard(device_mesh)
            if receive:
                self._receive_weights(full)
                del full
        self.optimizer = None
        if trainable:
            params = [p for p in self.module.parameters() if p.requires_grad]
            self.optimizer = torch.optim.AdamW(params, lr=self.config.lr, betas=(self.config.beta1, self.config.beta2),
                                               eps=self.config.eps, weight_decay=self.config.weight_decay)

    def _shard(self, device_mesh) -> None:
        """``fully_shard`` every decoder layer (the model's ``_no_split_modules`` classes), then the
        small root wrapper holding the model, on a 1-D data-parallel mesh."""
        mesh = device_mesh or init_device_mesh(self.device.type, (self.world_size,), mesh_dim_names=("dp",))
        kwargs: dict[str, Any] = {"mesh": mesh}
        if self.config.param_dtype is not None:
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=DTYPES[self.config.param_dtype],
                                                       reduce_dtype=torch.float32)
        layer_classes = set(getattr(self.module, "_no_split_modules", None) or ())
        layers = [m for m in self.module.modules() if type(m).__name__ in layer_classes]
        if not layers:
            raise ValueError(f"{type(self.module).__name__}: no decoder layers found to shard "
                             f"(_no_split_modules={sorted(layer_classes)})")
        for layer in layers:
            fully_shard(layer, **kwargs)
        fully_shard(self.policy, **kwargs)

    def _receive_weights(self, full: Optional[tuple[dict, dict]]) -> None:
        """Give the sharded meta module storage for its shards on the device, then fill them from
        rank 0's whole weights (`full` on rank 0: its state dict and buffers; None elsewhere) one
        tensor at a time, then every buffer (e.g. the rotary ``inv_freq``, in no state dict) likewise."""
        self.module.to_empty(device=self.device)
        set_model_state_dict(self.module, full[0] if full else {},
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        with torch.no_grad():
            for name, buffer in sorted(self.module.named_buffers()):
                if full:
                    buffer.copy_(full[1][name])
                dist.broadcast(buffer, src=0)
        tied = getattr(getattr(self.module, "config", None), "tie_word_embeddings", False)
        if tied and self.module.get_output_embeddings().weight is not self.module.get_input_embeddings().weight:
            raise RuntimeError("the tied input and output embeddings came apart while loading the shards")

    @contextlib.contextmanager
    def unsharded(self) -> Iterator[nn.Module]:
        """Hold the whole model on every rank for the block and yield the Hugging Face module: HF
        generation and evaluation may then run any number of forwards per rank
        (FSDP2's per-forward all-gathers need every rank to call forward alike; gathered once here,
        they are skipped). Collective: every rank must enter, e.g. with no questions of its own.

        Memory: the full parameters in the all-gather dtype (``actor.param_dtype``, e.g. bf16: one
        copy in the compute dtype) on top of the fp32 shards, for the block only; they are freed
        (resharded) when it ends, before the update's activations. Not distributed: a no-op."""
        if not self.distributed:
            yield self.module
            return
        self._ensure_root()
        units = [m for m in self.policy.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False)
            unit.unshard()
        try:
            yield self.module
        finally:
            for unit in units:
                unit.reshard()
                unit.set_reshard_after_forward(unit is not self.policy)  # `_shard`'s layout: the root stays gathered

    @contextlib.contextmanager
    def sharded_inference(self) -> Iterator[tuple[nn.Module, Optional[Callable[[bool], bool]]]]:
        """Forwards of the Hugging Face module on the shards (teacher scoring): yields ``(module,
        lockstep)``. The root's own parameters (embeddings, final norm, output head) are gathered
        for the block; each decoder layer gathers its weights in its forward and frees them after
        (FSDP2's per-forward all-gather), so beside the shards at most the root and one layer are
        whole. Those gathers are collective: every rank must run the same number of forwards, which
        ``lockstep`` (`Actor.lockstep`, a `mempo.scoring.ForwardSync`) arranges. Collective: every
        rank must enter. Not distributed: ``(module, None)``."""
        if not self.distributed:
            yield self.module, None
            return
        self._ensure_root()
        self.policy.unshard()
        try:
            yield self.module, self.lockstep
        finally:
            self.policy.reshard()

    def lockstep(self, has_forward: bool) -> bool:
        """Whether any rank has a forward to run now (all-reduce MAX of `has_forward`; collective):
        `mempo.scoring.ForwardSync` over the ranks."""
        flag = torch.tensor([int(has_forward)], device=self.device)
        _all_reduce(flag, dist.ReduceOp.MAX)
        return bool(flag.item())

    def _ensure_root(self) -> None:
        if not self._root_ready:  # make `self.policy` FSDP's root before a layer runs alone
            self.compute_log_probs(torch.zeros(1, 2, dtype=torch.long), micro_batch_tokens=None)
            self._root_ready = True

    # --------------------------------------------------------------------------------------------
    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every parameter group (for schedules)."""
        for group in self.optimizer.param_groups:
            group["lr"] = float(lr)

    def _forward(self, part: _Batch, temperature: float, with_entropy: bool, packed: bool):
        return self.policy(part.input_ids, part.attention_mask, part.position_ids, part.loss_mask, float(temperature),
                           int(self.config.logprob_chunk_tokens), with_entropy, packed)

    def _synced_plans(self, batch: _Batch, rows: torch.Tensor, token_budget: Optional[int],
                      packed: bool) -> tuple[list, int]:
        # Every rank runs the same number of forwards (FSDP's collectives require it): `count` is the
        # most plans of any rank; a rank with fewer runs zero-weighted extra forwards.
        plans = plan_micro_batches(batch.first[rows].tolist(), batch.last[rows].tolist(), token_budget, packed)
        count = torch.tensor([len(plans)], device=self.device)
        _all_reduce(count, dist.ReduceOp.MAX if self.distributed else None)
        return [rows[plan] for plan in plans], int(count.item())

    @torch.no_grad()
    def compute_log_probs(self, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                          position_ids: Optional[torch.Tensor] = None, response_mask: Optional[torch.Tensor] = None,
                          temperature: float = 1.0, with_entropy: bool = False,
                          micro_batch_tokens: Optional[int] = -1) -> LogProbs:
        """Token-aligned log-probs (and optionally entropies) of this rank's rows, fp32 `[B, L]`.

        response_mask None: every real token except each row's first. micro_batch_tokens: -1 uses
        the config's value, None one forward. Runs the model in eval mode. Collective when
        distributed. Results are on the device of `input_ids`.
        """
        budget = self.config.micro_batch_tokens if micro_batch_tokens == -1 else micro_batch_tokens
        batch = _prepare_batch(input_ids, attention_mask, position_ids, response_mask, self.device)
        log_probs = torch.zeros(batch.input_ids.shape, dtype=torch.float32, device=self.device)
        entropy = torch.zeros_like(log_probs) if with_entropy else None
        plans, count = self._synced_plans(batch, torch.arange(batch.input_ids.shape[0], device=self.device), budget,
                                          self.packed)
        self.module.eval()
        for index in range(count):
            rows = plans[index] if index < len(plans) else plans[0][:1]
            part, _, (low, high) = _slice_rows(batch, rows)
            part_logp, part_entropy = self._forward(part, temperature, with_entropy, self.packed)
            if index < len(plans):
                log_probs[rows, low:high] = part_logp
                if with_entropy:
                    entropy[rows, low:high] = part_entropy
        out_device = input_ids.device
        return LogProbs(log_probs.to(out_device), None if entropy is None else entropy.to(out_device))

    # --------------------------------------------------------------------------------------------
    def update(self, batch: Mapping[str, torch.Tensor], advantages: torch.Tensor,
               old_log_probs: Optional[torch.Tensor] = None, ref_log_probs: Optional[torch.Tensor] = None,
               config: Optional[ActorConfig] = None, temperature: float = 1.0,
               rollout: Optional[RolloutCorrection] = None) -> dict[str, float]:
        """PPO-clip + KL update on this rank's rows; returns metrics averaged over
        the optimiser steps: ``loss``, ``pg_loss``, ``kl_loss``, ``entropy``, ``pg_clipfrac``,
        ``pg_clipfrac_lower``, ``ppo_kl``, ``ratio_mean/max/min``, ``grad_norm``, ``lr``,
        ``num_tokens``, ``optimizer_steps``, ``skipped_steps`` (global over ranks).

        batch: ``input_ids``, ``attention_mask``, optional ``position_ids``, ``response_mask``
        (`[B, L]`). advantages / old_log_probs / ref_log_probs: fp32 `[B, L]`, token-aligned.
        config: loss settings for this call (default: the actor's; the learning rate is set with
        `set_lr`). temperature: the sampling temperature the rollout used.

        ``ppo_epochs`` passes; each splits the rows into ``ppo_mini_batches`` contiguous
        mini-batches, one optimiser step each, accumulated over micro-batches of at most
        ``micro_batch_tokens`` tokens (padded: rows x padded length; packed: real tokens). Loss per
        mini-batch: ``policy_loss + kl_coef * agg(kl) - entropy_coef * agg(entropy)``
        (`mempo.train.losses`, one aggregation mode for all three). Gradients are clipped to
        ``grad_clip`` (global norm); a non-finite norm skips the step (``skipped_steps``).
        ``old_log_probs=None`` is on-policy: the ratio is taken against the detached current
        log-probs (ratio 1 in every epoch; pass the rollout policy's log-probs for multi-epoch or
        multi-mini-batch PPO). ``kl_coef > 0`` needs ``ref_log_probs``. Train mode; PPO ratios
        assume dropout 0 (true for Qwen2/Llama configs).

        rollout: the sampling policy's log-probs (`RolloutCorrection`); each token's policy loss is
        then multiplied by its truncated importance weight against the old log-probs (the level's;
        none with level None) and the metrics add ``rollout_is_mean`` / ``rollout_is_max`` (weights
        over the sampled loss tokens), ``rollout_is_clipped_frac`` (share truncated at the cap),
        ``rollout_kl`` (mean rollout - old log-prob: KL(pi_rollout || pi_train)), ``rollout_is_tokens``
        and ``rollout_is_applied`` (1.0 when the weights entered the loss).
        """
        if self.optimizer is None:
            raise RuntimeError("this Actor was built with trainable=False")
        cfg = config or self.config
        packed = resolve_packing(cfg.packing, self.attn_implementation)
        if cfg.kl_coef > 0 and ref_log_probs is None:
            raise ValueError("kl_coef > 0 needs ref_log_probs (or set kl_coef to 0)")
        data = _prepare_batch(batch["input_ids"], batch.get("attention_mask"), batch.get("position_ids"),
                              batch["response_mask"], self.device)
        targets = {"advantages": advantages, "old_log_probs": old_log_probs, "ref_log_probs": ref_log_probs,
                   "rollout_log_probs": None if rollout is None else rollout.log_probs,
                   "rollout_known": None if rollout is None else rollout.known}
        for name, tensor in targets.items():
            if tensor is not None and tensor.shape != data.input_ids.shape:
                raise ValueError(f"{name} must have shape {tuple(data.input_ids.shape)}, got {tuple(tensor.shape)}")
        targets = {k: None if v is None else v.to(self.device, torch.bool if k == "rollout_known" else torch.float32)
                   for k, v in targets.items()}
        correction = None if rollout is None else (rollout.level, float(rollout.cap))
        num_rows = data.input_ids.shape[0]
        if num_rows < cfg.ppo_mini_batches:  # every rank must pass at least ppo_mini_batches rows
            raise ValueError(f"{num_rows} rows cannot be split into ppo_mini_batches={cfg.ppo_mini_batches}")
        self.module.train()
        step_metrics = []
        for _ in range(cfg.ppo_epochs):
            for rows in torch.arange(num_rows, device=self.device).tensor_split(cfg.ppo_mini_batches):
                step_metrics.append(self._train_mini_batch(data, rows, targets, cfg, temperature, packed, correction))
        return {name: sum(m[name] for m in step_metrics) / len(step_metrics) for name in step_metrics[0]} | {
            "optimizer_steps": float(sum(1 - m["skipped_steps"] for m in step_metrics)),
            "skipped_steps": float(sum(m["skipped_steps"] for m in step_metrics))}

    def _global_normalisers(self, loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Loss tokens and non-empty rows summed over ranks; padded length L, max over ranks."""
        counts = torch.stack([loss_mask.sum(), loss_mask.any(dim=-1).sum()]).to(torch.float64)
        _all_reduce(counts)
        length = torch.tensor([loss_mask.shape[1]], device=loss_mask.device)
        _all_reduce(length, dist.ReduceOp.MAX if self.distributed else None)
        return counts[0], counts[1], int(length.item())

    def _micro_loss(self, part: _Batch, extras, cfg: ActorConfig, temperature: float, norms, packed: bool,
                    correction: Optional[tuple[Optional[str], float]]):
        advantages, old, ref, rollout_logp, rollout_known = extras
        log_probs, entropy = self._forward(part, temperature, with_entropy=True, packed=packed)
        if cfg.entropy_coef == 0:
            entropy = entropy.detach()
        old = log_probs.detach() if old is None else old
        is_weights, is_stats = None, None
        if correction is not None:  # pi_train / pi_rollout against the policy before the update
            is_weights, is_stats = rollout_is_weights(old, rollout_logp, rollout_known, part.loss_mask, *correction)
        pg_loss, metrics = policy_loss(log_probs, old, advantages, part.loss_mask, cfg.clip_ratio_low,
                                       cfg.clip_ratio_high, cfg.clip_ratio_c, cfg.loss_agg_mode, **norms,
                                       is_weights=is_weights)
        loss = pg_loss
        kl_loss = torch.zeros((), device=self.device)
        if cfg.kl_coef > 0:
            kl_per_token = kl_penalty(log_probs, ref, cfg.kl_estimator)
            kl_loss = agg_loss(kl_per_token, part.loss_mask, cfg.loss_agg_mode, **norms)
            loss = loss + cfg.kl_coef * kl_loss
        if cfg.entropy_coef > 0:
            loss = loss - cfg.entropy_coef * agg_loss(entropy, part.loss_mask, cfg.loss_agg_mode, **norms)
        entropy_sum = torch.where(part.loss_mask, entropy.detach(), 0.0).sum()
        return loss, pg_loss.detach(), kl_loss.detach(), entropy_sum, metrics, is_stats

    def _train_mini_batch(self, data: _Batch, rows: torch.Tensor, targets: dict, cfg: ActorConfig,
                          temperature: float, packed: bool,
                          correction: Optional[tuple[Optional[str], float]] = None) -> dict[str, float]:
        num_tokens, num_sequences, padded_length = self._global_normalisers(data.loss_mask[rows])
        norms = {"num_tokens": num_tokens, "num_sequences": num_sequences,
                 "norm_length": cfg.loss_norm_length or padded_length}
        plans, count = self._synced_plans(data, rows, cfg.micro_batch_tokens, packed)
        # loss, pg_loss, kl_loss, entropy sum, then token-weighted clipfrac, clipfrac_lower, ppo_kl, ratio_mean,
        # then the rollout correction's weight sum, clipped tokens, rollout - old sum, sampled loss tokens
        sums = torch.zeros(12, dtype=torch.float64, device=self.device)
        ratio_max = torch.full((), -math.inf, dtype=torch.float64, device=self.device)
        ratio_min = torch.full((), math.inf, dtype=torch.float64, device=self.device)
        is_max = torch.full((), -math.inf, dtype=torch.float64, device=self.device)
        self.optimizer.zero_grad(set_to_none=True)
        for index in range(count):
            real = index < len(plans)
            part, extras, _ = _slice_rows(data, plans[index] if real else rows[:1], targets["advantages"],
                                          targets["old_log_probs"], targets["ref_log_probs"],
                                          targets["rollout_log_probs"], targets["rollout_known"])
            loss, pg_loss, kl_loss, entropy_sum, metrics, is_stats = self._micro_loss(
                part, extras, cfg, temperature, norms, packed, correction)
            # The normalisers are global (all-reduced), so the ranks' losses sum to the loss of the
            # whole batch; times world_size undoes FSDP's gradient averaging (N ranks = one process).
            (loss * (self.world_size if real else 0.0)).backward()
            if real:
                n = metrics["num_tokens"].double()
                sums[:8] += torch.stack([v.double() for v in (
                    loss.detach(), pg_loss, kl_loss, entropy_sum, metrics["pg_clipfrac"] * n,
                    metrics["pg_clipfrac_lower"] * n, metrics["ppo_kl"] * n, metrics["ratio_mean"] * n)])
                if n > 0:
                    ratio_max = torch.maximum(ratio_max, metrics["ratio_max"].double())
                    ratio_min = torch.minimum(ratio_min, metrics["ratio_min"].double())
                if is_stats is not None:
                    sums[8:] += torch.stack([is_stats[k].double()
                                             for k in ("weight_sum", "clipped", "kl_sum", "count")])
                    if is_stats["count"] > 0:
                        is_max = torch.maximum(is_max, is_stats["weight_max"].double())
        grad_norm, skipped = self._clip_and_step(cfg)
        metrics = self._reduce_metrics(sums, ratio_max, ratio_min, num_tokens, grad_norm, skipped, is_max)
        if correction is None:
            return {k: v for k, v in metrics.items() if not k.startswith("rollout_")}
        return metrics | {"rollout_is_applied": float(correction[0] is not None)}

    def _clip_and_step(self, cfg: ActorConfig) -> tuple[float, int]:
        params = [p for p in self.module.parameters() if p.requires_grad]
        max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, error_if_nonfinite=False)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        norm = float(norm)
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return norm, 1
        self.optimizer.step()
        return norm, 0

    def _reduce_metrics(self, sums, ratio_max, ratio_min, num_tokens, grad_norm, skipped, is_max) -> dict[str, float]:
        _all_reduce(sums)
        extremes = torch.stack([ratio_max, -ratio_min, is_max])
        _all_reduce(extremes, dist.ReduceOp.MAX if self.distributed else None)
        tokens, sampled = float(num_tokens), float(sums[11])

        def per_token(value) -> float:
            return float(value) / tokens if tokens > 0 else 0.0

        def per_sampled(value, empty: float = 0.0) -> float:
            return float(value) / sampled if sampled > 0 else empty

        has_tokens = tokens > 0 and math.isfinite(float(extremes[0]))
        return {
            "loss": float(sums[0]), "pg_loss": float(sums[1]), "kl_loss": float(sums[2]),
            "entropy": per_token(sums[3]), "pg_clipfrac": per_token(sums[4]), "pg_clipfrac_lower": per_token(sums[5]),
            "ppo_kl": per_token(sums[6]), "ratio_mean": per_token(sums[7]) if tokens > 0 else 1.0,
            "ratio_max": float(extremes[0]) if has_tokens else 1.0,
            "ratio_min": float(-extremes[1]) if has_tokens else 1.0,
            "grad_norm": grad_norm, "lr": float(self.optimizer.param_groups[0]["lr"]), "num_tokens": tokens,
            "skipped_steps": skipped,
            "rollout_is_mean": per_sampled(sums[8], 1.0), "rollout_is_clipped_frac": per_sampled(sums[9]),
            "rollout_kl": per_sampled(sums[10]), "rollout_is_tokens": sampled,
            "rollout_is_max": float(extremes[2]) if sampled > 0 else 1.0,
        }

    # --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """{"model": full model state dict, "optimizer": full FQN-keyed optimiser state} on CPU.
        Collective when distributed (rank 0 receives the values, other ranks empty dicts)."""
        state = {"model": model_state_dict(self.module)}
        if self.optimizer is not None:
            state["optimizer"] = optimizer_state_dict(self.module, self.optimizer)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load `state_dict()` output (collective when distributed; rank 0's values are broadcast)."""
        load_model_state(self.module, state.get("model", {}))
        if self.optimizer is not None and "optimizer" in state:
            load_optimizer_state(self.module, self.optimizer, state["optimizer"])
