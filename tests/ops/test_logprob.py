"""Tests of the masked, thresholded answer log-prob ops (mempo.ops.logprob).

Three implementations are compared on random inputs: the Triton kernels (CPU interpreter here, small
shapes), the vectorised torch path, and the float64 loop reference (mempo.ops.reference). The hidden
entry point has three methods (issue 45): "chunked" (the default: fp32 logits blocks through the GEMM,
an online log-sum-exp epilogue per block, Triton or torch), "materialise" (one block) and "fused"
(the Triton kernel that never stores logits); HIDDEN_PATHS runs a test through each backend's.

Tolerances. fp32 paths vs the float64 reference: |d logp| <= 2e-5 + 2e-6 |logp| (fp32 log-sum-exp
over up to 151,936 terms). Low-precision inputs (bf16 / fp16 logits or hidden states) are checked
twice: (1) against the float64 reference on the same low-precision inputs with the fp32 tolerance
(the op accumulates in fp32 whatever the input dtype), and (2) flash-attention style against the
reference on the original fp32 inputs: the op's error must be <= 2x the error of PyTorch computing
the same thing natively in that dtype (+1e-5). keep may differ from the reference only on a row
whose reference logp lies within the tolerance of log(threshold) (a legitimate flip); the context of
such a row is then not compared on P / mean / num_kept (the tests assert that most contexts are).
"""
import math
import os
import subprocess
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from mempo.ops.logprob import (AnswerLogProb, answer_logprob, answer_logprob_from_hidden,
                               answer_logprob_from_token_logp, plan_chunks)
from mempo.ops.reference.logprob import (
    answer_logprob_from_hidden_reference,
    answer_logprob_reference,
)
from support.live_bytes import LiveBytes

HAS_CUDA = torch.cuda.is_available()
BACKENDS = ["torch", "triton"]
# (backend, method) of answer_logprob_from_hidden: the chunked epilogue in torch ops and as the Triton
# block kernel, and the fused Triton kernel.
HIDDEN_PATHS = [("torch", "chunked"), ("triton", "chunked"), ("triton", "fused")]


# ------------------------------------------------------------------------------------------------
# input builders
# ------------------------------------------------------------------------------------------------
def _gen(seed):
    return torch.Generator().manual_seed(seed)


def random_cu(M, C, g, empty=True):
    """Random CSR offsets over M rows into C contexts (some empty when `empty`)."""
    if C == 1:
        return torch.tensor([0, M])
    cuts = torch.randint(0, M + 1, (C - 1,), generator=g).sort().values
    if not empty:
        cuts = torch.linspace(0, M, C + 1)[1:-1].round().long()
    return torch.cat([torch.tensor([0]), cuts, torch.tensor([M])])


def make_logits_case(M, V, seed=0, p_mask=0.75, scale=2.0):
    """fp32 logits whose target log-probs spread from about -log V to 0 (so a 0.5 threshold both
    keeps and drops rows); masked rows get target -100."""
    g = _gen(seed)
    logits = torch.randn(M, V, generator=g) * scale
    targets = torch.randint(0, V, (M,), generator=g)
    boost = torch.rand(M, generator=g) * (math.log(max(V, 2)) + 3 * scale)
    logits[torch.arange(M), targets] += boost
    mask = torch.rand(M, generator=g) < p_mask
    targets = torch.where(mask, targets, torch.full_like(targets, -100))
    return logits, targets, mask


def make_hidden_case(M, V, H, seed=0, p_mask=0.75, with_bias=True):
    g = _gen(seed)
    weight = torch.randn(V, H, generator=g) / math.sqrt(H)
    targets = torch.randint(0, V, (M,), generator=g)
    hidden = torch.randn(M, H, generator=g)
    w_t = weight[targets]
    boost = torch.rand(M, generator=g) * (math.log(max(V, 2)) + 4)
    hidden = hidden + boost[:, None] * w_t / w_t.pow(2).sum(1, keepdim=True)
    bias = torch.randn(V, generator=g) * 0.5 if with_bias else None
    mask = torch.rand(M, generator=g) < p_mask
    targets = torch.where(mask, targets, torch.full_like(targets, -100))
    return hidden, weight, bias, targets, mask


def on(device, *xs):
    return [None if x is None else x.to(device) for x in xs]


# ------------------------------------------------------------------------------------------------
# comparison
# ------------------------------------------------------------------------------------------------
def assert_no_nan(out: AnswerLogProb):
    for name, x in out._asdict().items():
        if x.dtype.is_floating_point:
            assert not torch.isnan(x).any(), f"NaN in {name}"


def assert_matches(out: AnswerLogProb, ref: AnswerLogProb, mask, threshold, cu=None, *, atol=2e-5,
                   rtol=2e-6, min_compared=0.5):
    """Compare an op result with the float64 reference (see module docstring)."""
    assert out.token_logp.dtype == torch.float32 and out.p.dtype == torch.float32
    assert out.mean_logp.dtype == torch.float32 and out.num_kept.dtype == torch.int64
    assert out.keep.dtype == torch.bool
    assert out.token_logp.shape == ref.token_logp.shape and out.keep.shape == ref.keep.shape
    assert out.p.shape == ref.p.shape
    assert_no_nan(out)
    lp = out.token_logp.detach().cpu().double().reshape(-1)
    rlp = ref.token_logp.double().reshape(-1)
    m = mask.cpu().reshape(-1).bool()
    tol = atol + rtol * rlp.abs()
    err = (lp - rlp).abs()
    assert bool((err <= tol).all()), f"token_logp max err {err.max().item():.3g}"
    assert bool((lp[~m] == 0).all()), "masked rows must report 0.0"
    assert bool((lp[m] <= 0).all()), "log-probs must be <= 0"
    keep = out.keep.cpu().reshape(-1)
    rkeep = ref.keep.reshape(-1)
    assert not bool(keep[~m].any()), "masked rows must not be kept"
    if threshold is None:
        near = torch.zeros_like(m)
    else:
        near = m & ((rlp - math.log(threshold)).abs() <= 2 * tol)
    flipped = keep != rkeep
    assert not bool((flipped & ~near).any()), "keep differs away from the threshold"
    border = flipped

    # Contexts without a flipped row must agree exactly on num_kept and closely on mean / P.
    bad_ctx = torch.zeros(ref.p.numel(), dtype=torch.bool)
    bad_ctx[row_contexts(tuple(mask.shape), cu)[border]] = True
    good = ~bad_ctx
    if ref.p.numel():
        assert good.float().mean() >= min_compared, "too few contexts away from the threshold"
    assert torch.equal(out.num_kept.cpu()[good], ref.num_kept[good])
    mean_err = (out.mean_logp.cpu().double() - ref.mean_logp)[good].abs()
    assert bool((mean_err <= atol + rtol * ref.mean_logp[good].abs()).all()), \
        f"mean_logp err {mean_err.max().item():.3g}"
    p_err = (out.p.cpu().double() - ref.p)[good].abs()
    assert bool((p_err <= 2 * atol + 2 * rtol * ref.p[good].abs() + 1e-5 * ref.p[good].abs()).all()), \
        f"p err {p_err.max().item():.3g}"


def row_contexts(row_shape, cu):
    """Context index of every row (flattened)."""
    if len(row_shape) == 2:
        n, t = row_shape
        return torch.arange(n).repeat_interleave(t)
    M = row_shape[0]
    if cu is None:
        return torch.zeros(M, dtype=torch.long)
    cu = cu.cpu().long()
    return torch.repeat_interleave(torch.arange(cu.numel() - 1), cu[1:] - cu[:-1], output_size=M)


# ------------------------------------------------------------------------------------------------
# logits entry point vs reference
# ------------------------------------------------------------------------------------------------
SHAPES = [(1, 1, 1), (1, 17, 1), (7, 17, 3), (33, 100, 5), (33, 1000, 6), (7, 4097, 2)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("M,V,C", SHAPES)
@pytest.mark.parametrize("threshold", [None, 0.5, 1.0])
def test_logits_matches_reference(backend, M, V, C, threshold, device):
    logits, targets, mask = make_logits_case(M, V, seed=M * 1000 + V)
    cu = random_cu(M, C, _gen(V))
    ref = answer_logprob_reference(logits, targets, mask, cu, threshold=threshold)
    dev = device if backend == "triton" else torch.device("cpu")
    out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=threshold, backend=backend)
    assert_matches(out, ref, mask, threshold, cu)
    if threshold == 1.0:  # strict: log p > log 1 = 0 never holds
        assert not out.keep.any() and bool((out.p == 0).all())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", [0.7, 2.5])
