"""How mempo's Triton kernels are launched: on the tensors' device, with int64 row offsets.

* Device: Triton launches on the current CUDA device and stream, not the tensors'
  (triton/runtime/jit.py); every launcher in `mempo.kernels` launches under
  `mempo.kernels._launch.launch_device`. On CPU (the interpreter) a recording stand-in for the guard
  checks that every kernel the package defines is launched, and launched only inside the guard for
  its own tensors' device; the GPU tier runs the ops on cuda:1 while cuda:0 is current.
* int64 offsets: the span-scatter kernel's `b * stride` over a [B, L] mask wraps in int32 once
  b * stride >= 2**31; a strided view over a 4 GiB (virtual, barely touched) CPU buffer makes the
  interpreter compute exactly that offset.
"""
import contextlib
from collections import Counter

import pytest
import torch

from mempo.kernels import _launch
from mempo.ops import answer_logprob, answer_logprob_from_hidden, group_zscore, mempo_advantage
from support.triton_kernels import kernel_objects

HAS_CUDA = torch.cuda.is_available()


def run_every_op(device):
    """Each public op's Triton path once (varlen, padded, fused, chunked in 3 vocabulary blocks,
    advantage: every kernel)."""
    g = torch.Generator().manual_seed(0)
    M, V, H = 12, 40, 16
    logits = torch.randn(M, V, generator=g)
    targets = torch.randint(0, V, (M,), generator=g)
    mask = torch.rand(M, generator=g) < 0.7
    cu = torch.tensor([0, 5, 12])
    hidden, weight = torch.randn(M, H, generator=g), torch.randn(V, H, generator=g)
    on = lambda *ts: [t.to(device) for t in ts]  # noqa: E731
    outs = [answer_logprob(*on(logits, targets, mask, cu), backend="triton"),
            answer_logprob(*on(logits.view(3, 4, V), targets.view(3, 4), mask.view(3, 4)), backend="triton"),
            answer_logprob_from_hidden(*on(hidden, weight, targets, mask, cu), backend="triton", method="fused"),
            answer_logprob_from_hidden(*on(hidden, weight, targets, mask, cu), backend="triton", vocab_chunk=16)]
    scores, index = torch.tensor([1.0, 0.0, 2.0, 1.0]), [0, 0, 1, 1]
    response = torch.rand(4, 20, generator=g) < 0.8
    adv, _ = mempo_advantage(*on(scores), index, *on(response, torch.tensor([0.5, -1.0])),
                             torch.tensor([0, 1, 1, 2, 2]), torch.tensor([[2, 6], [3, 9]]), backend="triton")
    z = group_zscore(*on(torch.randn(6, generator=g), torch.tensor([0, 0, 1, 1, 1, 2])), 3,
                     singleton="zero", backend="triton")
    return outs, adv, z


def test_launch_device_is_the_tensors_device():
    assert isinstance(_launch.launch_device(torch.zeros(2)), contextlib.nullcontext)
    with pytest.raises(ValueError, match="one device"):
        _launch.launch_device(torch.zeros(2), torch.zeros(2, device="meta"))


def test_every_kernel_launch_runs_under_the_launch_device_guard(monkeypatch, device):
    guards = []

    @contextlib.contextmanager
    def recording_guard(*tensors):
        guards.append({t.device for t in tensors})
        try:
            yield
        finally:
            guards.pop()

    launched = Counter()

    class Recorder:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                assert guards, f"{self.name} launched outside launch_device"
                tensor_devices = {a.device for a in args if isinstance(a, torch.Tensor)}
                assert len(guards[-1]) == 1 and tensor_devices == guards[-1], (self.name, tensor_devices, guards[-1])
                launched[self.name] += 1
                return self.kernel[grid](*args, **kwargs)
            return launch

    kernels = kernel_objects()
    assert len(kernels) >= 7  # row, block, hidden, combine, segment, group z-score, span scatter
    for module, name in kernels:
        monkeypatch.setattr(module, name, Recorder(f"{module.__name__}.{name}", getattr(module, name)))
    monkeypatch.setattr(_launch, "launch_device", recording_guard)
    run_every_op(device)
    assert set(launched) == {f"{m.__name__}.{n}" for m, n in kernels}, launched
    assert not guards


