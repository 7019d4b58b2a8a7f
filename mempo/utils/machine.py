"""What machine a run ran on: CPU count and model, the instruction set torch's kernels use, library
versions, CUDA device (`machine_facts`). The CPU model and instruction set are facts of a result, not
only of its speed: MKL and ATen pick their kernels by them, and the floats of a long CPU training run
(the demo's SFT) follow (docs/experiments/X1-another-cpu.md)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any, Optional

import torch

from mempo.utils.allocator import allocator_setting

__all__ = ["FLOAT_PATH_VARIABLES", "cpu_model", "machine_facts"]

#: environment variables that pin the kernels' instruction set (and so the floats) when set
FLOAT_PATH_VARIABLES = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")


def cpu_model() -> Optional[str]:
    """The CPU's model name (``/proc/cpuinfo``'s first "model name", else `platform.processor`), or
    None when neither says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def machine_facts() -> dict[str, Any]:
    """CPU count (and the CPUs this process may use), CPU model (`cpu_model`, left out when unknown),
    the instruction set of torch's CPU kernels (``cpu_capability``, e.g. "AVX512") and the variables
    of `FLOAT_PATH_VARIABLES` that are set (``float_path``, "NAME=value, ..."; left out when none),
    torch / transformers / tokenizers / Python versions, platform, torch's thread count, the C
    allocator's setting (`mempo.utils.allocator`) and CUDA device (None without one). A library that
    is not installed is left out (versions are read from the installed distributions: no import)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                             "platform": platform.platform()}
    model = cpu_model()
    if model is not None:
        facts["cpu_model"] = model
    facts["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    pinned = [f"{name}={os.environ[name]}" for name in FLOAT_PATH_VARIABLES if os.environ.get(name)]
    if pinned:
        facts["float_path"] = ", ".join(pinned)
    try:
        facts["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    facts["torch"] = torch.__version__
    facts["torch_threads"] = torch.get_num_threads()
    facts["allocator"] = allocator_setting()
    facts["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    for package in ("transformers", "tokenizers"):
        try:
            facts[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return facts
