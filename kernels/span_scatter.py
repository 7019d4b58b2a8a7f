"""Triton kernel: the final MemPO token advantage, a segment-wise scatter of per-round values onto
`<mem>` spans fused with the broadcast of the per-trajectory outcome advantage.

    out[b, t] = (row_value[b] + sum_{k in spans of b, start_k <= t < end_k} span_value[k]) * mask[b, t]

Spans are in CSR form over trajectories (`span_offsets[b] : span_offsets[b + 1]`). One program per
(trajectory, token tile): every output element is written exactly once, by one program, with no
atomics, so the result is deterministic. Spans of one trajectory are expected not to overlap (the
op validates that before launching); the kernel itself would sum overlapping spans.
"""
import triton
import triton.language as tl

from mempo.kernels import _launch


@triton.jit
def _span_scatter_kernel(
    row_value_ptr,      # [B] fp32: per-trajectory value broadcast to every token (outcome advantage)
    span_value_ptr,     # [S] fp32: per-span value (normalised memory reward x weight)
    span_start_ptr,     # [S] int64
    span_end_ptr,       # [S] int64
    span_offsets_ptr,   # [B + 1] int64, CSR over trajectories
    mask_ptr,           # [B, L] any dtype (bool / int / float response mask)
    out_ptr,            # [B, L] fp32
    L,
    stride_mask,
    stride_out,
    BLOCK_L: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # int64: b * stride reaches 2**31 once B * L does
    tile = tl.program_id(1)
    t = tile * BLOCK_L + tl.arange(0, BLOCK_L)
    in_row = t < L

    # 1. Start from the trajectory's own value (broadcast over its tokens).
    acc = tl.zeros([BLOCK_L], dtype=tl.float32) + tl.load(row_value_ptr + b)

    # 2. Add the value of every span of this trajectory that covers the token.
    lo = tl.load(span_offsets_ptr + b)
    hi = tl.load(span_offsets_ptr + b + 1)
    for k in range(lo, hi):
        s = tl.load(span_start_ptr + k)
        e = tl.load(span_end_ptr + k)
        v = tl.load(span_value_ptr + k)
        acc += tl.where((t >= s) & (t < e), v, 0.0)

    # 3. Multiply by the response mask (tool and padding tokens carry no advantage) and store.
    m = tl.load(mask_ptr + b * stride_mask + t, mask=in_row, other=0).to(tl.float32)
    tl.store(out_ptr + b * stride_out + t, acc * m, mask=in_row)


def span_scatter(row_value, span_value, span_start, span_end, span_offsets, mask, out, block_l: int = 1024):
    """Launch over (B, cdiv(L, block_l)). `mask` and `out` are [B, L] with unit stride on L."""
    num_rows, length = out.shape
    if num_rows == 0 or length == 0:
        return out
    grid = (num_rows, triton.cdiv(length, block_l))
    with _launch.launch_device(row_value, span_value, span_start, span_end, span_offsets, mask, out):
        _span_scatter_kernel[grid](
            row_value, span_value, span_start, span_end, span_offsets, mask, out,
            length, mask.stride(0), out.stride(0), BLOCK_L=block_l,
        )
    return out
