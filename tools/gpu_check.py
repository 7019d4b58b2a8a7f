"""The prepared GPU check: validate and time every GPU path of mempo in one run (docs/TRAINING.md, "GPU").

Run it through `bash tools/gpu_check.sh` (which makes mempo, its kernels, the C++ scanner and, when
no real flash-attn 2 is installed, the validation shim tools/fa_shim/ importable), from the
repository root. Written for one H200 with no network; the sections' time limits (SECTIONS) and
the overall budget (--budget, 465 s) keep it within 8 minutes. Not yet run on a GPU.

Output: one line per check,
    RESULT <section>.<check> PASS|FAIL|SKIP|INFO key=value ...
then `SECTION <name> <seconds>s rc=<code>` per section, a summary table, and $OUT/gpu_check.json
(every result with its values, the sections' times and return codes, versions, the mode). Each
section runs in its own subprocess (`--section NAME`) with its own time limit, so a CUDA fault or a
hang cannot take the later sections down; the JSON is rewritten after every section.

Modes: "gpu" when torch sees CUDA; otherwise "plumbing", in which every section either runs its
CPU part at tiny sizes (the Triton kernels through the interpreter, no timings) or SKIPs with the
reason, so that the script runs on a CPU machine and tests/tools/test_gpu_check.py keeps it from rotting.

Sections (SECTIONS below): env (versions, measured ceilings: device copy GB/s, bf16 and fp32
matmul TFLOP/s), aot (every kernel variant compiled for this GPU's arch, registers and spills),
triton_ops (the kernels on CUDA against the torch path and fp64 at real sizes, -inf columns, keep
flips, time against the ceilings; answer log-probs from hidden states by the chunked default and the
fused kernel against materialised logits -- ms, peak MiB, their ratios, TF32 for fp32 with its error
against fp64, other block shapes, issue 45's targets (1.05x the time, 1/8 of the memory; TF32 1.5x);
the advantage ops at 2,048 x 4,096: per
mask dtype; off the host with device group ids and validate="device" -- host syncs under
torch.cuda.set_sync_debug_mode("error"), kernels / copies / syncs from torch.profiler, end-to-end
wall ms against issue 45's 0.3 ms and the limit (bytes moved at 4.3 TB/s), a CUDA-graph capture
replayed on new inputs -- and with verl's uid object array (one host-to-device copy, 1.0 ms); row
offsets past 2**31), pytest_ops (the ops' test files with CUDA), flash_actor (packed varlen
training forward vs padded SDPA on a Qwen2 with V = 151,936 in bf16: log-probs, gradients, time),
scoring (teacher scoring reference / packed / cached on CUDA: agreement, time, tokens), train (one
`mempo train` step under torchrun with nccl, one process, bf16, stage times), sglang (end to end
where installed). Exit status: 1 if any check FAILed, else 0.
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
OUT = Path(os.environ.get("OUT", "/tmp/gpu_check_out"))
QWEN_V = 151_936
LOG_HALF = math.log(0.5)


# ------------------------------------------------------------------------------------------------
# result lines
# ------------------------------------------------------------------------------------------------
def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.4g}"
    return re.sub(r"\s+", "_", str(value)) or '""'


def result(section: str, check: str, status: str, **values: Any) -> None:
    assert status in ("PASS", "FAIL", "SKIP", "INFO"), status
    items = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
    print(f"RESULT {section}.{check} {status} {items}".rstrip(), flush=True)


def checked(section: str, check: str, fn: Callable[[], None]) -> None:
    """Run one check; an exception is a FAIL line naming it (traceback on stderr)."""
    t0 = time.perf_counter()
    try:
        fn()
    except Exception as error:  # noqa: BLE001 - one check's failure must not stop the section
        result(section, check, "FAIL", error=repr(error)[:300], s=time.perf_counter() - t0)
        traceback.print_exc(limit=6)


_LINE = re.compile(r"^RESULT (\S+?)\.(\S+) (PASS|FAIL|SKIP|INFO)(.*)$")


def parse_result(line: str) -> Optional[dict]:
    found = _LINE.match(line.strip())
    if not found:
        return None
    values: dict[str, Any] = {}
    for item in found.group(4).split():
        key, _, raw = item.partition("=")
        value: Any = raw
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                pass
        values[key] = {"true": True, "false": False}.get(raw, value) if isinstance(value, str) else value
    return {"section": found.group(1), "check": found.group(2), "status": found.group(3), "values": values}


# ------------------------------------------------------------------------------------------------
# context shared by the sections
# ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one mode (real sizes on a GPU, tiny ones for the CPU plumbing run)."""

    vocab: int
    from_hidden: tuple    # (M, H, dtype name) cases of answer_logprob_from_hidden (chunked and fused)
    neginf_h: int         # H of the -inf-columns case
    row_m: int            # rows of the materialised-logits case
    adv_groups: int       # advantage ops: groups x 16 trajectories x adv_len tokens
    adv_len: int
    actor: dict           # Qwen2 of the packed-vs-padded check
    actor_rows: int
    actor_len: int
    scoring: dict         # Qwen2 of the scoring check
    scoring_requests: int
    scoring_len: int


GPU_SIZES = Sizes(
    vocab=QWEN_V,
    from_hidden=((4608, 896, "bfloat16"), (4608, 3584, "bfloat16"), (4608, 896, "float16"), (4608, 3584, "float16"),
           (4608, 896, "float32"), (4608, 3584, "float32"), (16, 3584, "bfloat16"), (200, 896, "bfloat16")),
    neginf_h=896, row_m=4608, adv_groups=128, adv_len=4096,
    actor=dict(vocab_size=QWEN_V, hidden_size=896, intermediate_size=4864, num_hidden_layers=4,
               num_attention_heads=14, num_key_value_heads=2), actor_rows=16, actor_len=1024,
    scoring=dict(vocab_size=QWEN_V, hidden_size=896, intermediate_size=4864, num_hidden_layers=2,
                 num_attention_heads=14, num_key_value_heads=2), scoring_requests=8, scoring_len=1500,
)
CPU_SIZES = Sizes(
    vocab=997, from_hidden=((48, 64, "bfloat16"), (48, 40, "float32")), neginf_h=32, row_m=48, adv_groups=2, adv_len=96,
    actor=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2), actor_rows=4, actor_len=40,
    scoring=dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2), scoring_requests=2, scoring_len=120,
)


class Ctx:
    """What a section needs: the mode, the device, the sizes, timing and the measured ceilings."""

    def __init__(self):
        import torch

        self.torch = torch
        self.gpu = torch.cuda.is_available()
        self.mode = "gpu" if self.gpu else "plumbing"
        self.device = torch.device("cuda" if self.gpu else "cpu")
        self.sizes = GPU_SIZES if self.gpu else CPU_SIZES

    def dtype(self, name: str):
        return getattr(self.torch, name)

    def sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize()

    def bench_ms(self, fn: Callable[[], Any]) -> Optional[float]:
        """Median milliseconds (triton.testing.do_bench: CUDA events, warm-up first); None on CPU,
        where the kernels run in the interpreter and a time would mean nothing."""
        if not self.gpu:
            return None
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))

    def wall_ms(self, fn: Callable[[], Any], reps: int = 50) -> Optional[float]:
        """Host wall-clock milliseconds per call, end to end (what a caller waits: host work, launches
        and device time): `reps` calls back to back after 5 warm-up calls, one synchronisation at the
        end. None on CPU."""
        if not self.gpu:
            return None
        for _ in range(5):
            fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e3 / reps

    def seconds(self, fn: Callable[[], Any]) -> tuple[Any, float]:
        self.sync()
        t0 = time.perf_counter()
        out = fn()
        self.sync()
        return out, time.perf_counter() - t0

    def ceilings(self) -> dict:
        try:
            return json.loads((OUT / "ceilings.json").read_text())
        except (OSError, ValueError):
            return {}

    def peak_mib(self, fn: Callable[[], Any]) -> Optional[float]:
        """Extra device memory `fn` needs at its peak (MiB), beyond what was allocated before."""
        if not self.gpu:
            return None
        torch = self.torch
        self.sync()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        self.sync()
        return (torch.cuda.max_memory_allocated() - base) / 2**20


