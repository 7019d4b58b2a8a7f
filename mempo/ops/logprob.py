"""Masked, thresholded answer log-probabilities for MemPO teacher scoring (ALGORITHM.md section 4).

For C scored contexts, the answer rows are either concatenated (M rows; context c owns rows
``cu_seqlens[c]:cu_seqlens[c+1]``) or a padded ``[N, T]`` batch (row n is context n). Row i's logits
predict ``targets[i]``: the causal shift is the caller's (from a causal LM's logits ``[L, V]`` over
tokens ``ids [L]``, the rows of answer position t are ``logits[t - 1]`` with target ``ids[t]``). Per row
i and context c (`answer_mask` is 1 on gold-answer tokens):

    logp_i  = log softmax(logits_i / temperature)[target_i]
    keep_i  = answer_mask_i and (logp_i > log(threshold))        (threshold=None: keep_i = answer_mask_i)
    P_c     = exp(mean_{i in c, keep_i} logp_i)                   (no kept row: P_c = empty_value)

Every backend reads fp32 / bf16 / fp16 inputs as they are, accumulates in fp32 and returns fp32;
nothing is NaN for finite inputs. Forward only: every op runs under ``torch.no_grad()`` and its outputs
carry no autograd graph (teacher scoring is a reward, not a loss).
"""
from __future__ import annotations

import math
from numbers import Integral, Real
from typing import NamedTuple, Optional

import torch

from mempo.ops._dispatch import interpreting, resolve_backend

__all__ = ["AnswerLogProb", "answer_logprob", "answer_logprob_from_hidden", "answer_logprob_from_token_logp"]

_FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class AnswerLogProb(NamedTuple):
    """Result of `answer_logprob` / `answer_logprob_from_hidden` / `answer_logprob_from_token_logp`.

    token_logp: fp32 `[M]` (or `[N, T]` for padded input): log p(target) per row; 0.0 on masked rows.
    keep:       bool `[M]` (or `[N, T]`): answer_mask and logp > log(threshold).
    p:          fp32 `[C]`: exp(mean kept logp); empty_value where no row is kept.
    mean_logp:  fp32 `[C]`: mean kept logp; 0.0 where no row is kept.
    num_kept:   int64 `[C]`: number of kept rows.
    """

    token_logp: torch.Tensor
    keep: torch.Tensor
    p: torch.Tensor
    mean_logp: torch.Tensor
    num_kept: torch.Tensor


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
_MIN_TEMPERATURE = 1.0 / float(torch.finfo(torch.float32).max)  # 1 / temperature must be a finite fp32


def _is_real(value) -> bool:
    """A real number: Python or numpy ints and floats (np.float32 included); never a bool."""
    return isinstance(value, Real) and not isinstance(value, bool)


def _check_scalars(threshold, temperature, empty_value):
    if threshold is not None and (not _is_real(threshold) or not 0.0 < float(threshold) <= 1.0):
        raise ValueError(f"threshold must be a number in (0, 1] or None, got {threshold!r}")
    if not _is_real(temperature) or not _MIN_TEMPERATURE <= float(temperature) < math.inf:
        raise ValueError(f"temperature must be a finite number >= {_MIN_TEMPERATURE:.3g} (1 / temperature a finite "
                         f"float32), got {temperature!r}")
    if not _is_real(empty_value) or not math.isfinite(float(empty_value)):
        raise ValueError(f"empty_value must be a finite number, got {empty_value!r}")
    log_threshold = None if threshold is None else math.log(float(threshold))
    return log_threshold, 1.0 / float(temperature), float(empty_value)


def _check_token_logp(token_logp, row_shape, source):
    """NaN log-probs come only from NaN / +inf logits on a masked-in row (or logits / temperature
    overflowing fp32): a ValueError naming the first such row, never a NaN result."""
    nan = torch.isnan(token_logp)
    if bool(nan.any()):
        i = int(nan.nonzero()[0, 0])
        where = f"row {i}" if len(row_shape) == 1 else f"row {i} (n={i // row_shape[1]}, t={i % row_shape[1]})"
        raise ValueError(f"the log-probability of masked-in {where} is NaN: {source} hold NaN or +inf there, or "
                         "overflow fp32 once divided by the temperature")


