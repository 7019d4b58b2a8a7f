"""Benchmark: answer log-probs from hidden states (chunked) vs materialised logits (Qwen2.5-0.5B shapes).

Run: `.venv/bin/pytest bench/bench_answer_logprob.py --benchmark-only`

CPU (always): V = 151,936, H = 896, M = 1,152 rows (72 contexts x 16 tokens), fp32.
  * chunked:      `answer_logprob_from_hidden(hidden, weight, ...)` (torch path; its default method,
                  blocks planned from the memory budget: `mempo.ops.logprob.plan_chunks`)
  * materialised: `logits = hidden @ weight.T; answer_logprob(logits, ...)` (torch path)
  each with two answer masks: "gold" (6 gold-answer tokens inside each 16-token template: the
  realistic case, 432 masked-in rows) and "all" (every row masked in: the chunked path's worst case,
  as it computes only masked-in rows).

Peak memory: each variant runs once in a fresh Python process (`python bench/bench_answer_logprob.py
--peak VARIANT MASK`). After the inputs are allocated and a small warm-up call has loaded the math
libraries, the process resets the kernel's resident-set high-water mark (writing "5" to
/proc/self/clear_refs resets VmHWM), reads its resident set size (VmRSS) as the baseline, runs the
op once and reports VmHWM - baseline: the extra resident memory the op needed at its peak. Where
clear_refs is not writable it falls back to ru_maxrss growth over the baseline (an upper bound).

GPU (only with CUDA): the Triton paths (chunked: cuBLAS blocks and the block kernel; the fused kernel;
the row kernel on materialised logits) and the torch paths at M = 4,608, H = 896 and 3,584, bf16,
timed with `triton.testing.do_bench`; peak memory from `torch.cuda.max_memory_allocated`.
"""
from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from functools import lru_cache

import pytest
import torch

V, H, C, T = 151_936, 896, 72, 16
M = C * T
GOLD = slice(8, 14)  # gold-answer tokens inside each 16-token answer template
DEVICE_NOTE = "CPU-only dev machine, 2 cores, 24 GiB, Python 3.11, torch 2.13 CPU"


def make_inputs(mask_kind: str, m=M, v=V, h=H, contexts=C, seq=T, dtype=torch.float32, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(m, h, generator=g).to(device=device, dtype=dtype)
    weight = (torch.randn(v, h, generator=g) / h ** 0.5).to(device=device, dtype=dtype)
    targets = torch.randint(0, v, (m,), generator=g).to(device)
    if mask_kind == "all":
        mask = torch.ones(m, dtype=torch.bool)
    else:
        mask = torch.zeros(contexts, seq, dtype=torch.bool)
        mask[:, GOLD] = True
        mask = mask.view(-1)
    cu = torch.arange(contexts + 1) * seq
    return hidden, weight, targets, mask.to(device), cu.to(device)


def run_variant(variant, hidden, weight, targets, mask, cu, backend="torch"):
    from mempo.ops import answer_logprob, answer_logprob_from_hidden

    if variant in ("chunked", "fused"):
        return answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend=backend, method=variant)
    logits = hidden @ weight.T
    return answer_logprob(logits, targets, mask, cu, backend=backend)


# ------------------------------------------------------------------------------------------------
# peak memory in a fresh process
# ------------------------------------------------------------------------------------------------
def _status_kib(field):
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def _measure_peak_here(variant, mask_kind):
    inputs = make_inputs(mask_kind)
    small = make_inputs(mask_kind, v=1000)
    run_variant(variant, *small)  # load MKL / OpenMP buffers before the baseline
    del small
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        method = "VmHWM - VmRSS baseline (HWM reset via /proc/self/clear_refs)"
        base = _status_kib("VmRSS")
        run_variant(variant, *inputs)
        peak = _status_kib("VmHWM")
    except OSError:
        method = "ru_maxrss growth over the baseline (upper bound)"
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        run_variant(variant, *inputs)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_extra_mib": (peak - base) / 1024.0, "baseline_rss_mib": base / 1024.0, "method": method}


@lru_cache(maxsize=None)
def peak_extra_memory(variant, mask_kind):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--peak", variant, mask_kind],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# CPU benchmarks
# ------------------------------------------------------------------------------------------------
@lru_cache(maxsize=None)
def _cpu_inputs(mask_kind):
    return make_inputs(mask_kind)


