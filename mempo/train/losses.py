"""Policy-update losses: PPO-clip with clip-higher and dual-clip, KL estimators, loss aggregation,
entropy, truncated importance weights for rollout correction (verl `core_algos` /
`rollout_corr_helper` semantics). The token advantages and the loss mask they act on come from
`mempo.algo.advantages`.

Tensors are ``[B, L]``; ``mask`` (bool, or 0/1 of any dtype) is 1 on the tokens that carry loss.
Values at masked-out positions are ignored, even NaN or inf (every function selects with
``torch.where`` rather than multiplying by the mask, so nothing leaks into a result or gradient).
Computations run in ``promote(input dtype, fp32)`` (fp64 stays fp64, half precision is lifted);
losses are 0-dim; a zero normaliser gives exactly 0, still in the autograd graph (never NaN).
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from mempo.config import KL_ESTIMATORS, LOSS_AGG_MODES

__all__ = [
    "LOSS_AGG_MODES", "KL_ESTIMATORS", "ROLLOUT_IS_APPLIED", "agg_loss", "masked_mean", "policy_loss", "kl_penalty",
    "entropy_from_logits", "rollout_is_weights",
]

#: the levels `rollout_is_weights` applies (None: weights computed for the metrics only)
ROLLOUT_IS_APPLIED = ("token", "sequence")

Number = Union[int, float, torch.Tensor]
_LOG_RATIO_CLAMP = 20.0
_LOW_VAR_KL_CLAMP = 10.0


def _bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    if mask.shape != like.shape:
        raise ValueError(f"{name} must have the shape of the loss tensor {tuple(like.shape)}, got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _zero_like_graph(values: torch.Tensor) -> torch.Tensor:
    """A 0-dim zero that keeps `values` in the autograd graph (finite even if `values` is not)."""
    return torch.where(torch.isfinite(values), values, torch.zeros_like(values)).sum() * 0.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor, empty_value: float = 0.0) -> torch.Tensor:
    """Mean of `values` over `mask` (same shape); `empty_value` when the mask selects nothing.

    Returns a 0-dim tensor of dtype promote(values.dtype, float32).
    """
    mask = _bool_mask(mask, values)
    values = values.to(_compute_dtype(values))
    count = mask.sum()
    total = torch.where(mask, values, torch.zeros_like(values)).sum()
    return torch.where(count > 0, total / count.clamp(min=1), torch.full_like(total, empty_value))


def _masked_extreme(values: torch.Tensor, mask: torch.Tensor, largest: bool) -> torch.Tensor:
    """Max (or min) of `values` over `mask`; 1.0 when the mask is empty (the ratio of no change)."""
    if values.numel() == 0:
        return torch.ones((), dtype=values.dtype, device=values.device)
    fill = -torch.inf if largest else torch.inf
    picked = torch.where(mask, values, torch.full_like(values, fill))
    extreme = picked.max() if largest else picked.min()
    return torch.where(mask.any(), extreme, torch.ones_like(extreme))


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str = "token-mean", *,
             num_tokens: Optional[Number] = None, num_sequences: Optional[Number] = None,
             norm_length: Optional[Number] = None) -> torch.Tensor:
    """Aggregate a per-token loss `[B, L]` into a 0-dim loss (verl >= 0.6 semantics).

    With s_b = sum_t mask*loss (token sum of row b), n_b = sum_t mask, "non-empty" rows n_b > 0:

        token-mean               sum_b s_b / T              T = num_tokens (default sum_b n_b)
        seq-mean-token-sum       sum_{b non-empty} s_b / S  S = num_sequences (default #non-empty rows)
        seq-mean-token-mean      sum_{b non-empty} (s_b / n_b) / S
        seq-mean-token-sum-norm  sum_{b non-empty} s_b / S / N   N = norm_length (default L)

    "seq-mean-token-sum-norm" is Dr.GRPO's constant-length normalisation: pass the same N every step
    (e.g. the rollout's max response length); the default L, the padded length, changes with the
    batch. (verl <= 0.5 divided the batch token sum by L without the 1/S.) s_b / n_b is an exact
    division (verl adds 1e-8 to n_b).

    loss_mat: float `[B, L]`; loss_mask: bool or 0/1 `[B, L]`; loss_agg_mode: one of LOSS_AGG_MODES.
    num_tokens / num_sequences: the *global* normalisers (int or 0-dim tensor) when a batch is split
    into micro-batches or ranks: each part passes the whole batch's totals, so the parts' losses sum
    to the whole batch's loss. A zero normaliser gives 0 (connected to the graph: zero gradients).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if loss_mat.dim() != 2:
        raise ValueError(f"loss_mat must be [B, L], got shape {tuple(loss_mat.shape)}")
    mask = _bool_mask(loss_mask, loss_mat, "loss_mask")
    values = loss_mat.to(_compute_dtype(loss_mat))
    masked = torch.where(mask, values, torch.zeros_like(values))
    row_tokens = mask.sum(dim=-1)
    if loss_agg_mode == "token-mean":
        numerator = masked.sum()
        denominator = row_tokens.sum() if num_tokens is None else num_tokens
    else:
        non_empty = row_tokens > 0
        row_sums = masked.sum(dim=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            row_sums = row_sums / row_tokens.clamp(min=1).to(row_sums.dtype)
        numerator = torch.where(non_empty, row_sums, torch.zeros_like(row_sums)).sum()
        denominator = non_empty.sum() if num_sequences is None else num_sequences
        if loss_agg_mode == "seq-mean-token-sum-norm":
            length = loss_mat.shape[-1] if norm_length is None else norm_length
            denominator = denominator * torch.as_tensor(length, dtype=numerator.dtype, device=numerator.device)
    denominator = torch.as_tensor(denominator, dtype=numerator.dtype, device=numerator.device)
    zero = _zero_like_graph(values)
    return torch.where(denominator != 0, numerator / torch.where(denominator != 0, denominator, 1.0), zero)


def policy_loss(log_prob: torch.Tensor, old_log_prob: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.28, clip_ratio_c: Optional[float] = 3.0,
                loss_agg_mode: str = "token-mean", *, num_tokens: Optional[Number] = None,
                num_sequences: Optional[Number] = None, norm_length: Optional[Number] = None,
                is_weights: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip surrogate with clip-higher and dual-clip (verl `compute_policy_loss_vanilla`),
    aggregated by `agg_loss`.

    log_prob: `[B, L]` current policy log-probs (carries the gradient); old_log_prob: `[B, L]`
    behaviour-policy log-probs (no gradient); advantages: `[B, L]`; mask: `[B, L]` loss tokens;
    is_weights: `[B, L]` rollout-correction weights (`rollout_is_weights`, no gradient) multiplying
    each token's clipped loss, as verl multiplies ``pg_losses`` (None: 1).
    Returns (loss 0-dim, metrics) where metrics are detached 0-dim tensors over the mask tokens:
    ``pg_clipfrac`` (fraction where the clipped term was taken), ``pg_clipfrac_lower`` (fraction where
    dual-clip bound the loss), ``ppo_kl`` (mean old - new log-prob), ``ratio_mean`` / ``ratio_max`` /
    ``ratio_min`` and ``num_tokens`` (mask count, float). Over no tokens the fractions and
    ``ppo_kl`` are 0 and the ratios 1.
    """
    if not (clip_ratio_low > 0 and clip_ratio_high > 0 and clip_ratio_low < 1):
        raise ValueError(f"clip ratios must satisfy 0 < clip_ratio_low < 1 and clip_ratio_high > 0, "
                         f"got low={clip_ratio_low}, high={clip_ratio_high}")
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip) must be > 1 or None, got {clip_ratio_c}")
    bool_mask = _bool_mask(mask, log_prob)
    for name, tensor in (("old_log_prob", old_log_prob), ("advantages", advantages)):
        if tensor.shape != log_prob.shape:
            raise ValueError(f"{name} must have shape {tuple(log_prob.shape)}, got {tuple(tensor.shape)}")
    dtype = _compute_dtype(log_prob)
    zeros = torch.zeros((), dtype=dtype, device=log_prob.device)
    log_prob_c = torch.where(bool_mask, log_prob.to(dtype), zeros)
    old_c = torch.where(bool_mask, old_log_prob.detach().to(dtype), zeros)
    adv = torch.where(bool_mask, advantages.detach().to(dtype), zeros)

    # 1. ratio = exp(clamp(log_prob - old_log_prob, -20, 20))
    log_ratio = torch.clamp(log_prob_c - old_c, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    # 2. l = max(-A * ratio, -A * clamp(ratio, 1 - low, 1 + high)); clip-higher (high > low) lets
    #    unlikely tokens with A > 0 grow.
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    loss_mat = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(bool_mask)
    if clip_ratio_c is not None:
        # 3. Dual-clip, c > 1: for A < 0, l = min(l, -A * c) bounds a token whose ratio exploded.
        bound = -adv * clip_ratio_c
        dual_clipped = (adv < 0) & (loss_mat > bound)
        loss_mat = torch.where(adv < 0, torch.minimum(loss_mat, bound), loss_mat)
    if is_weights is not None:
        if is_weights.shape != log_prob.shape:
            raise ValueError(f"is_weights must have shape {tuple(log_prob.shape)}, got {tuple(is_weights.shape)}")
        loss_mat = loss_mat * torch.where(bool_mask, is_weights.detach().to(dtype), torch.ones((), dtype=dtype,
                                                                                               device=log_prob.device))
    loss = agg_loss(loss_mat, bool_mask, loss_agg_mode, num_tokens=num_tokens, num_sequences=num_sequences,
                    norm_length=norm_length)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((clipped > unclipped).to(dtype), bool_mask),
            "pg_clipfrac_lower": masked_mean(dual_clipped.to(dtype), bool_mask),
            "ppo_kl": masked_mean(-log_ratio, bool_mask),
            "ratio_mean": masked_mean(ratio, bool_mask, empty_value=1.0),
            "ratio_max": _masked_extreme(ratio, bool_mask, largest=True),
            "ratio_min": _masked_extreme(ratio, bool_mask, largest=False),
            "num_tokens": bool_mask.sum().to(dtype),
        }
    return loss, {k: v.detach() for k, v in metrics.items()}


def rollout_is_weights(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, known: torch.Tensor,
                       mask: torch.Tensor, level: Optional[str], cap: float
                       ) -> tuple[Optional[torch.Tensor], dict[str, torch.Tensor]]:
    """Truncated importance weights correcting for a rollout policy that is not the trained one
    (verl's ``rollout_is`` with a single threshold: TIS), and their statistics.

    old_log_prob: `[B, L]` the trained policy's log-probs before the update (pi_train);
    rollout_log_prob: `[B, L]` the sampling policy's (pi_rollout); known: `[B, L]` the tokens whose
    rollout log-prob is known (the sampled ones; forced-prefix ids are not); mask: `[B, L]` loss
    tokens. With r = clamp(old - rollout, -20, 20) on the known loss tokens:

        "token"     w_t = min(exp(r_t), cap) on them, 1 on the other loss tokens (the forced ids)
        "sequence"  w = min(exp(sum_row r_t), cap) on every loss token of the row
        None        no weights (returned None); the statistics are the token level's

    Returns (weights `[B, L]` float32 detached or None, stats): 0-dim sums over the known loss tokens
    for a token-weighted reduction: ``weight_sum``, ``clipped`` (tokens whose weight was truncated),
    ``kl_sum`` (sum of rollout - old: KL(pi_rollout || pi_train) by the k1 estimator), ``count``, and
    ``weight_max`` (1.0 over no token).
    """
    if level is not None and level not in ROLLOUT_IS_APPLIED:
        raise ValueError(f"rollout correction level must be one of {ROLLOUT_IS_APPLIED} or None, got {level!r}")
    if not cap > 0:
        raise ValueError(f"the rollout correction cap must be > 0, got {cap!r}")
    known = _bool_mask(known, old_log_prob, "known") & _bool_mask(mask, old_log_prob)
    with torch.no_grad():
        zero = torch.zeros((), dtype=torch.float32, device=old_log_prob.device)
        ratio_log = torch.where(known, (old_log_prob.float() - rollout_log_prob.float()), zero)
        ratio_log = ratio_log.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        if level == "sequence":
            row_log = ratio_log.sum(dim=-1, keepdim=True).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
            raw = torch.exp(row_log).expand_as(ratio_log)
            weights = torch.where(_bool_mask(mask, old_log_prob), raw.clamp(max=cap), 1.0)
        else:
            raw = torch.exp(ratio_log)
            weights = torch.where(known, raw.clamp(max=cap), 1.0)
        stats = {
            "weight_sum": torch.where(known, weights, zero).sum(),
            "clipped": (known & (raw > cap)).sum().float(),
            "kl_sum": torch.where(known, rollout_log_prob.float() - old_log_prob.float(), zero).sum(),
            "count": known.sum().float(),
            "weight_max": _masked_extreme(weights, known, largest=True).float(),
        }
    return (weights if level is not None else None), stats


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: str = "low_var_kl") -> torch.Tensor:
    """Per-token KL estimate between the policy and the reference, `[B, L]` (same shape as inputs).

    estimator (Schulman's k1/k2/k3): "k1" (log_prob - ref), "k2" (0.5 * (log_prob - ref)^2),
    "k3" / "low_var_kl" (exp(ref - lp) - (ref - lp) - 1 with ref - lp clamped to [-20, 20] and the
    result to [-10, 10], verl's clamps).
    Gradient flows through `log_prob` only. dtype: promote(log_prob.dtype, float32). Mask with `agg_loss`.
    """
    if estimator not in KL_ESTIMATORS:
        raise ValueError(f"kl estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")
    if ref_log_prob.shape != log_prob.shape:
        raise ValueError(f"ref_log_prob must have shape {tuple(log_prob.shape)}, got {tuple(ref_log_prob.shape)}")
    dtype = _compute_dtype(log_prob)
    log_ratio = log_prob.to(dtype) - ref_log_prob.detach().to(dtype)
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    neg_log_ratio = torch.clamp(-log_ratio, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    kl = torch.exp(neg_log_ratio) - neg_log_ratio - 1.0
    return torch.clamp(kl, -_LOW_VAR_KL_CLAMP, _LOW_VAR_KL_CLAMP)


def entropy_from_logits(logits: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, computed `chunk_size` rows at a time.

    logits: `[..., V]`, any float dtype (-inf entries allowed: banned tokens contribute 0). Returns
    `[...]` in promote(logits.dtype, float32). Only one chunk is lifted to fp32 at a time (no full
    fp32/fp64 copy of `[..., V]`); under autograd each chunk's intermediates are kept for backward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    dtype = _compute_dtype(logits)
    flat = logits.reshape(-1, logits.shape[-1])
    pieces = []
    for start in range(0, flat.shape[0], chunk_size):
        z = flat[start:start + chunk_size].to(dtype)
        log_p = torch.log_softmax(z, dim=-1)
        p = log_p.exp()
        p_log_p = torch.where(p > 0, p * log_p, torch.zeros_like(p))
        pieces.append(-p_log_p.sum(dim=-1))
    if not pieces:
        return torch.zeros(logits.shape[:-1], dtype=dtype, device=logits.device)
    return torch.cat(pieces).reshape(logits.shape[:-1])