def test_temperature(backend, temperature, device):
    logits, targets, mask = make_logits_case(33, 1000, seed=5)
    cu = torch.tensor([0, 10, 20, 33])
    ref = answer_logprob_reference(logits, targets, mask, cu, threshold=0.5, temperature=temperature)
    dev = device if backend == "triton" else torch.device("cpu")
    out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=0.5, temperature=temperature,
                         backend=backend)
    assert_matches(out, ref, mask, 0.5, cu)


def test_triton_equals_torch(device):
    logits, targets, mask = make_logits_case(33, 4097, seed=11)
    cu = torch.tensor([0, 3, 3, 17, 33])
    a = answer_logprob(logits, targets, mask, cu, threshold=None, backend="torch")
    b = answer_logprob(*on(device, logits, targets, mask, cu), threshold=None, backend="triton")
    torch.testing.assert_close(b.token_logp.cpu(), a.token_logp, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(b.p.cpu(), a.p, atol=1e-6, rtol=1e-5)
    assert torch.equal(b.keep.cpu(), a.keep) and torch.equal(b.num_kept.cpu(), a.num_kept)


@pytest.mark.parametrize("backend", BACKENDS)
def test_auto_backend_on_cpu(backend, device):
    logits, targets, mask = make_logits_case(7, 17, seed=3)
    a = answer_logprob(logits, targets, mask, threshold=0.5)  # auto -> torch on CPU
    dev = device if backend == "triton" else torch.device("cpu")  # Triton takes CPU tensors only interpreted
    b = answer_logprob(logits.to(dev), targets.to(dev), mask.to(dev), threshold=0.5, backend=backend)
    torch.testing.assert_close(a.token_logp, b.token_logp.cpu(), atol=1e-5, rtol=1e-6)


# ------------------------------------------------------------------------------------------------
# low precision
# ------------------------------------------------------------------------------------------------
def _native_token_logp(logits_lp, targets, mask, temperature=1.0):
    """What PyTorch computes in the low-precision dtype itself (the flash-attention yardstick)."""
    lp = (logits_lp / temperature).log_softmax(-1)
    t = targets.clamp(min=0)
    out = lp.gather(-1, t.unsqueeze(-1)).squeeze(-1).double()
    return torch.where(mask, out, torch.zeros_like(out))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_logits(backend, dtype, device):
    M, V = 33, 1000
    logits, targets, mask = make_logits_case(M, V, seed=21, scale=1.0)
    cu = torch.tensor([0, 8, 16, 24, 33])
    lowp = logits.to(dtype)
    dev = device if backend == "triton" else torch.device("cpu")
    out = answer_logprob(*on(dev, lowp, targets, mask, cu), threshold=0.5, backend=backend)
    # (1) fp32 accumulation on the low-precision inputs: reference-grade accuracy.
    assert_matches(out, answer_logprob_reference(lowp, targets, mask, cu, threshold=0.5), mask, 0.5, cu,
                   min_compared=0.25)
    # (2) against the fp32-input reference: at most 2x PyTorch's own error in that dtype.
    ref32 = answer_logprob_reference(logits, targets, mask, cu, threshold=0.5).token_logp
    ours = (out.token_logp.cpu().double() - ref32).abs().max().item()
    theirs = (_native_token_logp(lowp, targets, mask) - ref32).abs().max().item()
    assert ours <= 2 * theirs + 1e-5, (ours, theirs)


@pytest.mark.parametrize("backend,method", HIDDEN_PATHS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_hidden(backend, method, dtype, device):
    M, V, H = 33, 1000, 40
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=22)
    cu = torch.tensor([0, 8, 16, 24, 33])
    h, w, b = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
    dev = device if backend == "triton" else torch.device("cpu")
    chunks = dict(vocab_chunk=300) if method == "chunked" else {}
    out = answer_logprob_from_hidden(*on(dev, h, w), *on(dev, targets, mask, cu), bias=b.to(dev),
                                     threshold=0.5, backend=backend, method=method, **chunks)
    ref = answer_logprob_from_hidden_reference(h, w, targets, mask, cu, bias=b, threshold=0.5)
    assert_matches(out, ref, mask, 0.5, cu, atol=5e-5, min_compared=0.25)
    ref32 = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, cu, bias=bias).token_logp
    ours = (out.token_logp.cpu().double() - ref32).abs().max().item()
    native_logits = torch.nn.functional.linear(h, w, b)
    theirs = (_native_token_logp(native_logits, targets, mask) - ref32).abs().max().item()
    assert ours <= 2 * theirs + 1e-5, (ours, theirs)


# ------------------------------------------------------------------------------------------------
# fused hidden entry point
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend,method", HIDDEN_PATHS)
def test_mixed_dtypes_hidden(backend, method, device):
    """hidden bf16, weight fp32, bias fp16: every operand is read as it is and upcast to fp32."""
    hidden, weight, bias, targets, mask = make_hidden_case(17, 300, 40, seed=71)
    h, b = hidden.to(torch.bfloat16), bias.to(torch.float16)
    dev = device if backend == "triton" else torch.device("cpu")
    chunks = dict(vocab_chunk=128) if method == "chunked" else {}
    out = answer_logprob_from_hidden(*on(dev, h, weight, targets, mask), bias=b.to(dev), threshold=None,
                                     backend=backend, method=method, **chunks)
    ref = answer_logprob_from_hidden_reference(h, weight, targets, mask, None, bias=b, threshold=None)
    assert_matches(out, ref, mask, None)


@pytest.mark.parametrize("backend,method", HIDDEN_PATHS)
@pytest.mark.parametrize("M,V,H", [(1, 1, 16), (7, 17, 16), (33, 1000, 40), (7, 4097, 40)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_hidden_equals_logits_path(backend, method, M, V, H, with_bias, device):
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=M + V + H, with_bias=with_bias)
    cu = random_cu(M, 3, _gen(M))
    logits = hidden @ weight.T + (bias if bias is not None else 0)
    dev = device if backend == "triton" else torch.device("cpu")
    a = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=0.5, temperature=1.3, backend=backend)
    chunks = dict(vocab_chunk=64) if method == "chunked" else {}
    b = answer_logprob_from_hidden(*on(dev, hidden, weight, targets, mask, cu), bias=on(dev, bias)[0],
                                   threshold=0.5, temperature=1.3, backend=backend, method=method, **chunks)
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, cu, bias=bias, threshold=0.5,
                                               temperature=1.3)
    assert_matches(b, ref, mask, 0.5, cu, min_compared=0.3)
    torch.testing.assert_close(b.token_logp.cpu(), a.token_logp.cpu(), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("vocab_chunk", [1, 7, 64, 1000, 8192])
def test_hidden_torch_vocab_chunks(vocab_chunk):
    hidden, weight, bias, targets, mask = make_hidden_case(33, 1000, 40, seed=7)
    cu = torch.tensor([0, 11, 11, 33])
    out = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, bias=bias, threshold=None,
                                     vocab_chunk=vocab_chunk, backend="torch")
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, cu, bias=bias, threshold=None)
    assert_matches(out, ref, mask, None, cu)


@pytest.mark.parametrize("num_splits,block_v", [(1, 16), (3, 16), (5, 64), (2, 1024), (63, 16)])
def test_hidden_triton_splits(num_splits, block_v, device):
    """Several vocabulary splits per row block (63: the combine kernel merges them in two steps),
    partial last tiles, H not a multiple of BLOCK_H."""
    from mempo.kernels import answer_logprob as kern

    M, V, H = 33, 1000, 40
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=num_splits)
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, None, bias=bias, threshold=None)
    h, w, b, t = on(device, hidden, weight, bias, targets)
    out = torch.empty(M, dtype=torch.float32, device=device)
    kern.hidden_logp(h, w, b, t, mask.to(device).view(torch.uint8), out, 1.0, interpret=not HAS_CUDA,
                     block_m=16, block_v=block_v, block_h=16, num_splits=num_splits)
    err = (out.cpu().double() - ref.token_logp).abs()
    assert err.max().item() < 2e-5


# ------------------------------------------------------------------------------------------------
# the real vocabulary size (151,936, Qwen2.5; not a multiple of 1024 or 4096)
# ------------------------------------------------------------------------------------------------
QWEN_V = 151_936


