"""mempo.utils.machine: the facts a report names the machine by."""
import torch

from mempo.utils.machine import FLOAT_PATH_VARIABLES, cpu_model, machine_facts


def test_machine_facts_name_the_cpu_and_its_kernels(monkeypatch):
    for name in FLOAT_PATH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    facts = machine_facts()
    assert facts["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert "float_path" not in facts  # nothing pins the instruction set
    assert facts.get("cpu_model") == cpu_model()
    assert facts["torch"] == torch.__version__ and facts["cpu_count"] >= 1
    assert isinstance(facts["allocator"], str)  # the C allocator's setting (mempo.utils.allocator)


def test_machine_facts_name_a_pinned_instruction_set(monkeypatch):
    for name in FLOAT_PATH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_CBWR", "AVX2")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert machine_facts()["float_path"] == "MKL_CBWR=AVX2, ONEDNN_MAX_CPU_ISA=AVX2"
