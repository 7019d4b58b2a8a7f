"""Triton kernel: the memory pool key of every scored round, and the checks of the CSR round inputs.

One program per trajectory b walks its rounds `span_offsets[b] : span_offsets[b + 1]` and writes
each round's pool key: the trajectory's group id, or ``group id * STAGE_LIMIT + stage`` when the
rounds carry stages (one pool per (group, stage)). On the way it checks what the CSR form promises,
into the flags word (OR-ed atomically, only by a program that finds something): offsets that start
at 0, never decrease and end at S (`offsets_bit`), spans with 0 <= start <= end <= L (`spans_bit`),
stages in [0, STAGE_LIMIT) (`stages_bit`). Offsets are clamped into [0, S] before use, so any
offsets read and write in bounds; a round no valid program reaches keeps whatever `keys` held, which
only happens when the offsets flag is set. Nothing is read back on the host.
"""
import triton
import triton.language as tl

from mempo.kernels import _launch


@triton.jit
def _round_keys_kernel(
    span_offsets_ptr,   # [B + 1] int64, CSR over trajectories
    spans_ptr,          # [S, 2] int64 (start, end), contiguous
    stages_ptr,         # [S] int64 (HAS_STAGES)
    gid_ptr,            # [B] int64 group id of each trajectory
    keys_ptr,           # [S] int64 out: pool key of each round
    flags_ptr,          # [1] int32 validation flags, OR-ed
    B,
    S,
    L,
    offsets_bit,
    spans_bit,
    stages_bit,
    HAS_STAGES: tl.constexpr,
    STAGE_LIMIT: tl.constexpr,  # stages lie in [0, STAGE_LIMIT); a key is group id * STAGE_LIMIT + stage
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)  # the grid has max(B, 1) programs: with B = 0, offsets = [0] and S = 0
    cols = tl.arange(0, BLOCK)
    lo_raw = tl.load(span_offsets_ptr + b)
    hi_raw = tl.load(span_offsets_ptr + tl.minimum(b + 1, B))
    wrong = hi_raw < lo_raw
    wrong = wrong | ((b == 0) & (lo_raw != 0))
    wrong = wrong | ((b + 1 >= B) & (hi_raw != S))  # the last program also sees offsets[B]
    bad = tl.where(wrong, offsets_bit, 0)

    lo = tl.minimum(tl.maximum(lo_raw, 0), S)
    hi = tl.minimum(tl.maximum(hi_raw, lo), S)
    group = tl.load(gid_ptr + b, mask=b < B, other=0)
    span_wrong = tl.zeros([BLOCK], dtype=tl.int32)
    stage_wrong = tl.zeros([BLOCK], dtype=tl.int32)
    for first in range(lo, hi, BLOCK):
        k = first + cols
        m = k < hi
        start = tl.load(spans_ptr + 2 * k, mask=m, other=0)
        end = tl.load(spans_ptr + 2 * k + 1, mask=m, other=0)
        span_wrong |= (m & ((start < 0) | (end < start) | (end > L))).to(tl.int32)
        key = tl.zeros([BLOCK], dtype=tl.int64) + group
        if HAS_STAGES:
            stage = tl.load(stages_ptr + k, mask=m, other=0)
            stage_wrong |= (m & ((stage < 0) | (stage >= STAGE_LIMIT))).to(tl.int32)
            key = key * STAGE_LIMIT + stage
        tl.store(keys_ptr + k, key, mask=m)
    bad = bad | tl.where(tl.max(span_wrong, axis=0) > 0, spans_bit, 0)
    bad = bad | tl.where(tl.max(stage_wrong, axis=0) > 0, stages_bit, 0)
    if bad != 0:
        tl.atomic_or(flags_ptr, bad)


def round_keys(span_offsets, spans, stages, gid, keys, flags, length: int, stage_limit: int = 2 ** 31,
               offsets_bit: int = 0, spans_bit: int = 0, stages_bit: int = 0, block: int = 32):
    """Launch max(B, 1) programs (B = len(span_offsets) - 1) of one warp (a row has a few rounds).

    span_offsets int64 [B + 1]; spans int64 [S, 2] contiguous; stages int64 [S] or None; gid int64
    [B] (group ids in [0, 2**32) when stages are given, so that the key fits int64); keys int64 [S]
    (written); flags int32 [1]; length: L, the response length the spans must lie in.
    """
    num_rows = span_offsets.numel() - 1
    has_stages = stages is not None
    tensors = [t for t in (span_offsets, spans, stages, gid, keys, flags) if t is not None]
    with _launch.launch_device(*tensors):
        _round_keys_kernel[(max(num_rows, 1),)](
            span_offsets, spans, stages if has_stages else keys, gid, keys, flags, num_rows, keys.numel(),
            int(length), int(offsets_bit), int(spans_bit), int(stages_bit), HAS_STAGES=has_stages,
            STAGE_LIMIT=int(stage_limit), BLOCK=block, num_warps=1,
        )
    return keys