def test_qwen_vocab_torch_vs_reference():
    logits, targets, mask = make_logits_case(3, QWEN_V, seed=1)
    mask[:] = True
    targets = torch.tensor([0, QWEN_V - 1, 77_777])  # first, last and a middle token
    logits[1, -1] += 15.0
    ref = answer_logprob_reference(logits, targets, mask, None, threshold=None)
    out = answer_logprob(logits, targets, mask, threshold=None, backend="torch")
    assert_matches(out, ref, mask, None)
    hidden, weight, bias, targets_h, mask_h = make_hidden_case(3, QWEN_V, 16, seed=2, p_mask=1.0)
    targets_h = torch.tensor([QWEN_V - 1, 5, 151_935 - 4096])
    ref_h = answer_logprob_from_hidden_reference(hidden, weight, targets_h, mask_h, None, bias=bias,
                                                 threshold=None)
    out_h = answer_logprob_from_hidden(hidden, weight, targets_h, mask_h, bias=bias, threshold=None,
                                       backend="torch")
    assert_matches(out_h, ref_h, mask_h, None)


def test_qwen_vocab_triton(device):
    logits, targets, mask = make_logits_case(2, QWEN_V, seed=3)
    mask[:] = True
    targets = torch.tensor([QWEN_V - 1, 4096 * 37 + 3])
    ref = answer_logprob_reference(logits, targets, mask, None, threshold=None)
    out = answer_logprob(*on(device, logits, targets, mask), threshold=None, backend="triton")
    assert_matches(out, ref, mask, None)
    hidden, weight, bias, _, mask_h = make_hidden_case(2, QWEN_V, 16, seed=4, p_mask=1.0)
    targets_h = torch.tensor([QWEN_V - 1, 1024 * 148 - 1])
    ref_h = answer_logprob_from_hidden_reference(hidden, weight, targets_h, mask_h, None, bias=bias,
                                                 threshold=None)
    out_h = answer_logprob_from_hidden(*on(device, hidden, weight, targets_h, mask_h),
                                       bias=bias.to(device), threshold=None, backend="triton")
    assert_matches(out_h, ref_h, mask_h, None)


# ------------------------------------------------------------------------------------------------
# contexts: empty, all-masked, C = 1, M = 0, padded vs varlen, empty_value
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_and_all_masked_contexts(backend, device):
    M, V = 12, 50
    logits, targets, mask = make_logits_case(M, V, seed=9, p_mask=1.0)
    mask[4:8] = False  # context 2 (rows 4..7) is all masked
    targets[4:8] = -100
    cu = torch.tensor([0, 0, 4, 8, 8, 12, 12])  # contexts 0, 3, 5 are empty
    dev = device if backend == "triton" else torch.device("cpu")
    for threshold in (None, 0.5):
        out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=threshold, backend=backend)
        ref = answer_logprob_reference(logits, targets, mask, cu, threshold=threshold)
        assert_matches(out, ref, mask, threshold, cu)
        for c in (0, 2, 3, 5):
            assert out.p[c].item() == 0.0 and out.mean_logp[c].item() == 0.0
            assert out.num_kept[c].item() == 0
        if threshold is None:
            assert out.num_kept.tolist() == [0, 4, 0, 0, 4, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_value_convention(backend, device):
    """An empty context gets empty_value (default 0.0), never exp(0) = 1."""
    logits, targets, mask = make_logits_case(6, 20, seed=2)
    mask[:] = False
    cu = torch.tensor([0, 3, 3, 6])
    dev = device if backend == "triton" else torch.device("cpu")
    out = answer_logprob(*on(dev, logits, targets, mask, cu), backend=backend)
    assert out.p.tolist() == [0.0, 0.0, 0.0]
    assert out.mean_logp.tolist() == [0.0, 0.0, 0.0] and out.num_kept.tolist() == [0, 0, 0]
    assert out.token_logp.tolist() == [0.0] * 6 and not out.keep.any()
    out = answer_logprob(*on(dev, logits, targets, mask, cu), empty_value=-1.0, backend=backend)
    assert out.p.tolist() == [-1.0, -1.0, -1.0]
    # Everything below the threshold: also empty.
    mask[:] = True
    targets = torch.zeros(6, dtype=torch.long)
    logits = torch.zeros(6, 20)  # uniform: log p = -log 20 < log 0.5
    out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=0.5, empty_value=0.25,
                         backend=backend)
    assert out.p.tolist() == [0.25, 0.25, 0.25] and out.num_kept.tolist() == [0, 0, 0]
    out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=None, backend=backend)
    torch.testing.assert_close(out.p.cpu(), torch.tensor([1 / 20, 0.0, 1 / 20]), rtol=1e-6, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_context(backend, device):
    logits, targets, mask = make_logits_case(9, 30, seed=4)
    dev = device if backend == "triton" else torch.device("cpu")
    a = answer_logprob(*on(dev, logits, targets, mask), threshold=None, backend=backend)
    b = answer_logprob(*on(dev, logits, targets, mask, torch.tensor([0, 9])), threshold=None, backend=backend)
    assert a.p.shape == (1,)
    assert torch.equal(a.p, b.p) and torch.equal(a.token_logp, b.token_logp)
    assert_matches(a, answer_logprob_reference(logits, targets, mask, None, threshold=None), mask, None)


@pytest.mark.parametrize("backend", BACKENDS)
def test_zero_rows(backend, device):
    dev = device if backend == "triton" else torch.device("cpu")
    logits = torch.zeros(0, 17, device=dev)
    t = torch.zeros(0, dtype=torch.long, device=dev)
    m = torch.zeros(0, dtype=torch.bool, device=dev)
    out = answer_logprob(logits, t, m, torch.tensor([0]), backend=backend)
    assert out.token_logp.shape == (0,) and out.p.shape == (0,) and out.num_kept.shape == (0,)
    out = answer_logprob(logits, t, m, torch.tensor([0, 0, 0]), empty_value=0.5, backend=backend)
    assert out.p.tolist() == [0.5, 0.5] and out.num_kept.tolist() == [0, 0]
    out = answer_logprob_from_hidden(torch.zeros(0, 16, device=dev), torch.randn(17, 16, device=dev), t, m,
                                     torch.tensor([0, 0]), backend=backend)
    assert out.p.tolist() == [0.0]
    out = answer_logprob(torch.zeros(3, 0, 17, device=dev), t.view(3, 0), m.view(3, 0), backend=backend)
    assert out.p.tolist() == [0.0, 0.0, 0.0] and out.token_logp.shape == (3, 0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("threshold", [None, 0.5])
def test_padded_equals_varlen(backend, threshold, device):
    N, T, V, H = 5, 7, 100, 16
    hidden, weight, bias, targets, mask = make_hidden_case(N * T, V, H, seed=31)
    mask[2 * T:3 * T] = False  # an all-masked context
    targets[2 * T:3 * T] = -100
    logits = hidden @ weight.T + bias
    cu = torch.arange(N + 1) * T
    dev = device if backend == "triton" else torch.device("cpu")
    flat = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=threshold, backend=backend)
    pad = answer_logprob(*on(dev, logits.view(N, T, V), targets.view(N, T), mask.view(N, T)),
                         threshold=threshold, backend=backend)
    assert pad.token_logp.shape == (N, T) and pad.keep.shape == (N, T) and pad.p.shape == (N,)
    for x, y in zip(flat, pad):
        assert torch.equal(x.cpu(), y.reshape(x.shape).cpu())
    padh = answer_logprob_from_hidden(*on(dev, hidden.view(N, T, H), weight, targets.view(N, T),
                                         mask.view(N, T)),
                                      bias=bias.to(dev), threshold=threshold, backend=backend)
    torch.testing.assert_close(padh.token_logp.reshape(-1), flat.token_logp, atol=2e-5, rtol=1e-5)
    ref = answer_logprob_reference(logits.view(N, T, V), targets.view(N, T), mask.view(N, T), None,
                                   threshold=threshold)
    assert_matches(pad, ref, mask.view(N, T), threshold)


# ------------------------------------------------------------------------------------------------
# never NaN
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_never_nan_extreme_logits(backend, device):
    M, V = 6, 40
    logits = torch.randn(M, V) * 5
    logits[0] = float("-inf")                     # every logit -inf
    logits[0, 3] = 0.0
    logits[1, :20] = float("-inf")                # a run of -inf logits
    logits[2] = torch.linspace(-1e4, 1e4, V)      # huge spread
    logits[3, 7] = float("-inf")                  # target logit -inf
    logits[4] = float("-inf")                     # a row that is entirely -inf
    logits[5] = 1e4                               # huge, equal
    targets = torch.tensor([3, 25, V - 1, 7, 1, 0])
    mask = torch.ones(M, dtype=torch.bool)
    cu = torch.tensor([0, 2, 3, 4, 5, 6])
    dev = device if backend == "triton" else torch.device("cpu")
    for threshold in (None, 0.5):
        out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=threshold, backend=backend)
        assert_no_nan(out)
        lp = out.token_logp.cpu()
        assert lp[0].item() == 0.0 and lp[2].item() == 0.0
        assert lp[3].item() == float("-inf") and lp[4].item() == float("-inf")
        assert abs(lp[5].item() + math.log(V)) < 1e-5
        assert abs(lp[1].item() - torch.log_softmax(logits[1], 0)[25].item()) < 1e-5
        if threshold is None:  # a kept -inf log-prob: mean -inf, P = 0
            assert out.p[2].item() == 0.0 and out.p[3].item() == 0.0
            assert out.mean_logp[2].item() == float("-inf")
        else:
            assert out.num_kept[2].item() == 0 and out.p[2].item() == 0.0


