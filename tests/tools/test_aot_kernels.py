"""Every Triton kernel variant the ops can launch compiles for sm_90 (H100/H200), without a GPU.

`tools/aot_kernels.py` records the launches the public ops make over a sweep of their inputs (the
launchers choose block sizes, warps, stages and flags themselves), specialises each with Triton's
own binder for a CUDA sm_90 target, compiles the distinct variants with `triton.compile`, and reads
registers, stack and local memory from each cubin (cuobjdump) and spills from ptxas -v. It runs in
a subprocess because this test process runs the kernels through the interpreter
(TRITON_INTERPRET=1), where they are not JIT functions. Measured on the 2-core dev machine under a
load average of about 8: 70 s with an empty Triton cache, 8 s once the cache holds the kernels. The
report is printed (pytest -s or -rA).

Bound on spills: none. Every variant compiles without spill stores or loads and with no stack or
local memory, so a change that makes one spill fails here and must say why it is worth it (the
combine kernel spilled at 512 vocabulary splits until it merged 32 splits per step).
"""
import json
import os
import subprocess
import sys

import pytest

from support.paths import REPO

TOOL = REPO / "tools" / "aot_kernels.py"


@pytest.fixture(scope="session")
def aot_report(tmp_path_factory):
    nvidia = pytest.importorskip("triton.backends.nvidia.compiler",
                                 reason="Triton without its NVIDIA backend cannot compile for sm_90")
    try:
        ptxas = nvidia.get_ptxas(90).path
    except Exception as error:  # noqa: BLE001 - no bundled ptxas on this platform
        pytest.skip(f"Triton's bundled ptxas is unavailable: {error}")
    assert os.path.exists(ptxas), ptxas
    out = tmp_path_factory.mktemp("aot") / "aot_sm90.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, str(TOOL), "--arch", "90", "--json", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    print(done.stdout[-20000:])
    report = json.loads(out.read_text()) if out.exists() else None
    return done, report


def test_every_launchable_variant_compiles_for_sm90(aot_report):
    done, report = aot_report
    assert report is not None, done.stdout[-4000:] + done.stderr[-4000:]
    failed = [v for v in report["variants"] if v["error"]]
    assert not failed, "\n".join(f"{v['kernel']} {v['constexprs']} {v['signature']}: {v['error']}" for v in failed)
    assert done.returncode == 0, done.stderr[-4000:]
    assert all(v["registers"] for v in report["variants"])


def test_no_variant_spills_registers(aot_report):
    _, report = aot_report
    assert report is not None
    spilling = [v for v in report["variants"]
                if v["spill_stores"] or v["spill_loads"] or v["stack_bytes"] or v["local_bytes"]]
    assert not spilling, "\n".join(f"{v['kernel']} {v['constexprs']} warps={v['num_warps']}: regs={v['registers']} "
                                   f"spill stores={v['spill_stores']} loads={v['spill_loads']} "
                                   f"stack={v['stack_bytes']} local={v['local_bytes']}" for v in spilling)


def test_the_sweep_reaches_every_kernel_and_its_block_size_choices(aot_report):
    """Every kernel of `mempo.kernels` is launched by some op in the sweep, and the choices the
    launchers make (block sizes, flags, the fused config per dtype) each appear."""
    from support.triton_kernels import kernel_objects

    _, report = aot_report
    assert report is not None
    variants = report["variants"]
    names = {f"{m.__name__.rsplit('.', 1)[-1]}.{n}" for m, n in kernel_objects()}
    assert {v["kernel"] for v in variants} == names

    def choices(kernel, key):
        return {v["constexprs"].get(key) for v in variants if v["kernel"] == kernel}

    assert choices("answer_logprob._row_logp_kernel", "BLOCK_V") == {2 ** k for k in range(13)}
    assert choices("answer_logprob._segment_kernel", "BLOCK_T") == {2 ** k for k in range(4, 11)}
    assert choices("answer_logprob._segment_kernel", "HAS_THRESHOLD") == {True, False}
    assert choices("answer_logprob._segment_kernel", "IS_VARLEN") == {True, False}
    assert choices("answer_logprob._combine_kernel", "BLOCK_S") == {2, 4, 8, 16, 32}
    assert choices("answer_logprob._hidden_logp_kernel", "DOT_FP32") == {True, False}
    assert choices("answer_logprob._hidden_logp_kernel", "HAS_BIAS") == {True, False}
    assert choices("answer_logprob._block_logp_kernel", "BLOCK_V") == {2 ** k for k in range(13)}
    for flag in ("HAS_BIAS", "FIRST", "LAST"):
        assert choices("answer_logprob._block_logp_kernel", flag) == {True, False}, flag
    assert choices("group_zscore._group_zscore_kernel", "NORM_BY_STD") == {True, False}
    assert choices("group_zscore._group_zscore_kernel", "SINGLETON_ZERO") == {True, False}
    mask_types = {v["signature"]["mask_ptr"] for v in variants if v["kernel"] == "span_scatter._span_scatter_kernel"}
    assert len(mask_types) == 10  # every response-mask dtype the op accepts
    for flag in ("HAS_VALUES", "WRITE_GID", "CHECK_FINITE", "CHECK_KEYS"):
        assert choices("group_zscore._group_zscore_kernel", flag) == {True, False}, flag
    for flag in ("HAS_ROW_VALUE", "HAS_SPANS", "CHECK_MASK"):
        assert choices("span_scatter._span_scatter_kernel", flag) == {True, False}, flag
    assert choices("round_keys._round_keys_kernel", "HAS_STAGES") == {True, False}
    value_types = {v["signature"]["values_ptr"] for v in variants
                   if v["kernel"] == "group_zscore._group_zscore_kernel" and v["constexprs"]["HAS_VALUES"]}
    assert {"*fp16", "*bf16", "*fp32", "*fp64", "*i32", "*i64"} <= value_types, value_types  # scores as given
    # bf16 / fp16 operands reach Hopper's wgmma; fp32 (IEEE) does not use the tensor cores.
    for v in variants:
        if v["kernel"] == "answer_logprob._hidden_logp_kernel":
            assert (v["mma"] == "wgmma") == (not v["constexprs"]["DOT_FP32"]), v


RECORD_WITH_NAN_MEMORY = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
real_empty = torch.empty
def nan_empty(*args, **kwargs):  # fresh memory that happens to hold NaN
    out = real_empty(*args, **kwargs)
    return out.fill_(float("nan")) if out.is_floating_point() else out
torch.empty = nan_empty
import aot_kernels
sink = aot_kernels.record()
print(json.dumps(sorted({l.kwargs["BLOCK_T"] for l in sink if l.kernel == "answer_logprob._segment_kernel"})))
"""


def test_the_sweep_does_not_depend_on_what_fresh_memory_holds(tmp_path):
    """A recorded launch writes nothing; the op checks the row kernel's output (no NaN) before it
    launches the segment kernel, so with outputs left as fresh memory the sweep reached the segment
    kernel's larger blocks only when that memory held no NaN (a CI run once missed 256 and 512)."""
    pytest.importorskip("triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # from outside the source tree: `python -c` puts the working directory first on sys.path, and
    # the repository's own mempo/ has no compiled parts and no mempo.kernels
    done = subprocess.run([sys.executable, "-c", RECORD_WITH_NAN_MEMORY, str(REPO / "tools")], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [2 ** k for k in range(4, 11)]
