"""Triton kernel: grouped mean/std normalisation (z-score), the groups found on the device.

A group is a run of equal keys in sorted order: `perm` lists the item indices sorted stably by
`keys`, so the items of one group are `perm[lo:hi]` for a run of equal `keys[perm[...]]`. One program
per sorted position: the program at the first position of a run (its head) finds the run's end and
takes the group's statistics; the others only check their own item. The number of groups is never
needed on the host (the grid is the item count, whatever the keys), so a launch reads nothing back
and can be captured in a CUDA graph. Values are written without atomics (deterministic); the
validation flags word is OR-ed atomically, an order-independent result.

Conventions (shared with the torch path in `mempo.ops.advantage`): fp64 statistics of the values
divided by the group's largest magnitude (values of any float or int dtype are loaded and widened,
so no sum or square overflows), unbiased (Bessel) std floored at `std_floor` (0: no floor),
`epsilon` added to it, a group of one either passes its value through with mean 0 / std 1 (verl
GRPO) or gives 0 (memory-reward pools); results are saturated at +-`value_limit`, rounded to fp32,
multiplied by `weight` in fp64, saturated again and stored as fp32 (weight 1 changes nothing).
Optionally each item's group id is written: the head position of its run, in [0, n), the same for
all items of a group.
"""
import triton
import triton.language as tl

from mempo.kernels import _launch


@triton.jit
def _group_zscore_kernel(
    values_ptr,          # [n] any float or int dtype (HAS_VALUES)
    keys_ptr,            # [n] int64 group key of each item
    perm_ptr,            # [n] int64 item indices sorted stably by key
    out_ptr,             # [n] fp32, written at each item's own position (HAS_VALUES)
    gid_ptr,             # [n] int64 group id of each item (WRITE_GID)
    flags_ptr,           # [1] int32 validation flags, OR-ed
    n,
    key_limit,           # keys must lie in [0, key_limit) (CHECK_KEYS)
    finite_bit,          # flag bit for a value that is not finite (CHECK_FINITE)
    range_bit,           # flag bit for a key outside [0, key_limit) (CHECK_KEYS)
    epsilon,             # a positive normal fp32 (validated by the op)
    std_floor,           # >= 0, a finite fp32 (validated by the op); 0: no floor
    value_limit,         # results saturate at +-value_limit
    weight: tl.float64,  # >= 0, finite: the saturated fp32 result times weight (fp64, not Triton's fp32 float)
    HAS_VALUES: tl.constexpr,
    WRITE_GID: tl.constexpr,
    CHECK_FINITE: tl.constexpr,
    CHECK_KEYS: tl.constexpr,
    NORM_BY_STD: tl.constexpr,
    SINGLETON_ZERO: tl.constexpr,
    BLOCK: tl.constexpr,
):
    p = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)

    # 1. This program's own item (by index, not by sorted position): is its value finite, its key in range?
    bad = 0
    if CHECK_FINITE:
        own = tl.load(values_ptr + p).to(tl.float64)
        bad = bad | tl.where(own - own == 0.0, 0, finite_bit)  # x - x is NaN for +-inf and NaN
    if CHECK_KEYS:
        own_key = tl.load(keys_ptr + p)
        bad = bad | tl.where((own_key >= 0) & (own_key < key_limit), 0, range_bit)
    if bad != 0:
        tl.atomic_or(flags_ptr, bad)

    # 2. Heads only: the run of equal keys that starts at sorted position p is the group [lo, hi).
    key = tl.load(keys_ptr + tl.load(perm_ptr + p))
    before = tl.load(keys_ptr + tl.load(perm_ptr + tl.maximum(p - 1, 0)))
    if (p == 0) | (before != key):
        lo = p
        hi = p + 1
        searching = hi < n
        while searching:  # block by block until the first different key (or the end)
            idx = hi + cols
            m = idx < n
            k = tl.load(keys_ptr + tl.load(perm_ptr + idx, mask=m, other=0), mask=m, other=0)
            first = tl.min(tl.where((k != key) | (idx >= n), idx, hi + BLOCK), axis=0)
            searching = first == hi + BLOCK
            hi = first
        if WRITE_GID:
            for start in range(lo, hi, BLOCK):
                idx = start + cols
                m = idx < hi
                item = tl.load(perm_ptr + idx, mask=m, other=0)
                tl.store(gid_ptr + item, tl.zeros([BLOCK], dtype=tl.int64) + lo, mask=m)
        if HAS_VALUES:
            count = hi - lo
            # 3. Scale a = the largest |x| of the group (1 if all are 0): statistics of y = x / a, in
            #    [-1, 1], so no fp64 sum or square overflows whatever the inputs.
            amax = tl.zeros([BLOCK], dtype=tl.float64)
            for start in range(lo, hi, BLOCK):
                idx = start + cols
                m = idx < hi
                item = tl.load(perm_ptr + idx, mask=m, other=0)
                amax = tl.maximum(amax, tl.abs(tl.load(values_ptr + item, mask=m, other=0).to(tl.float64)))
            a = tl.max(amax, axis=0)
            a = tl.where(a > 0.0, a, 1.0)

            # 4. mean of y, accumulated in fp64 block by block.
            acc = tl.zeros([BLOCK], dtype=tl.float64)
            for start in range(lo, hi, BLOCK):
                idx = start + cols
                m = idx < hi
                item = tl.load(perm_ptr + idx, mask=m, other=0)
                acc += tl.load(values_ptr + item, mask=m, other=0).to(tl.float64) / a
            mean = tl.sum(acc, axis=0) / count.to(tl.float64)

            # 5. Unbiased variance of y from the centred values (two passes: no cancellation).
            acc2 = tl.zeros([BLOCK], dtype=tl.float64)
            for start in range(lo, hi, BLOCK):
                idx = start + cols
                m = idx < hi
                item = tl.load(perm_ptr + idx, mask=m, other=0)
                y = tl.load(values_ptr + item, mask=m, other=0).to(tl.float64) / a
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

            # 6. Write the normalised value, saturated, as fp32 back to each item's own position. A
            #    group of one: verl's mean 0 / std 1 (x / (1 + eps), or x when only centring), or 0.
            for start in range(lo, hi, BLOCK):
                idx = start + cols
                m = idx < hi
                item = tl.load(perm_ptr + idx, mask=m, other=0)
                x = tl.load(values_ptr + item, mask=m, other=0).to(tl.float64)
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
                v = z.to(tl.float32).to(tl.float64) * weight
                v = tl.minimum(tl.maximum(v, -value_limit), value_limit)
                tl.store(out_ptr + item, v.to(tl.float32), mask=m)