@pytest.mark.gpu
def test_ops_on_a_second_gpu_while_the_first_is_current():
    """Tensors on cuda:1 with cuda:0 current: the Triton path equals the torch path (without the
    guard Triton would launch on cuda:0 with cuda:1 pointers)."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    with torch.cuda.device(0):
        outs, adv, z = run_every_op(torch.device("cuda", 1))
        torch.cuda.synchronize(1)
    routs, radv, rz = run_every_op(torch.device("cpu"))
    for got, want in zip(outs, routs):
        torch.testing.assert_close(got.token_logp.cpu(), want.token_logp, atol=1e-4, rtol=1e-4)
        assert torch.equal(got.num_kept.cpu(), want.num_kept)
    torch.testing.assert_close(adv.cpu(), radv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(z.cpu(), rz, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(HAS_CUDA, reason="CPU interpreter check (the GPU check script covers B * L > 2**31 on CUDA)")
def test_span_scatter_row_offsets_do_not_wrap_at_2_31():
    """Row 2 of a mask with row stride 2**30 lies 2**31 elements past row 0. An int32 `b * stride`
    wraps to -2**31, i.e. to the start of the buffer, which holds zeros; the int64 offset reads
    row 2 itself (ones)."""
    L = 64
    try:
        storage = torch.empty(2**32 + L, dtype=torch.bool)  # virtual: only the pages written are touched
    except RuntimeError as error:
        pytest.skip(f"cannot reserve 4 GiB of address space: {error}")
    storage[:L] = False
    mask = storage[2**31:].as_strided((3, L), (2**30, 1))
    mask.fill_(True)
    scores, index = torch.tensor([1.0, 0.0, 2.0]), [0, 0, 0]
    rewards, offsets, spans = torch.tensor([0.5]), torch.tensor([0, 0, 0, 1]), torch.tensor([[3, 9]])
    got, _ = mempo_advantage(scores, index, mask, rewards, offsets, spans, backend="triton")
    want, _ = mempo_advantage(scores, index, mask.contiguous(), rewards, offsets, spans, backend="torch")
    assert bool(want[2].ne(0).all())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_combine_merges_many_splits_with_leading_banned_vocabulary(device):
    """63 vocabulary splits (two combine steps of 32); the first 43 splits are all -inf (banned
    tokens via the bias), so the first step's running max stays -inf: finite log-probs equal the
    float64 reference, a banned target gives -inf, nothing is NaN."""
    from mempo.kernels import answer_logprob as kern
    from mempo.ops.reference.logprob import answer_logprob_from_hidden_reference

    g = torch.Generator().manual_seed(7)
    M, V, H = 5, 1000, 24
    hidden, weight = torch.randn(M, H, generator=g), torch.randn(V, H, generator=g) / H ** 0.5
    bias = torch.zeros(V)
    bias[:700] = float("-inf")
    targets = 700 + torch.randint(0, 300, (M,), generator=g)
    targets[1] = 3  # banned
    mask = torch.ones(M, dtype=torch.bool)
    ref = answer_logprob_from_hidden_reference(hidden, weight, targets, mask, None, bias=bias, threshold=None)
    out = torch.empty(M, dtype=torch.float32, device=device)
    h, w, b, t, m = (x.to(device) for x in (hidden, weight, bias, targets, mask.view(torch.uint8)))
    kern.hidden_logp(h, w, b, t, m, out, 1.0, interpret=not HAS_CUDA, block_m=16, block_v=16, block_h=16,
                     num_splits=63)
    out = out.cpu()
    assert not bool(out.isnan().any()) and out[1].item() == float("-inf")
    finite = torch.arange(M) != 1
    assert (out[finite].double() - ref.token_logp[finite]).abs().max().item() < 2e-5
