"""Triton kernels: masked, thresholded answer log-probabilities (ALGORITHM.md section 4).

Four kernels, each with its launcher below it (the functional API, validation, chunk planning and
dispatch live in `mempo.ops.logprob`):

* `_row_logp_kernel`      one program per row of materialised logits `[M, V]`: online log-sum-exp
                          over BLOCK_V vocabulary tiles, target logit read directly -> token_logp.
* `_block_logp_kernel`    the epilogue of the chunked path: one program per row of a `[R, N]` fp32
                          logits block that cuBLAS wrote (R kept rows x N vocabulary entries from v0);
                          the row kernel's online log-sum-exp, continued from the row's running
                          (max, rescaled sum, target logit) of the earlier blocks, stored back, or
                          turned into token_logp at the row's last block.
* `_hidden_logp_kernel`   one program per (block of BLOCK_M rows, vocabulary split): logits tile
                          = hidden @ weight.T built with `tl.dot` over H chunks, never stored;
                          online log-sum-exp over the split's tiles -> per-split partials
                          (running max, rescaled sum, target logit).
  `_combine_kernel`       merges the per-split partials of each row, 32 splits at a time -> token_logp.
* `_segment_kernel`       one program per context over CSR offsets (or n*T for padded input):
                          keep, num_kept, mean_logp, P. Deterministic, no atomics.

Numeric conventions (shared with the torch path and the loop reference): every load is cast to
fp32 and all accumulation is fp32 (`tl.dot` takes native bf16/fp16 operands on a GPU); logits are
multiplied by `inv_temp` before the softmax; masked rows write 0.0 and never read their target;
-inf logits give -inf, never NaN, and a NaN / +inf logit leaves a NaN the op reports.
"""
import torch
import triton
import triton.language as tl

from mempo.kernels import _launch


# Splits the combine kernel merges per step: a 64 x 32 tile of each partial fits in registers on
# sm_90 without spills (register counts: bench/RESULTS.md, "Answer log-prob"; tools/aot_kernels.py).
COMBINE_MAX_SPLITS = 32


