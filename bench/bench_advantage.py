"""Advantage pipeline (outcome + pooled memory z-score + span scatter) benchmarks.

Run: pytest bench/bench_advantage.py --benchmark-only
Shapes: 3 questions x 16 trajectories x 8 rounds x 8,192 response tokens, and 128 x 16 trajectories
x 4,096 tokens (2,048 trajectories); 8 rounds per trajectory, rounds 2-8 scored, 64-token <mem>
spans. Compares the vectorised torch path (what runs on CPU, e.g. in verl's CPU-only advantage actor;
the groups as verl's uid array or as an int tensor) with the loop reference and, when verl is
installed, verl's GRPO. The Triton path is timed only on a GPU (never the interpreter): device group
ids with validate="host" (one read per call) and "device" (none), and verl's uid array.
"""
import numpy as np
import pytest
import torch

from mempo.ops.advantage import group_ids, mempo_advantage
from mempo.ops.reference.advantage import mempo_advantage_reference, random_memory_batch

SHAPES = {
    "3x16x8192": dict(num_groups=3, group_size=16, length=8192),
    "128x16x4096": dict(num_groups=128, group_size=16, length=4096),
}


def _batch(name):
    return random_memory_batch(0, max_rounds=8, layout="rounds", mem_len=64, **SHAPES[name])


def _info(benchmark, name, batch, device, path):
    scores, index, mask, rewards, offsets, spans = batch
    benchmark.extra_info.update(shape=name, trajectories=int(mask.shape[0]), response_length=int(mask.shape[1]),
                                scored_rounds=int(rewards.numel()), device=str(device), path=path,
                                threads=torch.get_num_threads())


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("index_kind", ["uid_array", "int_ids"])
def test_mempo_advantage_torch(benchmark, name, index_kind):
    batch = _batch(name)
    _info(benchmark, name, batch, "cpu", "torch")
    scores, index, mask, rewards, offsets, spans = batch
    # verl's uid array, or the groups as an int tensor (grouped by the op itself)
    index = np.array(index, dtype=object) if index_kind == "uid_array" else group_ids(index, len(index))[0]
    benchmark.extra_info.update(index=index_kind)
    # Warm-up: the output is faulted in as huge pages (mempo.ops._alloc); on a fresh VM the first ~10
    # such calls in a process also pay for the host backing never-touched memory (RESULTS.md).
    benchmark.pedantic(lambda: mempo_advantage(scores, index, mask, rewards, offsets, spans, backend="torch"),
                       rounds=10, warmup_rounds=10)


@pytest.mark.parametrize("name", list(SHAPES))
def test_mempo_advantage_loop_reference(benchmark, name):
    scores, index, mask, rewards, offsets, spans = _batch(name)
    _info(benchmark, name, (scores, index, mask, rewards, offsets, spans), "cpu", "loop reference")
    # Conversion to Python lists is setup, not timed: the reference consumes lists.
    args = (scores.tolist(), list(index), mask.tolist(), rewards.tolist(), offsets.tolist(), spans.tolist())
    benchmark.pedantic(lambda: mempo_advantage_reference(*args), rounds=3, warmup_rounds=0)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("fn_name", ["compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage"])
def test_verl_grpo(benchmark, name, fn_name):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos", reason="verl not installed")
    fn = getattr(core_algos, fn_name, None)
    if fn is None:
        pytest.skip(f"this verl has no {fn_name}")
    scores, index, mask, rewards, offsets, spans = _batch(name)
    _info(benchmark, name, (scores, index, mask, rewards, offsets, spans), "cpu", f"verl {fn_name} (outcome only)")
    token_rewards = torch.zeros(mask.shape)
    token_rewards[:, -1] = scores
    uid = np.array(index, dtype=object)
    benchmark.pedantic(lambda: fn(token_rewards.clone(), mask, uid), rounds=3, warmup_rounds=1)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("path, index_kind, validate", [("torch", "device_ids", "host"),
                                                        ("triton", "device_ids", "host"),
                                                        ("triton", "device_ids", "device"),
                                                        ("triton", "uid_array", "device")])
def test_mempo_advantage_gpu(benchmark, name, path, index_kind, validate):
    """End to end per call (host work, launches and device time; one synchronisation per call)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (Triton timings are GPU-only; the interpreter is never timed)")
    scores, index, mask, rewards, offsets, spans = _batch(name)
    _info(benchmark, name, (scores, index, mask, rewards, offsets, spans), "cuda", path)
    benchmark.extra_info.update(index=index_kind, validate=validate)
    labels = group_ids(index, len(index))[0].cuda() if index_kind == "device_ids" else np.array(index, dtype=object)
    args = (scores.cuda(), labels, mask.cuda(), rewards.cuda(), offsets.cuda(), spans.cuda())

    def run():
        out = mempo_advantage(*args, backend=path, validate=validate)
        torch.cuda.synchronize()
        return out

    benchmark.pedantic(run, rounds=20, warmup_rounds=3)