def _bench_cpu(benchmark, variant, mask_kind):
    inputs = _cpu_inputs(mask_kind)
    result = benchmark.pedantic(run_variant, args=(variant, *inputs), rounds=3, warmup_rounds=1,
                                iterations=1)
    mem = peak_extra_memory(variant, mask_kind)
    benchmark.extra_info.update({
        "variant": variant, "mask": mask_kind, "kept_rows": int(inputs[3].sum()),
        "V": V, "H": H, "M": M, "contexts": C, "tokens_per_context": T,
        "dtype": "float32", "device": "cpu", "machine": DEVICE_NOTE, "threads": torch.get_num_threads(),
        "peak_extra_mib": round(mem["peak_extra_mib"], 1), "peak_method": mem["method"],
    })
    if variant == "chunked":
        from mempo.ops.logprob import plan_chunks

        plan = plan_chunks(M, int(inputs[3].sum()), V, H, torch.float32, torch.float32, "cpu")
        benchmark.extra_info["block"] = f"{plan.rows} x {plan.vocab}"
        other = peak_extra_memory("materialised", mask_kind)
        ratio = mem["peak_extra_mib"] / other["peak_extra_mib"]
        benchmark.extra_info["peak_ratio_vs_materialised"] = round(ratio, 4)
        ref = run_variant("materialised", *inputs)
        torch.testing.assert_close(result.token_logp, ref.token_logp, atol=2e-4, rtol=1e-5)
        if ratio > 1 / 8:
            pytest.fail(f"chunked peak memory is {ratio:.3f} of materialised (target <= 1/8)")
    return result


def test_cpu_chunked_gold(benchmark):
    _bench_cpu(benchmark, "chunked", "gold")


def test_cpu_materialised_gold(benchmark):
    _bench_cpu(benchmark, "materialised", "gold")


def test_cpu_chunked_all(benchmark):
    _bench_cpu(benchmark, "chunked", "all")


def test_cpu_materialised_all(benchmark):
    _bench_cpu(benchmark, "materialised", "all")


@pytest.mark.parametrize("mask_kind", ["gold", "all"])
def test_cpu_interleaved_ab(benchmark, mask_kind):
    """A/B interleaved in one process (robust to a shared machine's load drifting between tests):
    the timed function is the chunked path; pytest-benchmark's untimed `setup` runs (and times) the
    materialised path right before each chunked round. Both series go to extra_info."""
    import time

    inputs = _cpu_inputs(mask_kind)
    materialised_s = []

    def setup():
        t0 = time.perf_counter()
        run_variant("materialised", *inputs)
        materialised_s.append(time.perf_counter() - t0)
        return (("chunked", *inputs), {})

    benchmark.pedantic(run_variant, setup=setup, rounds=5, warmup_rounds=1, iterations=1)
    chunked_s = benchmark.stats.stats.data if benchmark.stats else []
    benchmark.extra_info.update({
        "variant": "chunked (timed) vs materialised (setup, interleaved)", "mask": mask_kind,
        "kept_rows": int(inputs[3].sum()), "V": V, "H": H, "M": M, "dtype": "float32", "device": "cpu",
        "machine": DEVICE_NOTE, "materialised_s": [round(t, 4) for t in materialised_s[1:]],
        "materialised_min_s": round(min(materialised_s[1:]), 4),
        "chunked_min_s": round(min(chunked_s), 4) if chunked_s else None,
    })


# ------------------------------------------------------------------------------------------------
# GPU benchmarks (skipped without CUDA)
# ------------------------------------------------------------------------------------------------
GPU_PATHS = ("triton_chunked", "triton_fused", "triton_materialised", "torch_chunked", "torch_materialised")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("path", GPU_PATHS)
@pytest.mark.parametrize("hidden_size", [896, 3584])
def test_gpu_answer_logprob(benchmark, hidden_size, path):
    from triton.testing import do_bench

    m_gpu, contexts = 4608, 288
    inputs = make_inputs("gold", m=m_gpu, h=hidden_size, contexts=contexts, seq=m_gpu // contexts,
                         dtype=torch.bfloat16, device="cuda")
    backend, variant = path.split("_")

    def fn():
        return run_variant(variant, *inputs, backend=backend)

    fn()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2 ** 20
    ms = do_bench(fn, warmup=25, rep=200)

    def timed():  # synchronise inside the timed function
        fn()
        torch.cuda.synchronize()

    benchmark.pedantic(timed, rounds=10, warmup_rounds=2, iterations=1)
    benchmark.extra_info.update({
        "path": path, "V": V, "H": hidden_size, "M": m_gpu, "dtype": "bfloat16",
        "device": torch.cuda.get_device_name(), "do_bench_ms": ms, "peak_extra_mib": round(peak, 1),
    })


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--peak":
        print(json.dumps(_measure_peak_here(sys.argv[2], sys.argv[3])))
    else:
        sys.exit("usage: bench_answer_logprob.py --peak chunked|materialised gold|all")