# ------------------------------------------------------------------------------------------------
# (a) row kernel: token log-prob from materialised logits
# ------------------------------------------------------------------------------------------------
@triton.jit
def _row_logp_kernel(
    logits_ptr,          # [M, V] fp32 / bf16 / fp16, last dim contiguous
    stride_row,          # elements between consecutive rows of logits
    targets_ptr,         # [M] int
    mask_ptr,            # [M] uint8 (answer_mask != 0)
    out_ptr,             # [M] fp32 token_logp
    V,
    inv_temp,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)

    # 1. Early exit: a masked row is not computed; its token_logp is defined as 0.0.
    active = tl.load(mask_ptr + row)
    if active == 0:
        tl.store(out_ptr + row, 0.0)
        return

    base = logits_ptr + row * stride_row
    cols = tl.arange(0, BLOCK_V)
    m = float("-inf")  # running max of z = logits / T
    d = 0.0            # running sum of exp(z - m)

    # 2. Online log-sum-exp over the vocabulary, one BLOCK_V tile at a time:
    #      m' = max(m, max_tile z)
    #      d' = d * exp(m - m') + sum_tile exp(z - m')
    #    Lanes past V load -inf (exp(-inf) = 0). If m' is still -inf (every logit so far -inf),
    #    subtract 0 instead, so that -inf - -inf cannot produce NaN.
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + cols
        z = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_temp
        m_new = tl.maximum(m, tl.max(z, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
        m = m_new

    # 3. log p(target) = (z_target - m) - log d, subtracting the max first (z_t - m is exact-ish
    #    even for logits ~1e4, where m + log d would round to the fp32 grid of 1e4). Since d >= 1
    #    whenever m is finite and z_t <= m, the result is <= 0 by construction.
    #    If every logit is -inf (m = -inf, d = 0), z_t is -inf too: with m -> 0 and d -> 1 the
    #    result is -inf, with no NaN even as an intermediate.
    target = tl.load(targets_ptr + row).to(tl.int64)
    z_t = tl.load(base + target).to(tl.float32) * inv_temp
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    logp = (z_t - m_safe) - tl.log(tl.where(d == 0.0, 1.0, d))  # a NaN d (NaN / +inf logit) stays NaN
    tl.store(out_ptr + row, logp)


def row_logp(logits, targets, mask_u8, out, inv_temp: float, block_v: int = None):
    """Launch one program per row. logits `[M, V]` (stride(1) == 1), targets `[M]` int, mask_u8
    `[M]` uint8, out `[M]` fp32 (written entirely: 0.0 on masked rows)."""
    M, V = logits.shape
    if M == 0:
        return out
    if block_v is None:
        block_v = min(4096, triton.next_power_of_2(V))
    num_warps = 8 if block_v >= 2048 else 4
    targets = targets.to(torch.int64)  # one kernel variant for every integer dtype ([M]: a negligible copy)
    with _launch.launch_device(logits, targets, mask_u8, out):
        _row_logp_kernel[(M,)](
            logits, logits.stride(0), targets, mask_u8, out, V, float(inv_temp),
            BLOCK_V=block_v, num_warps=num_warps,
        )
    return out


# ------------------------------------------------------------------------------------------------
# (a') block kernel: the chunked path's epilogue over one cuBLAS logits block
# ------------------------------------------------------------------------------------------------
# row0, v0 and K are offsets: left unspecialised, so that each block of a call compiles to one variant.
@triton.jit(do_not_specialize=["row0", "v0", "K"])
def _block_logp_kernel(
    block_ptr,           # [R, N] fp32 logits block (no bias, no temperature), last dim contiguous
    stride_row,          # elements between consecutive rows of the block
    bias_ptr,            # [V] fp32 or dummy
    targets_ptr,         # [K] int64: targets of the kept rows
    state_ptr,           # [3, K] fp32: running max m, rescaled sum d, target logit z_t per kept row
    out_ptr,             # [K] fp32 token_logp of the kept rows (written at the last block only)
    row0,                # kept row of the block's first row
    N,                   # vocabulary entries in the block
    v0,                  # vocabulary index of the block's first column
    K,                   # kept rows (the stride between the three state vectors)
    inv_temp,
    HAS_BIAS: tl.constexpr,
    FIRST: tl.constexpr,  # the row's first block: the state starts at (-inf, 0, -inf), nothing is read
    LAST: tl.constexpr,   # the row's last block: write token_logp instead of the state
    BLOCK_V: tl.constexpr,
):
    r = tl.program_id(0).to(tl.int64)
    k = row0 + r
    base = block_ptr + r * stride_row
    cols = tl.arange(0, BLOCK_V)

    # 1. The row's running state from the earlier vocabulary blocks (m: max of z, d: sum exp(z - m),
    #    z_t: the target logit if an earlier block held it).
    if FIRST:
        m = float("-inf")
        d = 0.0
        z_t = float("-inf")
    else:
        m = tl.load(state_ptr + k)
        d = tl.load(state_ptr + K + k)
        z_t = tl.load(state_ptr + 2 * K + k)

    # 2. Online log-sum-exp over the block, z = (logits + bias) / T, exactly as the row kernel:
    #      m' = max(m, max_tile z);  d' = d * exp(m - m') + sum_tile exp(z - m')
    #    (lanes past N load -inf; subtract 0 while every z so far is -inf, so -inf - -inf never occurs).
    for c0 in range(0, N, BLOCK_V):
        offs = c0 + cols
        ok = offs < N
        z = tl.load(base + offs, mask=ok, other=float("-inf"))
        if HAS_BIAS:
            z += tl.load(bias_ptr + v0 + offs, mask=ok, other=0.0)
        z = z * inv_temp
        m_new = tl.maximum(m, tl.max(z, axis=0))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe), axis=0)
        m = m_new

    # 3. The target logit, read directly if this block holds the target's column.
    local = tl.load(targets_ptr + k) - v0
    inside = (local >= 0) & (local < N)
    picked = tl.load(base + local, mask=inside, other=float("-inf"))
    if HAS_BIAS:
        picked += tl.load(bias_ptr + v0 + local, mask=inside, other=0.0)
    z_t = tl.where(inside, picked * inv_temp, z_t)

    # 4. Last block: log p = (z_t - m) - log d, the max subtracted first and the all -inf row giving
    #    -inf, never NaN (the row kernel's step 3). Otherwise the state goes back for the next block.
    if LAST:
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        logp = (z_t - m_safe) - tl.log(tl.where(d == 0.0, 1.0, d))  # a NaN d (NaN / +inf logit) stays NaN
        tl.store(out_ptr + k, logp)
    else:
        tl.store(state_ptr + k, m)
        tl.store(state_ptr + K + k, d)
        tl.store(state_ptr + 2 * K + k, z_t)


