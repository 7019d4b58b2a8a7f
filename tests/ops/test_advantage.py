"""Advantage ops: Triton (interpreter on CPU) vs vectorised torch vs the loop reference."""
import numpy as np
import pytest
import torch

from mempo.ops import advantage as adv_ops
from mempo.ops.advantage import (
    group_ids,
    group_zscore,
    grpo_outcome_advantage,
    memory_advantage,
    mempo_advantage,
)
from mempo.ops.reference.advantage import (
    random_memory_batch as random_batch,
    group_zscore_reference,
    grpo_outcome_advantage_reference,
    memory_advantage_reference,
    mempo_advantage_reference,
)
from support.host_reads import HostTraffic

BACKENDS = ["torch", "triton"]


def reference(scores, index, mask, rewards, offsets, spans, **kw):
    return torch.tensor(
        mempo_advantage_reference(scores.tolist(), list(index), mask.tolist(), rewards.tolist(), offsets.tolist(),
                                  spans.tolist(), **kw),
        dtype=torch.float64,
    ).reshape(mask.shape)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "num_groups,group_size,length,singletons",
    [(1, 1, 1, 0), (3, 5, 17, 2), (4, 16, 33, 0), (2, 2, 129, 3), (0, 0, 7, 4), (5, 3, 1025, 1)],
)
def test_mempo_advantage_matches_reference(backend, device, num_groups, group_size, length, singletons):
    for seed in range(2):
        batch = random_batch(seed, num_groups, group_size, length, singleton_groups=singletons,
                             binary_scores=seed == 0)
        scores, index, mask, rewards, offsets, spans = batch
        want = reference(*batch, memory_weight=0.7)
        got, returns = mempo_advantage(scores.to(device), index, mask.to(device), rewards.to(device), offsets,
                                       spans, memory_weight=0.7, backend=backend)
        assert got is returns
        assert got.dtype == torch.float32 and got.shape == mask.shape
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm", [True, False])
def test_outcome_and_memory_parts(backend, device, norm):
    scores, index, mask, rewards, offsets, spans = random_batch(7, 3, 6, 40, binary_scores=False)
    out = grpo_outcome_advantage(scores.to(device), index, mask.to(device), norm_adv_by_std=norm, backend=backend)
    want = grpo_outcome_advantage_reference(scores.tolist(), index, mask.tolist(), norm_adv_by_std=norm)
    torch.testing.assert_close(out.cpu().double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    mem = memory_advantage(rewards, offsets, spans, index, mask.to(device), norm_adv_by_std=norm, backend=backend)
    want = memory_advantage_reference(rewards.tolist(), offsets.tolist(), spans.tolist(), index, mask.tolist(),
                                      norm_adv_by_std=norm)
    torch.testing.assert_close(mem.cpu().double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    # Memory advantage lives on <mem> spans only.
    covered = torch.zeros_like(mask, dtype=torch.bool)
    for b in range(mask.shape[0]):
        for r in range(int(offsets[b]), int(offsets[b + 1])):
            covered[b, spans[r, 0]:spans[r, 1]] = True
    assert (mem.cpu()[~covered] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_input_dtypes(backend, device, dtype):
    scores, index, mask, rewards, offsets, spans = random_batch(3, 2, 8, 24, binary_scores=False)
    scores, rewards = scores.to(dtype), rewards.to(dtype)
    want = reference(scores.double(), index, mask, rewards.double(), offsets, spans)
    got, _ = mempo_advantage(scores.to(device), index, mask.to(device).bool(), rewards.to(device), offsets, spans,
                             backend=backend)
    # Inputs are rounded to their dtype; from there on everything is fp32.
    torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device_ids", [False, True])
def test_degenerate_groups_are_finite_zeros(backend, device, device_ids):
    # Equal scores, a singleton group, a group with no scored round, a group with one scored round.
    index = ["a", "a", "a", "b", "c", "c", "d", "d"]
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    mask = torch.ones(8, 6, dtype=torch.long)
    offsets = torch.tensor([0, 1, 2, 3, 4, 4, 4, 5, 5])
    spans = torch.tensor([[0, 2], [0, 2], [0, 2], [0, 2], [1, 3]])
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.9, -0.2])
    if device_ids:  # every input on the device, the groups as int ids, nothing read back (issue 45)
        on = device if backend == "triton" else torch.device("cpu")
        got, _ = mempo_advantage(scores.to(on), _device_ids(index, on), mask.to(on), rewards.to(on), offsets.to(on),
                                 spans.to(on), backend=backend, validate="device")
    else:
        got, _ = mempo_advantage(scores.to(device), index, mask.to(device), rewards, offsets, spans, backend=backend)
    got = got.cpu()
    assert torch.isfinite(got).all()
    assert (got[0:3] == 0).all()  # equal scores, equal memory rewards -> 0
    torch.testing.assert_close(got[3], torch.full((6,), 1.0 / (1.0 + 1e-6)))  # singleton: verl passthrough;
    # its single memory reward (pool of one) contributes nothing
    assert (got[4:6] == 0).all()  # equal scores, no scored round
    torch.testing.assert_close(got[6, 3:], torch.full((3,), 1 / (2 ** 0.5 + 1e-6)))
    assert got[6, 1] == got[6, 3]  # pool of one in group d adds zero on its span


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_batch_and_empty_response(backend, device):
    for batch, length in [(0, 5), (3, 0), (0, 0)]:
        mask = torch.ones(batch, length, dtype=torch.long, device=device)
        got, _ = mempo_advantage(torch.zeros(batch), list(range(batch)), mask, torch.zeros(0),
                                 torch.zeros(batch + 1, dtype=torch.long), torch.zeros(0, 2, dtype=torch.long),
                                 backend=backend)
        assert got.shape == (batch, length)
        on = mask.device if backend == "triton" else torch.device("cpu")
        ids, no_rounds = torch.arange(batch, device=on), torch.zeros(0, device=on)
        got, _ = mempo_advantage(torch.zeros(batch, device=on), ids, mask.to(on), no_rounds,
                                 torch.zeros(batch + 1, dtype=torch.long, device=on),
                                 torch.zeros(0, 2, dtype=torch.long, device=on), backend=backend, validate="device")
        assert got.shape == (batch, length) and (got == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_group_zscore_matches_reference(backend, device):
    g = torch.Generator().manual_seed(5)
    for n, num_groups in [(1, 1), (2, 2), (37, 5), (300, 3), (64, 64)]:
        values = torch.randn(n, generator=g) * 3 + 1
        groups = torch.randint(0, num_groups, (n,), generator=g)
        dense, count = group_ids(groups, n)
        for singleton in ("passthrough", "zero"):
            got = group_zscore(values.to(device), dense.to(device), count, singleton=singleton, backend=backend)
            want = group_zscore_reference(values.tolist(), groups.tolist(), singleton=singleton)
            torch.testing.assert_close(got.cpu().double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5,
                                       atol=1e-5)


def test_group_ids_accepts_labels_of_any_kind():
    for index in (np.array(["x", "y", "x"], dtype=object), np.array(["x", "y", "x"]), ["x", "y", "x"],
                  torch.tensor([7, 3, 7]), np.array([7, 3, 7]), [("a", 1), ("b", 2), ("a", 1)]):
        dense, count = group_ids(index, 3)
        assert count == 2 and dense[0] == dense[2] and dense[0] != dense[1]
    with pytest.raises(ValueError, match="index must have 3 entries"):
        group_ids(["a", "b"], 3)
    with pytest.raises(ValueError, match="integer group ids"):
        group_ids(torch.tensor([1.0, 2.0, 3.0]), 3)


def test_kernels_write_only_their_outputs(device):
    """Canary padding: outputs are views inside sentinel-filled buffers; the sentinel survives."""
    from mempo.kernels import group_zscore as zk
    from mempo.kernels import round_keys as rk
    from mempo.kernels import span_scatter as sk

    sentinel = 12345.0
    values = torch.randn(13, device=device)
    keys = torch.tensor([0, 1, 2] * 4 + [2], device=device)
    flags = torch.zeros(1, dtype=torch.int32, device=device)
    buf = torch.full((13 + 8,), sentinel, device=device)
    gid_buf = torch.full((13 + 8,), -7, dtype=torch.int64, device=device)
    zk.group_zscore(values, keys, torch.argsort(keys, stable=True), buf[4:17], gid_buf[4:17], flags, 1e-6, True,
                    False, block=4)
    assert (buf[:4] == sentinel).all() and (buf[17:] == sentinel).all()
    assert torch.isfinite(buf[4:17]).all()
    assert (gid_buf[:4] == -7).all() and (gid_buf[17:] == -7).all()
    # each item's group id: its group's first position in the sorted order (4, 4 and 5 items)
    assert gid_buf[4:17].tolist() == [0, 4, 8] * 4 + [8]

    offsets = torch.tensor([0, 2, 2, 3], device=device)
    spans = torch.tensor([[0, 4], [6, 9], [3, 30]], device=device)
    key_buf = torch.full((3 + 8,), -7, dtype=torch.int64, device=device)
    rk.round_keys(offsets, spans, torch.tensor([1, 2, 0], device=device), torch.tensor([5, 6, 7], device=device),
                  key_buf[4:7], flags, 37, block=4)
    assert (key_buf[:4] == -7).all() and (key_buf[7:] == -7).all()
    assert key_buf[4:7].tolist() == [5 * 2 ** 31 + 1, 5 * 2 ** 31 + 2, 7 * 2 ** 31]

    rows, length = 3, 37
    out_buf = torch.full((rows + 2, length + 9), sentinel, device=device)
    out = out_buf[1:rows + 1, 4:4 + length]
    mask = torch.ones(rows, length, device=device)
    sk.span_scatter(torch.ones(rows, device=device), torch.tensor([2.0], device=device),
                    torch.tensor([[3, 30]], device=device), torch.tensor([0, 1, 1, 1], device=device), mask, out,
                    flags, block_l=16)
    inside = torch.zeros_like(out_buf, dtype=torch.bool)
    inside[1:rows + 1, 4:4 + length] = True
    assert (out_buf[~inside] == sentinel).all()
    assert out[0, 3:30].eq(3.0).all() and out[0, :3].eq(1.0).all() and out[1:].eq(1.0).all()
    assert flags.item() == 0  # valid inputs raise no flag


def test_bad_inputs_raise_clear_errors():
    scores, index, mask, rewards, offsets, spans = random_batch(1, 2, 3, 10)
    with pytest.raises(ValueError, match="response_mask has 6 rows, expected 5"):
        mempo_advantage(scores[:5], index[:5], mask)
    with pytest.raises(ValueError, match="given together"):
        mempo_advantage(scores, index, mask, mem_rewards=rewards)
    with pytest.raises(ValueError, match=r"scores\[2\] is not finite"):
        mempo_advantage(torch.tensor([0.0, 1.0, float("nan"), 0, 0, 0]), index, mask)
    bad = spans.clone()
    if len(bad):
        bad[0] = torch.tensor([4, 11])
        with pytest.raises(ValueError, match=r"mem_spans\[0\] = \(4, 11\) is not a span inside \[0, 10\]"):
            mempo_advantage(scores, index, mask, rewards, offsets, bad)
    overlapping = torch.tensor([[0, 5], [4, 8]])
    with pytest.raises(ValueError, match="overlap in trajectory 0"):
        mempo_advantage(scores, index, mask, torch.zeros(2), torch.tensor([0, 2, 2, 2, 2, 2, 2]), overlapping)
    with pytest.raises(ValueError, match=r"mem_offsets ends at 1, but mem_rewards and mem_spans hold 2"):
        mempo_advantage(scores, index, mask, torch.zeros(2), torch.tensor([0, 1, 1, 1, 1, 1, 1]), overlapping)
    with pytest.raises(ValueError, match="mem_offsets must start at 0"):
        mempo_advantage(scores, index, mask, torch.zeros(2), torch.tensor([1, 2, 2, 2, 2, 2, 2]), overlapping)
    with pytest.raises(ValueError, match="backend must be one of"):
        mempo_advantage(scores, index, mask, backend="cuda")


def test_adjacent_spans_are_exact():
    """Spans that touch ([0,3) then [3,6)) get exactly their own values, nothing leaks across."""
    mask = torch.ones(1, 8)
    got = adv_ops._span_scatter_torch(torch.zeros(1), torch.tensor([0.1, 0.3]), torch.tensor([0, 3]),
                                      torch.tensor([3, 6]), torch.tensor([0, 2]), mask)
    assert got[0, :3].eq(torch.tensor(0.1)).all() and got[0, 3:6].eq(torch.tensor(0.3)).all()
    assert got[0, 6:].eq(0).all()


@pytest.mark.parametrize("starts, lengths", [([0, 10, 2, 5], [5, 5, 5, 4]), ([0, 10, 2, 5], [1, 1, 1, 60]),
                                             ([0, 10, 2, 5], [0, 0, 3, 0]), ([0, 63, 2, 6], [63, 7, 1, 64])])
def test_torch_scatter_power_of_two_pieces(starts, lengths):
    """The torch path cuts spans into power-of-two pieces written back as rows of an unfolded view;
    whatever the mix of lengths (one class, many classes, empty spans, a span ending at the last
    cell of the block) it must equal the loop definition."""
    rows, length = 3, 70
    spans = torch.tensor([[s, s + n] for s, n in zip(starts, lengths)])
    offsets = torch.tensor([0, 2, 3, 4])
    mask = (torch.arange(rows * length).reshape(rows, length) % 7 != 3).long()
    values = torch.tensor([0.5, -1.25, 2.0, 0.75])
    got = adv_ops._span_scatter_torch(torch.tensor([0.1, 0.2, 0.3]), values, spans[:, 0], spans[:, 1], offsets, mask)
    want = torch.tensor([0.1, 0.2, 0.3])[:, None] * mask
    for b in range(rows):
        for r in range(int(offsets[b]), int(offsets[b + 1])):
            want[b, spans[r, 0]:spans[r, 1]] += values[r] * mask[b, spans[r, 0]:spans[r, 1]]
    torch.testing.assert_close(got, want)


def test_torch_scatter_back_to_back_spans_of_every_length():
    """Rows tiled edge to edge with spans of lengths 1..40 (every bit class, pieces of neighbouring
    spans touching) at a size where the writes run on several threads: exact against the reference."""
    lengths = torch.arange(1, 41)
    length = int(lengths.sum())
    rows = 64
    start = (torch.cumsum(lengths, 0) - lengths).repeat(rows)
    end = torch.cumsum(lengths, 0).repeat(rows)
    offsets = torch.arange(rows + 1) * lengths.numel()
    values = torch.randn(start.numel(), generator=torch.Generator().manual_seed(3))
    row_value = torch.randn(rows, generator=torch.Generator().manual_seed(4))
    mask = (torch.rand(rows, length, generator=torch.Generator().manual_seed(5)) > 0.1).long()
    got = adv_ops._span_scatter_torch(row_value, values, start, end, offsets, mask)
    want = row_value[:, None] * mask
    span_of_token = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
    want += values.view(rows, -1)[:, span_of_token] * mask
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
def test_triton_matches_torch_at_real_sizes():
    """GPU tier: 128 questions x 16 trajectories x 4,096 tokens, 8 scored rounds each."""
    scores, index, mask, rewards, offsets, spans = random_batch(0, 128, 16, 4096, max_rounds=8)
    args = (scores.cuda(), index, mask.cuda(), rewards.cuda(), offsets.cuda(), spans.cuda())
    got, _ = mempo_advantage(*args, backend="triton")
    want, _ = mempo_advantage(*args, backend="torch")
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("huge", ["1", "0"])
def test_huge_page_outputs_hold_the_same_values(monkeypatch, huge):
    """The huge-page advice on large CPU outputs (mempo.ops._alloc) changes page backing only:
    a 2,048 x 1,024 result (8 MiB, above the threshold) equals the loop reference either way."""
    from mempo.ops import _alloc

    monkeypatch.setenv("MEMPO_HUGE_PAGES", huge)
    assert _alloc.huge_pages_enabled() is (huge == "1")
    scores, index, mask, rewards, offsets, spans = random_batch(7, num_groups=128, group_size=16, length=1024,
                                                                       max_rounds=4, layout="rounds", mem_len=48)
    assert mask.numel() * 4 >= _alloc.MIN_BYTES
    got, _ = mempo_advantage(scores, index, mask, rewards, offsets, spans, backend="torch")
    want = torch.tensor(mempo_advantage_reference(scores.tolist(), list(index), mask.tolist(), rewards.tolist(),
                                                  offsets.tolist(), spans.tolist()))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    small = _alloc.empty_output((3, 5))
    assert small.shape == (3, 5) and small.dtype == torch.float32


# --------------------------------------------------------------------------------------------
# Hostile scalars and values (issue 10, case 7): validated by name, finite results otherwise
# --------------------------------------------------------------------------------------------
def _small_batch():
    index = ["a", "a", "b", "b", "c"]
    mask = torch.ones(5, 6, dtype=torch.long)
    offsets = torch.tensor([0, 1, 2, 3, 4, 4])
    spans = torch.tensor([[0, 2], [1, 3], [0, 2], [2, 5]])
    return index, mask, offsets, spans


_UNSET = object()


def _every_op(epsilon=1e-6, memory_weight=_UNSET, norm_adv_by_std=True, backend="torch", scores=None, rewards=None,
              mask=None, device="cpu"):
    """Each public advantage op called on a small batch with these arguments (memory_weight given:
    only the op that takes it; scores given: only the ops that take scores), its tensors on `device`."""
    index, default_mask, offsets, spans = _small_batch()
    given_scores = scores is not None
    scores = (torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]) if scores is None else scores).to(device)
    rewards = (torch.tensor([0.1, 0.3, 0.2, 0.2]) if rewards is None else rewards).to(device)
    mask = (default_mask if mask is None else mask).to(device)
    weight = 1.0 if memory_weight is _UNSET else memory_weight
    yield lambda: mempo_advantage(scores, index, mask, rewards, offsets, spans, epsilon=epsilon,
                                  memory_weight=weight, norm_adv_by_std=norm_adv_by_std, backend=backend)
    if memory_weight is _UNSET:
        yield lambda: grpo_outcome_advantage(scores, index, mask, epsilon, norm_adv_by_std, backend=backend)
        yield lambda: group_zscore(scores, torch.tensor([0, 0, 1, 1, 2], device=device), 3, epsilon=epsilon,
                                   norm_by_std=norm_adv_by_std, backend=backend)
        if not given_scores:
            yield lambda: memory_advantage(rewards, offsets, spans, index, mask, epsilon, norm_adv_by_std,
                                           backend=backend)