def _flatten_rows(name, x, targets, answer_mask, cu_seqlens):
    """Shape checks shared by both entry points. Returns (x2d [M, D], targets [M], mask bool [M],
    cu_seqlens int64 [C+1] or None, seq_len T or None, row_shape)."""
    if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3):
        raise ValueError(f"{name} must be a [M, D] or [N, T, D] tensor, got "
                         f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"{name} must be fp32, bf16 or fp16, got {x.dtype}")
    row_shape = tuple(x.shape[:-1])
    for tname, t in (("targets", targets), ("answer_mask", answer_mask)):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != row_shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{tname} must have shape {row_shape} (the rows of {name}), got {got}")
        if t.device != x.device:
            raise ValueError(f"{tname} is on {t.device} but {name} is on {x.device}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor, got {targets.dtype}")
    x2d = x.reshape(math.prod(row_shape), x.shape[-1])
    if x2d.numel() and x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    M = x2d.shape[0]
    mask = answer_mask.reshape(M)
    mask = mask if mask.dtype == torch.bool else mask != 0
    tgt = targets.reshape(M)

    seq_len = None
    if x.dim() == 3:
        if cu_seqlens is not None:
            raise ValueError("cu_seqlens must be None for padded [N, T, ...] input "
                             "(each row n is one context)")
        seq_len = x.shape[1]
        return x2d, tgt, mask, None, seq_len, row_shape
    if cu_seqlens is None:
        cu = torch.tensor([0, M], dtype=torch.int64, device=x.device)
        return x2d, tgt, mask, cu, None, row_shape
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError("cu_seqlens must be a 1-D integer tensor [C + 1]")
    if cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype.is_complex or cu_seqlens.dtype == torch.bool:
        raise ValueError(f"cu_seqlens must be an integer tensor, got {cu_seqlens.dtype}")
    cu_host = cu_seqlens.detach().to("cpu", torch.int64)
    if int(cu_host[0]) != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {int(cu_host[0])}")
    if int(cu_host[-1]) != M:
        raise ValueError(f"cu_seqlens must end at M = {M} (rows of {name}), got {int(cu_host[-1])}")
    if cu_host.numel() > 1:
        steps = cu_host[1:] - cu_host[:-1]
        if bool((steps < 0).any()):
            c = int((steps < 0).nonzero()[0, 0])
            raise ValueError(f"cu_seqlens must be non-decreasing; cu_seqlens[{c + 1}] = "
                             f"{int(cu_host[c + 1])} < cu_seqlens[{c}] = {int(cu_host[c])}")
    return x2d, tgt, mask, cu_seqlens.to(device=x.device, dtype=torch.int64), None, row_shape


def _check_targets(targets, mask, V, row_shape):
    # compared as int64: a small integer dtype would wrap V (int8 targets with V >= 128)
    wide = targets.long()
    bad = mask & ((wide < 0) | (wide >= V))
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        where = f"row {i}" if len(row_shape) == 1 else \
            f"row {i} (n={i // row_shape[1]}, t={i % row_shape[1]})"
        raise ValueError(f"target {int(targets[i])} out of range [0, {V}) at masked-in {where}")


def _num_contexts(cu, row_shape):
    """C: len(cu_seqlens) - 1 (varlen), or N (padded)."""
    return cu.numel() - 1 if cu is not None else row_shape[0]


# ------------------------------------------------------------------------------------------------
# torch path (vectorised; no loops over rows or contexts)
# ------------------------------------------------------------------------------------------------
def _logp_from_parts(z_t, m, d):
    """log p = (z_t - m) - log d from the row max m and d = sum exp(z - m).

    The max is subtracted first: for logits ~1e4, m + log d would round to fp32's grid at 1e4.
    A row whose logits are all -inf (m = -inf, d = 0) has z_t = -inf: with m -> 0 and d -> 1 the
    result is -inf, never -inf - -inf = NaN. A NaN d (from a NaN or +inf logit) is kept, and the
    op then rejects the row (`_check_token_logp`)."""
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    d_safe = torch.where(d == 0, torch.ones_like(d), d)  # NaN (a NaN / +inf logit) stays NaN: reported
    return (z_t - m_safe) - torch.log(d_safe)


