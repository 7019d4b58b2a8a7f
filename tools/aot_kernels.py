"""Compile every Triton kernel variant that mempo's ops can launch, ahead of time, for a CUDA target
(default sm_90, the H100/H200), on a machine without a GPU; report registers and spills.

    python tools/aot_kernels.py [--arch 90] [--sms 132] [--json report.json] [--jobs N]

How the variants are found: not from a hand-written list. The public ops (`mempo.ops`) are called
on small CPU tensors over a sweep of their inputs (every float dtype the ops accept for each tensor,
every integer / mask dtype, sizes across every power-of-two boundary the launchers' block-size
selection uses, thresholds on and off, padded and varlen, every flag of the z-score), with each
Triton kernel in `mempo.kernels` replaced by a recorder. The launchers therefore run their own
selection code (block sizes, warps, stages, vocabulary splits for `--sms` multiprocessors, flags)
and the recorder keeps the arguments of each launch. Triton's own binder then specialises each
launch for the target exactly as `JITFunction.run` would on a GPU (argument types, constexprs,
divisibility of pointers and integers), distinct specialisations are compiled once each with
`triton.compile` (in parallel processes), registers, stack and local memory are read from each
cubin (Triton's bundled cuobjdump), and spill stores / loads from the ptxas -v log Triton writes
while compiling. A new block size or flag in a launcher is covered as long as some input of the
sweep selects it; tests/tools/test_aot_kernels.py asserts that each known choice is reached.

Needs Triton with its NVIDIA backend (bundled ptxas and cuobjdump); no CUDA driver and no GPU: the
target is given, not queried. Must run without TRITON_INTERPRET (the kernels must be JIT
functions). Uses Triton internals (`create_function_from_signature`, `JITFunction._pack_args`),
read in Triton 3.6 and 3.9; a Triton without them fails here with the missing name. On a GPU
machine the same run fills Triton's cache for the kernels the ops will JIT-compile.

Exit status: 0 when every variant compiled; 1 when any failed (each failure is printed).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import multiprocessing
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Iterator, Optional

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("aot_kernels: unset TRITON_INTERPRET (the kernels must be compiled, not interpreted)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import JITFunction, create_function_from_signature  # noqa: E402

import mempo.kernels  # noqa: E402
from mempo.ops import _dispatch  # noqa: E402
# The submodules, not the functions `mempo.ops` exports under the same names.
adv_ops = importlib.import_module("mempo.ops.advantage")
alp_ops = importlib.import_module("mempo.ops.logprob")

H200_SMS = 132
# Every integer dtype torch offers for targets, and every dtype a response mask may have.
INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
MASK_DTYPES = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64,
               torch.float16, torch.bfloat16, torch.float32, torch.float64)


# ------------------------------------------------------------------------------------------------
# 1. record the launches the ops make
# ------------------------------------------------------------------------------------------------
@dataclass
class Launch:
    kernel: str                  # "answer_logprob._row_logp_kernel"
    fn: JITFunction
    args: tuple
    kwargs: dict


class _Recorder:
    """Stands in for a JIT kernel: `kernel[grid](*args, **kwargs)` records and launches nothing."""

    def __init__(self, name: str, fn: JITFunction, sink: list):
        self.name, self.fn, self.sink = name, fn, sink

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.sink.append(Launch(self.name, self.fn, args, kwargs))
        return launch


def kernels() -> list[tuple[types.ModuleType, str, JITFunction]]:
    """Every JIT kernel defined in the `mempo.kernels` package: (module, attribute, kernel)."""
    found = []
    for info in pkgutil.iter_modules(mempo.kernels.__path__):
        module = importlib.import_module(f"mempo.kernels.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, JITFunction):
                found.append((module, name, value))
    return found


@contextlib.contextmanager
def recording(sms: int) -> Iterator[list]:
    """Within: every kernel launch is recorded instead of run; backend="triton" accepts CPU tensors;
    the device reports `sms` multiprocessors (the fused kernel's split count depends on it);
    `torch.empty` / `torch.empty_like` return zeros. A recorded launch writes nothing, so an
    output the op allocated would hold whatever memory held: its check after the launch (no NaN
    log-probs) would then pass or fail by chance, and with it the launches that follow (the
    segment kernel after the row kernel). Zeros pass it every time."""
    sink: list[Launch] = []
    saved = [(module, name, fn) for module, name, fn in kernels()]
    saved_interpreting = _dispatch.interpreting
    saved_props = torch.cuda.get_device_properties
    saved_empty, saved_empty_like = torch.empty, torch.empty_like
    try:
        for module, name, fn in saved:
            setattr(module, name, _Recorder(f"{module.__name__.rsplit('.', 1)[-1]}.{name}", fn, sink))
        _dispatch.interpreting = lambda: True  # resolve_backend: allow CPU tensors with backend="triton"
        torch.cuda.get_device_properties = lambda device=None: types.SimpleNamespace(multi_processor_count=sms)
        torch.empty = lambda *args, **kwargs: saved_empty(*args, **kwargs).zero_()
        torch.empty_like = lambda *args, **kwargs: saved_empty_like(*args, **kwargs).zero_()
        yield sink
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        _dispatch.interpreting = saved_interpreting
        torch.cuda.get_device_properties = saved_props
        torch.empty, torch.empty_like = saved_empty, saved_empty_like


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def op_calls() -> Iterator[tuple[str, Callable[[], Any]]]:
    """(label, call) over the ops' input space; each call runs one public op with backend="triton"."""
    floats = alp_ops._FLOAT_DTYPES

    def logits_case(M, V, dtype=torch.float32, tdtype=torch.int64, cu=True, padded_T=None, threshold=0.5):
        def call():
            if padded_T is not None:
                shape = (M, padded_T)
                logits = torch.randn(*shape, V, generator=_g(0)).to(dtype)
                return alp_ops.answer_logprob(logits, torch.zeros(shape, dtype=tdtype),
                                              torch.ones(shape, dtype=torch.bool), threshold=threshold,
                                              backend="triton")
            logits = torch.randn(M, V, generator=_g(0)).to(dtype)
            cu_seqlens = torch.tensor([0, M]) if cu else None
            return alp_ops.answer_logprob(logits, torch.zeros(M, dtype=tdtype), torch.ones(M, dtype=torch.bool),
                                          cu_seqlens, threshold=threshold, backend="triton")
        return call

    def hidden_case(M, V, H, hdtype, wdtype, bias_dtype=None, tdtype=torch.int64, method="fused", **chunks):
        def call():
            hidden = torch.randn(M, H, generator=_g(1)).to(hdtype)
            weight = torch.randn(V, H, generator=_g(2)).to(wdtype)
            bias = None if bias_dtype is None else torch.zeros(V, dtype=bias_dtype)
            return alp_ops.answer_logprob_from_hidden(hidden, weight, torch.zeros(M, dtype=tdtype),
                                                      torch.ones(M, dtype=torch.bool), torch.tensor([0, M]),
                                                      bias=bias, method=method, backend="triton", **chunks)
        return call

    # Row kernel: BLOCK_V = min(4096, next_pow2(V)) and the warps follow it: V across powers of two.
    for dtype in floats:
        for k in range(0, 14):
            yield f"answer_logprob V={2 ** k} {dtype}", logits_case(3, 2 ** k, dtype)
        yield f"answer_logprob V=151936 {dtype}", logits_case(2, 151_936, dtype)
    for tdtype in INT_DTYPES:
        yield f"answer_logprob targets {tdtype}", logits_case(3, 64, tdtype=tdtype)
    # Segment kernel: BLOCK_T from the longest context (varlen) or T (padded); threshold on / off.
    for k in range(0, 12):
        for threshold in (0.5, None):
            yield f"answer_logprob varlen M={2 ** k} thr={threshold}", logits_case(2 ** k, 2, threshold=threshold)
            yield f"answer_logprob padded T={2 ** k} thr={threshold}", logits_case(2, 2, padded_T=2 ** k,
                                                                                    threshold=threshold)
    # Fused kernel: every (hidden, weight, bias) dtype combination; the config follows the dtypes.
    for hdtype in floats:
        for wdtype in floats:
            for bias_dtype in (None,) + floats:
                yield (f"from_hidden {hdtype} {wdtype} bias={bias_dtype}",
                       hidden_case(64, 256, 16, hdtype, wdtype, bias_dtype))
    for tdtype in INT_DTYPES:
        # V = 64 < 128: an int8 target can name every token
        yield f"from_hidden targets {tdtype}", hidden_case(64, 64, 16, torch.bfloat16, torch.bfloat16, tdtype=tdtype)
    # Combine kernel: BLOCK_S follows the vocabulary split count, which follows M, V and the SM count.
    for m in (64, 4096, 16384):
        for k in range(0, 11):
            yield f"from_hidden M={m} V={128 << k}", hidden_case(m, 128 << k, 16, torch.bfloat16, torch.bfloat16)
    # Odd sizes: Triton specialises integers equal to 1 and pointers / integers by divisibility by 16.
    for dtype in (torch.bfloat16, torch.float32):
        for m, v in ((1, 151_936), (3, 37), (64, 1), (1, 1)):
            yield f"from_hidden odd M={m} V={v} {dtype}", hidden_case(m, v, 24, dtype, dtype)
    # Block kernel (the chunked method's epilogue): BLOCK_V = min(4096, next_pow2(N)) over block widths
    # N across powers of two (one block per row: first and last), with and without a bias; several
    # vocabulary blocks per row (first / middle / last, widths that are and are not multiples of 16);
    # the planner's own blocks at V = 151,936; odd sizes. The GEMM runs on the CPU here (not a kernel).
    for k in range(0, 14):
        for bias_dtype in (None, torch.float32):
            yield (f"from_hidden chunked V={2 ** k} bias={bias_dtype}",
                   hidden_case(3, 2 ** k, 16, torch.float32, torch.float32, bias_dtype, method="chunked"))
    for v, n in ((1000, 128), (1000, 77), (151_936, 9472), (37, 1)):
        yield (f"from_hidden chunked V={v} vocab_chunk={n}",
               hidden_case(5, v, 16, torch.bfloat16, torch.bfloat16, torch.bfloat16, method="chunked",
                           vocab_chunk=n))
    for m, v in ((1, 151_936), (64, 1), (1, 1)):
        yield (f"from_hidden chunked odd M={m} V={v}",
               hidden_case(m, v, 24, torch.float32, torch.float32, method="chunked"))

    # Advantage ops: span scatter per mask dtype (float masks are checked in the kernel), with and without
    # the outcome and the spans; the z-score per flag combination and value dtype (loaded as given); round
    # keys with and without stages. Index given as labels (host) and as device ids: the same kernels.
    def advantage_case(mask_dtype, norm_by_std=True, score_dtype=torch.float32, stages=False, memory=True,
                       outcome=True):
        def call():
            mask = (torch.rand(4, 40, generator=_g(3)) > 0.2).to(mask_dtype)
            scores = torch.tensor([1.0, 0.0, 2.0, 1.0]).to(score_dtype)
            ids = torch.tensor([0, 0, 1, 1])
            rounds = (torch.tensor([0.5, -1.0, 0.2]), torch.tensor([0, 1, 1, 2, 3]),
                      torch.tensor([[2, 6], [3, 9], [0, 4]]))
            kw = dict(mem_stages=torch.tensor([0, 1, 0]) if stages else None, backend="triton")
            if not outcome:
                return adv_ops.memory_advantage(*rounds, ids, mask, norm_adv_by_std=norm_by_std, **kw)
            if not memory:
                return adv_ops.grpo_outcome_advantage(scores, ids, mask, norm_adv_by_std=norm_by_std,
                                                      backend="triton")
            return adv_ops.mempo_advantage(scores, [0, 0, 1, 1], mask, *rounds, norm_adv_by_std=norm_by_std, **kw)
        return call

    for mask_dtype in MASK_DTYPES:
        yield f"mempo_advantage mask {mask_dtype}", advantage_case(mask_dtype)
        yield f"grpo_outcome_advantage mask {mask_dtype}", advantage_case(mask_dtype, memory=False)
        yield f"memory_advantage mask {mask_dtype}", advantage_case(mask_dtype, outcome=False)
    for score_dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64, torch.bool):
        yield f"mempo_advantage scores {score_dtype}", advantage_case(torch.bool, score_dtype=score_dtype)
    yield "mempo_advantage norm_adv_by_std=False", advantage_case(torch.bool, norm_by_std=False)
    yield "mempo_advantage mem_stages", advantage_case(torch.bool, stages=True)
    yield "memory_advantage mem_stages", advantage_case(torch.bool, stages=True, outcome=False)
    for norm_by_std in (True, False):
        for singleton in ("passthrough", "zero"):
            yield (f"group_zscore std={norm_by_std} {singleton}",
                   lambda n=norm_by_std, s=singleton: adv_ops.group_zscore(
                       torch.randn(5, generator=_g(4)), torch.tensor([0, 0, 1, 1, 2]), 3, norm_by_std=n,
                       singleton=s, backend="triton"))
    # The std floor is a runtime float (no new variant); memory pools by (group, stage) reuse the kernel.
    yield ("group_zscore std_floor=0.05", lambda: adv_ops.group_zscore(
        torch.randn(5, generator=_g(4)), torch.tensor([0, 0, 1, 1, 2]), 3, std_floor=0.05, singleton="zero",
        backend="triton"))


