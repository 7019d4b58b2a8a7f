"""The prepared GPU check (tools/gpu_check.sh -> tools/gpu_check.py) in its CPU "plumbing" mode.

On a machine without CUDA every section either runs its CPU part at tiny sizes (the Triton kernels
through the interpreter against the torch path and fp64, packed vs padded SDPA with gradients,
the three scoring methods) or SKIPs with a reason. Running it here keeps the script from rotting:
its imports resolve against the current code, every section is enumerated and reports, the RESULT
lines parse, and the JSON report is written. About 40 s on the 2-core dev machine.
"""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from support.paths import REPO, load_script

LINE = re.compile(r"^RESULT (\S+?)\.(\S+) (PASS|FAIL|SKIP|INFO)( \S+=\S+)*$")


def load_gpu_check():
    """tools/gpu_check.py as a module (tools/ is not a package)."""
    return load_script("tools/gpu_check.py")


@pytest.mark.skipif(torch.cuda.is_available(), reason="plumbing mode is the CPU mode (on a GPU, run the check itself)")
def test_plumbing_mode_runs_every_section_and_writes_the_report(tmp_path):
    gpu_check = load_gpu_check()
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable, MEMPO_GPU_CHECK_BUDGET="400")
    done = subprocess.run(["bash", str(REPO / "tools" / "gpu_check.sh")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    for line in lines:
        assert LINE.match(line), line
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["mode"] == "plumbing"
    assert [s["name"] for s in report["sections"]] == [name for name, _, _ in gpu_check.SECTIONS]
    assert all(s["rc"] == 0 for s in report["sections"]), report["sections"]
    results = report["results"]
    assert len(results) == len(lines) and report["counts"]["FAIL"] == 0
    by_section = {}
    for r in results:
        by_section.setdefault(r["section"], []).append(r)
        if r["status"] == "SKIP":
            assert r["values"].get("reason"), r
    assert set(by_section) == {name for name, _, _ in gpu_check.SECTIONS}
    # the CPU parts ran and passed
    passed = {f"{r['section']}.{r['check']}" for r in results if r["status"] == "PASS"}
    for check in ("triton_ops.from_hidden_M48_H64_bfloat16", "triton_ops.from_hidden_M48_H40_float32",
                  "triton_ops.from_hidden_neginf_float32", "triton_ops.row_float16",
                  "triton_ops.advantage_bool", "triton_ops.advantage_device_ids", "triton_ops.advantage_uid_array",
                  "flash_actor.logprob_packed_vs_padded",
                  "flash_actor.grad_packed_vs_padded", "scoring.cached_fusedTrue_float32"):
        assert check in passed, (check, sorted(passed))
    assert {r["check"] for r in by_section["train"]} == {"step"}  # the config loaded; the step needs CUDA
    # issue 45's GPU-only parts of the advantage and log-prob checks say why they did not run
    skipped = {r["check"]: r["values"]["reason"] for r in by_section["triton_ops"] if r["status"] == "SKIP"}
    assert {"advantage_graph", "advantage_targets", "from_hidden_chunks", "from_hidden_targets"} <= set(skipped), \
        skipped
    # the log-prob cases checked both methods (chunked, fused) against the torch path and fp64
    case = next(r for r in by_section["triton_ops"] if r["check"] == "from_hidden_M48_H64_bfloat16")
    assert {"chunked_err_vs_fp64", "fused_err_vs_fp64", "chunked_nan", "fused_nan"} <= set(case["values"]), case


def test_result_lines_round_trip():
    gpu_check = load_gpu_check()
    line = "RESULT triton_ops.row_bfloat16 FAIL err=0.001 nan=0 ok=false reason=a=b_c"
    parsed = gpu_check.parse_result(line)
    assert parsed == {"section": "triton_ops", "check": "row_bfloat16", "status": "FAIL",
                      "values": {"err": 0.001, "nan": 0, "ok": False, "reason": "a=b_c"}}
    assert gpu_check.parse_result("SECTION env 3.1s rc=0") is None