def _torch_token_logp(logits2d, targets, mask, inv_temp):
    M = logits2d.shape[0]
    out = torch.zeros(M, dtype=torch.float32, device=logits2d.device)
    rows = mask.nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    if rows.numel() == M:
        z = logits2d.float()  # no copy for fp32
        fresh = logits2d.dtype != torch.float32
    else:
        z = logits2d.index_select(0, rows).float()
        fresh = True
    if inv_temp != 1.0:
        z = z.mul_(inv_temp) if fresh else z * inv_temp
        fresh = True
    # 1. Target logit and row max; 2. d = sum exp(z - m) (in place when z is our own copy).
    z_t = z.gather(1, targets.index_select(0, rows).long().unsqueeze(1)).squeeze(1)
    m = z.amax(dim=1)
    m_safe = torch.where(torch.isneginf(m), torch.zeros_like(m), m)
    e = z.sub_(m_safe.unsqueeze(1)) if fresh else z - m_safe.unsqueeze(1)
    d = e.exp_().sum(dim=1)
    out.index_copy_(0, rows, _logp_from_parts(z_t, m, d))
    return out


def _torch_hidden_token_logp(hidden2d, weight, bias, targets, mask, inv_temp, vocab_chunk):
    M = hidden2d.shape[0]
    V = weight.shape[0]
    device = hidden2d.device
    out = torch.zeros(M, dtype=torch.float32, device=device)
    rows = mask.nonzero().squeeze(1)
    K = rows.numel()
    if K == 0:
        return out
    h = hidden2d.index_select(0, rows).float() if K < M else hidden2d.float()
    tgt = targets.index_select(0, rows).long()
    chunk = min(vocab_chunk, V)
    buf = torch.empty(K * chunk, dtype=torch.float32, device=device)
    run_m = torch.full((K,), float("-inf"), dtype=torch.float32, device=device)
    run_d = torch.zeros(K, dtype=torch.float32, device=device)
    z_t = torch.full((K,), float("-inf"), dtype=torch.float32, device=device)
    bias32 = bias.float() if bias is not None else None
    for v0 in range(0, V, chunk):
        n = min(chunk, V - v0)
        z = buf[: K * n].view(K, n)
        w = weight[v0:v0 + n]
        # 1. z = (h @ w.T + b) / T for this vocabulary chunk, fp32, into a reused buffer.
        torch.mm(h, w.t() if w.dtype == torch.float32 else w.float().t(), out=z)
        if bias32 is not None:
            z.add_(bias32[v0:v0 + n])
        if inv_temp != 1.0:
            z.mul_(inv_temp)
        # 2. Pick up the target logit if this chunk holds it.
        local = tgt - v0
        inside = (local >= 0) & (local < n)
        picked = z.gather(1, local.clamp(0, n - 1).unsqueeze(1)).squeeze(1)
        z_t = torch.where(inside, picked, z_t)
        # 3. Chunk log-sum-exp in place (max, subtract, exp, sum), guarded against all -inf rows.
        c_m = z.amax(dim=1)
        c_safe = torch.where(torch.isneginf(c_m), torch.zeros_like(c_m), c_m)
        c_d = z.sub_(c_safe.unsqueeze(1)).exp_().sum(dim=1)
        # 4. Merge into the running (max, rescaled sum): d = d*exp(m - m') + d_c*exp(m_c - m').
        new_m = torch.maximum(run_m, c_m)
        new_safe = torch.where(torch.isneginf(new_m), torch.zeros_like(new_m), new_m)
        run_d = run_d * torch.exp(run_m - new_safe) + c_d * torch.exp(c_safe - new_safe)
        run_m = new_m
    out.index_copy_(0, rows, _logp_from_parts(z_t, run_m, run_d))
    return out