def block_logp(block, bias, targets, state, out, row0: int, v0: int, inv_temp: float, *, first: bool,
               last: bool, block_v: int = None):
    """Launch one program per row of `block` `[R, N]` fp32 (stride(1) == 1): the logits of kept rows
    row0 .. row0 + R - 1 over vocabulary entries v0 .. v0 + N - 1. bias `[V]` fp32 or None, targets
    `[K]` int64, state `[3, K]` fp32 (read unless `first`, written unless `last`), out `[K]` fp32
    (written at `last`)."""
    R, N = block.shape
    if R == 0:
        return out
    if block_v is None:
        block_v = min(4096, triton.next_power_of_2(N))
    num_warps = 8 if block_v >= 2048 else 4
    K = targets.numel()
    tensors = (block, targets, state, out) + ((bias,) if bias is not None else ())
    with _launch.launch_device(*tensors):
        _block_logp_kernel[(R,)](
            block, block.stride(0), bias if bias is not None else block, targets, state, out,
            row0, N, v0, K, float(inv_temp),
            HAS_BIAS=bias is not None, FIRST=bool(first), LAST=bool(last), BLOCK_V=block_v,
            num_warps=num_warps,
        )
    return out


# ------------------------------------------------------------------------------------------------
# (b) fused kernel: token log-prob from hidden states and the lm_head, logits never stored
# ------------------------------------------------------------------------------------------------
@triton.jit
def _hidden_logp_kernel(
    hidden_ptr, stride_hm, stride_hh,   # [M, H]
    weight_ptr, stride_wv, stride_wh,   # [V, H] (lm_head weight)
    bias_ptr,                           # [V] or dummy
    targets_ptr,                        # [M] int
    mask_ptr,                           # [M] uint8
    part_m_ptr, part_d_ptr, part_t_ptr, # [NUM_SPLITS, M] fp32 partials
    M, V, H,
    inv_temp,
    V_PER_SPLIT,                        # vocabulary entries per split (multiple of BLOCK_V)
    HAS_BIAS: tl.constexpr,
    DOT_FP32: tl.constexpr,             # cast operands to fp32 (fp32 inputs, or the interpreter)
    BLOCK_M: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_m.to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    part = pid_s.to(tl.int64) * M + rows

    # 1. Early exit: a block whose rows are all masked (or past M) computes nothing. The partials
    #    it writes (m = -inf, d = 0, z_t = -inf) are ignored by the combine kernel for masked rows.
    active = (tl.load(mask_ptr + rows, mask=row_ok, other=0) != 0) & row_ok
    n_active = tl.sum(active.to(tl.int32), axis=0)
    if n_active == 0:
        tl.store(part_m_ptr + part, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok)
        tl.store(part_d_ptr + part, tl.zeros([BLOCK_M], tl.float32), mask=row_ok)
        tl.store(part_t_ptr + part, tl.full([BLOCK_M], float("-inf"), tl.float32), mask=row_ok)
        return

    # Masked rows inside an active block read target -1 (never matches) and zero hidden states.
    target = tl.load(targets_ptr + rows, mask=active, other=-1).to(tl.int64)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)    # running max of z
    d = tl.zeros([BLOCK_M], tl.float32)                   # running sum of exp(z - m)
    z_t = tl.full([BLOCK_M], float("-inf"), tl.float32)  # target logit, if it lies in this split

    v_start = pid_s * V_PER_SPLIT
    v_stop = tl.minimum(V, v_start + V_PER_SPLIT)
    offs_v = tl.arange(0, BLOCK_V)
    offs_h = tl.arange(0, BLOCK_H)
    for v0 in range(v_start, v_stop, BLOCK_V):
        cols = v0 + offs_v
        col_ok = cols < v_stop

        # 2. Logit tile z = (hidden[rows] @ weight[cols].T + bias[cols]) / T, accumulated in fp32
        #    over H in BLOCK_H chunks. The weight tile is read transposed ([BLOCK_H, BLOCK_V]).
        acc = tl.zeros([BLOCK_M, BLOCK_V], tl.float32)
        for h0 in range(0, H, BLOCK_H):
            hh = h0 + offs_h
            h_ok = hh < H
            # int64 offsets throughout: a transposed view (stride_wh = V) makes hh * stride_wh reach H * V.
            hh64 = hh.to(tl.int64)
            a = tl.load(hidden_ptr + rows[:, None] * stride_hm + hh64[None, :] * stride_hh,
                        mask=active[:, None] & h_ok[None, :], other=0.0)
            b = tl.load(weight_ptr + cols[None, :].to(tl.int64) * stride_wv + hh64[:, None] * stride_wh,
                        mask=col_ok[None, :] & h_ok[:, None], other=0.0)
            if DOT_FP32:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
        z = acc * inv_temp
        # 3. Lanes past the split's end (the last, partial tile) become -inf before the max.
        z = tl.where(col_ok[None, :], z, float("-inf"))

        # 4. The target logit is picked up in the tile that holds it (at most one lane per row).
        hit = cols[None, :].to(tl.int64) == target[:, None]
        z_t = tl.maximum(z_t, tl.max(tl.where(hit, z, float("-inf")), axis=1))

        # 5. Online log-sum-exp, per row, with the -inf guard of the row kernel:
        #      m' = max(m, max_tile z);  d' = d * exp(m - m') + sum_tile exp(z - m')
        m_new = tl.maximum(m, tl.max(z, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d = d * tl.exp(m - m_safe) + tl.sum(tl.exp(z - m_safe[:, None]), axis=1)
        m = m_new

    tl.store(part_m_ptr + part, m, mask=row_ok)
    tl.store(part_d_ptr + part, d, mask=row_ok)
    tl.store(part_t_ptr + part, z_t, mask=row_ok)


@triton.jit
def _combine_kernel(
    part_m_ptr, part_d_ptr, part_t_ptr,  # [NUM_SPLITS, M] fp32
    mask_ptr,                            # [M] uint8
    out_ptr,                             # [M] fp32 token_logp
    M, NUM_SPLITS,
    BLOCK_M: tl.constexpr,
    BLOCK_S: tl.constexpr,               # splits merged per step (a loop covers any NUM_SPLITS)
):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < M
    offs_s = tl.arange(0, BLOCK_S)

    # 1. Merge BLOCK_S splits at a time, online (a [BLOCK_M, NUM_SPLITS] tile spills at hundreds
    #    of splits): mx' = max(mx, max_s m_s), d' = d * exp(mx - mx') + sum_s d_s * exp(m_s - mx'),
    #    with the -inf guard of the row kernel (subtract 0 while every m so far is -inf).
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    d = tl.zeros([BLOCK_M], tl.float32)
    z_t = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s0 in range(0, NUM_SPLITS, BLOCK_S):
        splits = s0 + offs_s
        ok = row_ok[:, None] & (splits[None, :] < NUM_SPLITS)
        idx = splits[None, :].to(tl.int64) * M + rows[:, None]
        pm = tl.load(part_m_ptr + idx, mask=ok, other=float("-inf"))
        pd = tl.load(part_d_ptr + idx, mask=ok, other=0.0)
        pt = tl.load(part_t_ptr + idx, mask=ok, other=float("-inf"))
        m_new = tl.maximum(m, tl.max(pm, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        d = d * tl.exp(m - m_safe) + tl.sum(pd * tl.exp(pm - m_safe[:, None]), axis=1)
        m = m_new
        # Exactly one split holds the target logit; the others report -inf.
        z_t = tl.maximum(z_t, tl.max(pt, axis=1))

    # 2. log p = (z_t - mx) - log d (max subtracted first, as in the row kernel). d = 0 only for
    #    masked rows and rows whose logits are all -inf (then z_t = -inf as well): -inf, never NaN.
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    log_d = tl.log(tl.where(d == 0.0, 1.0, d))  # NaN (a NaN / +inf logit) stays NaN: the op reports it
    logp = (z_t - m_safe) - log_d

    # 3. Masked rows report 0.0.
    active = tl.load(mask_ptr + rows, mask=row_ok, other=0) != 0
    tl.store(out_ptr + rows, tl.where(active, logp, 0.0), mask=row_ok)


def _default_hidden_config(M, V, H, device, interpret: bool, dot_fp32: bool, aligned: bool = True):
    """(block_m, block_v, block_h, num_splits, num_warps, num_stages, maxnreg) for the fused kernel.

    Fixed configs (no autotune), the largest that compile for sm_90 without spills (checked ahead
    of time by tools/aot_kernels.py; tests/tools/test_aot_kernels.py fails on any spill; register
    counts in bench/RESULTS.md, "Answer log-prob"; times on an H200 in "GPU"). The bf16/fp16
    configs use wgmma."""
    if interpret:
        # Few, large tiles: the interpreter pays per operation, not per element.
        block_v = max(16, min(1024, triton.next_power_of_2(V)))
        block_h = max(16, min(64, triton.next_power_of_2(H)))
        return 16, block_v, block_h, 1, 4, 1, None
    if dot_fp32:
        # ptxas holds these variants to 128 registers and spills (12-36 bytes at 64 x 128 x 16, Triton
        # 3.6, the first GPU check) unless allowed more: at 64 x 64 x 16 with up to 255 none spills
        # (tools/aot_kernels.py with Triton 3.6 and 3.9), at a cost: 197 ms against the spilling
        # config's 114 at M 4,608 x H 896 on an H200 (materialised logits: 26 ms).
        block_m, block_v, block_h, num_warps, num_stages, maxnreg = 64, 64, 16, 8, 2, 255
    elif aligned:
        # 1.55-1.76x faster than 64 x 128 x 64 / 3 stages on an H200 (bench/exploratory/fused_configs.py,
        # bench/RESULTS.md "GPU"); spills when H or a row stride is not a multiple of 16, hence `aligned`.
        block_m, block_v, block_h, num_warps, num_stages, maxnreg = 128, 128, 64, 8, 4, None
    else:
        block_m, block_v, block_h, num_warps, num_stages, maxnreg = 64, 128, 64, 8, 3, None
    num_splits = vocab_splits(M, V, block_m, block_v, device)
    return block_m, block_v, block_h, num_splits, num_warps, num_stages, maxnreg


def vocab_splits(M, V, block_m: int, block_v: int, device) -> int:
    """How many vocabulary splits the fused kernel runs for `block_m` x `block_v` tiles on `device`."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    row_blocks = triton.cdiv(M, block_m)
    # Split the vocabulary until there are about 4 programs per SM (M is often small: 1-5k rows).
    # Programs with the same split run side by side (axis 0 is fastest), sharing weight tiles in L2.
    return max(1, min(triton.cdiv(4 * sms, row_blocks), triton.cdiv(V, block_v)))


def hidden_logp(hidden, weight, bias, targets, mask_u8, out, inv_temp: float, *, interpret: bool,
                block_m: int = None, block_v: int = None, block_h: int = None,
                num_splits: int = None):
    """Launch the fused kernel and the combine kernel. hidden `[M, H]`, weight `[V, H]`, bias `[V]`
    or None, targets `[M]` int, mask_u8 `[M]` uint8, out `[M]` fp32 (written entirely).
    Block sizes and the number of vocabulary splits default to a fixed config (no autotune)."""
    M, H = hidden.shape
    V = weight.shape[0]
    if M == 0:
        return out
    # fp32 (IEEE) dot for fp32 or mixed operands, and under the interpreter (its bf16 dot is wrong).
    dot_fp32 = interpret or hidden.dtype == torch.float32 or weight.dtype == torch.float32 \
        or hidden.dtype != weight.dtype
    # Triton specialises integers divisible by 16; the large bf16/fp16 tiles fit in registers only then.
    aligned = H % 16 == 0 and hidden.stride(0) % 16 == 0 and weight.stride(0) % 16 == 0
    cfg = _default_hidden_config(M, V, H, hidden.device, interpret, dot_fp32, aligned)
    block_m = block_m or cfg[0]
    block_v = block_v or cfg[1]
    block_h = block_h or cfg[2]
    num_splits = num_splits or cfg[3]
    num_warps, num_stages, maxnreg = cfg[4], cfg[5], cfg[6]
    # Each split covers a whole number of BLOCK_V tiles; drop splits that would be empty.
    v_per_split = triton.cdiv(triton.cdiv(V, num_splits), block_v) * block_v
    num_splits = triton.cdiv(V, v_per_split)

    # One kernel variant for every integer target dtype and every bias dtype ([M] and [V]: negligible copies).
    targets = targets.to(torch.int64)
    bias = bias.to(torch.float32) if bias is not None else None
    part = torch.empty((3, num_splits, M), dtype=torch.float32, device=hidden.device)
    grid = (triton.cdiv(M, block_m), num_splits)
    tensors = (hidden, weight, targets, mask_u8, out) + ((bias,) if bias is not None else ())
    with _launch.launch_device(*tensors):
        _hidden_logp_kernel[grid](
            hidden, hidden.stride(0), hidden.stride(1),
            weight, weight.stride(0), weight.stride(1),
            bias if bias is not None else hidden,
            targets, mask_u8,
            part[0], part[1], part[2],
            M, V, H, float(inv_temp), v_per_split,
            HAS_BIAS=bias is not None, DOT_FP32=bool(dot_fp32),
            BLOCK_M=block_m, BLOCK_V=block_v, BLOCK_H=block_h,
            num_warps=num_warps, num_stages=num_stages, maxnreg=maxnreg,
        )
    combine_block_m = 64
    with _launch.launch_device(part, mask_u8, out):
        _combine_kernel[(triton.cdiv(M, combine_block_m),)](
            part[0], part[1], part[2], mask_u8, out, M, num_splits,
            BLOCK_M=combine_block_m, BLOCK_S=min(COMBINE_MAX_SPLITS, max(2, triton.next_power_of_2(num_splits))),
        )
    return out


# ------------------------------------------------------------------------------------------------
# (c) segment kernel: keep, num_kept, mean, P per context (CSR offsets or padded n*T)
# ------------------------------------------------------------------------------------------------
@triton.jit
def _segment_kernel(
    logp_ptr,            # [M] fp32 token_logp
    mask_ptr,            # [M] uint8
    cu_seqlens_ptr,      # [C + 1] int (IS_VARLEN) or dummy
    keep_ptr,            # [M] uint8 out
    p_ptr,               # [C] fp32 out
    mean_ptr,            # [C] fp32 out
    count_ptr,           # [C] int64 out
    T,                   # rows per context when not IS_VARLEN
    log_threshold,
    empty_value,
    HAS_THRESHOLD: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    BLOCK_T: tl.constexpr,
):
    c = tl.program_id(0).to(tl.int64)
    # 1. Row range of context c: CSR offsets, or n*T .. (n+1)*T for padded input (one kernel body).
    if IS_VARLEN:
        bos = tl.load(cu_seqlens_ptr + c).to(tl.int64)
        eos = tl.load(cu_seqlens_ptr + c + 1).to(tl.int64)
    else:
        bos = c * T
        eos = bos + T

    # 2. keep_i = mask_i and logp_i > log(threshold); sum and count the kept rows in fp32 / int32.
    offs = tl.arange(0, BLOCK_T)
    total = tl.zeros([BLOCK_T], tl.float32)
    count = tl.zeros([BLOCK_T], tl.int32)
    for start in range(bos, eos, BLOCK_T):
        rows = start + offs
        ok = rows < eos
        lp = tl.load(logp_ptr + rows, mask=ok, other=0.0)
        keep = (tl.load(mask_ptr + rows, mask=ok, other=0) != 0) & ok
        if HAS_THRESHOLD:
            keep = keep & (lp > log_threshold)
        tl.store(keep_ptr + rows, keep.to(tl.uint8), mask=ok)
        total += tl.where(keep, lp, 0.0)
        count += keep.to(tl.int32)
    s = tl.sum(total, axis=0)
    n = tl.sum(count, axis=0)

    # 3. mean = s / n and P = exp(mean); no kept row: P = empty_value, mean = 0 (never 0/0).
    has = n > 0
    mean = s / tl.maximum(n, 1).to(tl.float32)
    tl.store(p_ptr + c, tl.where(has, tl.exp(mean), empty_value))
    tl.store(mean_ptr + c, tl.where(has, mean, 0.0))
    tl.store(count_ptr + c, n.to(tl.int64))


def segment_reduce(token_logp, mask_u8, cu_seqlens, keep_u8, p, mean_logp, num_kept, *,
                   num_contexts: int, seq_len: int, log_threshold, empty_value: float,
                   block_t: int = None):
    """Launch one program per context. `cu_seqlens` `[C + 1]` int (varlen) or None (padded: context
    n is rows n*seq_len .. (n+1)*seq_len). `log_threshold` None disables the threshold. Outputs:
    keep_u8 `[M]` uint8, p / mean_logp `[C]` fp32, num_kept `[C]` int64 (each written entirely)."""
    if num_contexts == 0:
        return
    if block_t is None:
        if cu_seqlens is None:
            longest = seq_len
        else:
            longest = token_logp.numel() // max(1, num_contexts)
        block_t = max(16, min(1024, triton.next_power_of_2(max(1, longest))))
    tensors = (token_logp, mask_u8, keep_u8, p, mean_logp, num_kept) + ((cu_seqlens,) if cu_seqlens is not None else ())
    with _launch.launch_device(*tensors):
        _segment_kernel[(num_contexts,)](
            token_logp, mask_u8, cu_seqlens if cu_seqlens is not None else token_logp,
            keep_u8, p, mean_logp, num_kept,
            int(seq_len), float(log_threshold) if log_threshold is not None else 0.0, float(empty_value),
            HAS_THRESHOLD=log_threshold is not None, IS_VARLEN=cu_seqlens is not None,
            BLOCK_T=block_t,
        )
