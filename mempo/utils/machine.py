"""What machine a run ran on: CPU count, library versions, CUDA device (`machine_facts`)."""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

import torch

from mempo.utils.allocator import allocator_setting

__all__ = ["machine_facts"]


def machine_facts() -> dict[str, Any]:
    """CPU count (and the CPUs this process may use), torch / transformers / Python versions,
    platform, torch's thread count, the C allocator's setting
    (`mempo.utils.allocator`) and CUDA device (None without one). transformers is left out
    when it is not installed (its version is read from the installed distribution: no import)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                             "platform": platform.platform()}
    try:
        facts["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    facts["torch"] = torch.__version__
    facts["torch_threads"] = torch.get_num_threads()
    facts["allocator"] = allocator_setting()
    facts["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    try:
        facts["transformers"] = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        pass
    return facts