def flash_attention_2() -> tuple[bool, str]:
    """(available, what): a real flash-attn 2, the validation shim (tools/fa_shim), or neither."""
    try:
        from transformers.utils import is_flash_attn_2_available
    except ImportError as error:
        return False, f"transformers not importable: {error}"
    if not is_flash_attn_2_available():
        return False, "no flash-attn 2 (transformers.utils.is_flash_attn_2_available() is False)"
    import flash_attn

    if getattr(flash_attn, "SHIM", False):
        return True, "shim over aten._flash_attention_forward (tools/fa_shim; validation only)"
    return True, f"flash-attn {getattr(flash_attn, '__version__', '?')}"


def qwen2(spec: dict, attn: str, dtype, seed: int = 0):
    import torch
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**spec, tie_word_embeddings=False, max_position_embeddings=8192)
    return transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=dtype)


# ------------------------------------------------------------------------------------------------
# env: versions and measured ceilings
# ------------------------------------------------------------------------------------------------
def sec_env(ctx: Ctx) -> None:
    import platform

    import torch
    import triton

    try:
        import transformers
        tf_version = transformers.__version__
    except ImportError:
        tf_version = "absent"
    fa_ok, fa_what = flash_attention_2()
    import mempo

    result("env", "mempo", "INFO", path=Path(mempo.__file__).parent)
    result("env", "versions", "INFO", mode=ctx.mode, python=platform.python_version(), torch=torch.__version__,
           cuda=torch.version.cuda, triton=triton.__version__, transformers=tf_version, flash=fa_what if fa_ok else
           "none", sglang="installed" if _find("sglang") else "absent")
    if not ctx.gpu:
        result("env", "ceilings", "SKIP", reason="no CUDA device (plumbing mode)")
        return
    props = torch.cuda.get_device_properties(0)
    result("env", "device", "INFO", gpu=props.name, sm=f"{props.major}{props.minor}", sms=props.multi_processor_count,
           mem_gib=props.total_memory / 2**30, l2_mib=getattr(props, "L2_cache_size", 0) / 2**20)

    def copy_bandwidth() -> float:
        """GB/s of a 2 GiB device-to-device copy (read + write); its 4 GiB are freed on return."""
        src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        return 2 * src.numel() / ctx.bench_ms(lambda: dst.copy_(src)) / 1e6

    def ceilings():
        copy_gbs = copy_bandwidth()
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        bf16 = 2 * 8192**3 / ctx.bench_ms(lambda: a @ b) / 1e9
        torch.backends.cuda.matmul.allow_tf32 = False  # plain fp32 FMA: the ceiling of the fp32 (IEEE) kernels
        a32, b32 = a.float(), b.float()
        fp32 = 2 * 8192**3 / ctx.bench_ms(lambda: a32 @ b32) / 1e9
        values = {"copy_gbs": copy_gbs, "bf16_tflops": bf16, "fp32_tflops": fp32}
        (OUT / "ceilings.json").write_text(json.dumps(values))
        result("env", "ceilings", "INFO", copy_GBps=copy_gbs, bf16_TFLOPs=bf16, fp32_TFLOPs=fp32)
    checked("env", "ceilings", ceilings)


def _find(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


# ------------------------------------------------------------------------------------------------
# aot: every variant the ops can launch, compiled for this GPU
# ------------------------------------------------------------------------------------------------
def sec_aot(ctx: Ctx) -> None:
    if not ctx.gpu:
        result("aot", "compile", "SKIP",
               reason="plumbing mode: tests/tools/test_aot_kernels.py runs tools/aot_kernels.py on CPU")
        return
    import torch

    props = torch.cuda.get_device_properties(0)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-P", str(REPO / "tools" / "aot_kernels.py"), "--arch", f"{props.major}{props.minor}",
           "--sms", str(props.multi_processor_count), "--json", str(OUT / "aot_kernels.json"),
           "--jobs", str(min(16, os.cpu_count() or 1))]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    for line in done.stdout.splitlines():
        if line.startswith(("KERNEL ", "SUMMARY ", "FAIL ")):
            print("   ", line)
    kernels = [line.split() for line in done.stdout.splitlines() if line.startswith("KERNEL ")]
    for parts in kernels:
        fields = dict(p.split("=", 1) for p in parts[2:])
        spilled = int(fields.get("spill_stack_local_bytes", "0"))
        result("aot", f"kernel.{parts[1].split('.')[-1]}", "PASS" if spilled == 0 else "FAIL", **fields)
    result("aot", "compile", "PASS" if done.returncode == 0 and kernels else "FAIL", rc=done.returncode,
           s=time.perf_counter() - t0, stderr=done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else "")


