"""bench/learning_runs8/run.sh: execution 8 runs on one CPU model, either of the workplace's two, the one its first
finished SFT row was made on (amendment A1)."""
import subprocess

import pytest

from support.paths import REPO

RUN = REPO / "bench" / "learning_runs8" / "run.sh"
MACHINE = REPO / "bench" / "learning_runs8" / "machine.txt"


def run_on(tmp_path, vendor, model, pinned=None):
    """run.sh on a CPU described by a cpuinfo file, with cpu.txt holding `pinned` (absent when None). PY=/bin/false:
    past the guard run.sh stops at its scanner check, before it writes or starts anything."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel\t\t: {model}\n")
    pin = tmp_path / "cpu.txt"
    if pinned is not None:
        pin.write_text(pinned + "\n")
    env = {"CPUINFO": str(cpuinfo), "PINNED": str(pin), "PATH": "/usr/bin:/bin", "PY": "/bin/false"}
    before = MACHINE.read_bytes() if MACHINE.exists() else None
    done = subprocess.run(["bash", str(RUN)], env=env, capture_output=True, text=True, timeout=60)
    assert (MACHINE.read_bytes() if MACHINE.exists() else None) == before  # nothing written
    assert (pin.read_text() if pin.exists() else None) == (None if pinned is None else pinned + "\n")
    return done


@pytest.mark.parametrize("vendor, model", [("GenuineIntel", "106"), ("AuthenticAMD", "1")])
def test_another_cpu_is_refused_before_any_job(tmp_path, vendor, model):
    done = run_on(tmp_path, vendor, model)
    assert done.returncode == 2
    assert f"this CPU is {vendor} model {model}" in done.stderr and "Intel Xeon model 167" in done.stderr
    assert "scanner" not in done.stderr  # it stopped at the guard, not at a later check


@pytest.mark.parametrize("vendor, model", [("GenuineIntel", "167"), ("AuthenticAMD", "17")])
def test_either_cpu_passes_before_a_row_pins_one(tmp_path, vendor, model):
    done = run_on(tmp_path, vendor, model)
    assert done.returncode == 2 and "scanner is not built" in done.stderr  # past the guard


def test_the_pinned_cpu_passes_and_the_other_is_refused(tmp_path):
    done = run_on(tmp_path, "AuthenticAMD", "17", pinned="AuthenticAMD model 17")
    assert "scanner is not built" in done.stderr
    done = run_on(tmp_path, "GenuineIntel", "167", pinned="AuthenticAMD model 17")
    assert done.returncode == 2
    assert "made on AuthenticAMD model 17" in done.stderr and "this CPU is GenuineIntel model 167" in done.stderr
