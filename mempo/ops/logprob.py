"""Masked, thresholded answer log-probabilities for MemPO teacher scoring (ALGORITHM.md section 4).

For C scored contexts, the answer rows are either concatenated (M rows; context c owns rows
``cu_seqlens[c]:cu_seqlens[c+1]``) or a padded ``[N, T]`` batch (row n is context n). Row i's logits
predict ``targets[i]``: the causal shift is the caller's (from a causal LM's logits ``[L, V]`` over
tokens ``ids [L]``, the rows of answer position t are ``logits[t - 1]`` with target ``ids[t]``). Per row
i and context c (`answer_mask` is 1 on gold-answer tokens):

    logp_i  = log softmax(logits_i / temperature)[target_i]
    keep_i  = answer_mask_i and (logp_i > log(threshold))        (threshold=None: keep_i = answer_mask_i)
    P_c     = exp(mean_{i in c, keep_i} logp_i)                   (no kept row: P_c = empty_value)

Every backend reads fp32 / bf16 / fp16 inputs as they are, accumulates in fp32 and returns fp32 (fp32
GEMMs in TF32 only where the caller allows it: `answer_logprob_from_hidden`'s allow_tf32); nothing is
NaN for finite inputs. Forward only: every op runs under ``torch.no_grad()`` and its outputs
carry no autograd graph (teacher scoring is a reward, not a loss).
"""
from __future__ import annotations

import contextlib
import math
from numbers import Integral, Real
from typing import NamedTuple, Optional

import torch

from mempo.ops._dispatch import interpreting, resolve_backend

__all__ = ["AnswerLogProb", "ChunkPlan", "METHODS", "answer_logprob", "answer_logprob_from_hidden",
           "answer_logprob_from_token_logp", "plan_chunks"]

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


# ------------------------------------------------------------------------------------------------
# chunked path: blocks of fp32 logits through the GEMM, an online log-sum-exp epilogue per block
# ------------------------------------------------------------------------------------------------
METHODS = ("chunked", "materialise", "fused")
# Largest fp32 logits block the chunked method plans, per device type (bytes). CUDA: binds only past
# about 7,000 bf16 rows at V = 151,936 (below, 1/8 of the materialised logits is less); a block of
# thousands of rows x thousands of entries already keeps cuBLAS at its tile efficiency (the GPU
# check times other shapes: tools/gpu_check.py CHUNK_SWEEP). CPU: blocks above ~40 MB ran slower (the
# exp pass falls out of cache: bench/RESULTS.md "Answer log-prob", vocab_chunk 16,384 vs 1,024-8,192).
MAX_CHUNK_BYTES = {"cuda": 256 << 20, "cpu": 32 << 20}
# The budget never goes below this: a few MiB cost nothing and spare tiny calls (teacher scoring of a
# few rows) a string of small GEMMs.
MIN_CHUNK_BYTES = 8 << 20
# Planned block sides below the whole K or V are multiples of this (cuBLAS tiles are 64-256 wide).
CHUNK_ALIGN = 128
# bf16 / fp16 operands, fp32 output in one cuBLAS call (torch >= 2.8, CUDA only).
_MM_OUT_DTYPE = hasattr(torch.ops.aten.mm, "dtype_out")


class ChunkPlan(NamedTuple):
    """Block shape of `answer_logprob_from_hidden`'s chunked and materialise methods.

    rows:   kept (masked-in) rows per block, R <= K.
    vocab:  vocabulary entries per block, N <= V.
    budget: bytes the block was planned for (the limit `peak` stays under unless a side was given).
    peak:   extra bytes the call holds at most: the fp32 [R, N] block, the block's hidden rows
            (gathered and / or upcast), an upcast weight slice, the bias in fp32, per-row vectors.
    """

    rows: int
    vocab: int
    budget: int
    peak: int


def _native_low_precision_gemm(hidden_dtype, weight_dtype, device) -> bool:
    """cuBLAS multiplies the bf16 / fp16 operands as they are and writes fp32 (no upcast copies)."""
    return (_MM_OUT_DTYPE and device.type == "cuda" and hidden_dtype == weight_dtype
            and hidden_dtype != torch.float32)