@pytest.mark.parametrize("epsilon", [0.0, -1e-6, float("nan"), float("inf"), float("-inf"), 1e-45, 1e39, "1e-6",
                                     True, None])
def test_bad_epsilon_is_rejected_by_name(epsilon):
    for op in _every_op(epsilon=epsilon):
        with pytest.raises(ValueError, match=r"epsilon must be a finite number in \[1.1754944e-38, 3.4028235e\+38\]"):
            op()


@pytest.mark.parametrize("memory_weight", [float("nan"), float("inf"), -0.5, True, "1"])
def test_bad_memory_weight_is_rejected_by_name(memory_weight):
    for op in _every_op(memory_weight=memory_weight):
        with pytest.raises(ValueError, match="memory_weight must be a finite number >= 0"):
            op()


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_norm_flag_must_be_a_bool(flag):
    for op in _every_op(norm_adv_by_std=flag):
        with pytest.raises(ValueError, match="norm_(adv_)?by_std must be a bool"):
            op()


@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_scalars_are_accepted(backend, device):
    for op in _every_op(epsilon=np.float32(1e-6), memory_weight=np.float64(0.5), norm_adv_by_std=np.bool_(True),
                        backend=backend, device=device if backend == "triton" else "cpu"):
        out = op()
        out = out[0] if isinstance(out, tuple) else out
        assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_smallest_epsilon_on_equal_groups_is_zero_not_nan(backend, device):
    """epsilon=0 gave NaN on an all-equal group; the smallest accepted epsilon gives 0."""
    index, mask, offsets, spans = _small_batch()
    equal = torch.full((5,), 0.3)
    got, _ = mempo_advantage(equal.to(device), index, mask.to(device), torch.full((4,), 0.7), offsets, spans,
                             epsilon=float(torch.finfo(torch.float32).tiny), backend=backend)
    assert torch.isfinite(got).all()
    assert (got.cpu()[:4] == 0).all()  # groups a and b: equal scores and equal memory rewards


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_scores_rewards_and_float_masks_are_rejected(bad):
    scores = torch.tensor([1.0, 0.0, bad, 1.0, 0.0])
    for op in _every_op(scores=scores):
        with pytest.raises(ValueError, match=r"(scores|values)\[2\] is not finite"):
            op()
    index, mask, offsets, spans = _small_batch()
    with pytest.raises(ValueError, match=r"mem_rewards\[1\] is not finite"):
        mempo_advantage(torch.zeros(5), index, mask, torch.tensor([0.0, bad, 0.0, 0.0]), offsets, spans)
    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        float_mask = mask.to(dtype)
        float_mask[3, 4] = bad
        for op in _every_op(mask=float_mask):
            if "group_zscore" in op.__code__.co_names:
                continue  # it takes no mask
            with pytest.raises(ValueError, match=r"response_mask\[3, 4\] = .* is not a mask weight"):
                op()
    huge = mask.double()
    huge[0, 0] = 1e30
    with pytest.raises(ValueError, match=r"response_mask\[0, 0\] = 1e\+30 is not a mask weight"):
        grpo_outcome_advantage(torch.zeros(5), index, huge)