def group_zscore(values, keys, perm, out, gid, flags, epsilon: float, norm_by_std: bool, singleton_zero: bool,
                 value_limit: float = 1e18, std_floor: float = 0.0, weight: float = 1.0, key_limit: int = 0,
                 finite_bit: int = 0, range_bit: int = 0, block: int = 128):
    """Launch one program per item (n = len(keys)).

    values: [n] float / int tensor, or None (only the group ids are written); keys, perm: [n] int64
    (perm = a stable argsort of keys); out: contiguous fp32 [n] (None without values); gid: int64 [n]
    or None; flags: int32 [1] on the same device. finite_bit / range_bit: the flag bits of a value
    that is not finite / a key outside [0, key_limit) (0: that check is off).
    """
    num_items = keys.numel()
    if num_items == 0:
        return out
    has_values, write_gid = values is not None, gid is not None
    with _launch.launch_device(*(t for t in (values, keys, perm, out, gid, flags) if t is not None)):
        _group_zscore_kernel[(num_items,)](
            values if has_values else keys, keys, perm, out if has_values else flags, gid if write_gid else keys,
            flags, num_items, int(key_limit), int(finite_bit), int(range_bit), float(epsilon), float(std_floor),
            float(value_limit), float(weight), HAS_VALUES=has_values, WRITE_GID=write_gid,
            CHECK_FINITE=bool(finite_bit) and has_values and values.dtype.is_floating_point,
            CHECK_KEYS=bool(range_bit), NORM_BY_STD=bool(norm_by_std), SINGLETON_ZERO=bool(singleton_zero),
            BLOCK=block,
        )
    return out