def _torch_segments(token_logp, mask, cu, seq_len, num_contexts, log_threshold, empty_value):
    """keep, p, mean_logp, num_kept from token_logp [M] via prefix sums (deterministic)."""
    device = token_logp.device
    keep = mask.clone() if log_threshold is None else mask & (token_logp > log_threshold)
    if cu is None:
        cu = torch.arange(num_contexts + 1, device=device, dtype=torch.int64) * seq_len
    # Per-context sums as differences of fp64 prefix sums at the CSR offsets (no atomics, no
    # loops). A kept -inf log-prob (possible only with threshold=None) is counted apart, so that a
    # prefix-sum difference never computes -inf - -inf: such a context has mean -inf and P = 0.
    vals = torch.where(keep, token_logp, torch.zeros_like(token_logp)).double()
    neg_inf = torch.isneginf(vals)
    M = token_logp.numel()
    csum = torch.zeros(M + 1, dtype=torch.float64, device=device)
    torch.cumsum(torch.where(neg_inf, torch.zeros_like(vals), vals), 0, out=csum[1:])
    ccnt = torch.zeros((2, M + 1), dtype=torch.int64, device=device)
    torch.cumsum(torch.stack([keep.long(), neg_inf.long()]), 1, out=ccnt[:, 1:])
    total = csum[cu[1:]] - csum[cu[:-1]]
    counts = ccnt[:, cu[1:]] - ccnt[:, cu[:-1]]
    num_kept, num_neg_inf = counts[0], counts[1]
    has = num_kept > 0
    mean = (total / num_kept.clamp(min=1)).float()
    mean = torch.where(num_neg_inf > 0, torch.full_like(mean, float("-inf")), mean)
    p = torch.where(has, torch.exp(mean), torch.full_like(mean, empty_value))
    mean_logp = torch.where(has, mean, torch.zeros_like(mean))
    return keep, p, mean_logp, num_kept


# ------------------------------------------------------------------------------------------------
# Triton path
# ------------------------------------------------------------------------------------------------
def _triton_segments(token_logp, mask_u8, cu, seq_len, num_contexts, log_threshold, empty_value):
    # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
    from mempo.kernels import answer_logprob as kern

    device = token_logp.device
    M = token_logp.numel()
    keep_u8 = torch.zeros(M, dtype=torch.uint8, device=device)
    p = torch.empty(num_contexts, dtype=torch.float32, device=device)
    mean_logp = torch.empty(num_contexts, dtype=torch.float32, device=device)
    num_kept = torch.empty(num_contexts, dtype=torch.int64, device=device)
    kern.segment_reduce(token_logp, mask_u8, cu, keep_u8, p, mean_logp, num_kept,
                        num_contexts=num_contexts, seq_len=seq_len or 0,
                        log_threshold=log_threshold, empty_value=empty_value)
    return keep_u8.view(torch.bool), p, mean_logp, num_kept


def _mask_u8(mask):
    return mask.contiguous().view(torch.uint8)


# ------------------------------------------------------------------------------------------------
# public API
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
@torch.no_grad()
def answer_logprob(
    logits: torch.Tensor,
    targets: torch.Tensor,
    answer_mask: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    threshold: Optional[float] = 0.5,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    backend: str = "auto",
) -> AnswerLogProb:
    """Masked, thresholded answer log-probs from materialised logits; forward only (no autograd).

    Args:
        logits: `[M, V]` (varlen: rows of all contexts concatenated) or `[N, T, V]` (padded: row n is
            context n), fp32 / bf16 / fp16. Only the last dim needs to be contiguous. Row i's logits
            predict targets[i] (shift a causal LM's logits by one position first: module docstring).
        targets: integer `[M]` / `[N, T]`, the token predicted at each row; must lie in [0, V) on
            rows with answer_mask set, anything (e.g. -100) elsewhere.
        answer_mask: bool or integer `[M]` / `[N, T]`, nonzero on gold-answer tokens.
        cu_seqlens: integer `[C + 1]` CSR offsets of contexts over the M rows (starts at 0,
            non-decreasing, ends at M; repeated offsets are empty contexts). None with `[M, V]`
            logits means one context; must be None with padded `[N, T, V]` logits (C = N).
        threshold: keep a masked-in row iff logp > log(threshold) (strict); in (0, 1], or None for
            no test (the paper's plain geometric mean). 1.0 keeps nothing (log-probs are <= 0).
        temperature: logits are divided by it (a finite number >= 2.9e-39, so that 1 / temperature
            is a finite fp32).
        empty_value: P of a context with no kept row (no rows, all masked or all below the
            threshold); default 0.0, not exp(0) = 1. Its mean_logp is 0.0 and num_kept 0.
        backend: "auto" (Triton when every tensor is on CUDA, torch otherwise) | "triton" | "torch".

    Returns:
        AnswerLogProb(token_logp fp32, keep bool, p fp32 [C], mean_logp fp32 [C], num_kept int64 [C]);
        token_logp / keep have the row shape of `targets`. Masked rows are not computed (their
        token_logp is 0.0, keep False, their targets never read). A -inf logit is allowed (banned
        tokens); a -inf target logit gives token_logp -inf (kept only when threshold=None: P = 0);
        a log-prob below -3.4e38 (logits spanning more than the fp32 range) is -inf.

    Raises:
        ValueError naming the argument or row: a scalar out of range (numpy scalars are accepted),
        a target outside [0, V) on a masked-in row, malformed cu_seqlens, or a NaN log-prob on a
        masked-in row (a NaN or +inf logit there, or logits / temperature overflowing fp32; the
        check reads the M log-probs, not the logits). Validation costs two device-to-host syncs
        per call: cu_seqlens and the target range before the kernels, the NaN check after them.
    """
    log_threshold, inv_temp, empty_value = _check_scalars(threshold, temperature, empty_value)
    logits2d, tgt, mask, cu, seq_len, row_shape = _flatten_rows(
        "logits", logits, targets, answer_mask, cu_seqlens)
    V = logits2d.shape[1]
    if V < 1:
        raise ValueError("logits must have a vocabulary dimension V >= 1")
    M = logits2d.shape[0]
    _check_targets(tgt, mask, V, row_shape)
    C = _num_contexts(cu, row_shape)
    use = resolve_backend(backend, logits, targets, answer_mask)

    if use == "torch":
        token_logp = _torch_token_logp(logits2d, tgt, mask, inv_temp)
        _check_token_logp(token_logp, row_shape, "the logits")
        keep, p, mean_logp, num_kept = _torch_segments(
            token_logp, mask, cu, seq_len, C, log_threshold, empty_value)
    else:
        # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
        from mempo.kernels import answer_logprob as kern

        mask_u8 = _mask_u8(mask)
        tgt_c = tgt.contiguous()
        token_logp = torch.empty(M, dtype=torch.float32, device=logits2d.device)
        kern.row_logp(logits2d, tgt_c, mask_u8, token_logp, inv_temp)
        _check_token_logp(token_logp, row_shape, "the logits")
        keep, p, mean_logp, num_kept = _triton_segments(
            token_logp, mask_u8, cu, seq_len, C, log_threshold, empty_value)
    return AnswerLogProb(token_logp.view(row_shape), keep.view(row_shape), p, mean_logp, num_kept)