def test_length_mismatches_name_the_argument_that_disagrees():
    """A wrong number of memory rewards blamed mem_spans (issue 10, case 11)."""
    index, mask, offsets, spans = _small_batch()
    with pytest.raises(ValueError, match="mem_rewards has 3 entries, but mem_offsets and mem_spans describe 4"):
        memory_advantage(torch.zeros(3), offsets, spans, index, mask)
    with pytest.raises(ValueError, match="mem_spans has 3 rows, but mem_rewards and mem_offsets describe 4"):
        memory_advantage(torch.zeros(4), offsets, spans[:3], index, mask)
    with pytest.raises(ValueError, match="disagree on the number of scored rounds"):
        mempo_advantage(torch.zeros(5), index, mask, torch.zeros(2), offsets, spans[:3])
    with pytest.raises(ValueError, match=r"group ids must lie in \[0, num_groups = 2\)"):
        group_zscore(torch.zeros(3), torch.tensor([0, 1, 2]), 2)
    with pytest.raises(ValueError, match="num_rows must be an integer >= 0"):
        adv_ops.csr_offsets_from_rows([0, 1], -1)
    with pytest.raises(ValueError, match="num_items must be an integer >= 0"):
        group_ids(["a"], 1.0)
    with pytest.raises(ValueError, match=r"index\[1\] is NaN"):
        grpo_outcome_advantage(torch.zeros(3), np.array([1.0, np.nan, 1.0]), torch.ones(3, 2))