def record(sms: int = H200_SMS) -> list[Launch]:
    """Every launch the op sweep makes (not deduplicated)."""
    with recording(sms) as sink:
        for label, call in op_calls():
            before = len(sink)
            try:
                call()
            except Exception as error:
                # Nothing ran, so the outputs are uninitialised memory: an op that checks its results
                # (NaN log-probs are an error) may reject them after its launches were recorded.
                # Rejected before any launch, the sweep point itself is wrong.
                if len(sink) == before:
                    raise RuntimeError(f"aot_kernels: op call '{label}' failed: {error!r}") from error
    return sink


# ------------------------------------------------------------------------------------------------
# 2. specialise each launch for the target, as JITFunction.run does, and keep the distinct ones
# ------------------------------------------------------------------------------------------------
@dataclass
class Variant:
    kernel: str
    signature: dict            # argument -> Triton type ("*bf16", "i32", "constexpr", ...)
    constexprs: dict           # argument -> value
    num_warps: int
    num_stages: int
    launches: int = 0          # how many recorded launches specialise to this variant
    # filled by compile_variant
    registers: Optional[int] = None
    spill_stores: Optional[int] = None
    spill_loads: Optional[int] = None
    stack_bytes: Optional[int] = None
    local_bytes: Optional[int] = None
    shared_bytes: Optional[int] = None
    mma: Optional[str] = None  # "wgmma", "mma.sync" or "none"
    seconds: Optional[float] = None
    error: Optional[str] = None
    _compile_args: Any = field(default=None, repr=False)


