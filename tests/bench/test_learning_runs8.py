"""bench/learning_runs8/run.sh: execution 8 runs on its protocol's CPU only."""
import subprocess

import pytest

from support.paths import REPO

RUN = REPO / "bench" / "learning_runs8" / "run.sh"


@pytest.mark.parametrize("vendor, model", [("AuthenticAMD", "17"), ("GenuineIntel", "106")])
def test_another_cpu_is_refused_before_any_job(tmp_path, vendor, model):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel\t\t: {model}\n")
    machine = REPO / "bench" / "learning_runs8" / "machine.txt"
    before = machine.read_bytes() if machine.exists() else None
    # PY=/bin/false: were the guard gone, run.sh would stop at its scanner check instead of starting SFT jobs
    env = {"CPUINFO": str(cpuinfo), "PATH": "/usr/bin:/bin", "PY": "/bin/false"}
    done = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"this CPU is {vendor} model {model}" in done.stderr and "Intel Xeon model 167" in done.stderr
    assert "scanner" not in done.stderr  # it stopped at the guard, not at a later check
    assert (machine.read_bytes() if machine.exists() else None) == before  # refused before it wrote anything