def _free_device_bytes(device) -> Optional[int]:
    """Bytes a new allocation can get on a CUDA device: free on the device plus what the caching
    allocator holds unused. None elsewhere."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def plan_chunks(M: int, K: int, V: int, H: int, hidden_dtype, weight_dtype, device, *,
                chunk_rows: Optional[int] = None, vocab_chunk: Optional[int] = None, whole: bool = False,
                has_bias: bool = False, free_bytes: Optional[int] = None) -> ChunkPlan:
    """Block shape for M rows of which K are kept, V vocabulary entries, hidden size H.

    Budget B (every extra byte, `ChunkPlan.peak`) = 1/8 of the materialised logits (M x V in the dtype
    of hidden @ weight.T), at most half of `free_bytes` (default: on CUDA `torch.cuda.mem_get_info`
    plus the allocator's unused cache), at least MIN_CHUNK_BYTES; the fp32 block alone at most
    MAX_CHUNK_BYTES[device type]. Square-ish blocks re-read the fewest operand bytes (the hidden rows
    once per vocabulary block, the weight once per row block): R = min(K, the side s of a square
    block that fits B), which for K up to a few thousand is every kept row, so that the weight is
    read once; then N = what fits next to R rows (if that is all of V, R = what fits next to V).
    Sides below K / V are rounded down to multiples of CHUNK_ALIGN. `chunk_rows` / `vocab_chunk` fix
    a side (the other still follows B); `whole` is one [K, V] block (method "materialise")."""
    device = torch.device(device)
    h_size = hidden_dtype.itemsize
    upcast = not (hidden_dtype == weight_dtype == torch.float32
                  or _native_low_precision_gemm(hidden_dtype, weight_dtype, device))
    # Bytes per block row besides its logits: the gathered hidden row (when rows are skipped) and its
    # fp32 copy (upcast GEMM); per block column: the fp32 copy of a weight row (upcast GEMM).
    a = (H * h_size if K < M else 0) + (H * 4 if upcast and hidden_dtype != torch.float32 else 0)
    b = H * 4 if upcast and weight_dtype != torch.float32 else 0
    # Per kept row: state (3 fp32), target (int64), index (int64), compact log-prob (fp32) and the
    # torch epilogue's [R] temporaries (max, shifted max, target column, ...); the [M] output; the bias
    # in fp32.
    fixed = 96 * K + 4 * M + (4 * V if has_bias else 0)

    materialised = M * V * torch.promote_types(hidden_dtype, weight_dtype).itemsize
    budget = materialised // 8
    if free_bytes is None:
        free_bytes = _free_device_bytes(device)
    if free_bytes is not None:
        budget = min(budget, free_bytes // 2)
    # Never below MIN_CHUNK_BYTES: on a device with less free memory the allocation fails with torch's
    # out-of-memory error rather than the call crawling through thousands of tiny blocks.
    budget = max(budget, MIN_CHUNK_BYTES)
    avail = max(budget - fixed, 0)
    block_cap = MAX_CHUNK_BYTES.get(device.type, MIN_CHUNK_BYTES)

    def align(n, whole_n):
        return n - n % CHUNK_ALIGN if CHUNK_ALIGN <= n < whole_n else n

    def rows_for(n):  # rows that fit next to n columns
        return max(1, min(K, (avail - n * b) // (4 * n + a), block_cap // (4 * n)))

    def cols_for(r):  # columns that fit next to r rows
        return max(1, min(V, (avail - r * a) // (4 * r + b), block_cap // (4 * r)))

    if whole:
        R, N = K, V
    elif chunk_rows is not None and vocab_chunk is not None:
        R, N = min(chunk_rows, K), min(vocab_chunk, V)
    elif chunk_rows is not None:
        R = min(chunk_rows, K)
        N = align(cols_for(R), V)
    elif vocab_chunk is not None:
        N = min(vocab_chunk, V)
        R = align(rows_for(N), K)
    else:
        # s: 4 s^2 + (a + b) s = avail
        side = int((math.sqrt((a + b) ** 2 + 16 * avail) - (a + b)) / 8)
        R = max(1, min(K, side, math.isqrt(block_cap // 4)))
        N = cols_for(R)
        if N == V:  # the whole vocabulary fits next to R rows: as many rows as fit next to it
            R = rows_for(V)
        R = align(R, K)
        N = align(cols_for(R), V)
    peak = 4 * R * N + R * a + N * b + fixed
    return ChunkPlan(R, N, budget, peak)


def _gemm_precision(device, tf32: bool):
    """Context under which fp32 GEMMs run as IEEE fp32 (TF32 on CUDA when `tf32`), whatever the
    caller's global setting (`torch.set_float32_matmul_precision("medium")` makes CPU fp32 matmuls
    bf16); the setting is restored on exit. Uses the backend's `fp32_precision` (torch >= 2.9) and
    CUDA's `allow_tf32` before it; leaves a setting alone when it already holds the wanted value."""
    if device.type == "cuda":
        backend, want = torch.backends.cuda.matmul, "tf32" if tf32 else "ieee"
    elif device.type == "cpu":
        backend, want = getattr(torch.backends.mkldnn, "matmul", None), "ieee"
    else:
        return contextlib.nullcontext()
    if backend is not None and hasattr(backend, "fp32_precision"):
        name, old = "fp32_precision", backend.fp32_precision
        if old == want or (old == "none" and want == "ieee"):
            return contextlib.nullcontext()
    elif device.type == "cuda":
        name, old, want = "allow_tf32", backend.allow_tf32, bool(tf32)
        if old == want:
            return contextlib.nullcontext()
    else:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def scoped():
        setattr(backend, name, want)
        try:
            yield
        finally:
            setattr(backend, name, old)
    return scoped()