def specialise(launches: list[Launch], target: GPUTarget) -> list[Variant]:
    backend = make_backend(target)
    binders: dict[int, Callable] = {}
    variants: dict[tuple, Variant] = {}
    for launch in launches:
        fn = launch.fn
        binder = binders.get(id(fn))
        if binder is None:
            binder = binders[id(fn)] = create_function_from_signature(fn.signature, fn.params, backend)
        kwargs = dict(launch.kwargs, debug=False)
        bound_args, specialization, options = binder(*launch.args, **kwargs)
        key = (launch.kernel, tuple(map(str, specialization)), tuple(sorted(map(str, options.items()))))
        if key in variants:
            variants[key].launches += 1
            continue
        opts, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
        names = [p.name for p in fn.params]
        variants[key] = Variant(
            kernel=launch.kernel, signature=dict(signature),
            constexprs={names[path[0]]: value for path, value in constexprs.items()},
            num_warps=opts.num_warps, num_stages=opts.num_stages, launches=1,
            _compile_args=(fn, signature, constexprs, attrs, opts))
    return list(variants.values())


# ------------------------------------------------------------------------------------------------
# 3. compile; registers and spills from the cubin and from ptxas -v
# ------------------------------------------------------------------------------------------------
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_RES_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _nvidia_tool(name: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Triton's bundled {name} is missing: {path}")
    return path


def resource_usage(cubin: bytes) -> tuple[int, int, int]:
    """(registers, stack bytes, local bytes) of the one kernel in `cubin` (Triton's bundled cuobjdump)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        done = subprocess.run([_nvidia_tool("cuobjdump"), "--dump-resource-usage", path], capture_output=True,
                              text=True)
    found = _RES_USAGE.search(done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"cuobjdump --dump-resource-usage failed ({done.returncode}): "
                           f"{done.stdout[-500:]}{done.stderr[-500:]}")
    regs, stack, _, local = map(int, found.groups())
    return regs, stack, local


def compile_variant(variant: Variant, target: GPUTarget) -> Variant:
    """triton.compile for `target`. Registers, stack and local memory from the cubin (cuobjdump);
    spill stores / loads from the ptxas -v log Triton prints (``knobs.nvidia.dump_ptxas_log``)
    when it compiled the kernel here (None when Triton's cache served it: then the stack and local
    bytes, 0 unless something spilled or a local array exists, are the check)."""
    fn, signature, constexprs, attrs, opts = variant._compile_args
    t0 = time.perf_counter()
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target,
                                      options=opts.__dict__)
        variant.registers, variant.stack_bytes, variant.local_bytes = resource_usage(compiled.asm["cubin"])
    except Exception as error:  # the point of the tool: report every failure, do not stop at the first
        variant.error = f"{type(error).__name__}: {str(error)[:2000]}"
        variant.seconds = time.perf_counter() - t0
        return variant
    ptx = compiled.asm["ptx"]
    variant.shared_bytes = int(compiled.metadata.shared)
    variant.mma = "wgmma" if "wgmma" in ptx else ("mma.sync" if "mma.sync" in ptx else "none")
    spill = _PTXAS_SPILL.search(log.getvalue())
    if spill:
        _, variant.spill_stores, variant.spill_loads = map(int, spill.groups())
    variant.seconds = time.perf_counter() - t0
    return variant


_POOL_VARIANTS: list[Variant] = []
_POOL_TARGET: Optional[GPUTarget] = None


def _compile_in_worker(i: int) -> Variant:
    variant = compile_variant(_POOL_VARIANTS[i], _POOL_TARGET)
    variant._compile_args = None  # JIT functions do not pickle; the parent keeps its own
    return variant


def run(arch: int = 90, sms: int = H200_SMS, jobs: Optional[int] = None) -> list[Variant]:
    """Record, specialise and compile; returns every distinct variant with its report."""
    global _POOL_VARIANTS, _POOL_TARGET
    target = GPUTarget("cuda", arch, 32)
    variants = specialise(record(sms), target)
    triton.knobs.nvidia.dump_ptxas_log = True
    jobs = jobs or max(1, os.cpu_count() or 1)
    if jobs == 1:
        return [compile_variant(v, target) for v in variants]
    # Processes, not threads: triton's MLIR passes hold the GIL, and each worker captures the ptxas
    # log triton prints on its own stdout. Forked, so the workers inherit the JIT functions.
    _POOL_VARIANTS, _POOL_TARGET = variants, target
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(_compile_in_worker, range(len(variants)), chunksize=1)


def _describe(v: Variant) -> str:
    pointers = ",".join(f"{k}={t[1:]}" for k, t in v.signature.items() if t.startswith("*"))
    consts = ",".join(f"{k}={c}" for k, c in v.constexprs.items())
    return f"{v.kernel} [{consts}] warps={v.num_warps} stages={v.num_stages} ({pointers})"


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability (90: H100/H200)")
    parser.add_argument("--sms", type=int, default=H200_SMS, help="multiprocessors the split count assumes")
    parser.add_argument("--json", help="write the report (one record per variant) here")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compilations (default: CPU count)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    variants = run(args.arch, args.sms, args.jobs)
    failed = [v for v in variants if v.error]
    for v in sorted(variants, key=lambda v: (v.kernel, -(v.registers or 0))):
        status = "FAIL" if v.error else "OK"
        print(f"{status} regs={v.registers} stack={v.stack_bytes} local={v.local_bytes} spill_st={v.spill_stores} "
              f"spill_ld={v.spill_loads} smem={v.shared_bytes} mma={v.mma} {v.seconds:.2f}s {_describe(v)}")
        if v.error:
            print("   ", v.error.replace("\n", "\n    "))
    per_kernel: dict[str, list[Variant]] = {}
    for v in variants:
        per_kernel.setdefault(v.kernel, []).append(v)
    for name, vs in sorted(per_kernel.items()):
        regs = [v.registers for v in vs if v.registers is not None]
        spilled = sum((v.spill_stores or 0) + (v.spill_loads or 0) + (v.stack_bytes or 0) + (v.local_bytes or 0)
                      for v in vs)
        print(f"KERNEL {name} variants={len(vs)} max_regs={max(regs) if regs else None} "
              f"spill_stack_local_bytes={spilled}")
    print(f"SUMMARY arch=sm_{args.arch} triton={triton.__version__} variants={len(variants)} failed={len(failed)} "
          f"launches_recorded={sum(v.launches for v in variants)} seconds={time.perf_counter() - t0:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"arch": args.arch, "sms": args.sms, "triton": triton.__version__,
                       "variants": [{f.name: getattr(v, f.name) for f in fields(v) if not f.name.startswith("_")}
                                    for v in variants]}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
