"""Triton kernel: grouped mean/std normalisation (z-score) over CSR groups.

One program per group; deterministic (no atomics). Items of group g are
`values[perm[group_offsets[g] : group_offsets[g + 1]]]`, i.e. `perm` lists item indices sorted by
group. Conventions (shared with the torch path in `mempo.ops.advantage`): fp32 accumulation,
unbiased (Bessel) std, `epsilon` added to the std, a group of one either passes its value through
with mean 0 / std 1 (verl GRPO) or gives 0 (memory-reward pools).
"""
import triton
import triton.language as tl

from mempo.ops import _dispatch


@triton.jit
def _group_zscore_kernel(
    values_ptr,          # [n] any float dtype
    perm_ptr,            # [n] int64, item indices sorted by group
    group_offsets_ptr,   # [G + 1] int64, CSR offsets into perm
    out_ptr,             # [n] fp32, written at perm positions
    epsilon,
    NORM_BY_STD: tl.constexpr,
    SINGLETON_ZERO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    g = tl.program_id(0)
    lo = tl.load(group_offsets_ptr + g)
    hi = tl.load(group_offsets_ptr + g + 1)
    count = hi - lo
    cols = tl.arange(0, BLOCK)

    # 1. Empty group: nothing to write.
    if count > 0:
        # 2. mean = sum(x) / n, accumulated in fp32 block by block.
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            acc += tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / count.to(tl.float32)

        # 3. Unbiased variance from the centred values (two passes: no cancellation).
        acc2 = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            x = tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float32)
            d = tl.where(m, x - mean, 0.0)
            acc2 += d * d
        denom = tl.maximum(count - 1, 1).to(tl.float32)
        std = tl.sqrt(tl.sum(acc2, axis=0) / denom)

        # 4. A group of one: verl's GRPO uses mean 0 / std 1 (value passes through); memory pools give 0.
        single = count == 1
        mean = tl.where(single, 0.0, mean)
        std = tl.where(single, 1.0, std)
        scale = 1.0 / (std + epsilon) if NORM_BY_STD else 1.0

        # 5. Write (x - mean) * scale back to each item's own position.
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            x = tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float32)
            z = (x - mean) * scale
            if SINGLETON_ZERO:
                z = tl.where(single, 0.0, z)
            tl.store(out_ptr + item, z, mask=m)


def group_zscore(values, perm, group_offsets, out, epsilon: float, norm_by_std: bool, singleton_zero: bool,
                 block: int = 128):
    """Launch one program per group. `out` must be a contiguous fp32 tensor of len(values)."""
    num_groups = group_offsets.numel() - 1
    if num_groups <= 0 or values.numel() == 0:
        return out
    with _dispatch.launch_device(values, perm, group_offsets, out):
        _group_zscore_kernel[(num_groups,)](
            values, perm, group_offsets, out, float(epsilon),
            NORM_BY_STD=bool(norm_by_std), SINGLETON_ZERO=bool(singleton_zero), BLOCK=block,
        )
    return out