@torch.no_grad()
def answer_logprob_from_hidden(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    answer_mask: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    bias: Optional[torch.Tensor] = None,
    threshold: Optional[float] = 0.5,
    temperature: float = 1.0,
    empty_value: float = 0.0,
    vocab_chunk: int = 8192,
    backend: str = "auto",
) -> AnswerLogProb:
    """Same as `answer_logprob` on logits = hidden @ weight.T + bias, without materialising them; forward
    only (no autograd). Row i's hidden state predicts targets[i] (the causal shift is the caller's).

    Args:
        hidden: `[M, H]` or `[N, T, H]` final hidden states (fp32 / bf16 / fp16).
        weight: `[V, H]` lm_head weight (fp32 / bf16 / fp16).
        targets, answer_mask, cu_seqlens, threshold, temperature, empty_value, backend: as in
            `answer_logprob`.
        bias: optional `[V]` lm_head bias.
        vocab_chunk: torch path only: vocabulary entries per matmul chunk; extra memory is about
            K x vocab_chunk fp32 values (K = masked-in rows). The Triton path tiles on its own.

    Returns:
        AnswerLogProb, as `answer_logprob`. Only masked-in rows are computed: an online
        log-sum-exp over vocabulary chunks (running max and rescaled sum), the target logit taken
        from the chunk that holds it.
    """
    log_threshold, inv_temp, empty_value = _check_scalars(threshold, temperature, empty_value)
    hidden2d, tgt, mask, cu, seq_len, row_shape = _flatten_rows(
        "hidden", hidden, targets, answer_mask, cu_seqlens)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        got = tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise ValueError(f"weight must be [V, H] with H = {hidden.shape[-1]}, got {got}")
    if weight.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"weight must be fp32, bf16 or fp16, got {weight.dtype}")
    if weight.device != hidden.device:
        raise ValueError(f"weight is on {weight.device} but hidden is on {hidden.device}")
    V = weight.shape[0]
    if V < 1:
        raise ValueError("weight must have V >= 1 rows")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (V,):
            got = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
            raise ValueError(f"bias must be [V] = [{V}], got {got}")
        if bias.device != hidden.device:
            raise ValueError(f"bias is on {bias.device} but hidden is on {hidden.device}")
        if bias.dtype not in _FLOAT_DTYPES:
            raise ValueError(f"bias must be fp32, bf16 or fp16, got {bias.dtype}")
    if isinstance(vocab_chunk, bool) or not isinstance(vocab_chunk, Integral) or vocab_chunk < 1:
        raise ValueError(f"vocab_chunk must be a positive int, got {vocab_chunk!r}")
    M = hidden2d.shape[0]
    _check_targets(tgt, mask, V, row_shape)
    C = _num_contexts(cu, row_shape)
    tensors = (hidden, weight, targets, answer_mask) + ((bias,) if bias is not None else ())
    use = resolve_backend(backend, *tensors)

    if use == "torch":
        token_logp = _torch_hidden_token_logp(hidden2d, weight, bias, tgt, mask, inv_temp, int(vocab_chunk))
        _check_token_logp(token_logp, row_shape, "the logits hidden @ weight.T + bias")
        keep, p, mean_logp, num_kept = _torch_segments(
            token_logp, mask, cu, seq_len, C, log_threshold, empty_value)
    else:
        # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
        from mempo.kernels import answer_logprob as kern

        mask_u8 = _mask_u8(mask)
        token_logp = torch.empty(M, dtype=torch.float32, device=hidden2d.device)
        kern.hidden_logp(hidden2d, weight, bias.contiguous() if bias is not None else None,
                         tgt.contiguous(), mask_u8, token_logp, inv_temp, interpret=interpreting())
        _check_token_logp(token_logp, row_shape, "the logits hidden @ weight.T + bias")
        keep, p, mean_logp, num_kept = _triton_segments(
            token_logp, mask_u8, cu, seq_len, C, log_threshold, empty_value)
    return AnswerLogProb(token_logp.view(row_shape), keep.view(row_shape), p, mean_logp, num_kept)