# ------------------------------------------------------------------------------------------------
# triton_ops: the kernels on CUDA at real sizes
# ------------------------------------------------------------------------------------------------
def _hidden_case(ctx: Ctx, M: int, H: int, dtype, seed: int):
    """hidden [M, H], weight [V, H], targets (-100 off the mask), mask, cu_seqlens (contexts of ~16
    rows). Each row's hidden state is pushed toward its target's weight row by a random amount, so
    target log-probs spread from about -log V to 0 and a 0.5 threshold keeps some and drops some."""
    torch = ctx.torch
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    V = ctx.sizes.vocab
    weight = torch.randn(V, H, device=ctx.device, generator=g) / H ** 0.5
    targets = torch.randint(0, V, (M,), device=ctx.device, generator=g)
    w_t = weight[targets]
    boost = torch.rand(M, 1, device=ctx.device, generator=g) * (math.log(V) + 6.0)
    hidden = torch.randn(M, H, device=ctx.device, generator=g) + boost * w_t / w_t.pow(2).sum(1, keepdim=True)
    mask = torch.rand(M, device=ctx.device, generator=g) > 0.02
    targets = torch.where(mask, targets, torch.full_like(targets, -100))
    C = max(1, M // 16)
    cu = torch.linspace(0, M, C + 1, device=ctx.device).round().long()
    return hidden.to(dtype), weight.to(dtype), targets, mask, cu


def _fp64_rows(hidden, weight, bias, targets, rows):
    z = hidden[rows].double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    return z.gather(1, targets[rows, None]).squeeze(1) - z.logsumexp(dim=1)


def _sample_rows(mask, count: int):
    rows = mask.nonzero().squeeze(1)
    step = max(1, rows.numel() // count)
    return rows[::step][:count]


def _flips(keep_a, keep_b, ref_logp, mask, tol: float) -> tuple[int, int]:
    """(flips, unexplained flips): rows whose keep differs, and of those the ones whose logp is not
    within tol of log(threshold) (a legitimate flip lies at the threshold)."""
    flip = (keep_a != keep_b) & mask
    near = (ref_logp - LOG_HALF).abs() <= tol
    return int(flip.sum()), int((flip & ~near).sum())


def sec_triton_ops(ctx: Ctx) -> None:
    import torch

    from mempo.ops import answer_logprob, answer_logprob_from_hidden

    sz, ceil = ctx.sizes, ctx.ceilings()
    if ctx.gpu and not ceil:
        result("triton_ops", "ceilings", "INFO", note="env.ceilings missing: no percentages")

    # (a) answer log-probs from hidden states (chunked default, fused kernel) vs the torch path vs fp64;
    #     time and peak memory against materialised logits; TF32 for fp32; issue 45's targets
    measured: dict = {}
    for i, (M, H, dname) in enumerate(sz.from_hidden):
        checked("triton_ops", f"from_hidden_M{M}_H{H}_{dname}",
                lambda M=M, H=H, dname=dname, seed=i: _from_hidden(ctx, ceil, M, H, dname, seed, measured))
    checked("triton_ops", "from_hidden_chunks", lambda: _from_hidden_chunks(ctx))
    checked("triton_ops", "from_hidden_targets", lambda: _from_hidden_targets(ctx, measured))

    # (b) -inf columns through the bias (banned tokens): banned targets give -inf, nothing is NaN
    for dname in ("bfloat16", "float32"):
        def neginf(dname=dname):
            dtype = ctx.dtype(dname)
            M = sz.row_m
            hidden, weight, targets, mask, cu = _hidden_case(ctx, M, sz.neginf_h, dtype, 11)
            g = torch.Generator(device=ctx.device).manual_seed(12)
            bias = torch.zeros(sz.vocab, device=ctx.device)
            banned = torch.randperm(sz.vocab, device=ctx.device, generator=g)[: max(8, sz.vocab // 150)]
            bias[banned] = float("-inf")
            bias[: sz.vocab // 4] = float("-inf")  # whole tiles and splits of -inf
            picks = _sample_rows(mask, 8)
            targets = targets.clone()
            targets[picks] = banned[: picks.numel()]
            ok_rows = mask & ~torch.isneginf(bias[targets.clamp(min=0)])
            ref = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, bias=bias, backend="torch")
            tol = 1e-4 if dtype == torch.float32 else 2e-3
            values, ok = {}, True
            for method in ("chunked", "fused"):  # the default, and the kernel that never stores logits
                tri = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, bias=bias, backend="triton",
                                                 method=method)
                nan = int(tri.token_logp.isnan().sum() + tri.p.isnan().sum() + tri.mean_logp.isnan().sum())
                inf_ok = bool(torch.isneginf(tri.token_logp[picks]).all())
                same_inf = bool(torch.equal(torch.isneginf(tri.token_logp) & mask,
                                            torch.isneginf(ref.token_logp) & mask))
                err = (tri.token_logp - ref.token_logp)[ok_rows].abs().max().item()
                ok = ok and nan == 0 and inf_ok and same_inf and err < tol
                values.update({f"{method}_nan": nan, f"{method}_banned_targets_neginf": inf_ok,
                               f"{method}_neginf_agree": same_inf, f"{method}_err_vs_torch": err})
            result("triton_ops", f"from_hidden_neginf_{dname}", "PASS" if ok else "FAIL", **values)
        checked("triton_ops", f"from_hidden_neginf_{dname}", neginf)

    # (c) row kernel on materialised logits: -inf columns and rows, parity, HBM bandwidth
    for i, dname in enumerate(("bfloat16", "float16", "float32")):
        def row(dname=dname, seed=20 + i):
            dtype = ctx.dtype(dname)
            M, V = sz.row_m, sz.vocab
            g = torch.Generator(device=ctx.device).manual_seed(seed)
            logits = torch.randn(M, V, device=ctx.device, generator=g) * 2
            targets = torch.randint(0, V, (M,), device=ctx.device, generator=g)
            logits[torch.arange(M, device=ctx.device), targets] += torch.rand(M, device=ctx.device, generator=g) * (
                math.log(V) + 6.0)
            banned = torch.randperm(V, device=ctx.device, generator=g)[: max(8, V // 150)]
            logits[:, banned] = float("-inf")
            logits[1] = float("-inf")  # a row with every logit -inf: -inf, not NaN
            targets[:4] = banned[:4]
            mask = torch.rand(M, device=ctx.device, generator=g) > 0.02
            mask[:4] = True
            targets = torch.where(mask, targets, torch.full_like(targets, -100))
            logits = logits.to(dtype)
            cu = torch.arange(0, M + 1, 16, device=ctx.device)
            if int(cu[-1]) != M:
                cu = torch.cat([cu, torch.tensor([M], device=ctx.device)])
            tri = answer_logprob(logits, targets, mask, cu, backend="triton")
            ref = answer_logprob(logits, targets, mask, cu, backend="torch")
            fin = torch.isfinite(ref.token_logp) & mask
            err = (tri.token_logp - ref.token_logp)[fin].abs().max().item()
            same_inf = bool(torch.equal(torch.isneginf(tri.token_logp), torch.isneginf(ref.token_logp)))
            nan = int(tri.token_logp.isnan().sum() + tri.p.isnan().sum())
            flips, bad = _flips(tri.keep, ref.keep, ref.token_logp, mask, 1e-4)
            values = dict(err_vs_torch=err, neginf_agree=same_inf, nan=nan, keep_flips=flips, unexplained_flips=bad)
            ms = ctx.bench_ms(lambda: answer_logprob(logits, targets, mask, cu, backend="triton"))
            if ms is not None:
                gbs = int(mask.sum()) * V * logits.element_size() / ms / 1e6
                ms_torch = ctx.bench_ms(lambda: answer_logprob(logits, targets, mask, cu, backend="torch"))
                values.update(ms=ms, GBps=gbs, pct_copy=100 * gbs / ceil["copy_gbs"] if ceil else "n/a",
                              ms_torch_path=ms_torch)
            ok = err < 1e-4 and same_inf and nan == 0 and bad == 0
            result("triton_ops", f"row_{dname}", "PASS" if ok else "FAIL", **values)
        checked("triton_ops", f"row_{dname}", row)

    # (d) advantage ops at 2,048 x 4,096 (128 groups x 16, 8 rounds with a <mem> span each)
    checked("triton_ops", "advantage", lambda: _advantage(ctx, ceil))
    # (e) span scatter with B * L > 2**31 on CUDA (int64 row offsets)
    if ctx.gpu:
        checked("triton_ops", "span_offsets_past_2_31", lambda: _span_overflow(ctx))
    else:
        result("triton_ops", "span_offsets_past_2_31", "SKIP",
               reason="plumbing mode: tests/kernels/test_launch.py checks the int64 offsets in the interpreter")


# Issue 45: the default (chunked) path at most 1.05x the materialised logits' time with at most 1/8 of
# their memory (bf16, M 4,608, H 896 and 3,584); fp32 with TF32 allowed at most 1.5x materialised fp32.
LOGPROB_TARGET_X = 1.05
LOGPROB_TARGET_MEM = 1 / 8
LOGPROB_TF32_TARGET_X = 1.5
# |log p error| of the TF32 GEMM against fp64 that the check accepts on its inputs (logits ~N(0, 1)):
# emulated on CPU (bench/exploratory/tf32_error.py; `answer_logprob_from_hidden(allow_tf32=...)`),
# 1e-3 with operands rounded to nearest, 6.6e-3 truncated; the bound leaves room for either.
TF32_LOGP_BOUND = 1e-2


def _from_hidden(ctx: Ctx, ceil: dict, M: int, H: int, dname: str, seed: int, measured: dict) -> None:
    """One (M, H, dtype) case of `answer_logprob_from_hidden`: the default method (chunked: cuBLAS
    blocks and the Triton block kernel) and method "fused" against the torch path and fp64 rows, no
    NaN, keep flips only at the threshold. On a GPU: ms and peak MiB of chunked, fused, the torch path
    and the materialised logits (`hidden @ weight.T`, then the row kernel: what a user writes), their
    ratios; fp32: the TF32 path's ms and its error against fp64."""
    import torch

    from mempo.ops import answer_logprob, answer_logprob_from_hidden
    from mempo.ops.logprob import _chunked_token_logp

    sz = ctx.sizes
    dtype = ctx.dtype(dname)
    hidden, weight, targets, mask, cu = _hidden_case(ctx, M, H, dtype, seed)
    kw = dict(threshold=0.5, temperature=1.0)
    ref = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="torch", **kw)
    rows = _sample_rows(mask, 64)
    exact = _fp64_rows(hidden, weight, None, targets, rows)
    tol = 1e-4 if dtype == torch.float32 else 2e-3
    values: dict[str, Any] = dict(rows=int(mask.sum()))
    ok = True
    for method in ("chunked", "fused"):
        out = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="triton", method=method, **kw)
        err_torch = (out.token_logp - ref.token_logp)[mask].abs().max().item()
        err_fp64 = (out.token_logp[rows].double() - exact).abs().max().item()
        nan = int(out.token_logp.isnan().sum() + out.p.isnan().sum())
        flips, bad = _flips(out.keep, ref.keep, ref.token_logp, mask, 2 * tol)
        kept = int(out.keep.sum())
        spread = 0 < kept < int(mask.sum()) or M < 64  # the threshold both keeps and drops rows
        ok = ok and err_torch < tol and err_fp64 < 10 * tol and nan == 0 and bad == 0 and spread
        values.update({f"{method}_err_vs_torch": err_torch, f"{method}_err_vs_fp64": err_fp64, f"{method}_nan": nan,
                       f"{method}_unexplained_flips": bad, f"{method}_kept": kept})
        values[f"{method}_keep_flips"] = flips

    def run(method="chunked", **extra):
        return lambda: answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="triton", method=method,
                                                  **extra)

    def materialised():
        return answer_logprob(hidden @ weight.T, targets, mask, cu, backend="triton")

    def core():  # the chunked GEMMs and epilogues without the op's validation (its host syncs)
        return _chunked_token_logp(hidden, weight, None, targets, mask, 1.0, epilogue="triton", tf32=False)

    ms = ctx.bench_ms(run())
    if ms is not None:
        flop = 2.0 * int(mask.sum()) * sz.vocab * H
        peak_flops = ceil.get("fp32_tflops" if dtype == torch.float32 else "bf16_tflops")
        ms_mat = ctx.bench_ms(materialised)
        ms_fused = ctx.bench_ms(run("fused"))
        # where the time goes: the GEMM alone (as the materialised path runs it), the chunked core
        values.update(ms_gemm_only=ctx.bench_ms(lambda: hidden @ weight.T), ms_chunked_core=ctx.bench_ms(core))
        mib, mib_mat, mib_fused = ctx.peak_mib(run()), ctx.peak_mib(materialised), ctx.peak_mib(run("fused"))
        values.update(ms_chunked=ms, ms_materialised=ms_mat, ms_fused=ms_fused,
                      ms_torch_path=ctx.bench_ms(lambda: answer_logprob_from_hidden(hidden, weight, targets, mask, cu,
                                                                                    backend="torch")),
                      x_materialised=ms / ms_mat, fused_x_materialised=ms_fused / ms_mat,
                      MiB_chunked=mib, MiB_materialised=mib_mat, MiB_fused=mib_fused, mem_ratio=mib / mib_mat,
                      TFLOPs=flop / ms / 1e9, pct_ceiling=100 * flop / ms / 1e9 / peak_flops if peak_flops else "n/a")
        measured[(M, H, dname)] = values
        if dtype == torch.float32:
            tf32 = answer_logprob_from_hidden(hidden, weight, targets, mask, cu, backend="triton", allow_tf32=True)
            err_tf32 = (tf32.token_logp[rows].double() - exact).abs().max().item()
            ms_tf32 = ctx.bench_ms(run(allow_tf32=True))
            values.update(ms_tf32=ms_tf32, tf32_x_materialised=ms_tf32 / ms_mat, tf32_err_vs_fp64=err_tf32,
                          tf32_bound=TF32_LOGP_BOUND)
            ok = ok and err_tf32 <= TF32_LOGP_BOUND and int(tf32.token_logp.isnan().sum()) == 0
    result("triton_ops", f"from_hidden_M{M}_H{H}_{dname}", "PASS" if ok else "FAIL", **values)


# Block shapes timed at the sizes (kept rows R x vocabulary entries N; None: planned): the
# planner's default, narrower vocabulary blocks of every kept row (L2-sized at 2,048-4,096), and
# Liger-style row chunks over the whole vocabulary (which re-read the weight once per chunk).
CHUNK_SWEEP = ((None, None), (None, 1024), (None, 2048), (None, 4096), (None, 16384), (None, 32768), (256, QWEN_V),
               (512, QWEN_V), (1152, 8192))


def _from_hidden_chunks(ctx: Ctx) -> None:
    """Time the chunked method under other block shapes at M 4,608, H 896 / 3,584, bf16 (GPU only): the
    evidence for the planner's choice. INFO lines; the default's own check is from_hidden_targets."""
    import torch

    from mempo.ops import answer_logprob_from_hidden
    from mempo.ops.logprob import plan_chunks

    if not ctx.gpu:
        result("triton_ops", "from_hidden_chunks", "SKIP", reason="plumbing mode: block shapes are timed on a GPU")
        return
    def sweep(H: int) -> dict[str, Any]:  # a function of its own: its tensors are freed when it returns
        hidden, weight, targets, mask, cu = _hidden_case(ctx, 4608, H, torch.bfloat16, 0)
        plan = plan_chunks(4608, int(mask.sum()), QWEN_V, H, torch.bfloat16, torch.bfloat16, ctx.device)
        values: dict[str, Any] = dict(planned=f"{plan.rows}x{plan.vocab}")
        for rows, vocab in CHUNK_SWEEP:
            name = "default" if rows is None and vocab is None else f"{rows or 'all'}x{vocab}"
            call = functools.partial(answer_logprob_from_hidden, hidden, weight, targets, mask, cu, backend="triton",
                                     chunk_rows=rows, vocab_chunk=vocab)
            values[f"ms_{name}"] = ctx.bench_ms(call)
            values[f"MiB_{name}"] = ctx.peak_mib(call)
        return values

    for H in (896, 3584):
        result("triton_ops", f"from_hidden_chunks_H{H}", "INFO", **sweep(H))
        torch.cuda.empty_cache()


def _from_hidden_targets(ctx: Ctx, measured: dict) -> None:
    """Issue 45's targets from the cases measured: bf16 chunked / materialised <= 1.05 and memory <= 1/8
    at M 4,608, H 896 and 3,584; fp32 with TF32 <= 1.5x materialised fp32."""
    if not ctx.gpu:
        result("triton_ops", "from_hidden_targets", "SKIP", reason="plumbing mode: times and memory need CUDA")
        return
    values: dict[str, Any] = {}
    met = True
    for H in (896, 3584):
        bf16 = measured.get((4608, H, "bfloat16"))
        fp32 = measured.get((4608, H, "float32"))
        if bf16 is None or fp32 is None:
            values[f"H{H}"] = "not_measured"
            met = False
            continue
        values.update({f"H{H}_x_materialised": bf16["x_materialised"], f"H{H}_mem_ratio": bf16["mem_ratio"],
                       f"H{H}_tf32_x_materialised": fp32.get("tf32_x_materialised", "n/a")})
        met = met and bf16["x_materialised"] <= LOGPROB_TARGET_X and bf16["mem_ratio"] <= LOGPROB_TARGET_MEM \
            and fp32.get("tf32_x_materialised", math.inf) <= LOGPROB_TF32_TARGET_X
    result("triton_ops", "from_hidden_targets", "PASS" if met else "FAIL", target_x=LOGPROB_TARGET_X,
           target_mem=LOGPROB_TARGET_MEM, target_tf32_x=LOGPROB_TF32_TARGET_X, **values)


ADV_TARGET_MS = {"device_ids": 0.3, "uid_array": 1.0}  # issue 45: end to end at 2,048 x 4,096, one H200
HBM_TBPS = 4.3  # the limit issue 45 names: the op's bytes moved at 4.3 TB/s


def _advantage(ctx: Ctx, ceil: dict) -> None:
    import torch

    from mempo.ops import grpo_outcome_advantage, mempo_advantage
    from mempo.ops.reference.advantage import mempo_advantage_reference, random_memory_batch

    sz = ctx.sizes
    scores, index, mask, rewards, offsets, spans = random_memory_batch(
        0, sz.adv_groups, 16, sz.adv_len, max_rounds=8, layout="rounds", mem_len=64)
    dev = ctx.device
    scores, rewards, offsets, spans = (t.to(dev) for t in (scores, rewards, offsets, spans))
    # loop reference on the first two groups (group statistics only involve a group's own rows)
    sub = 32
    cut = int(offsets[sub])
    exact = torch.tensor(mempo_advantage_reference(
        scores[:sub].tolist(), index[:sub], mask[:sub].tolist(), rewards[:cut].tolist(), offsets[:sub + 1].tolist(),
        spans[:cut].tolist()))
    for mdt in (torch.bool, torch.int64, torch.float32):
        def by_mask(mdt=mdt):
            m = mask.to(dev, mdt)
            tri, _ = mempo_advantage(scores, index, m, rewards, offsets, spans, backend="triton")
            ref, _ = mempo_advantage(scores, index, m, rewards, offsets, spans, backend="torch")
            err = (tri - ref).abs().max().item()
            err_loop = (tri[:sub].cpu().double() - exact).abs().max().item()
            nan = int(tri.isnan().sum())
            values = dict(err_vs_torch=err, err_vs_loop=err_loop, nan=nan, B=mask.shape[0], L=mask.shape[1])
            ms = ctx.bench_ms(lambda: mempo_advantage(scores, index, m, rewards, offsets, spans, backend="triton"))
            if ms is not None:
                moved = mask.numel() * (m.element_size() + 4)  # the scatter kernel reads the mask, writes fp32
                values.update(ms_end_to_end=ms, GBps_mask_out=moved / ms / 1e6,
                              pct_copy=100 * moved / ms / 1e6 / ceil["copy_gbs"] if ceil else "n/a",
                              ms_torch_path=ctx.bench_ms(lambda: mempo_advantage(scores, index, m, rewards, offsets,
                                                                                 spans, backend="torch")),
                              ms_grpo_only=ctx.bench_ms(lambda: grpo_outcome_advantage(scores, index, m,
                                                                                       backend="triton")))
            ok = err < 1e-5 and err_loop < 1e-5 and nan == 0
            result("triton_ops", f"advantage_{str(mdt).split('.')[-1]}", "PASS" if ok else "FAIL", **values)
        checked("triton_ops", f"advantage_{str(mdt).split('.')[-1]}", by_mask)
    batch = (scores, index, mask.to(dev, torch.float32), rewards, offsets, spans)  # the fp32 mask
    checked("triton_ops", "advantage_off_host", lambda: _advantage_off_host(ctx, batch))
    checked("triton_ops", "advantage_graph", lambda: _advantage_graph(ctx, batch))


def _cuda_activity(fn: Callable[[], Any]) -> dict:
    """What one call of `fn` does on the GPU, from torch.profiler: kernels, copies host-to-device and
    device-to-host, memsets, and the host's waits for the device (stream / device / event
    synchronisations, the profiler's own final one not counted)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()  # every kernel done before the trace closes (subtracted below)
    events = prof.events()
    gpu = [e.name for e in events if e.device_type == DeviceType.CUDA]
    h2d = sum("HtoD" in name for name in gpu)
    d2h = sum("DtoH" in name for name in gpu)
    other_copies = sum(name.startswith("Memcpy") for name in gpu) - h2d - d2h
    memsets = sum(name.startswith("Memset") for name in gpu)
    waits = [e.name for e in events if e.device_type == DeviceType.CPU
             and e.name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")]
    # None when the trace holds no runtime calls at all (not even the synchronize above)
    syncs = len(waits) - 1 if "cudaDeviceSynchronize" in waits else None
    return dict(kernels=len(gpu) - h2d - d2h - other_copies - memsets, h2d=h2d, d2h=d2h, memsets=memsets,
                syncs="n/a" if syncs is None else syncs)


def _sync_free(fn: Callable[[], Any]) -> tuple[bool, str]:
    """(True, "") when `fn` runs under torch.cuda.set_sync_debug_mode("error"), else (False, the error)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        return True, ""
    except RuntimeError as error:
        return False, str(error).splitlines()[0][:160]
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


def _advantage_off_host(ctx: Ctx, batch: tuple) -> None:
    """Issue 45: group ids as a device int tensor (validate="device": no host sync at all), verl's uid
    object array (one host-to-device copy), the default (one read): equal results; on a GPU host syncs
    under the sync debug mode, launches / copies / syncs from the profiler, end-to-end wall ms and
    the ratio to the limit (bytes moved at 4.3 TB/s)."""
    import numpy as np
    import torch

    from mempo.ops import group_ids, mempo_advantage

    scores, index, mask, rewards, offsets, spans = batch
    ids = group_ids(index, len(index))[0].to(ctx.device)
    uid = np.array(index, dtype=object)

    def call(labels, validate):  # the Triton path: CUDA's default, the interpreter in plumbing mode
        return lambda: mempo_advantage(scores, labels, mask, rewards, offsets, spans, backend="triton",
                                       validate=validate)[0]

    paths = {"ids": call(ids, "device"), "ids_host": call(ids, "host"), "uid": call(uid, "device"),
             "uid_host": call(uid, "host")}
    want = call(list(index), "host")()
    equal = {name: bool(torch.equal(fn(), want)) for name, fn in paths.items()}
    values: dict[str, Any] = dict(equal_all=all(equal.values()), B=mask.shape[0], L=mask.shape[1],
                                  R=rewards.numel(), mask="float32")
    ok = all(equal.values())
    uid_ok = equal["uid"] and equal["uid_host"]
    uid_values: dict[str, Any] = dict(equal=uid_ok)
    if ctx.gpu:
        sync_free, error = _sync_free(paths["ids"])
        uid_sync_free, uid_error = _sync_free(paths["uid"])
        acts = {name: _cuda_activity(fn) for name, fn in paths.items()}
        ms = {name: ctx.wall_ms(fn) for name, fn in paths.items()}
        moved = mask.numel() * (mask.element_size() + 4)  # read the mask, write fp32 [B, L]; the rest is < 1 %
        limit_ms = moved / (HBM_TBPS * 1e12) * 1e3
        values.update(sync_free=sync_free, sync_error=error or "none", kernels=acts["ids"]["kernels"],
                      memsets=acts["ids"]["memsets"], h2d=acts["ids"]["h2d"], d2h=acts["ids"]["d2h"],
                      syncs=acts["ids"]["syncs"], syncs_validate_host=acts["ids_host"]["syncs"], ms=ms["ids"],
                      ms_validate_host=ms["ids_host"], ms_gpu_do_bench=ctx.bench_ms(paths["ids"]),
                      limit_ms=limit_ms, x_limit=ms["ids"] / limit_ms, target_ms=ADV_TARGET_MS["device_ids"])
        ok = ok and sync_free and acts["ids"]["h2d"] == 0 and acts["ids"]["d2h"] == 0
        uid_values.update(sync_free=uid_sync_free, sync_error=uid_error or "none", h2d=acts["uid"]["h2d"],
                          syncs=acts["uid"]["syncs"], kernels=acts["uid"]["kernels"], ms=ms["uid"],
                          ms_validate_host=ms["uid_host"], syncs_validate_host=acts["uid_host"]["syncs"],
                          x_limit=ms["uid"] / limit_ms, target_ms=ADV_TARGET_MS["uid_array"])
        uid_ok = uid_ok and uid_sync_free and acts["uid"]["h2d"] == 1 and acts["uid"]["d2h"] == 0
        met = ms["ids"] <= ADV_TARGET_MS["device_ids"] and ms["uid"] <= ADV_TARGET_MS["uid_array"]
        result("triton_ops", "advantage_targets", "PASS" if met and sync_free else "FAIL", device_ids_ms=ms["ids"],
               device_ids_target_ms=ADV_TARGET_MS["device_ids"], uid_ms=ms["uid"],
               uid_target_ms=ADV_TARGET_MS["uid_array"], sync_free=sync_free)
    else:
        result("triton_ops", "advantage_targets", "SKIP", reason="plumbing mode: times, syncs and launches need CUDA")
    result("triton_ops", "advantage_device_ids", "PASS" if ok else "FAIL", **values)
    result("triton_ops", "advantage_uid_array", "PASS" if uid_ok else "FAIL", **uid_values)


def _advantage_graph(ctx: Ctx, batch: tuple) -> None:
    """The device-ids call (validate="device") captured in a CUDA graph, replayed on new inputs copied
    into the captured tensors: equal to the eager call on those inputs."""
    import torch

    from mempo.ops import group_ids, mempo_advantage

    if not ctx.gpu:
        result("triton_ops", "advantage_graph", "SKIP", reason="plumbing mode: CUDA graphs need CUDA")
        return
    scores, index, mask, rewards, offsets, spans = (t.clone() if isinstance(t, torch.Tensor) else t for t in batch)
    ids = group_ids(index, len(index))[0].to(ctx.device)

    def op():
        return mempo_advantage(scores, ids, mask, rewards, offsets, spans, validate="device")[0]

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            op()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = op()
    # new values in the captured inputs: other scores and rewards, groups merged in pairs (other pools)
    g = torch.Generator(device=ctx.device).manual_seed(1)
    scores.copy_(torch.randn(scores.shape, device=ctx.device, generator=g))
    rewards.copy_(torch.rand(rewards.shape, device=ctx.device, generator=g) - 0.5)
    ids.copy_(ids // 2 * 1_000_003 - 7)
    graph.replay()
    want = op()
    same = bool(torch.equal(captured, want))
    changed = not bool(torch.equal(want, mempo_advantage(*batch[:1], group_ids(index, len(index))[0].to(ctx.device),
                                                         *batch[2:])[0]))
    result("triton_ops", "advantage_graph", "PASS" if same and changed else "FAIL", replay_equal_eager=same,
           inputs_changed=changed, ms_replay=ctx.bench_ms(graph.replay))


def _span_overflow(ctx: Ctx) -> None:
    """B * L = 2,149,580,800 > 2**31: the last row's mask and output lie past int32 offsets."""
    import torch

    from mempo.kernels import span_scatter as kern

    B, L = 32768, 65600
    mask = torch.ones(B, L, dtype=torch.bool, device="cuda")
    out = torch.full((B, L), -7.0, device="cuda")
    row_value = torch.zeros(B, device="cuda")
    row_value[-1] = 1.0
    start, end = torch.tensor([L - 10], device="cuda"), torch.tensor([L - 2], device="cuda")
    offsets = torch.zeros(B + 1, dtype=torch.int64, device="cuda")
    offsets[-1] = 1
    kern.span_scatter(row_value, torch.tensor([2.0], device="cuda"), start, end, offsets, mask, out)
    torch.cuda.synchronize()
    last = out[-1]
    ok = bool(last[-10:-2].eq(3.0).all()) and last[-1].item() == 1.0 and last[0].item() == 1.0 \
        and bool(out[0].eq(0.0).all())
    result("triton_ops", "span_offsets_past_2_31", "PASS" if ok else "FAIL", B=B, L=L, last=last[-3:].tolist())
    del mask, out
    torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------
# pytest_ops: the ops' test files with CUDA
# ------------------------------------------------------------------------------------------------
OPS_TEST_FILES = ("tests/ops/test_logprob.py", "tests/ops/test_advantage.py", "tests/kernels/test_launch.py")


def sec_pytest_ops(ctx: Ctx) -> None:
    if not ctx.gpu:
        result("pytest_ops", "suite", "SKIP", reason="plumbing mode: the CPU suite runs these files in the interpreter")
        return
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    workers = ["-n", "8"] if _find("xdist") else []
    cmd = [sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers, *OPS_TEST_FILES]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    (OUT / "pytest_ops.log").write_text(done.stdout + done.stderr)  # failures' tracebacks come back
    lines = (done.stdout + done.stderr).strip().splitlines()
    for line in lines:
        if line.startswith(("FAILED", "ERROR")):
            print("   ", line[:300])
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|error)", line)), "no summary")
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    result("pytest_ops", "suite", "PASS" if done.returncode == 0 else "FAIL", rc=done.returncode,
           workers=workers[1] if workers else 1, **counts)


# ------------------------------------------------------------------------------------------------
# flash_actor: packed varlen training forward vs padded SDPA
# ------------------------------------------------------------------------------------------------
def _actor_batch(ctx: Ctx, rows: int, L: int, vocab: int, seed: int = 1):
    """Rows of random lengths, half left- and half right-padded, the first 16 real tokens a prompt."""
    import torch

    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(L // 4, L + 1, (rows,), generator=g)
    ids = torch.randint(0, vocab, (rows, L), generator=g)
    cols = torch.arange(L)
    left = torch.arange(rows) % 2 == 0
    att = torch.where(left[:, None], cols[None] >= L - lengths[:, None], cols[None] < lengths[:, None]).long()
    first = torch.where(att.bool(), cols, L).min(1).values
    response = att.bool() & (cols[None] >= first[:, None] + min(16, L // 4))
    return {"input_ids": ids, "attention_mask": att, "response_mask": response}, torch.randn(rows, L, generator=g)


def sec_flash_actor(ctx: Ctx) -> None:
    import torch

    from mempo.train.actor import Actor
    from mempo.config import ActorConfig

    fa_ok, fa_what = flash_attention_2()
    if ctx.gpu and fa_ok:
        packed_impl, dtype = "flash_attention_2", torch.bfloat16
    else:
        packed_impl, dtype = "sdpa", (torch.bfloat16 if ctx.gpu else torch.float32)
        result("flash_actor", "flash_packed_vs_padded", "SKIP",
               reason=("no CUDA device (plumbing mode): packed SDPA vs padded runs instead" if not ctx.gpu
                       else f"{fa_what}: packed SDPA vs padded runs instead"))
    result("flash_actor", "setup", "INFO", packed_impl=packed_impl, flash=fa_what, dtype=str(dtype).split(".")[-1])
    sz = ctx.sizes
    calls: list = []
    if packed_impl == "flash_attention_2":
        import transformers.integrations.flash_attention as hf_flash

        forward = hf_flash._flash_attention_forward

        def recording(*args, **kwargs):
            calls.append((kwargs.get("attention_mask", args[3] if len(args) > 3 else None),
                          kwargs.get("cu_seq_lens_q")))
            return forward(*args, **kwargs)
        hf_flash._flash_attention_forward = recording

    def run():
        batch, advantages = _actor_batch(ctx, sz.actor_rows, sz.actor_len, sz.actor["vocab_size"])
        # lr ~ 0 and no clipping: update() leaves each parameter's gradient in place, to compare
        cfg_packed = ActorConfig(lr=1e-30, weight_decay=0.0, kl_coef=0.0, grad_clip=None, micro_batch_tokens=None,
                                 packing="packed")
        cfg_padded = ActorConfig(lr=1e-30, weight_decay=0.0, kl_coef=0.0, grad_clip=None, micro_batch_tokens=None,
                                 packing="padded")
        padded_model = qwen2(sz.actor, "sdpa", dtype)
        packed_model = qwen2(sz.actor, packed_impl, dtype)
        packed_model.load_state_dict(padded_model.state_dict())
        packed = Actor(packed_model, cfg_packed, device=ctx.device)
        padded = Actor(padded_model, cfg_padded, device=ctx.device)
        lp_packed, t_packed = ctx.seconds(lambda: packed.compute_log_probs(**batch, with_entropy=True))
        lp_padded, t_padded = ctx.seconds(lambda: padded.compute_log_probs(**batch, with_entropy=True))
        # second forward: timed warm
        _, t_packed = ctx.seconds(lambda: packed.compute_log_probs(**batch))
        _, t_padded = ctx.seconds(lambda: padded.compute_log_probs(**batch))
        m = batch["response_mask"].to(lp_packed.log_probs.device)
        d_logp = (lp_packed.log_probs - lp_padded.log_probs)[m].abs()
        d_ent = (lp_packed.entropy - lp_padded.entropy)[m].abs()
        half = dtype != torch.float32
        tol_max, tol_mean = (0.15, 0.02) if half else (1e-4, 1e-5)
        varlen = packed_impl != "flash_attention_2" or (
            bool(calls) and all(mask is None and cu is not None and cu.dtype == torch.int32 for mask, cu in calls))
        ok = d_logp.max().item() < tol_max and d_logp.mean().item() < tol_mean and d_ent.max().item() < 10 * tol_max \
            and varlen and packed.packed and not padded.packed
        real_tokens = int(batch["attention_mask"].sum())
        result("flash_actor", "logprob_packed_vs_padded", "PASS" if ok else "FAIL", max_abs=d_logp.max().item(),
               mean_abs=d_logp.mean().item(), entropy_max_abs=d_ent.max().item(), varlen_route=varlen,
               packed_s=t_packed, padded_s=t_padded, real_tokens=real_tokens, padded_tokens=batch["input_ids"].numel())

        old = lp_padded.log_probs.detach()
        (m_packed, t_up_packed) = ctx.seconds(lambda: packed.update(batch, advantages, old))
        (m_padded, t_up_padded) = ctx.seconds(lambda: padded.update(batch, advantages, old))
        grads_a, grads_b = [], []
        for (name, pa), (_, pb) in zip(packed.module.named_parameters(), padded.module.named_parameters()):
            if pa.grad is None or pb.grad is None:
                raise RuntimeError(f"no gradient for {name}")
            grads_a.append(pa.grad.float().flatten())
            grads_b.append(pb.grad.float().flatten())
        ga, gb = torch.cat(grads_a), torch.cat(grads_b)
        rel = ((ga - gb).norm() / gb.norm()).item()
        cos = torch.nn.functional.cosine_similarity(ga, gb, dim=0).item()
        tol_rel = 0.05 if half else 1e-4
        ok = rel < tol_rel and math.isfinite(m_packed["grad_norm"])
        result("flash_actor", "grad_packed_vs_padded", "PASS" if ok else "FAIL", rel_l2=rel, cosine=cos,
               grad_norm_packed=m_packed["grad_norm"], grad_norm_padded=m_padded["grad_norm"],
               loss_packed=m_packed["loss"], loss_padded=m_padded["loss"], update_packed_s=t_up_packed,
               update_padded_s=t_up_padded)
    checked("flash_actor", "packed_vs_padded", run)


# ------------------------------------------------------------------------------------------------
# scoring: teacher scoring reference / packed / cached
# ------------------------------------------------------------------------------------------------
def _scoring_requests(n: int, length: int, vocab: int, seed: int = 0):
    import random

    from mempo.records.scoring import ScoredRound, ScoringRequest

    rnd = random.Random(seed)
    requests = []
    for _ in range(n):
        seq = [rnd.randrange(vocab) for _ in range(length)]
        ends = [length * k // 5 for k in (1, 2, 3, 4)]
        rounds = [ScoredRound(e, seq[:length // 15] + [rnd.randrange(vocab) for _ in range(length // 30)])
                  for e in ends]
        answer = [rnd.randrange(vocab) for _ in range(12)]
        requests.append(ScoringRequest(seq, rounds, answer, [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0]))
    return requests


def sec_scoring(ctx: Ctx) -> None:
    import torch

    from mempo.scoring import ScoringStats, resolve_method, score

    sz = ctx.sizes
    requests = _scoring_requests(sz.scoring_requests, sz.scoring_len, sz.scoring["vocab_size"])
    for dname, tol in (("bfloat16", 5e-2), ("float32", 1e-3)) if ctx.gpu else (("float32", 1e-4),):
        def run(dname=dname, tol=tol):
            model = qwen2(sz.scoring, "sdpa", ctx.dtype(dname)).to(ctx.device)
            out = {}
            for method in ("reference", "packed", "cached"):
                for fused in (False, True):
                    stats = ScoringStats()
                    score(model, requests[:1], method=method, threshold=None, fused=fused)  # warm-up
                    res, secs = ctx.seconds(lambda: score(model, requests, method=method, threshold=None,
                                                          fused=fused, stats=stats))
                    out[(method, fused)] = ([p for r in res for p in r.p_full + r.p_mem], secs, stats)
            base = out[("reference", False)][0]
            for (method, fused), (ps, secs, stats) in out.items():
                nan = sum(1 for p in ps if p != p)
                d = max(abs(math.log(a) - math.log(b)) for a, b in zip(ps, base))
                result("scoring", f"{method}_fused{fused}_{dname}", "PASS" if d < tol and nan == 0 else "FAIL",
                       max_abs_dlogP=d, s=secs, tokens=stats.tokens, forwards=stats.forwards, contexts=stats.contexts)
            # what scoring.method "auto" picks on this device against the fastest fused method measured
            fastest = min(("reference", "packed", "cached"), key=lambda m: out[(m, True)][1])
            result("scoring", f"auto_pick_{dname}", "INFO", picks=resolve_method(model), fastest=fastest,
                   fastest_s=out[(fastest, True)][1], picked_s=out[(resolve_method(model), True)][1])
        checked("scoring", f"methods_{dname}", run)

    fa_ok, fa_what = flash_attention_2()
    if not (ctx.gpu and fa_ok):
        result("scoring", "flash_model_restored", "SKIP", reason="no CUDA device" if not ctx.gpu else fa_what)
        return

    def flash_model():
        sdpa = qwen2(sz.scoring, "sdpa", torch.bfloat16).to(ctx.device)
        flash = qwen2(sz.scoring, "flash_attention_2", torch.bfloat16).to(ctx.device)
        flash.load_state_dict(sdpa.state_dict())
        a = score(sdpa, requests, method="packed", threshold=None)
        b = score(flash, requests, method="packed", threshold=None)
        d = max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra.p_full + ra.p_mem, rb.p_full + rb.p_mem))
        impl = flash.config._attn_implementation
        # packed scoring needs a dense mask: it runs the flash model under SDPA and restores it after
        ok = impl == "flash_attention_2" and d <= 1e-6
        result("scoring", "flash_model_restored", "PASS" if ok else "FAIL", impl=impl, max_abs_dP_vs_sdpa=d)
    checked("scoring", "flash_model_restored", flash_model)


# ------------------------------------------------------------------------------------------------
# train: one `mempo train` step under torchrun (nccl, one process), bf16
# ------------------------------------------------------------------------------------------------
def train_overrides(flash: bool) -> list[str]:
    return ["trainer.total_steps=1", "trainer.tensorboard=false", "trainer.progress=false", "trainer.save_every=0",
            "model.dtype=bfloat16", f"model.attn_implementation={'flash_attention_2' if flash else 'sdpa'}"]


def sec_train(ctx: Ctx) -> None:
    from mempo.config import load_config

    fa_ok, fa_what = flash_attention_2()
    flash = ctx.gpu and fa_ok
    config = REPO / "configs" / "tiny.yaml"
    overrides = train_overrides(flash)
    load_config(config, overrides)  # the run's config is valid before anything starts
    if not ctx.gpu:
        result("train", "step", "SKIP", reason="plumbing mode: nccl needs CUDA; one CPU step takes about a minute "
                                               "(tests/train/test_trainer.py covers the step on CPU)")
        return
    run_dir = Path("/tmp/gpu_check_train")
    subprocess.run(["rm", "-rf", str(run_dir)], check=False)
    cmd = [sys.executable, "-P", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(SCRIPT),
           "--train-worker", str(config), str(run_dir), *overrides]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="8"), capture_output=True, text=True)
    wall = time.perf_counter() - t0
    text = done.stdout + done.stderr
    (OUT / "train.log").write_text(text)  # the whole run's output comes back with the results
    for line in text.splitlines():
        if line.startswith("RESULT "):
            print(line, flush=True)
    errors = [line for line in text.splitlines()
              if re.search(r"\w+(Error|Exception): ", line) and "ChildFailedError" not in line][-3:]
    for line in errors:
        print("   ", line[:300])
    metrics_path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    step = next((r for r in rows if r.get("step") == 1), None)
    if step is None:
        result("train", "step", "FAIL", reason="no step-1 metrics", rc=done.returncode, s=wall)
    else:
        (OUT / "train_metrics.jsonl").write_text(metrics_path.read_text())
        finite = all(math.isfinite(float(step.get(k, float("nan")))) for k in ("actor/loss", "actor/grad_norm"))
        result("train", "step", "PASS" if finite else "FAIL", attn="flash_attention_2" if flash else "sdpa",
               loss=step.get("actor/loss"), grad_norm=step.get("actor/grad_norm"), reward=step.get("reward/mean"),
               tokens=step.get("train/tokens"), s=wall)
        result("train", "stage_times", "INFO",
               **{k.split("/", 1)[1]: v for k, v in step.items() if k.startswith("time/")})
    result("train", "cli_exit", "PASS" if done.returncode == 0 else "FAIL", rc=done.returncode,
           last_error=errors[-1][:200] if errors else "")


def train_worker(config: str, run_dir: str, overrides: list[str]) -> int:
    """Under torchrun: initialise the process group as the trainer does, report its backend, then
    run the `mempo train` command itself."""
    import torch.distributed as dist

    from mempo.apps.cli import main as cli_main
    from mempo.train.actor import init_distributed

    info = init_distributed()
    backend = dist.get_backend() if info.distributed else "none"
    result("train", "backend", "PASS" if "nccl" in backend else "FAIL", backend=backend, world=info.world_size)
    return cli_main(["train", "--config", config, "--out", run_dir, *overrides])


# ------------------------------------------------------------------------------------------------
# sglang: end to end where installed
# ------------------------------------------------------------------------------------------------
def sec_sglang(ctx: Ctx) -> None:
    import torch

    if not _find("sglang"):
        tf = _version("transformers")
        result("sglang", "engine_e2e", "SKIP",
               reason=f"sglang not installed (sglang 0.5.23 pins torch==2.14.1 and transformers==5.19.0; this "
                      f"environment has torch {torch.__version__}, transformers {tf}: it needs its own, "
                      "docs/TRAINING.md 'GPU')")
        return
    if not ctx.gpu:
        result("sglang", "engine_e2e", "SKIP", reason="no CUDA device")
        return
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/rollout/backends/test_sglang.py"], cwd=REPO, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    print("\n".join(lines[-15:]))
    result("sglang", "engine_e2e", "PASS" if done.returncode == 0 else "FAIL", rc=done.returncode,
           summary=lines[-1] if lines else "")


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "absent"


# ------------------------------------------------------------------------------------------------
# the runner
# ------------------------------------------------------------------------------------------------
SECTIONS = [  # (name, time limit on a GPU in seconds, on CPU); in order of what matters most
    ("env", 60, 60), ("aot", 90, 30), ("triton_ops", 180, 120), ("flash_actor", 90, 90), ("scoring", 90, 90),
    ("train", 150, 60), ("pytest_ops", 180, 30), ("sglang", 120, 30),
]


def _run_section(name: str, limit: float, env: dict) -> tuple[list[str], Any, float]:
    """Run one section in a subprocess; stream its output; kill its process group at `limit`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-P", str(SCRIPT), "--section", name], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []

    def pump():
        for line in proc.stdout:
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        rc: Any = proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = "timeout"
    reader.join(timeout=10)
    return lines, rc, time.perf_counter() - t0


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description="mempo GPU check (tools/gpu_check.sh runs this)")
    parser.add_argument("--section", help="run one section in this process (the runner's subprocesses)")
    parser.add_argument("--only", help="comma-separated sections to run (default: all)")
    parser.add_argument("--budget", type=float, default=float(os.environ.get("MEMPO_GPU_CHECK_BUDGET", 465)),
                        help="seconds for the whole run; each section gets at most what is left")
    parser.add_argument("--train-worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    if args.train_worker is not None:
        config, run_dir, *overrides = args.train_worker
        return train_worker(config, run_dir, overrides)
    if args.section:
        ctx = Ctx()
        checked(args.section, "section", lambda: globals()[f"sec_{args.section}"](ctx))
        return 0

    import torch  # the mode decides the sections' environment

    gpu = torch.cuda.is_available()
    env = dict(os.environ, PYTHONSAFEPATH="1")  # children import the mempo on PYTHONPATH, never the tree's
    if not gpu:
        env["TRITON_INTERPRET"] = "1"  # plumbing: kernels through the interpreter
    else:
        env.pop("TRITON_INTERPRET", None)
    names = [s[0] for s in SECTIONS]
    wanted = args.only.split(",") if args.only else names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        parser.error(f"unknown sections {unknown}; sections: {', '.join(names)}")
    report: dict[str, Any] = {"mode": "gpu" if gpu else "plumbing", "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                              "budget_s": args.budget, "sections": [], "results": []}
    t_all = time.perf_counter()

    def write():
        counts = {s: sum(1 for r in report["results"] if r["status"] == s) for s in ("PASS", "FAIL", "SKIP", "INFO")}
        report.update(counts=counts, total_s=round(time.perf_counter() - t_all, 1))
        (OUT / "gpu_check.json").write_text(json.dumps(report, indent=1))
        return counts

    for name, gpu_limit, cpu_limit in SECTIONS:
        if name not in wanted:
            continue
        left = args.budget - (time.perf_counter() - t_all) - 5
        if left < 15:
            rec = {"section": name, "check": "section", "status": "SKIP", "values": {"reason": "budget_spent"}}
            print(f"RESULT {name}.section SKIP reason=budget_spent", flush=True)
            report["results"].append(rec)
            continue
        limit = min(gpu_limit if gpu else cpu_limit, left)
        lines, rc, secs = _run_section(name, limit, env)
        got = [r for r in map(parse_result, lines) if r is not None]
        if rc != 0 or not got:
            line = f"RESULT {name}.process FAIL rc={rc} limit_s={limit:.0f}"
            print(line, flush=True)
            got.append(parse_result(line))
        report["results"] += got
        report["sections"].append({"name": name, "seconds": round(secs, 1), "rc": rc, "limit_s": round(limit)})
        print(f"SECTION {name} {secs:.1f}s rc={rc}", flush=True)
        write()
    counts = write()
    print("=" * 100)  # the table again, without the RESULT prefix (one RESULT line per check)
    for r in report["results"]:
        values = " ".join(f"{k}={_fmt(v)}" for k, v in r["values"].items())
        print(f"  {r['status']:4} {r['section']}.{r['check']} {values}"[:400].rstrip())
    print(f"SUMMARY mode={report['mode']} {' '.join(f'{k}={v}' for k, v in counts.items())} "
          f"total_s={report['total_s']} json={OUT / 'gpu_check.json'}")
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
