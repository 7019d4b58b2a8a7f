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
def test_degenerate_groups_are_finite_zeros(backend, device):
    # Equal scores, a singleton group, a group with no scored round, a group with one scored round.
    index = ["a", "a", "a", "b", "c", "c", "d", "d"]
    scores = torch.tensor([1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    mask = torch.ones(8, 6, dtype=torch.long)
    offsets = torch.tensor([0, 1, 2, 3, 4, 4, 4, 5, 5])
    spans = torch.tensor([[0, 2], [0, 2], [0, 2], [0, 2], [1, 3]])
    rewards = torch.tensor([0.3, 0.3, 0.3, 0.9, -0.2])
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
    from mempo.kernels import span_scatter as sk

    sentinel = 12345.0
    values = torch.randn(13, device=device)
    perm = torch.argsort(torch.tensor([0, 1, 2] * 4 + [2]), stable=True).to(device)
    group_offsets = torch.tensor([0, 4, 8, 13], device=device)
    buf = torch.full((13 + 8,), sentinel, device=device)
    zk.group_zscore(values, perm, group_offsets, buf[4:17], 1e-6, True, False, block=4)
    assert (buf[:4] == sentinel).all() and (buf[17:] == sentinel).all()
    assert torch.isfinite(buf[4:17]).all()

    rows, length = 3, 37
    out_buf = torch.full((rows + 2, length + 9), sentinel, device=device)
    out = out_buf[1:rows + 1, 4:4 + length]
    mask = torch.ones(rows, length, device=device)
    sk.span_scatter(torch.ones(rows, device=device), torch.tensor([2.0], device=device),
                    torch.tensor([3], device=device), torch.tensor([30], device=device),
                    torch.tensor([0, 1, 1, 1], device=device), mask, out, block_l=16)
    inside = torch.zeros_like(out_buf, dtype=torch.bool)
    inside[1:rows + 1, 4:4 + length] = True
    assert (out_buf[~inside] == sentinel).all()
    assert out[0, 3:30].eq(3.0).all() and out[0, :3].eq(1.0).all() and out[1:].eq(1.0).all()


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
    with pytest.raises(ValueError, match="mem_offsets must start at 0"):
        mempo_advantage(scores, index, mask, torch.zeros(2), torch.tensor([0, 1, 1, 1, 1, 1, 1]), overlapping)
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
