"""The C++ side on its own: configure, build and run ctest (unit tests + fuzz smoke test).

Builds in build-ctest/ at the repository root (git-ignored, reused between runs, so a rebuild is
incremental); every path is absolute and the commands run in tmp_path. Skipped with a reason when
cmake or a C++ compiler is missing.
"""
import shutil
import subprocess

import pytest

from support.paths import REPO



def _run(args, cwd, timeout):
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
@pytest.mark.skipif(
    shutil.which("c++") is None and shutil.which("g++") is None and shutil.which("clang++") is None,
    reason="no C++ compiler on PATH",
)
def test_ctest_unit_tests_and_fuzz_smoke(tmp_path):
    build = str(REPO / "build-ctest")
    _run(["cmake", "-S", str(REPO), "-B", build], tmp_path, timeout=120)
    _run(["cmake", "--build", build, "-j2"], tmp_path, timeout=300)
    out = _run(["ctest", "--test-dir", build, "--output-on-failure"], tmp_path, timeout=120)
    assert "100% tests passed" in out
