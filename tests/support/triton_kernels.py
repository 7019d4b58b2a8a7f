"""Every Triton kernel object of the `mempo.kernels` package (tests/kernels/test_launch.py,
tests/tools/test_aot_kernels.py)."""
import importlib
import pkgutil

import mempo.kernels
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction


def kernel_objects():
    """(module, attribute name) of every Triton kernel in the `mempo.kernels` package."""
    found = []
    for info in pkgutil.iter_modules(mempo.kernels.__path__):
        module = importlib.import_module(f"mempo.kernels.{info.name}")
        for name, value in vars(module).items():
            if isinstance(value, (JITFunction, InterpretedFunction)):
                found.append((module, name))
    return found