F32_MAX = float(torch.finfo(torch.float32).max)

# Values near the top of each accepted dtype (fp16's and bf16's own maxima; int64 near 2^63).
EXTREME_SCORES = {
    torch.float32: [[3e38, 3e38, 3e38], [3e38, -3e38, -3e38], [F32_MAX, -F32_MAX, F32_MAX], [3e38, 0.0, 1e-45]],
    torch.float64: [[1e300, 1e300, -1e300], [1e308, -1e308, 5.0], [1e-300, 2e-300, 1e-300]],
    torch.float16: [[65504.0, 65504.0, -65504.0], [65504.0, -65504.0, 6e-8]],
    torch.bfloat16: [[3.3e38, 3.3e38, -3.3e38], [3.3e38, -3.3e38, 0.0]],
    torch.int64: [[2 ** 62, -2 ** 62, 2 ** 62], [9 * 10 ** 18, 9 * 10 ** 18, 9 * 10 ** 18]],
    torch.int32: [[2 ** 31 - 1, -2 ** 31, 0]],
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", list(EXTREME_SCORES))
@pytest.mark.parametrize("norm", [True, False])
def test_scores_near_the_dtype_limit_give_finite_advantages(backend, device, dtype, norm):
    """[3e38, 3e38] gave NaN (fp32 sums overflow); now fp64 statistics and saturation at VALUE_LIMIT
    give finite values equal to the loop reference, on the torch path, the Triton path and the loop."""
    for rows in EXTREME_SCORES[dtype]:
        scores = torch.tensor(rows + rows[:1] + [rows[-1]], dtype=dtype)  # a group of 3, a group of 2
        index = ["g", "g", "g", "h", "h"]
        rewards = torch.tensor(rows + rows[:1], dtype=dtype)  # 4 rounds, pooled per group
        offsets = torch.tensor([0, 1, 2, 3, 4, 4])
        spans = torch.tensor([[0, 2], [1, 3], [0, 2], [2, 5]])
        mask = torch.ones(5, 6, dtype=torch.bool)
        # fp64 inputs are summed in fp64, in another order on the GPU (a tree) than in the loop (left to
        # right): values may differ by the summation error bound, n * eps * max|x| per mean, times the
        # weight (the group [1e308, -1e308, 5] has mean 5/3 or 0, both within it; the first GPU run),
        # capped at the saturated range (no inf). Other dtypes' fp64 sums are exact enough.
        scale = 4 * len(rows) * torch.finfo(torch.float64).eps * max(abs(float(x)) for x in rows)
        cap = 4 * adv_ops.VALUE_LIMIT
        for weight in (1.0, 1e30):
            got, _ = mempo_advantage(scores.to(device), index, mask.to(device), rewards.to(device), offsets, spans,
                                     memory_weight=weight, norm_adv_by_std=norm, backend=backend)
            want = reference(scores.double(), index, mask, rewards.double(), offsets, spans, memory_weight=weight,
                             norm_adv_by_std=norm)
            assert torch.isfinite(got).all() and torch.isfinite(want).all(), (rows, weight)
            bound = (cap if scale > cap / weight else scale * weight) if dtype == torch.float64 else 0.0
            torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5 + bound)
            assert got.abs().max() <= 2 * adv_ops.VALUE_LIMIT
        zs = group_zscore(scores.to(device), torch.tensor([0, 0, 0, 1, 1], device=device), 2, norm_by_std=norm,
                          backend=backend)
        want = group_zscore_reference(scores.double().tolist(), [0, 0, 0, 1, 1], norm_by_std=norm)
        bound = min(scale, cap) if dtype == torch.float64 else 0.0  # weight 1
        torch.testing.assert_close(zs.cpu().double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5,
                                   atol=1e-5 + bound)
        if dtype == torch.float32 and rows[:2] == [3e38, 3e38]:
            assert (zs.cpu()[:3] == 0).all()  # the case: equal scores at the limit -> exactly 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_mask_weights_stay_finite(backend, device):
    """The saturation bound holds for the largest accepted mask entries (int64's range, float <= 2^63)."""
    index, _, offsets, spans = _small_batch()
    scores = torch.tensor([3e38, -3e38, 1.0, 2.0, 5.0])
    for mask in (torch.full((5, 6), 2 ** 62, dtype=torch.long), torch.full((5, 6), 2.0 ** 63, dtype=torch.float64)):
        got, _ = mempo_advantage(scores.to(device), index, mask.to(device), torch.tensor([1e38, -1e38, 0.0, 1.0]),
                                 offsets, spans, memory_weight=1e30, norm_adv_by_std=False, backend=backend)
        assert torch.isfinite(got).all()


