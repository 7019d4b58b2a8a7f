"""Triton kernel: grouped mean/std normalisation (z-score) over CSR groups.

One program per group; deterministic (no atomics). Items of group g are
`values[perm[group_offsets[g] : group_offsets[g + 1]]]`, i.e. `perm` lists item indices sorted by
group. Conventions (shared with the torch path in `mempo.ops.advantage`): fp64 statistics (values
of any float dtype are loaded and widened, so sums of values near the fp32 limit cannot overflow),
unbiased (Bessel) std floored at `std_floor` (0: no floor), `epsilon` added to it, a group of one
either passes its value through with mean 0 / std 1 (verl GRPO) or gives 0 (memory-reward pools);
results are saturated at +-`value_limit` and stored as fp32.
"""
import triton
import triton.language as tl

from mempo.kernels import _launch


@triton.jit
def _group_zscore_kernel(
    values_ptr,          # [n] any float dtype
    perm_ptr,            # [n] int64, item indices sorted by group
    group_offsets_ptr,   # [G + 1] int64, CSR offsets into perm
    out_ptr,             # [n] fp32, written at perm positions
    epsilon,             # a positive normal fp32 (validated by the op)
    std_floor,           # >= 0, a finite fp32 (validated by the op); 0: no floor
    value_limit,         # results saturate at +-value_limit
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
        # 2. Scale a = the largest |x| of the group (1 if all are 0): statistics of y = x / a, in
        #    [-1, 1], so no fp64 sum or square overflows whatever the inputs.
        amax = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            amax = tl.maximum(amax, tl.abs(tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float64)))
        a = tl.max(amax, axis=0)
        a = tl.where(a > 0.0, a, 1.0)

        # 3. mean of y, accumulated in fp64 block by block.
        acc = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            acc += tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float64) / a
        mean = tl.sum(acc, axis=0) / count.to(tl.float64)

        # 4. Unbiased variance of y from the centred values (two passes: no cancellation).
        acc2 = tl.zeros([BLOCK], dtype=tl.float64)
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            y = tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float64) / a
            d = tl.where(m, y - mean, 0.0)
            acc2 += d * d
        denom = tl.maximum(count - 1, 1).to(tl.float64)
        std = tl.sqrt(tl.sum(acc2, axis=0) / denom)
        # (x - mean) / (max(std, floor) + eps) = (y - mean_y) / (max(std_y, floor / a) + eps / a); a
        # zero denominator (eps / a underflowed, floor 0) comes only with std_y = 0, where every
        # centred value is 0 and the result 0; floor / a may be inf (a tiny group): the result is 0.
        scale_den = tl.maximum(std, std_floor / a) + epsilon / a
        scale_den = tl.where(scale_den > 0.0, scale_den, 1.0)
        single = count == 1

        # 5. Write the normalised value, saturated, as fp32 back to each item's own position. A group
        #    of one: verl's mean 0 / std 1 (x / (1 + eps), or x when only centring), or 0 for pools.
        for start in range(lo, hi, BLOCK):
            idx = start + cols
            m = idx < hi
            item = tl.load(perm_ptr + idx, mask=m, other=0)
            x = tl.load(values_ptr + item, mask=m, other=0.0).to(tl.float64)
            centred = tl.where(m, x / a - mean, 0.0)  # 0 on idle lanes, which are never stored
            if NORM_BY_STD:
                z = centred / scale_den
                z = tl.where(single, x / (1.0 + epsilon), z)
            else:
                z = centred * a
                z = tl.where(single, x, z)
            if SINGLETON_ZERO:
                z = tl.where(single, 0.0, z)
            z = tl.minimum(tl.maximum(z, -value_limit), value_limit)
            tl.store(out_ptr + item, z.to(tl.float32), mask=m)


def group_zscore(values, perm, group_offsets, out, epsilon: float, norm_by_std: bool, singleton_zero: bool,
                 value_limit: float = 1e18, block: int = 128, std_floor: float = 0.0):
    """Launch one program per group. `out` must be a contiguous fp32 tensor of len(values)."""
    num_groups = group_offsets.numel() - 1
    if num_groups <= 0 or values.numel() == 0:
        return out
    with _launch.launch_device(values, perm, group_offsets, out):
        _group_zscore_kernel[(num_groups,)](
            values, perm, group_offsets, out, float(epsilon), float(std_floor), float(value_limit),
            NORM_BY_STD=bool(norm_by_std), SINGLETON_ZERO=bool(singleton_zero), BLOCK=block,
        )
    return out