# ------------------------------------------------------------------------------------------------
# kernels write only their own range (canary padding)
# ------------------------------------------------------------------------------------------------
SENTINEL = 12345.0


def test_kernels_canary(device):
    from mempo.kernels import answer_logprob as kern

    M, V, H, C, pad = 21, 100, 40, 4, 7
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=41)
    logits = hidden @ weight.T + bias
    cu = torch.tensor([0, 5, 5, 13, 21])
    logits, hidden, weight, bias, targets, cu = on(device, logits, hidden, weight, bias, targets, cu)
    mask_u8 = mask.to(device).view(torch.uint8)

    def padded(n, dtype, fill):
        buf = torch.full((n + 2 * pad,), fill, dtype=dtype, device=device)
        return buf, buf[pad:pad + n]

    def untouched(buf, n, fill):
        return bool((buf[:pad] == fill).all()) and bool((buf[pad + n:] == fill).all())

    lp_buf, lp = padded(M, torch.float32, SENTINEL)
    kern.row_logp(logits, targets, mask_u8, lp, 1.0, block_v=32)
    assert untouched(lp_buf, M, SENTINEL) and not bool((lp == SENTINEL).any())
    lh_buf, lh = padded(M, torch.float32, SENTINEL)
    kern.hidden_logp(hidden, weight, bias, targets, mask_u8, lh, 1.0, interpret=not HAS_CUDA,
                     block_m=16, block_v=32, block_h=16, num_splits=2)
    assert untouched(lh_buf, M, SENTINEL) and not bool((lh == SENTINEL).any())
    torch.testing.assert_close(lh, lp, atol=2e-5, rtol=1e-5)

    keep_buf, keep = padded(M, torch.uint8, 77)
    p_buf, p = padded(C, torch.float32, SENTINEL)
    mean_buf, mean = padded(C, torch.float32, SENTINEL)
    cnt_buf, cnt = padded(C, torch.int64, -7)
    kern.segment_reduce(lp, mask_u8, cu, keep, p, mean, cnt, num_contexts=C, seq_len=0,
                        log_threshold=math.log(0.5), empty_value=0.0, block_t=16)
    assert untouched(keep_buf, M, 77) and untouched(p_buf, C, SENTINEL)
    assert untouched(mean_buf, C, SENTINEL) and untouched(cnt_buf, C, -7)
    assert not bool((keep == 77).any()) and not bool((p == SENTINEL).any()) and not bool((cnt == -7).any())
    # Padded (IS_VARLEN=False) form over 3 contexts of 7 rows.
    keep_buf, keep = padded(M, torch.uint8, 77)
    p_buf, p = padded(3, torch.float32, SENTINEL)
    mean_buf, mean = padded(3, torch.float32, SENTINEL)
    cnt_buf, cnt = padded(3, torch.int64, -7)
    kern.segment_reduce(lp, mask_u8, None, keep, p, mean, cnt, num_contexts=3, seq_len=7,
                        log_threshold=None, empty_value=0.0, block_t=16)
    assert untouched(keep_buf, M, 77) and untouched(p_buf, 3, SENTINEL)
    assert untouched(mean_buf, 3, SENTINEL) and untouched(cnt_buf, 3, -7)
    assert cnt.tolist() == mask.view(3, 7).sum(1).tolist()


# ------------------------------------------------------------------------------------------------
# validation
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cu,match", [
    (torch.tensor([1, 3, 6]), "start at 0"),
    (torch.tensor([0, 4, 3, 6]), "non-decreasing"),
    (torch.tensor([0, 3, 5]), "end at M"),
    (torch.tensor([0, 3, 7]), "end at M"),
    (torch.tensor([0.0, 6.0]), "integer"),
    (torch.tensor([[0, 6]]), "1-D"),
    (torch.tensor([], dtype=torch.long), "1-D"),
])
def test_bad_cu_seqlens(cu, match):
    logits, targets, mask = make_logits_case(6, 10)
    with pytest.raises(ValueError, match=match):
        answer_logprob(logits, targets, mask, cu)


@pytest.mark.parametrize("threshold", [0.0, -0.5, 1.5, float("nan"), True, "0.5"])
def test_bad_threshold(threshold):
    logits, targets, mask = make_logits_case(6, 10)
    with pytest.raises(ValueError, match="threshold"):
        answer_logprob(logits, targets, mask, threshold=threshold)


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_temperature(temperature):
    logits, targets, mask = make_logits_case(6, 10)
    with pytest.raises(ValueError, match="temperature"):
        answer_logprob(logits, targets, mask, temperature=temperature)


@pytest.mark.parametrize("backend", BACKENDS)
def test_out_of_range_targets(backend, device):
    dev = device if backend == "triton" else torch.device("cpu")
    logits = torch.randn(6, 10, device=dev)
    mask = torch.tensor([1, 1, 0, 1, 1, 1], dtype=torch.bool, device=dev)
    targets = torch.tensor([0, 9, -100, 10, 3, 3], device=dev)  # row 2 masked: -100 is fine
    with pytest.raises(ValueError, match="row 3"):
        answer_logprob(logits, targets, mask, backend=backend)
    targets[3] = -1
    with pytest.raises(ValueError, match="row 3"):
        answer_logprob_from_hidden(torch.randn(6, 16, device=dev), torch.randn(10, 16, device=dev),
                                   targets, mask, backend=backend)
    with pytest.raises(ValueError, match=r"n=1, t=0"):
        answer_logprob(logits.view(2, 3, 10), targets.view(2, 3), mask.view(2, 3), backend=backend)
    targets[3] = 5
    out = answer_logprob(logits, targets, mask, backend=backend)  # masked -100 never read
    assert out.token_logp[2].item() == 0.0 and not out.keep[2].item()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32])
def test_small_integer_targets_with_a_large_vocabulary(dtype):
    """The range check compares in int64: V = 300 does not wrap for int8 / uint8 targets."""
    logits = torch.randn(4, 300)
    targets = torch.tensor([0, 5, 100, 120], dtype=dtype)
    mask = torch.ones(4, dtype=torch.bool)
    out = answer_logprob(logits, targets, mask, threshold=None, backend="torch")
    expected = torch.log_softmax(logits, -1).gather(1, targets.long()[:, None])[:, 0]
    torch.testing.assert_close(out.token_logp, expected)
    if dtype is not torch.uint8:
        with pytest.raises(ValueError, match="out of range"):
            answer_logprob(logits, torch.tensor([0, -1, 3, 4], dtype=dtype), mask, backend="torch")


def test_shape_and_type_errors():
    logits, targets, mask = make_logits_case(6, 10)
    with pytest.raises(ValueError, match="targets"):
        answer_logprob(logits, targets[:5], mask)
    with pytest.raises(ValueError, match="answer_mask"):
        answer_logprob(logits, targets, mask[:5])
    with pytest.raises(ValueError, match="targets must be an integer"):
        answer_logprob(logits, targets.float(), mask)
    with pytest.raises(ValueError, match="fp32, bf16 or fp16"):
        answer_logprob(logits.double(), targets, mask)
    with pytest.raises(ValueError, match="logits must be"):
        answer_logprob(logits[0], targets, mask)
    with pytest.raises(ValueError, match="cu_seqlens must be None"):
        answer_logprob(logits.view(2, 3, 10), targets.view(2, 3), mask.view(2, 3), torch.tensor([0, 3, 6]))
    with pytest.raises(ValueError, match="backend"):
        answer_logprob(logits, targets, mask, backend="cuda")
    hidden = torch.randn(6, 16)
    with pytest.raises(ValueError, match="weight"):
        answer_logprob_from_hidden(hidden, torch.randn(10, 15), targets, mask)
    with pytest.raises(ValueError, match="bias"):
        answer_logprob_from_hidden(hidden, torch.randn(10, 16), targets, mask, bias=torch.randn(9))
    with pytest.raises(ValueError, match="vocab_chunk"):
        answer_logprob_from_hidden(hidden, torch.randn(10, 16), targets, mask, vocab_chunk=0)
    with pytest.raises(ValueError, match="V >= 1"):
        answer_logprob(torch.zeros(6, 0), targets.clamp(min=0), mask)