# ---------------------------------------------------------------------------------------------------
# Memory pools by (group, stage) and the std floor (issue 20, weakness 3)
# ---------------------------------------------------------------------------------------------------
FLOORS = [0.0, 1e-3, 0.05, 0.3, 5.0]


def _stages(seed, num_rounds, num_stages):
    return torch.randint(0, num_stages, (num_rounds,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_groups,group_size,length,singletons", [(1, 1, 1, 0), (3, 5, 17, 2), (2, 2, 129, 3),
                                                                    (0, 0, 7, 4), (5, 3, 1025, 1)])
def test_stage_pools_and_floor_match_reference(backend, device, num_groups, group_size, length, singletons):
    for seed, floor in enumerate(FLOORS):
        batch = random_batch(seed, num_groups, group_size, length, singleton_groups=singletons,
                             binary_scores=seed % 2 == 0)
        scores, index, mask, rewards, offsets, spans = batch
        stages = _stages(seed, rewards.numel(), 1 + seed % 3)
        want = reference(*batch, memory_weight=0.7, mem_stages=stages.tolist(), memory_std_floor=floor)
        got, _ = mempo_advantage(scores.to(device), index, mask.to(device), rewards.to(device), offsets, spans,
                                 memory_weight=0.7, mem_stages=stages, memory_std_floor=floor, backend=backend)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
        mem = memory_advantage(rewards, offsets, spans, index, mask.to(device), mem_stages=stages.to(device),
                               std_floor=floor, backend=backend)
        want = memory_advantage_reference(rewards.tolist(), offsets.tolist(), spans.tolist(), index, mask.tolist(),
                                          mem_stages=stages.tolist(), std_floor=floor)
        torch.testing.assert_close(mem.cpu().double(), torch.tensor(want, dtype=torch.float64).reshape(mask.shape),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_group_zscore_floor_every_dtype(backend, device, dtype):
    g = torch.Generator().manual_seed(11)
    for n, num_groups, floor in [(1, 1, 0.3), (2, 2, 0.0), (37, 5, 1.0), (300, 3, 5.0), (64, 64, 0.05),
                                 (129, 7, 2.5)]:
        values = (torch.randn(n, generator=g) * 3 + 1).to(dtype)
        groups = torch.randint(0, num_groups, (n,), generator=g)
        dense, count = group_ids(groups, n)
        for singleton, norm in [("passthrough", True), ("zero", True), ("zero", False)]:
            got = group_zscore(values.to(device), dense.to(device), count, singleton=singleton, norm_by_std=norm,
                               std_floor=floor, backend=backend)
            want = group_zscore_reference(values.double().tolist(), groups.tolist(), singleton=singleton,
                                          norm_by_std=norm, std_floor=floor)
            torch.testing.assert_close(got.cpu().double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5,
                                       atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_floor_degenerate_pools(backend, device):
    """Zero-spread pools give 0 with or without a floor; single-item pools give 0 (memory) or pass
    through (outcome); a pool spreading 1e-3 is unit-size without a floor, about 1e-3 / floor with one;
    a pool of subnormal values gives 0."""
    values = torch.tensor([0.3, 0.3, 0.3, 0.7, 0.1000, 0.1010, 0.1020, 0.0, 0.0, 1e-320, -1e-320],
                          dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 2, 2, 2, 3, 3, 4, 4])
    for floor in (0.0, 0.05):
        for singleton in ("passthrough", "zero"):
            got = group_zscore(values.to(device), groups.to(device), 5, singleton=singleton, std_floor=floor,
                               backend=backend).cpu()
            want = group_zscore_reference(values.tolist(), groups.tolist(), singleton=singleton,
                                          std_floor=floor)
            assert torch.isfinite(got).all()
            torch.testing.assert_close(got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-6)
            assert (got[:3] == 0).all() and (got[7:9] == 0).all()  # zero spread
            assert got[3] == (0.0 if singleton == "zero" else pytest.approx(0.7 / (1 + 1e-6)))
            if floor == 0.0:
                # spread 1e-3: (x - mean) / (1e-3 + 1e-6), unit-size
                torch.testing.assert_close(got[4:7], torch.tensor([-1.0, 0.0, 1.0]) / 1.001, rtol=1e-4, atol=1e-4)
            else:
                torch.testing.assert_close(got[4:7], torch.tensor([-0.02, 0.0, 0.02]), rtol=1e-4, atol=1e-6)
            assert (got[9:] == 0).all()  # subnormal pool: eps / a and floor / a overflow to inf; 0, not NaN


@pytest.mark.parametrize("backend", BACKENDS)
def test_stage_pools_split_groups_only(backend, device):
    """Stages split a group's memory pool, never merge two groups; the outcome keeps the group."""
    index = ["a", "a", "b", "b"]
    scores = torch.tensor([1.0, 0.0, 1.0, 0.0])
    mask = torch.ones(4, 8, dtype=torch.long)
    offsets = torch.tensor([0, 2, 4, 6, 8])
    spans = torch.tensor([[0, 2], [4, 6]] * 4)
    rewards = torch.tensor([0.1, 0.9, 0.2, 0.5, 0.3, 0.8, 0.4, 0.6])
    stages = torch.tensor([1, 2, 1, 2, 1, 2, 1, 2])
    got, _ = mempo_advantage(scores.to(device), index, mask.to(device), rewards, offsets, spans, memory_weight=1.0,
                             mem_stages=stages, backend=backend)
    outcome = grpo_outcome_advantage(scores, index, mask, backend="torch")
    mem = (got.cpu() - outcome)[:, [0, 4]]  # [row, stage]
    # stage 1 of group a: 0.1 vs 0.2; stage 2: 0.9 vs 0.5; group b: 0.3 vs 0.4, 0.8 vs 0.6: each pool of two
    # gives -1/sqrt(2), +1/sqrt(2) (up to epsilon)
    want = torch.tensor([[-1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [1.0, -1.0]]) / 2 ** 0.5
    torch.testing.assert_close(mem, want, rtol=1e-5, atol=1e-5)
    one_stage = torch.zeros(8, dtype=torch.long)
    on = device if backend == "triton" else torch.device("cpu")  # Triton takes CPU tensors only interpreted
    same, _ = mempo_advantage(scores.to(on), index, mask.to(on), rewards, offsets, spans, mem_stages=one_stage,
                              backend=backend)
    default, _ = mempo_advantage(scores.to(on), index, mask.to(on), rewards, offsets, spans, backend=backend)
    assert torch.equal(same, default)  # one stage = the group pool


@pytest.mark.parametrize("floor", [-0.1, float("nan"), float("inf"), 1e39, "0.1", True, None])
def test_bad_std_floor_is_rejected_by_name(floor):
    scores, index, mask, rewards, offsets, spans = random_batch(1, 2, 3, 10)
    with pytest.raises(ValueError, match=r"memory_std_floor must be a finite number in \[0, 3.4028235e\+38\]"):
        mempo_advantage(scores, index, mask, rewards, offsets, spans, memory_std_floor=floor)
    with pytest.raises(ValueError, match=r"std_floor must be a finite number in \[0, "):
        memory_advantage(rewards, offsets, spans, index, mask, std_floor=floor)
    with pytest.raises(ValueError, match=r"std_floor must be a finite number in \[0, "):
        group_zscore(scores, torch.zeros(6, dtype=torch.long), 1, std_floor=floor)


def test_bad_stages_are_rejected_by_name():
    scores, index, mask, rewards, offsets, spans = random_batch(1, 2, 3, 10)
    num_rounds = rewards.numel()
    for bad in (torch.zeros(num_rounds + 1, dtype=torch.long), torch.zeros(num_rounds), torch.zeros(num_rounds, 1,
                                                                                                  dtype=torch.long)):
        with pytest.raises(ValueError, match=f"mem_stages must be an integer vector of {num_rounds} entries"):
            mempo_advantage(scores, index, mask, rewards, offsets, spans, mem_stages=bad)
    if num_rounds:
        negative = torch.zeros(num_rounds, dtype=torch.long)
        negative[-1] = -1
        with pytest.raises(ValueError, match=rf"mem_stages\[{num_rounds - 1}\] = -1: stages must lie in \[0, 2\^31\)"):
            mempo_advantage(scores, index, mask, rewards, offsets, spans, mem_stages=negative)
    with pytest.raises(ValueError, match="mem_stages needs the memory inputs"):
        mempo_advantage(scores, index, mask, mem_stages=torch.zeros(0, dtype=torch.long))


# ---------------------------------------------------------------------------------------------------
# The advantage op off the host (issue 45): device group ids, host reads counted, the fused value check
# ---------------------------------------------------------------------------------------------------
def _device_ids(index, device):
    """Integer labels of the same groups as `index`, not dense (negative, sparse, near int64's limits)."""
    dense, _ = group_ids(index, len(index))
    return (dense * 7_919_000_000_003 - 2 ** 62).to(device)


def _op_call(op, index_kind, backend, validate, device, batch=None):
    """One public op on `random_batch`-style inputs as a thunk (the inputs made first): every tensor on
    `device`, the index as device ids ("ids"), verl's uid object array ("uid") or strings ("list")."""
    scores, index, mask, rewards, offsets, spans = batch or random_batch(3, 3, 5, 40, singleton_groups=2)
    on = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    scores, mask, rewards, offsets, spans = on(scores, mask, rewards, offsets, spans)
    labels = {"ids": _device_ids(index, device), "uid": np.array(index, dtype=object), "list": list(index)}[index_kind]
    stages = (torch.arange(rewards.numel()) % 3).to(device)
    kw = dict(backend=backend, validate=validate)
    return {
        "mempo": lambda: mempo_advantage(scores, labels, mask, rewards, offsets, spans, memory_weight=0.7, **kw)[0],
        "mempo_stages": lambda: mempo_advantage(scores, labels, mask, rewards, offsets, spans, mem_stages=stages,
                                                **kw)[0],
        "grpo": lambda: grpo_outcome_advantage(scores, labels, mask, **kw),
        "memory": lambda: memory_advantage(rewards, offsets, spans, labels, mask, **kw),
        "memory_stages": lambda: memory_advantage(rewards, offsets, spans, labels, mask, mem_stages=stages,
                                                  std_floor=0.1, **kw),
        "zscore": lambda: group_zscore(rewards, stages, 3, singleton="zero", **kw),
    }[op]


# Host reads per call, exact (issue 45: "so the count cannot grow unnoticed"). The Triton path (CUDA's
# default; the interpreter here) reads nothing with validate="device" and once with "host" (the fused
# value check, settled at the end). The torch path (CPU's default) settles the same check, and its
# scatter reads the spans per length class once when there are spans.
HOST_READS = [  # (op, backend, validate, reads)
    *[(op, "triton", "device", 0) for op in ("mempo", "mempo_stages", "grpo", "memory", "memory_stages", "zscore")],
    *[(op, "triton", "host", 1) for op in ("mempo", "mempo_stages", "grpo", "memory", "memory_stages", "zscore")],
    ("mempo", "torch", "device", 1), ("mempo_stages", "torch", "device", 1), ("grpo", "torch", "device", 0),
    ("memory", "torch", "device", 1), ("memory_stages", "torch", "device", 1), ("zscore", "torch", "device", 0),
    ("mempo", "torch", "host", 2), ("mempo_stages", "torch", "host", 2), ("grpo", "torch", "host", 1),
    ("memory", "torch", "host", 2), ("memory_stages", "torch", "host", 2), ("zscore", "torch", "host", 1),
]


@pytest.mark.parametrize("op, backend, validate, reads", HOST_READS)
def test_host_reads_of_each_path_are_counted_exactly(device, op, backend, validate, reads):
    on = device if backend == "triton" else torch.device("cpu")
    want = _op_call(op, "list", "torch", "host", torch.device("cpu"))()
    call = _op_call(op, "ids", backend, validate, on)
    call()  # warm-up (first-call work is not per call)
    with HostTraffic() as traffic:
        got = call()
    assert len(traffic.reads) == reads, traffic.reads
    assert traffic.uploads == [], traffic.uploads  # device ids: nothing made from host data
    torch.testing.assert_close(got.cpu(), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("op", ["mempo", "mempo_stages", "grpo", "memory", "memory_stages"])
@pytest.mark.parametrize("validate, reads", [("device", 0), ("host", 1)])
def test_uid_array_costs_one_upload_and_nothing_else(device, op, validate, reads):
    """verl's uid object array: mapped to ids on the host, one tensor made from host data (one copy
    to the device), and no read beyond the device-ids path's."""
    call = _op_call(op, "uid", "triton", validate, device)
    with HostTraffic() as traffic:
        got = call()
    assert len(traffic.reads) == reads and len(traffic.uploads) == 1, (traffic.reads, traffic.uploads)
    assert torch.equal(got, _op_call(op, "ids", "triton", validate, device)())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("num_groups,group_size,length,singletons,max_rounds",
                         [(1, 1, 1, 0, 4), (3, 5, 17, 2, 4), (4, 16, 33, 0, 4), (2, 2, 129, 3, 4), (0, 0, 7, 4, 4),
                          (5, 3, 1025, 1, 4), (0, 0, 5, 0, 4), (2, 3, 9, 0, 0), (1, 7, 1, 0, 1), (0, 0, 31, 9, 6)])
def test_device_ids_match_the_reference(backend, device, num_groups, group_size, length, singletons, max_rounds):
    """Odd sizes and degenerate batches (empty, one group, only singletons, no scored round, L = 1),
    binary (all-equal groups) and continuous scores: device ids with validate="device" give the loop
    reference's values and exactly the host labels' result."""
    on = device if backend == "triton" else torch.device("cpu")
    for seed in range(2):
        batch = random_batch(seed, num_groups, group_size, length, max_rounds=max_rounds,
                             singleton_groups=singletons, binary_scores=seed == 0)
        scores, index, mask, rewards, offsets, spans = batch
        want = reference(*batch, memory_weight=0.7)
        ids = _device_ids(index, on)
        got, _ = mempo_advantage(scores.to(on), ids, mask.to(on), rewards.to(on), offsets.to(on), spans.to(on),
                                 memory_weight=0.7, backend=backend, validate="device")
        assert got.dtype == torch.float32 and got.shape == mask.shape and torch.isfinite(got).all()
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5)
        labelled, _ = mempo_advantage(scores.to(on), index, mask.to(on), rewards, offsets, spans, memory_weight=0.7,
                                      backend=backend)
        assert torch.equal(got, labelled)
        outcome = grpo_outcome_advantage(scores.to(on), ids, mask.to(on), backend=backend, validate="device")
        want = grpo_outcome_advantage_reference(scores.tolist(), index, mask.tolist())
        torch.testing.assert_close(outcome.cpu().double(), torch.tensor(want, dtype=torch.float64).reshape(mask.shape),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_ids_every_accepted_dtype(backend, device):
    """Scores and rewards of every accepted dtype, masks of every kind, ids of every integer dtype."""
    on = device if backend == "triton" else torch.device("cpu")
    scores, index, mask, rewards, offsets, spans = random_batch(5, 3, 4, 23, binary_scores=False)
    dense, _ = group_ids(index, len(index))
    value_dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.bool]
    id_dtypes = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
    mask_dtypes = [torch.bool, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
                   torch.float64]
    for i, dtype in enumerate(value_dtypes):
        s = (scores * 3).to(dtype)
        r = (rewards * 5).to(dtype)
        m = mask.to(mask_dtypes[i % len(mask_dtypes)])
        ids = (dense * 3 + 1).to(id_dtypes[i % len(id_dtypes)])
        want = reference(s.double(), index, m.double(), r.double(), offsets, spans)
        got, _ = mempo_advantage(s.to(on), ids.to(on), m.to(on), r.to(on), offsets.to(on), spans.to(on),
                                 backend=backend, validate="device")
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-5, atol=1e-5, msg=str(dtype))


def _invalid_cases():
    """(name, op taking (backend, validate, device), message) for every kind of invalid input value."""
    index, mask, offsets, spans = _small_batch()
    scores, rewards, stages = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0]), torch.tensor([0.1, 0.3, 0.2, 0.2]), None

    def mempo(scores=scores, mask=mask, rewards=rewards, offsets=offsets, spans=spans, stages=stages):
        def call(backend, validate, device):
            on = lambda t: None if t is None else t.to(device)  # noqa: E731
            return mempo_advantage(on(scores), _device_ids(index, device), on(mask), on(rewards), on(offsets),
                                   on(spans), mem_stages=on(stages), backend=backend, validate=validate)
        return call

    def with_value(t, at, value):
        t = t.clone()
        t[at] = value
        return t

    def zscore(values, group):
        return lambda backend, validate, device: group_zscore(values.to(device), group.to(device), 3,
                                                              backend=backend, validate=validate)

    nan, inf = float("nan"), float("inf")
    return [
        ("score_nan", mempo(scores=with_value(scores, 2, nan)), r"scores\[2\] is not finite \(nan\)"),
        ("reward_inf", mempo(rewards=with_value(rewards, 1, -inf)), r"mem_rewards\[1\] is not finite \(-inf\)"),
        ("mask_nan", mempo(mask=with_value(mask.half(), (3, 4), nan)), r"response_mask\[3, 4\] = nan is not a mask"),
        ("mask_huge", mempo(mask=with_value(mask.double(), (0, 0), 1e30)), r"response_mask\[0, 0\] = 1e\+30 is not"),
        ("offsets_start", mempo(offsets=torch.tensor([1, 1, 2, 3, 4, 4])), "mem_offsets must start at 0, be non-dec"),
        ("offsets_order", mempo(offsets=torch.tensor([0, 2, 1, 3, 4, 4])), "mem_offsets must start at 0, be non-dec"),
        ("offsets_end", mempo(offsets=torch.tensor([0, 1, 2, 3, 3, 3])),
         "mem_offsets ends at 3, but mem_rewards and mem_spans hold 4 scored rounds"),
        ("span_past_end", mempo(spans=with_value(spans, 0, torch.tensor([4, 7]))),
         r"mem_spans\[0\] = \(4, 7\) is not a span inside \[0, 6\]"),
        ("span_reversed", mempo(spans=with_value(spans, 1, torch.tensor([3, 1]))), r"mem_spans\[1\] = \(3, 1\) is not"),
        ("span_negative", mempo(spans=with_value(spans, 2, torch.tensor([-1, 2]))), r"mem_spans\[2\] = \(-1, 2\) is"),
        ("overlap", mempo(offsets=torch.tensor([0, 2, 2, 3, 4, 4]),
                          spans=torch.tensor([[0, 3], [2, 5], [0, 2], [2, 5]])),
         r"mem_spans\[0\] and mem_spans\[1\] overlap in trajectory 0"),
        ("stage_negative", mempo(stages=torch.tensor([0, 0, -1, 0])), r"mem_stages\[2\] = -1: stages must lie"),
        ("stage_too_big", mempo(stages=torch.tensor([0, 2 ** 31, 0, 0])), r"mem_stages\[1\] = 2147483648: stages"),
        ("zscore_nan", zscore(torch.tensor([0.0, 1.0, nan, 2.0, 1.0]), torch.tensor([0, 0, 1, 1, 2])),
         r"values\[2\] is not finite"),
        ("zscore_group", zscore(torch.tensor([0.0, 1.0, 2.0, 2.0, 1.0]), torch.tensor([0, 0, 1, 1, 3])),
         r"group ids must lie in \[0, num_groups = 3\), got ids in \[0, 3\]"),
    ]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("validate", ["host", "device"])
