"""Triton kernel: the final MemPO token advantage, a segment-wise scatter of per-round values onto
`<mem>` spans fused with the broadcast of the per-trajectory outcome advantage.

    out[b, t] = (row_value[b] + sum_{k in spans of b, start_k <= t < end_k} span_value[k]) * mask[b, t]

Spans are in CSR form over trajectories (`span_offsets[b] : span_offsets[b + 1]`). One program per
(trajectory, token tile): every output element is written exactly once, by one program, with no
atomics, so the result is deterministic. The kernel also validates what only it reads in full, into
the flags word (OR-ed atomically, only by a program that finds something): two spans of a row that
cover one token (`overlap_bit`), and a float mask entry that is not finite or beyond 2^63 in
magnitude (`mask_bit`). Offsets are clamped into [0, S] before use, so any offsets read in bounds
(their validity is checked by the round-keys kernel); overlapping spans would be summed.
"""
import triton
import triton.language as tl

from mempo.kernels import _launch


@triton.jit
def _span_scatter_kernel(
    row_value_ptr,      # [B] fp32: per-trajectory value broadcast to every token (HAS_ROW_VALUE)
    span_value_ptr,     # [S] fp32: per-span value (normalised memory reward x weight) (HAS_SPANS)
    spans_ptr,          # [S, 2] int64 (start, end), contiguous (HAS_SPANS)
    span_offsets_ptr,   # [B + 1] int64, CSR over trajectories (HAS_SPANS)
    mask_ptr,           # [B, L] any dtype (bool / int / float response mask)
    out_ptr,            # [B, L] fp32
    flags_ptr,          # [1] int32 validation flags, OR-ed
    L,
    S,
    stride_mask,
    stride_out,
    overlap_bit,
    mask_bit,
    mask_limit: tl.float64,  # largest |mask entry| (CHECK_MASK)
    HAS_ROW_VALUE: tl.constexpr,
    HAS_SPANS: tl.constexpr,
    CHECK_MASK: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # int64: b * stride reaches 2**31 once B * L does
    tile = tl.program_id(1)
    t = tile * BLOCK_L + tl.arange(0, BLOCK_L)
    in_row = t < L
    bad = 0

    # 1. Start from the trajectory's own value (broadcast over its tokens).
    acc = tl.zeros([BLOCK_L], dtype=tl.float32)
    if HAS_ROW_VALUE:
        acc += tl.load(row_value_ptr + b)

    # 2. Add the value of every span of this trajectory that covers the token; count the spans per token.
    if HAS_SPANS:
        lo = tl.minimum(tl.maximum(tl.load(span_offsets_ptr + b), 0), S)
        hi = tl.minimum(tl.maximum(tl.load(span_offsets_ptr + b + 1), lo), S)
        cover = tl.zeros([BLOCK_L], dtype=tl.int32)
        for k in range(lo, hi):
            s = tl.load(spans_ptr + 2 * k)
            e = tl.load(spans_ptr + 2 * k + 1)
            v = tl.load(span_value_ptr + k)
            inside = (t >= s) & (t < e)
            acc += tl.where(inside, v, 0.0)
            cover += inside.to(tl.int32)
        overlap = tl.max(tl.where(in_row, cover, 0), axis=0) > 1
        bad = bad | tl.where(overlap, overlap_bit, 0)

    # 3. Multiply by the response mask (tool and padding tokens carry no advantage) and store.
    m = tl.load(mask_ptr + b * stride_mask + t, mask=in_row, other=0)
    if CHECK_MASK:
        weight = m.to(tl.float64)  # exact for every float dtype; NaN fails the comparison
        wrong = in_row & ~(tl.abs(weight) <= mask_limit)
        bad = bad | tl.where(tl.max(wrong.to(tl.int32), axis=0) > 0, mask_bit, 0)
    tl.store(out_ptr + b * stride_out + t, acc * m.to(tl.float32), mask=in_row)
    if bad != 0:
        tl.atomic_or(flags_ptr, bad)


def span_scatter(row_value, span_value, spans, span_offsets, mask, out, flags, overlap_bit: int = 0,
                 mask_bit: int = 0, mask_limit: float = 2.0 ** 63, block_l: int = 1024):
    """Launch over (B, cdiv(L, block_l)). `mask` and `out` are [B, L] with unit stride on L.

    row_value: fp32 [B] or None (0); span_value fp32 [S], spans int64 [S, 2] (contiguous),
    span_offsets int64 [B + 1]: the spans, or all None (no spans); flags: int32 [1]. mask_bit: the
    flag bit of a float mask entry outside [-mask_limit, mask_limit] or NaN (0: not checked).
    """
    num_rows, length = out.shape
    if num_rows == 0 or length == 0:  # nothing to write, nor to check (no token to cover twice)
        return out
    has_row_value, has_spans = row_value is not None, spans is not None
    check_mask = bool(mask_bit) and mask.dtype.is_floating_point
    grid = (num_rows, triton.cdiv(length, block_l))
    tensors = [t for t in (row_value, span_value, spans, span_offsets, mask, out, flags) if t is not None]
    with _launch.launch_device(*tensors):
        _span_scatter_kernel[grid](
            row_value if has_row_value else out, span_value if has_spans else out, spans if has_spans else flags,
            span_offsets if has_spans else flags, mask, out, flags, length,
            spans.shape[0] if has_spans else 0, mask.stride(0), out.stride(0), int(overlap_bit), int(mask_bit),
            float(mask_limit), HAS_ROW_VALUE=has_row_value, HAS_SPANS=has_spans, CHECK_MASK=check_mask,
            BLOCK_L=block_l,
        )
    return out