def _tf32_allowed_globally() -> bool:
    """The caller's CUDA fp32 matmul setting: TF32 (`torch.set_float32_matmul_precision("high")`,
    `torch.backends.cuda.matmul.allow_tf32 = True` or its `fp32_precision = "tf32"`)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def _torch_block(z, bias32, v0, tgt, state, inv_temp):
    """Epilogue of one block in torch ops (the Triton block kernel's steps): z `[r, n]` fp32 logits of
    vocabulary v0 .. v0 + n (our buffer: overwritten), tgt `[r]` int64, state `[3, r]` (m, d, z_t)."""
    n = z.shape[1]
    # 1. z = (logits + bias) / T, in place.
    if bias32 is not None:
        z.add_(bias32[v0:v0 + n])
    if inv_temp != 1.0:
        z.mul_(inv_temp)
    m, d, z_t = state[0], state[1], state[2]
    # 2. The target logit, if this block holds the target's column.
    local = tgt - v0
    inside = (local >= 0) & (local < n)
    picked = z.gather(1, local.clamp(0, n - 1).unsqueeze(1)).squeeze(1)
    z_t.copy_(torch.where(inside, picked, z_t))
    # 3. Online log-sum-exp, merged into the running state with the row kernel's -inf guard:
    #      m' = max(m, max z);  d' = d * exp(m - m') + sum exp(z - m')
    m_new = torch.maximum(m, z.amax(dim=1))
    m_safe = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
    d.mul_(torch.exp(m - m_safe)).add_(z.sub_(m_safe.unsqueeze(1)).exp_().sum(dim=1))
    m.copy_(m_new)


def _chunked_token_logp(hidden2d, weight, bias, targets, mask, inv_temp, *, epilogue, tf32, whole=False,
                        chunk_rows=None, vocab_chunk=None):
    """token_logp `[M]` of the chunked / materialise methods: the kept rows' logits in blocks of
    plan_chunks' shape, each block one fp32 GEMM and one epilogue ("torch" ops or the "triton" block
    kernel), rows skipped where the mask is 0."""
    M, H = hidden2d.shape
    V = weight.shape[0]
    device = hidden2d.device
    out = torch.zeros(M, dtype=torch.float32, device=device)
    rows = mask.nonzero().squeeze(1)
    K = rows.numel()
    if K == 0:
        return out
    plan = plan_chunks(M, K, V, H, hidden2d.dtype, weight.dtype, device, chunk_rows=chunk_rows,
                       vocab_chunk=vocab_chunk, whole=whole, has_bias=bias is not None)
    R, N = plan.rows, plan.vocab
    skip = K < M
    tgt = (targets.index_select(0, rows) if skip else targets).to(torch.int64).contiguous()
    bias32 = bias.to(torch.float32).contiguous() if bias is not None else None
    native = _native_low_precision_gemm(hidden2d.dtype, weight.dtype, device)
    upcast = not (native or hidden2d.dtype == weight.dtype == torch.float32)
    lp = torch.empty(K, dtype=torch.float32, device=device) if skip else out
    several = N < V  # a row's state lives across vocabulary blocks
    if epilogue == "torch":
        state = torch.empty((3, K), dtype=torch.float32, device=device)
        state[0].fill_(float("-inf"))
        state[1].zero_()
        state[2].fill_(float("-inf"))
    else:
        # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
        from mempo.kernels import answer_logprob as kern

        state = torch.empty((3, K), dtype=torch.float32, device=device) if several else lp
    buf = torch.empty(R * N, dtype=torch.float32, device=device)
    with contextlib.nullcontext() if native else _gemm_precision(device, tf32):
        for r0 in range(0, K, R):
            r = min(R, K - r0)
            h = hidden2d.index_select(0, rows[r0:r0 + r]) if skip else hidden2d[r0:r0 + r]
            if upcast:
                h = h.float()
            for v0 in range(0, V, N):
                n = min(N, V - v0)
                z = buf[: r * n].view(r, n)
                w = weight[v0:v0 + n]
                # 1. z = h @ w.T: fp32 out of bf16 / fp16 operands (cuBLAS), of fp32 ones (IEEE or TF32).
                if native:
                    torch.mm(h, w.t(), out_dtype=torch.float32, out=z)
                else:
                    torch.mm(h, (w.float() if upcast else w).t(), out=z)
                # 2. Bias, temperature and the online log-sum-exp of the block, into the rows' state.
                if epilogue == "torch":
                    _torch_block(z, bias32, v0, tgt[r0:r0 + r], state[:, r0:r0 + r], inv_temp)
                else:
                    kern.block_logp(z, bias32, tgt, state, lp, r0, v0, inv_temp, first=v0 == 0,
                                    last=v0 + n == V)
    # 3. log p = (z_t - m) - log d once every block is in (the block kernel did it at the last block).
    if epilogue == "torch":
        lp.copy_(_logp_from_parts(state[2], state[0], state[1]))
    if skip:
        out.index_copy_(0, rows, lp)
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


def _check_chunk_side(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, Integral) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return None if value is None else int(value)


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
    method: str = "chunked",
    chunk_rows: Optional[int] = None,
    vocab_chunk: Optional[int] = None,
    allow_tf32: Optional[bool] = None,
    backend: str = "auto",
) -> AnswerLogProb:
    """Same as `answer_logprob` on logits = hidden @ weight.T + bias, without materialising the `[M, V]`
    logits; forward only (no autograd). Row i's hidden state predicts targets[i] (the causal shift is
    the caller's). Only masked-in (kept) rows are computed.

    Methods, for the K kept rows, V vocabulary entries and z = (hidden @ weight.T + bias) / T:

    * "chunked" (default): blocks of R kept rows x N vocabulary entries (`plan_chunks`).
        1. z_blk = hidden[rows] @ weight[v0:v0+N].T        one GEMM per block into one reused fp32
                                                            [R, N] buffer (cuBLAS on CUDA)
        2. m' = max(m, max z_blk)                           online log-sum-exp per row, continued
           d' = d exp(m - m') + sum exp(z_blk - m')         across the row's vocabulary blocks
           z_t = z_blk[target - v0] if the block holds it   (epilogue: the Triton block kernel, one
                                                            program per row; torch ops on "torch")
        3. log p = (z_t - m) - log d                        after the row's last block
      Extra memory (the block, the hidden rows it gathers, per-row state) stays under max(1/8 of
      the materialised logits, i.e. M x V in the dtype of hidden @ weight.T, 8 MiB) and half the
      free device memory. Time is the GEMM's plus one fp32 read of each block, against the
      materialised path's write and read of M x V logits (the shape of Liger-Kernel's fused linear
      cross-entropy; tools/gpu_check.py times both). bf16 / fp16 operands go to cuBLAS as they are
      with an fp32 output (CUDA, torch >= 2.8; elsewhere they are upcast per block), so z is never
      rounded to the input dtype.
    * "materialise": the same with one [K, V] block (fp32 logits of the kept rows; the baseline).
    * "fused": the Triton kernel that builds logit tiles with `tl.dot` and never stores them (extra
      memory: a few fp32 values per row and vocabulary split; backend "triton" only; fp32 operands
      use its IEEE dot). Slower than the GEMM on large M (bench/RESULTS.md "GPU").

    Args:
        hidden: `[M, H]` or `[N, T, H]` final hidden states (fp32 / bf16 / fp16).
        weight: `[V, H]` lm_head weight (fp32 / bf16 / fp16). Operands of different dtypes meet in an
            fp32 GEMM (each upcast per block).
        targets, answer_mask, cu_seqlens, threshold, temperature, empty_value, backend: as in
            `answer_logprob`. Backend "triton" runs the chunked epilogue as a Triton kernel (and
            is the only backend of "fused"); "torch" runs it in torch ops.
        bias: optional `[V]` lm_head bias.
        method: "chunked" | "materialise" | "fused" (above).
        chunk_rows / vocab_chunk: method "chunked" only: fix the block's kept rows / vocabulary
            entries (None: planned from the memory budget; a fixed side may exceed it).
        allow_tf32: fp32 GEMMs (fp32 or mixed-dtype operands) on CUDA may use TF32 tensor cores:
            True / False, or None to follow the caller's setting (`torch.backends.cuda.matmul`,
            e.g. `torch.set_float32_matmul_precision("high")`). TF32 keeps 10 of the operands' 23
            mantissa bits. Error of log p against fp64, emulated on CPU at H = 896 / 3,584 and
            V = 151,936 (bench/exploratory/tf32_error.py, max over 64-512 rows): operands rounded to
            nearest 1e-3 (inputs like the GPU check's, logits ~N(0, 1)) to 5e-3 (a few hidden
            dimensions 30x the rest, as LLM "massive activations"); truncated 6.6e-3 to 1.5e-2. The
            GPU check measures cuBLAS's own TF32 GEMM against fp64. Otherwise the GEMM is IEEE fp32,
            whatever the global setting, as on CPU always (CPU has no TF32, and
            `set_float32_matmul_precision("medium")` would make its fp32 matmuls bf16). The global
            setting is switched for the op's GEMMs and restored (process-wide while they run, as
            torch has no per-call flag). Not for method "fused".

    Returns:
        AnswerLogProb, as `answer_logprob`.

    Raises:
        ValueError naming the argument or row, as `answer_logprob`; also an unknown method, block
        sides that are not positive ints (or given to a method without blocks), allow_tf32=True
        with method "fused", and method "fused" on a call that resolves to the torch backend.
    """
    log_threshold, inv_temp, empty_value = _check_scalars(threshold, temperature, empty_value)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    chunk_rows = _check_chunk_side("chunk_rows", chunk_rows)
    vocab_chunk = _check_chunk_side("vocab_chunk", vocab_chunk)
    if method != "chunked" and (chunk_rows is not None or vocab_chunk is not None):
        raise ValueError(f"chunk_rows / vocab_chunk shape the blocks of method 'chunked'; method {method!r} "
                         "has none (leave them None)")
    if allow_tf32 is not None and not isinstance(allow_tf32, bool):
        raise ValueError(f"allow_tf32 must be True, False or None, got {allow_tf32!r}")
    if allow_tf32 and method == "fused":
        raise ValueError("allow_tf32=True applies to the cuBLAS GEMM of methods 'chunked' / 'materialise'; "
                         "method 'fused' always uses its IEEE fp32 dot")
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
    M = hidden2d.shape[0]
    tensors = (hidden, weight, targets, answer_mask) + ((bias,) if bias is not None else ())
    use = resolve_backend(backend, *tensors)
    if method == "fused" and use != "triton":
        raise ValueError("method 'fused' is the Triton kernel: it needs backend 'triton', or 'auto' with CUDA "
                         f"tensors (this call resolved to backend {use!r}); method 'chunked' runs anywhere")
    _check_targets(tgt, mask, V, row_shape)
    C = _num_contexts(cu, row_shape)
    tf32 = _tf32_allowed_globally() if allow_tf32 is None else allow_tf32

    if method == "fused":
        # reason: `import mempo.ops` stays without triton (heavy; only the CUDA path launches kernels)
        from mempo.kernels import answer_logprob as kern

        mask_u8 = _mask_u8(mask)
        token_logp = torch.empty(M, dtype=torch.float32, device=hidden2d.device)
        kern.hidden_logp(hidden2d, weight, bias.contiguous() if bias is not None else None,
                         tgt.contiguous(), mask_u8, token_logp, inv_temp, interpret=interpreting())
    else:
        token_logp = _chunked_token_logp(hidden2d, weight, bias, tgt, mask, inv_temp, epilogue=use, tf32=tf32,
                                         whole=method == "materialise", chunk_rows=chunk_rows,
                                         vocab_chunk=vocab_chunk)
    _check_token_logp(token_logp, row_shape, "the logits hidden @ weight.T + bias")
    if use == "torch":
        keep, p, mean_logp, num_kept = _torch_segments(
            token_logp, mask, cu, seq_len, C, log_threshold, empty_value)
    else:
        keep, p, mean_logp, num_kept = _triton_segments(
            token_logp, _mask_u8(mask), cu, seq_len, C, log_threshold, empty_value)
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