@pytest.mark.parametrize("name, call, message", _invalid_cases(), ids=[c[0] for c in _invalid_cases()])
def test_every_invalid_value_is_named_on_every_path(backend, device, validate, name, call, message):
    """The fused check catches each kind of invalid value on both paths (on the Triton path the
    kernels raise the flags), settled either way; on CPU validate="device" (the assert raises at
    once) names the entry as "host" does."""
    on = device if backend == "triton" else torch.device("cpu")
    with pytest.raises(ValueError, match=message):
        call(backend, validate, on)


def test_bad_validate_is_rejected_by_name():
    scores, index, mask, rewards, offsets, spans = random_batch(1, 2, 3, 10)
    for validate in ("sync", None, True):
        with pytest.raises(ValueError, match=r"validate must be one of \('host', 'device'\)"):
            mempo_advantage(scores, index, mask, rewards, offsets, spans, validate=validate)
        with pytest.raises(ValueError, match=r"validate must be one of"):
            grpo_outcome_advantage(scores, index, mask, validate=validate)
        with pytest.raises(ValueError, match=r"validate must be one of"):
            memory_advantage(rewards, offsets, spans, index, mask, validate=validate)
        with pytest.raises(ValueError, match=r"validate must be one of"):
            group_zscore(scores, torch.zeros(6, dtype=torch.long), 1, validate=validate)