def test_import_from_mempo_ops_gives_the_functions_whatever_was_imported_before():
    """`from mempo.ops import answer_logprob` is the function (the README's import line), also once the
    op's module was imported: no submodule of mempo.ops is named after a function it exports."""
    code = ("import mempo.ops.logprob, mempo.ops.reference.logprob, torch\n"
            "from mempo.ops import answer_logprob, answer_logprob_from_hidden, answer_logprob_from_token_logp\n"
            "import mempo.ops as ops\n"
            "fns = (answer_logprob, answer_logprob_from_hidden, answer_logprob_from_token_logp)\n"
            "assert all(callable(f) and f.__module__ == 'mempo.ops.logprob' for f in fns), fns\n"
            "assert ops.answer_logprob is answer_logprob\n"
            "out = answer_logprob(torch.zeros(2, 4), torch.tensor([1, 2]), torch.ones(2, dtype=torch.bool),\n"
            "                     threshold=None)\n"
            "assert abs(float(out.p[0]) - 0.25) < 1e-6, out\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_outputs_carry_no_autograd_graph():
    """Forward only, as documented: the outputs hold no graph even when the inputs require grad."""
    logits = torch.randn(5, 7, requires_grad=True)
    hidden, weight = torch.randn(5, 4, requires_grad=True), torch.randn(7, 4, requires_grad=True)
    targets, mask = torch.tensor([0, 1, 2, 3, 4]), torch.ones(5, dtype=torch.bool)
    token_logp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    for out in (answer_logprob(logits, targets, mask, threshold=None, backend="torch"),
                answer_logprob_from_hidden(hidden, weight, targets, mask, threshold=None, backend="torch"),
                answer_logprob_from_token_logp(token_logp, mask, threshold=None)):
        assert not any(t.requires_grad for t in out), out


def test_causal_shift_convention_matches_prompt_logprobs():
    """Row i's logits predict targets[i]: a causal LM's logits shifted by one give, on the answer's
    positions, the prompt log-probs an inference server reports (log p(ids[t] | ids[:t]) at t)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 11, (9,), generator=g)
    logits = torch.randn(9, 11, generator=g)                     # logits[t] scores ids[t + 1]
    prompt_logprobs = torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]  # positions 1..8
    start, end = 5, 9                                             # the answer: ids[5:9]
    mask = torch.ones(end - start, dtype=torch.bool)
    from_logits = answer_logprob(logits[start - 1:end - 1], ids[start:end], mask, threshold=None)
    from_server = answer_logprob_from_token_logp(prompt_logprobs[start - 1:end - 1], mask, threshold=None)
    torch.testing.assert_close(from_logits.token_logp, from_server.token_logp)
    torch.testing.assert_close(from_logits.p, from_server.p)


def test_import_is_light():
    """Importing the op module pulls in neither triton, the kernels, nor transformers."""
    code = ("import sys, mempo.ops.logprob, mempo.ops.reference.logprob; "
            "bad = [m for m in ('triton', 'mempo.kernels.answer_logprob', 'transformers') "
            "if m in sys.modules]; "
            "assert not bad, bad")
    env = dict(os.environ)
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


# ------------------------------------------------------------------------------------------------
# GPU tier: real sizes, Triton vs torch path on the same device
# ------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gpu_real_sizes(dtype):
    V, H, C, T = QWEN_V, 896, 72, 16
    M = C * T
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=99, with_bias=False)
    hidden, weight, targets, mask = on("cuda", hidden.to(dtype), weight.to(dtype), targets, mask)
    cu = (torch.arange(C + 1) * T).cuda()
    a = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="torch")
    b = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="triton", method="fused")
    e = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="triton")  # chunked, cuBLAS
    logits = (hidden.float() @ weight.float().T).to(dtype)
    c = answer_logprob(logits, targets, mask, cu, backend="triton")
    d = answer_logprob(logits, targets, mask, cu, backend="torch")
    # fp32 operands: IEEE dot vs cuBLAS fp32; bf16 operands: native bf16 MMA (fp32 accumulate) vs
    # fp32 matmul of the same bf16 values (identical products, different summation order).
    atol = 1e-4 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(b.token_logp, a.token_logp, atol=atol, rtol=1e-4)
    torch.testing.assert_close(e.token_logp, a.token_logp, atol=atol, rtol=1e-4)
    torch.testing.assert_close(c.token_logp, d.token_logp, atol=1e-5, rtol=1e-5)
    for out in (a, b, c, d, e):
        assert_no_nan(out)
    ref_rows = torch.arange(0, M, 97)
    sub = answer_logprob_from_hidden_reference(hidden[ref_rows].cpu(), weight.cpu(), targets[ref_rows].cpu(),
                                               mask[ref_rows].cpu(), threshold=None)
    for out in (b, e):
        err = (out.token_logp[ref_rows].cpu().double() - sub.token_logp).abs().max().item()
        assert err < atol * 10


@pytest.mark.parametrize("backend", BACKENDS)
def test_never_nan_banned_vocab_blocks(backend, device):
    """-inf bias over whole vocabulary tiles / splits / chunks (banned tokens), small tiles."""
    from mempo.kernels import answer_logprob as kern

    M, V, H = 9, 300, 16
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=51, with_bias=True)
    bias[:200] = float("-inf")
    targets = torch.where(mask, 200 + targets % 100, targets)
    targets[0] = 5  # a banned target: log p = -inf
    mask[0] = True
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, None, bias=bias, threshold=None)
    dev = device if backend == "triton" else torch.device("cpu")
    h, w, b, t, m = on(dev, hidden, weight, bias, targets, mask)
    if backend == "triton":
        out = torch.empty(M, dtype=torch.float32, device=dev)
        kern.hidden_logp(h, w, b, t, m.view(torch.uint8), out, 1.0, interpret=not HAS_CUDA,
                         block_m=16, block_v=16, block_h=16, num_splits=4)
        logits = (h @ w.T + b).contiguous()
        out_rows = torch.empty(M, dtype=torch.float32, device=dev)
        kern.row_logp(logits, t, m.view(torch.uint8), out_rows, 1.0, block_v=16)
        results = [out, out_rows]
    else:
        results = [answer_logprob_from_hidden(h, w, t, m, bias=b, threshold=None, vocab_chunk=50,
                                              backend="torch").token_logp]
        # the chunked method with blocks of 3 rows x 16 vocabulary entries (the first 12 blocks all -inf)
        results.append(answer_logprob_from_hidden(h, w, t, m, bias=b, threshold=None, chunk_rows=3, vocab_chunk=16,
                                                  backend=backend).token_logp)
    for lp in results:
        lp = lp.cpu().double()
        assert not torch.isnan(lp).any()
        assert lp[0].item() == float("-inf")
        finite = mask.clone()
        finite[0] = False
        assert (lp[finite] - ref.token_logp[finite]).abs().max().item() < 2e-5
    for method in ("chunked", "fused") if backend == "triton" else ("chunked",):
        out = answer_logprob_from_hidden(h, w, t, m, bias=b, threshold=None, backend=backend, method=method)
        assert_no_nan(out)
        assert out.p.item() == 0.0 and out.mean_logp.item() == float("-inf")


def test_hidden_triton_qwen_vocab_multi_h_chunks(device):
    """V = 151,936 through the fused kernel with H spanning several BLOCK_H chunks and 3 splits."""
    from mempo.kernels import answer_logprob as kern

    M, V, H = 2, QWEN_V, 40
    hidden, weight, bias, _, mask = make_hidden_case(M, V, H, seed=61, p_mask=1.0)
    targets = torch.tensor([V - 1, 2 * 50_688 + 1])
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, None, bias=bias, threshold=None)
    h, w, b, t = on(device, hidden, weight, bias, targets)
    out = torch.empty(M, dtype=torch.float32, device=device)
    kern.hidden_logp(h, w, b, t, mask.to(device).view(torch.uint8), out, 1.0, interpret=not HAS_CUDA,
                     block_m=16, block_v=2048, block_h=16, num_splits=3)
    assert (out.cpu().double() - ref.token_logp).abs().max().item() < 2e-5


# ------------------------------------------------------------------------------------------------
# hostile scalars and values (issue 10, cases 7 and 11)
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_numpy_scalars_are_accepted(backend, device):
    """An np.float32 threshold was rejected; numpy scalars now work like Python numbers."""
    import numpy as np

    dev = device if backend == "triton" else torch.device("cpu")
    logits, targets, mask = make_logits_case(12, 30, seed=3)
    hidden, weight, bias, h_targets, h_mask = make_hidden_case(12, 30, 8, seed=4)
    want = answer_logprob(*on(dev, logits, targets, mask), threshold=0.5, temperature=0.75, empty_value=-1.0,
                          backend=backend)
    got = answer_logprob(*on(dev, logits, targets, mask), threshold=np.float32(0.5), temperature=np.float64(0.75),
                         empty_value=np.float32(-1.0), backend=backend)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    want = answer_logprob_from_hidden(*on(dev, hidden, weight, h_targets, h_mask), bias=bias.to(dev),
                                      threshold=0.25, vocab_chunk=7, backend=backend)
    got = answer_logprob_from_hidden(*on(dev, hidden, weight, h_targets, h_mask), bias=bias.to(dev),
                                     threshold=np.float16(0.25), vocab_chunk=np.int64(7), backend=backend)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert answer_logprob(logits, targets, mask, threshold=1).num_kept.sum() == 0  # an int threshold: 1.0


@pytest.mark.parametrize("name, value, fragment", [
    ("threshold", float("inf"), r"threshold must be a number in \(0, 1\] or None"),
    ("threshold", float("nan"), "threshold must be a number"),
    ("threshold", 0, "threshold must be a number"),
    ("temperature", 1e-40, r"temperature must be a finite number >= 2.94e-39"),
    ("temperature", True, "temperature must be a finite number"),
    ("temperature", "1.0", "temperature must be a finite number"),
    ("empty_value", float("nan"), "empty_value must be a finite number"),
    ("empty_value", float("inf"), "empty_value must be a finite number"),
    ("empty_value", "0", "empty_value must be a finite number"),
    ("empty_value", None, "empty_value must be a finite number"),
])
def test_bad_scalars_are_rejected_by_name(name, value, fragment):
    logits, targets, mask = make_logits_case(6, 10)
    with pytest.raises(ValueError, match=fragment):
        answer_logprob(logits, targets, mask, **{name: value})
    hidden, weight, bias, h_targets, h_mask = make_hidden_case(6, 10, 4)
    with pytest.raises(ValueError, match=fragment):
        answer_logprob_from_hidden(hidden, weight, h_targets, h_mask, **{name: value})


@pytest.mark.parametrize("vocab_chunk", [0, -3, 1.5, True, "8"])
def test_bad_vocab_chunk(vocab_chunk):
    hidden, weight, bias, targets, mask = make_hidden_case(6, 10, 4)
    with pytest.raises(ValueError, match="vocab_chunk must be a positive int"):
        answer_logprob_from_hidden(hidden, weight, targets, mask, vocab_chunk=vocab_chunk)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_nan_or_inf_logits_are_rejected_naming_the_row(backend, device, bad, dtype):
    dev = device if backend == "triton" else torch.device("cpu")
    logits, targets, mask = make_logits_case(4 * 5, 12, seed=5, p_mask=1.0)
    logits = logits.to(dtype)
    logits[13, 4] = bad
    with pytest.raises(ValueError, match=r"row 13 is NaN: the logits hold NaN or \+inf there"):
        answer_logprob(*on(dev, logits, targets, mask, torch.tensor([0, 7, 20])), backend=backend)
    with pytest.raises(ValueError, match=r"row 13 \(n=2, t=3\) is NaN"):
        answer_logprob(*on(dev, logits.view(4, 5, 12), targets.view(4, 5), mask.view(4, 5)), backend=backend)
    # On a masked row the same values are never read: the result is the reference's.
    mask[13] = False
    targets[13] = -100
    out = answer_logprob(*on(dev, logits, targets, mask), backend=backend)
    ref = answer_logprob_reference(logits.float(), targets, mask)
    assert_matches(out, ref, mask, 0.5, atol=2e-5, rtol=2e-6)


@pytest.mark.parametrize("backend,method", HIDDEN_PATHS)
def test_hidden_path_nan_or_overflow_is_rejected_naming_the_row(backend, method, device):
    dev = device if backend == "triton" else torch.device("cpu")
    hidden, weight, bias, targets, mask = make_hidden_case(9, 40, 16, seed=6, p_mask=1.0)
    for row, value in ((2, float("nan")), (6, 3e38)):  # 3e38 x weight sums overflow fp32: +-inf logits
        bad = hidden.clone()
        bad[row] = value
        with pytest.raises(ValueError, match=f"row {row} is NaN: the logits hidden @ weight.T"):
            answer_logprob_from_hidden(*on(dev, bad, weight, targets, mask), bias=bias.to(dev), backend=backend,
                                       method=method)


F32_MAX = float(torch.finfo(torch.float32).max)


def _extreme_logits(dtype):
    """Rows of finite logits near the top of `dtype` (fp16: 65504; bf16 and fp32: about 3e38)."""
    top = float(torch.finfo(dtype).max) * 0.99
    logits = torch.zeros(6, 8, dtype=torch.float64)
    logits[0] = torch.tensor([top, -top, 0, 1, 2, 3, 4, 5])
    logits[1] = top  # huge and equal
    logits[2] = -top
    logits[3] = torch.linspace(-top, top, 8, dtype=torch.float64)
    logits[4, 2] = top
    logits[5] = torch.tensor([top, top, -top, -top, 0, 0, 1, -1])
    return logits.to(dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_extreme_finite_logits_match_the_reference(backend, device, dtype):
    """Finite inputs near the float limit give no NaN: the reference's values, with log-probs below
    -3.4e38 (not representable in fp32) reported as -inf, and so P = 0 where they are kept."""
    dev = device if backend == "triton" else torch.device("cpu")
    logits = _extreme_logits(dtype)
    for targets in (torch.tensor([0, 3, 5, 0, 2, 2]), torch.tensor([1, 7, 0, 7, 3, 4])):
        mask = torch.ones(6, dtype=torch.bool)
        cu = torch.tensor([0, 1, 3, 6])
        for threshold in (None, 0.5):
            out = answer_logprob(*on(dev, logits, targets, mask, cu), threshold=threshold, backend=backend)
            ref = answer_logprob_reference(logits, targets, mask, cu, threshold=threshold)
            assert_no_nan(out)
            lp, rlp = out.token_logp.cpu().double(), ref.token_logp
            representable = rlp >= -F32_MAX
            assert bool((lp[~representable] == float("-inf")).all())
            torch.testing.assert_close(lp[representable], rlp[representable], rtol=2e-6, atol=2e-5)
            assert torch.equal(out.keep.cpu(), ref.keep) and torch.equal(out.num_kept.cpu(), ref.num_kept)
            torch.testing.assert_close(out.p.cpu().double(), ref.p, rtol=1e-5, atol=2e-5)


def test_from_token_logp_equals_the_logits_path_and_refuses_bad_values():
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(9, 13, generator=g) * 3
    targets = torch.randint(0, 13, (9,), generator=g)
    mask = torch.tensor([1, 1, 0, 1, 1, 1, 0, 1, 1])
    cu = torch.tensor([0, 4, 4, 9])
    token_logp = torch.log_softmax(logits, -1).gather(1, targets[:, None])[:, 0]
    for threshold in (None, 0.05, 0.5):
        want = answer_logprob(logits, targets, mask, cu, threshold=threshold, backend="torch")
        got = answer_logprob_from_token_logp(token_logp, mask, cu, threshold=threshold)
        torch.testing.assert_close(got.p, want.p)
        torch.testing.assert_close(got.mean_logp, want.mean_logp)
        assert torch.equal(got.num_kept, want.num_kept) and torch.equal(got.keep, want.keep)
    bad = token_logp.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="row 3"):
        answer_logprob_from_token_logp(bad, mask, cu)
    bad[3] = 0.5
    with pytest.raises(ValueError, match=r"token_logp\[3\] = 0.5 is not a log-probability"):
        answer_logprob_from_token_logp(bad, mask, cu)
    bad[2] = float("nan")  # a masked-out row is not read
    bad[3] = -1.0
    answer_logprob_from_token_logp(bad, mask, cu)
    with pytest.raises(ValueError, match="cu_seqlens must end at M = 9"):
        answer_logprob_from_token_logp(token_logp, mask, torch.tensor([0, 4]))


# ------------------------------------------------------------------------------------------------
# the chunked method: blocks of logits through the GEMM, an online log-sum-exp epilogue (issue 45)
# ------------------------------------------------------------------------------------------------
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


class MatmulShapes(TorchFunctionMode):
    """Records the [rows, cols] of every `torch.mm` the op runs (its GEMMs)."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.mm:
            self.shapes.append((args[0].shape[0], args[1].shape[1]))
        return func(*args, **kwargs)


@pytest.mark.parametrize("backend,method", HIDDEN_PATHS + [("torch", "materialise"), ("triton", "materialise")])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_every_method_and_dtype_matches_the_reference(backend, method, dtype, device):
    """Odd sizes (M = 37 rows, V = 1,001), a bias, a temperature, empty and all-masked contexts: each
    method in each accepted dtype gives the float64 reference's numbers on the same inputs, and the
    chunked method the materialise method's."""
    M, V, H = 37, 1001, 24
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=81)
    mask[10:14] = False
    targets[10:14] = -100
    cu = torch.tensor([0, 0, 10, 14, 30, 37])
    h, w, b = hidden.to(dtype), weight.to(dtype), bias.to(dtype)
    dev = device if backend == "triton" else torch.device("cpu")
    kw = dict(threshold=0.5, temperature=1.3)
    out = answer_logprob_from_hidden(*on(dev, h, w, targets, mask, cu), bias=b.to(dev), backend=backend, method=method,
                                     **kw)
    ref = answer_logprob_from_hidden_reference(h, w, targets, mask, cu, bias=b, **kw)
    assert_matches(out, ref, mask, 0.5, cu, atol=2e-5 if dtype == torch.float32 else 5e-5, min_compared=0.3)
    assert out.num_kept[0].item() == 0 and out.p[0].item() == 0.0  # the empty context
    assert out.num_kept[2].item() == 0 and out.p[2].item() == 0.0  # the all-masked one
    whole = answer_logprob_from_hidden(h, w, targets, mask, cu, bias=b, method="materialise", backend="torch", **kw)
    torch.testing.assert_close(out.token_logp.cpu(), whole.token_logp, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("chunk_rows,vocab_chunk", [(1, 1), (5, 77), (1, None), (None, 1), (4, 1001), (100, 3),
                                                    (None, None)])
def test_chunked_block_shapes(backend, chunk_rows, vocab_chunk, device):
    """Any block shape gives the reference's numbers: 1 x 1 blocks, M (here the 9 kept of 14 rows) not
    a multiple of the block's rows, V = 31 not a multiple of its columns, a block larger than K. The
    GEMMs run exactly on the planned blocks: ceil(K / R) x ceil(V / N) of them, none larger than R x N."""
    M, V, H = 14, 31, 16
    hidden, weight, bias, targets, mask = make_hidden_case(M, V, H, seed=82, p_mask=0.6)
    K = int(mask.sum())
    dev = device if backend == "triton" else torch.device("cpu")
    with MatmulShapes() as mm:
        out = answer_logprob_from_hidden(*on(dev, hidden, weight, targets, mask), bias=bias.to(dev), threshold=None,
                                         chunk_rows=chunk_rows, vocab_chunk=vocab_chunk, backend=backend)
    assert_matches(out, answer_logprob_from_hidden_reference(hidden, weight, targets, mask, bias=bias, threshold=None),
                   mask, None)
    plan = plan_chunks(M, K, V, H, torch.float32, torch.float32, "cpu", chunk_rows=chunk_rows, vocab_chunk=vocab_chunk,
                       has_bias=True)
    R, N = plan.rows, plan.vocab
    assert R == min(chunk_rows or K, K) and N == min(vocab_chunk or V, V)  # tiny sizes: everything fits
    assert len(mm.shapes) == math.ceil(K / R) * math.ceil(V / N)
    assert all(r <= R and n <= N for r, n in mm.shapes)
    assert sum(r * n for r, n in mm.shapes) == K * V  # every kept row x every entry, once


@pytest.mark.parametrize("backend,method", HIDDEN_PATHS + [("torch", "materialise")])
def test_degenerate_calls(backend, method, device):
    """No masked-in row (every row masked: no GEMM at all), masked-in rows none of which passes the
    threshold, M = 0, a single masked-in row, V = 1."""
    dev = device if backend == "triton" else torch.device("cpu")
    hidden, weight, bias, targets, mask = make_hidden_case(6, 50, 16, seed=83)
    none = torch.zeros(6, dtype=torch.bool)
    with MatmulShapes() as mm:
        out = answer_logprob_from_hidden(*on(dev, hidden, weight, torch.full_like(targets, -100), none,
                                             torch.tensor([0, 2, 6])), backend=backend, method=method, empty_value=-1.0)
    assert mm.shapes == []
    assert out.token_logp.tolist() == [0.0] * 6 and not out.keep.any() and out.p.tolist() == [-1.0, -1.0]
    out = answer_logprob_from_hidden(*on(dev, torch.zeros(0, 16), weight, torch.zeros(0, dtype=torch.long),
                                         torch.zeros(0, dtype=torch.bool), torch.tensor([0, 0])),
                                     backend=backend, method=method)
    assert out.token_logp.shape == (0,) and out.p.tolist() == [0.0]
    out = answer_logprob_from_hidden(*on(dev, hidden, weight, targets, mask), threshold=1.0, empty_value=0.25,
                                     backend=backend, method=method)
    assert not out.keep.any() and out.num_kept.tolist() == [0] and out.p.tolist() == [0.25]
    assert bool((out.token_logp.cpu()[mask] < 0).all())  # computed, just not kept
    one = torch.zeros(6, dtype=torch.bool)
    one[4] = True
    out = answer_logprob_from_hidden(*on(dev, hidden, weight, targets.clamp(min=0), one), bias=bias.to(dev),
                                     threshold=None, backend=backend, method=method)
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets.clamp(min=0), one, bias=bias, threshold=None)
    assert_matches(out, ref, one, None)
    out = answer_logprob_from_hidden(*on(dev, hidden, weight[:1], torch.zeros(6, dtype=torch.long), mask),
                                     threshold=None, backend=backend, method=method)
    assert out.token_logp.tolist() == [0.0] * 6  # V = 1: log p = log 1 on kept rows, 0.0 on masked ones


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_all_banned_block_after_very_negative_logits_is_not_nan(backend, device):
    """Logits of -200 in the first vocabulary block, every logit -inf in the second: log p = -log 10.
    The torch path merged a block's sum with exp(0 - running max) = exp(200) = inf times its sum 0,
    i.e. NaN, and rejected finite inputs as holding NaN."""
    dev = device if backend == "triton" else torch.device("cpu")
    H, V = 4, 20
    bias = torch.full((V,), -200.0)
    bias[10:] = float("-inf")
    out = answer_logprob_from_hidden(*on(dev, torch.ones(2, H), torch.zeros(V, H), torch.tensor([3, 5]),
                                         torch.ones(2, dtype=torch.bool)), bias=bias.to(dev), threshold=None,
                                     vocab_chunk=10, backend=backend)
    torch.testing.assert_close(out.token_logp.cpu(), torch.full((2,), -math.log(10.0)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_peak_memory_is_one_block(dtype):
    """At the real vocabulary (M = 256 rows, 200 kept, V = 151,936) the tensors the chunked call
    allocates never hold more than its plan's peak, which is at most 1/8 of the materialised logits
    M x V (in the dtype of hidden @ weight.T); its largest tensor is the [R, N] fp32 block. The
    materialise method, counted the same way, holds its [K, V] fp32 logits (so the count sees them)."""
    M, V, H = 256, QWEN_V, 16
    g = _gen(84)
    hidden = torch.randn(M, H, generator=g).to(dtype)
    weight = (torch.randn(V, H, generator=g) / H ** 0.5).to(dtype)
    targets = torch.randint(0, V, (M,), generator=g)
    mask = torch.arange(M) % 32 < 25
    K = int(mask.sum())
    materialised = M * V * torch.empty((), dtype=dtype).element_size()
    plan = plan_chunks(M, K, V, H, dtype, dtype, "cpu")
    assert plan.peak <= plan.budget <= materialised // 8
    with LiveBytes(hidden, weight, targets, mask) as live, MatmulShapes() as mm:
        answer_logprob_from_hidden(hidden, weight, targets, mask, threshold=None, backend="torch")
    assert set(mm.shapes) <= {(plan.rows, plan.vocab), (plan.rows, V % plan.vocab)}, (mm.shapes, plan)
    assert live.largest == 4 * plan.rows * plan.vocab
    assert live.peak <= plan.peak, (live.peak, plan)
    with LiveBytes(hidden, weight, targets, mask) as whole:
        answer_logprob_from_hidden(hidden, weight, targets, mask, threshold=None, backend="torch", method="materialise")
    assert whole.largest == 4 * K * V and live.peak <= materialised // 8 < whole.peak


@pytest.mark.parametrize("backend", BACKENDS)
def test_fp32_gemm_is_ieee_whatever_the_global_matmul_precision(backend, device):
    """`torch.set_float32_matmul_precision("medium")` makes CPU fp32 matmuls bf16 (errors ~1e-1 at
    H = 256): the op's fp32 GEMM still matches the float64 reference to fp32 accuracy (it ran
    torch.mm under the global setting before), and the setting is back as it was afterwards."""
    dev = device if backend == "triton" else torch.device("cpu")
    hidden, weight, bias, targets, mask = make_hidden_case(24, 300, 256, seed=85)
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, bias=bias, threshold=None)
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        native = (hidden @ weight.T).double()
        if (native - hidden.double() @ weight.double().T).abs().max().item() < 1e-3:
            pytest.skip("this machine's fp32 matmul ignores the 'medium' precision")
        out = answer_logprob_from_hidden(*on(dev, hidden, weight, targets, mask), bias=bias.to(dev), threshold=None,
                                         backend=backend, vocab_chunk=128)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision(before)
    assert_matches(out, ref, mask, None)


def test_gemm_precision_scopes_and_restores_the_cuda_setting():
    """allow_tf32 switches CUDA's fp32 matmul setting for the op's GEMMs only: TF32 inside when
    allowed, IEEE inside when not (even under a global TF32), the caller's value after, and the
    legacy `allow_tf32` flag still readable (torch raises on a mix of its old and new flags)."""
    from mempo.ops.logprob import _gemm_precision, _tf32_allowed_globally

    matmul, cuda = torch.backends.cuda.matmul, torch.device("cuda")
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert not _tf32_allowed_globally()
        with _gemm_precision(cuda, True):
            assert _tf32_allowed_globally()
        assert not _tf32_allowed_globally() and matmul.allow_tf32 is False
        torch.set_float32_matmul_precision("high")
        assert _tf32_allowed_globally()
        with _gemm_precision(cuda, False):
            assert not _tf32_allowed_globally()
        assert _tf32_allowed_globally() and matmul.allow_tf32 is True
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_allow_tf32_is_exact_on_cpu():
    """CPU has no TF32: allow_tf32=True gives the IEEE result (bit for bit on this path)."""
    hidden, weight, bias, targets, mask = make_hidden_case(17, 300, 40, seed=86)
    a = answer_logprob_from_hidden(hidden, weight, targets, mask, bias=bias, allow_tf32=True)
    b = answer_logprob_from_hidden(hidden, weight, targets, mask, bias=bias, allow_tf32=False)
    assert torch.equal(a.token_logp, b.token_logp)


@pytest.mark.parametrize("kwargs,match", [
    (dict(method="chunky"), r"method must be one of \('chunked', 'materialise', 'fused'\)"),
    (dict(method="fused", vocab_chunk=8), "chunk_rows / vocab_chunk shape the blocks of method 'chunked'"),
    (dict(method="materialise", chunk_rows=8), "chunk_rows / vocab_chunk shape the blocks"),
    (dict(chunk_rows=0), "chunk_rows must be a positive int or None"),
    (dict(chunk_rows=2.0), "chunk_rows must be a positive int or None"),
    (dict(allow_tf32=1), "allow_tf32 must be True, False or None"),
    (dict(method="fused", allow_tf32=True, backend="triton"), "method 'fused' always uses its IEEE fp32 dot"),
    (dict(method="fused", backend="torch"), "method 'fused' is the Triton kernel"),
])
def test_bad_method_arguments_are_rejected_by_name(kwargs, match):
    hidden, weight, bias, targets, mask = make_hidden_case(6, 10, 4)
    with pytest.raises(ValueError, match=match):
        answer_logprob_from_hidden(hidden, weight, targets, mask, **kwargs)


def test_method_fused_on_cpu_tensors_with_auto_names_the_backend():
    """backend "auto" resolves to torch on CPU tensors, where no fused kernel exists: an error, never
    the chunked path in its place."""
    hidden, weight, bias, targets, mask = make_hidden_case(6, 10, 4)
    with pytest.raises(ValueError, match="resolved to backend 'torch'"):
        answer_logprob_from_hidden(hidden, weight, targets, mask, method="fused")


def test_block_kernel_writes_only_its_rows(device):
    """The block kernel on a [3, 7] block of kept rows 2..4 of K = 6, vocabulary 7..13 of V = 20:
    it writes the state (or, at the last block, the log-probs) of those rows only."""
    from mempo.kernels import answer_logprob as kern

    g = _gen(87)
    K = 6
    block = torch.randn(3, 7, generator=g).to(device)
    targets = torch.tensor([0, 0, 8, 19, 13, 0], device=device)
    state = torch.full((3, K), SENTINEL, device=device)
    out = torch.full((K,), SENTINEL, device=device)
    kern.block_logp(block, None, targets, state, out, 2, 7, 1.0, first=True, last=False)
    assert bool((out == SENTINEL).all())
    assert bool((state[:, [0, 1, 5]] == SENTINEL).all()) and not bool((state[:, 2:5] == SENTINEL).any())
    z = block.cpu().double()
    torch.testing.assert_close(state[0, 2:5].cpu().double(), z.max(1).values)
    torch.testing.assert_close(state[1, 2:5].cpu().double(), (z - z.max(1, keepdim=True).values).exp().sum(1),
                               rtol=1e-5, atol=1e-6)
    assert state[2, 2].item() == block[0, 1].item() and state[2, 4].item() == block[2, 6].item()
    assert state[2, 3].item() == float("-inf")  # target 19 lies outside the block
    kern.block_logp(block, None, targets, state, out, 2, 7, 1.0, first=False, last=True)
    assert bool((out[[0, 1, 5]] == SENTINEL).all()) and not bool((out[2:5] == SENTINEL).any())


def test_plan_chunks_keeps_to_its_budget():
    """The planner's blocks at Qwen2.5 shapes: every extra byte under 1/8 of the materialised logits,
    half the free device memory when that is less (never under MIN_CHUNK_BYTES), the block under the
    device's cap; all kept rows in one block while they fit (the weight read once), rows in aligned
    chunks beyond; a fixed side honoured with the other planned; one [K, V] block for "materialise"."""
    from mempo.ops.logprob import CHUNK_ALIGN, MAX_CHUNK_BYTES, MIN_CHUNK_BYTES

    bf16, fp32 = torch.bfloat16, torch.float32
    for M, K, H, dtype in ((4608, 4608, 3584, bf16), (4608, 4516, 896, bf16), (4608, 1728, 896, fp32),
                           (200, 196, 896, bf16), (65_536, 65_536, 896, bf16), (16, 16, 3584, bf16)):
        materialised = M * QWEN_V * dtype.itemsize
        plan = plan_chunks(M, K, QWEN_V, H, dtype, dtype, "cuda", free_bytes=100 << 30)
        assert plan.budget == max(materialised // 8, MIN_CHUNK_BYTES) and plan.peak <= plan.budget, plan
        assert 4 * plan.rows * plan.vocab <= MAX_CHUNK_BYTES["cuda"]
        assert plan.rows == K or plan.rows % CHUNK_ALIGN == 0
        assert plan.vocab == QWEN_V or plan.vocab % CHUNK_ALIGN == 0
        if K <= 4608:
            assert plan.rows == K, plan  # the weight is read once
    assert plan_chunks(65_536, 65_536, QWEN_V, 896, bf16, bf16, "cuda", free_bytes=100 << 30).rows < 65_536
    tight = plan_chunks(4608, 4608, QWEN_V, 3584, bf16, bf16, "cuda", free_bytes=64 << 20)
    assert tight.budget == 32 << 20 and tight.peak <= tight.budget
    floor = plan_chunks(4608, 4608, QWEN_V, 3584, bf16, bf16, "cuda", free_bytes=1 << 20)
    assert floor.budget == MIN_CHUNK_BYTES and floor.peak <= floor.budget and floor.rows * floor.vocab >= 1 << 20
    cpu = plan_chunks(4608, 4608, QWEN_V, 896, fp32, fp32, "cpu")
    assert 4 * cpu.rows * cpu.vocab <= MAX_CHUNK_BYTES["cpu"] and cpu.peak <= cpu.budget
    rows = plan_chunks(4608, 4608, QWEN_V, 896, bf16, bf16, "cuda", chunk_rows=256, free_bytes=100 << 30)
    assert rows.rows == 256 and rows.vocab == QWEN_V  # 256 x V fits the budget: the whole vocabulary
    vocab = plan_chunks(4608, 4608, QWEN_V, 896, bf16, bf16, "cuda", vocab_chunk=2048, free_bytes=100 << 30)
    assert vocab.vocab == 2048 and vocab.rows == 4608 and vocab.peak <= vocab.budget
    whole = plan_chunks(4608, 4516, QWEN_V, 896, bf16, bf16, "cuda", whole=True, free_bytes=100 << 30)
    assert (whole.rows, whole.vocab) == (4516, QWEN_V) and whole.peak > whole.budget