@torch.no_grad()
def answer_logprob_from_token_logp(
    token_logp: torch.Tensor,
    answer_mask: torch.Tensor,
    cu_seqlens: Optional[torch.Tensor] = None,
    *,
    threshold: Optional[float] = 0.5,
    empty_value: float = 0.0,
) -> AnswerLogProb:
    """The same mask / threshold / geometric-mean reduction from log-probs computed elsewhere, torch
    path (the rows are few); forward only (no autograd). The entry point for vLLM / SGLang users: their
    prompt log-probs already hold, at each prompt position t, log p(ids[t] | ids[:t]), so the rows of an
    answer are those positions' values, with no further shift.

    Args:
        token_logp: float `[M]`, log p(target) of every row (contexts concatenated; context c owns
            rows ``cu_seqlens[c]:cu_seqlens[c+1]``); read in fp32. -inf allowed, NaN not (ValueError)
            on a masked-in row; +inf is not a log-probability (ValueError).
        answer_mask: bool or integer `[M]`, nonzero on gold-answer rows.
        cu_seqlens: integer `[C + 1]` CSR offsets (None: one context), as `answer_logprob`.
        threshold / empty_value: as `answer_logprob`.

    Returns:
        AnswerLogProb with token_logp fp32 `[M]` (0.0 on masked rows), keep, p, mean_logp, num_kept;
        for the same per-row log-probs the numbers are `answer_logprob`'s.
    """
    log_threshold, _, empty_value = _check_scalars(threshold, 1.0, empty_value)
    if not isinstance(token_logp, torch.Tensor) or token_logp.dim() != 1:
        raise ValueError("token_logp must be a 1-D [M] tensor")
    if not token_logp.dtype.is_floating_point:
        raise ValueError(f"token_logp must be a float tensor, got {token_logp.dtype}")
    values = token_logp.to(torch.float32)
    _, _, mask, cu, _, _ = _flatten_rows("token_logp", values[:, None], torch.zeros_like(values, dtype=torch.int64),
                                         answer_mask, cu_seqlens)
    values = torch.where(mask, values, torch.zeros_like(values))
    _check_token_logp(values, tuple(values.shape), "the given log-probs")
    if bool((values > 0).any()):
        i = int((values > 0).nonzero()[0, 0])
        raise ValueError(f"token_logp[{i}] = {float(values[i])} is not a log-probability (> 0)")
    keep, p, mean_logp, num_kept = _torch_segments(values, mask, cu, None, cu.numel() - 1, log_threshold,
                                                   empty_value)
    return AnswerLogProb(values, keep, p, mean_logp, num_kept)