def test_kernels_flag_invalid_values_and_stay_in_bounds(device):
    """Whatever the values (offsets out of order and out of range, overlapping and reversed spans,
    NaN, keys out of range), the kernels read and write in bounds (the sentinels around every output
    survive) and raise the flag bit of each kind of invalid value."""
    from mempo.kernels import group_zscore as zk
    from mempo.kernels import round_keys as rk
    from mempo.kernels import span_scatter as sk

    flags = torch.zeros(1, dtype=torch.int32, device=device)
    offsets = torch.tensor([5, -3, 99, 2], device=device)  # B = 3 rows over S = 3 rounds
    spans = torch.tensor([[0, 4], [2, 6], [50, -9]], device=device)
    key_buf = torch.full((3 + 8,), -7, dtype=torch.int64, device=device)
    rk.round_keys(offsets, spans, torch.tensor([0, -1, 2 ** 40], device=device), torch.tensor([1, 2, 3], device=device),
                  key_buf[4:7], flags, 8, offsets_bit=1, spans_bit=2, stages_bit=4)
    assert (key_buf[:4] == -7).all() and (key_buf[7:] == -7).all()
    assert flags.item() == 1 | 2 | 4

    flags.zero_()
    sentinel = 12345.0
    out_buf = torch.full((3 + 2, 8 + 6), sentinel, device=device)
    out = out_buf[1:4, 3:11]
    mask = torch.ones(3, 8, device=device)
    mask[2, 5] = float("nan")
    sk.span_scatter(None, torch.tensor([1.0, 2.0, 4.0], device=device), spans, torch.tensor([0, 3, -2, 99],
                    device=device), mask, out, flags, overlap_bit=8, mask_bit=16, block_l=4)
    inside = torch.zeros_like(out_buf, dtype=torch.bool)
    inside[1:4, 3:11] = True
    assert (out_buf[~inside] == sentinel).all()
    assert flags.item() == 8 | 16
    assert out[0].tolist() == [1.0, 1.0, 3.0, 3.0, 2.0, 2.0, 0.0, 0.0]  # rows clamp their offsets into [0, S]

    flags.zero_()
    values = torch.tensor([0.5, float("nan"), 1.0, 2.0], device=device)
    keys = torch.tensor([4, -1, 4, 9], device=device)
    z_buf = torch.full((4 + 8,), sentinel, device=device)
    zk.group_zscore(values, keys, torch.argsort(keys, stable=True), z_buf[4:8], None, flags, 1e-6, True, False,
                    key_limit=5, finite_bit=32, range_bit=64, block=2)
    assert (z_buf[:4] == sentinel).all() and (z_buf[8:] == sentinel).all()
    assert flags.item() == 32 | 64
