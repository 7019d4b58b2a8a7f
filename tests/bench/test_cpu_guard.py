"""bench/learning_runs7/cpu_guard.sh, as executions 8-10 run it (bench/learning_runs<N>/run.sh): an execution runs
on one CPU model, either of the workplace's two, the one its first finished SFT row was made on (E8's amendment A1)."""
import subprocess

import pytest

from support.paths import REPO

EXECUTIONS = [8, 9, 10]


def run_on(tmp_path, vendor, model, pinned=None, execution=8):
    """run.sh on a CPU described by a cpuinfo file, with cpu.txt holding `pinned` (absent when None). PY=/bin/false:
    past the guard run.sh stops at its scanner check, before it writes or starts anything."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 6\nmodel\t\t: {model}\n")
    pin = tmp_path / "cpu.txt"
    if pinned is not None:
        pin.write_text(pinned + "\n")
    env = {"CPUINFO": str(cpuinfo), "PINNED": str(pin), "PATH": "/usr/bin:/bin", "PY": "/bin/false"}
    machine = REPO / "bench" / f"learning_runs{execution}" / "machine.txt"
    before = machine.read_bytes() if machine.exists() else None
    done = subprocess.run(["bash", str(REPO / "bench" / f"learning_runs{execution}" / "run.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert (machine.read_bytes() if machine.exists() else None) == before  # nothing written
    assert (pin.read_text() if pin.exists() else None) == (None if pinned is None else pinned + "\n")
    return done


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("vendor, model", [("GenuineIntel", "106"), ("AuthenticAMD", "1")])
def test_another_cpu_is_refused_before_any_job(tmp_path, vendor, model, execution):
    done = run_on(tmp_path, vendor, model, execution=execution)
    assert done.returncode == 2
    assert f"this CPU is {vendor} model {model}" in done.stderr and "Intel Xeon model 167" in done.stderr
    assert f"execution {execution} runs on" in done.stderr
    assert (REPO / "docs" / "experiments" / f"E{execution}-ablation-execution-{execution}.md").exists()  # it names
    assert "scanner" not in done.stderr  # it stopped at the guard, not at a later check


@pytest.mark.parametrize("execution", EXECUTIONS)
@pytest.mark.parametrize("vendor, model", [("GenuineIntel", "167"), ("AuthenticAMD", "17")])
def test_either_cpu_passes_before_a_row_pins_one(tmp_path, vendor, model, execution):
    done = run_on(tmp_path, vendor, model, execution=execution)
    assert done.returncode == 2 and "scanner is not built" in done.stderr  # past the guard


@pytest.mark.parametrize("execution", EXECUTIONS)
def test_the_pinned_cpu_passes_and_the_other_is_refused(tmp_path, execution):
    done = run_on(tmp_path, "AuthenticAMD", "17", pinned="AuthenticAMD model 17", execution=execution)
    assert "scanner is not built" in done.stderr
    done = run_on(tmp_path, "GenuineIntel", "167", pinned="AuthenticAMD model 17", execution=execution)
    assert done.returncode == 2
    assert "made on AuthenticAMD model 17" in done.stderr and "this CPU is GenuineIntel model 167" in done.stderr


def test_execution_10_keeps_execution_9s_cpu():
    """E10 remakes E9's models (its rows are E9's), so it is pinned to E9's CPU from the start."""
    runs = REPO / "bench"
    assert (runs / "learning_runs10" / "cpu.txt").read_text() == (runs / "learning_runs9" / "cpu.txt").read_text()
