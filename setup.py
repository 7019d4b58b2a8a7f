"""Build script: the only compiled part of mempo is the C++ tag scanner (csrc/), a pybind11 module.

No torch is needed at build time; the extension works on raw buffers (see csrc/bindings.cpp).
"""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ext_modules = [
    Pybind11Extension(
        "mempo._scanner",
        sources=["csrc/span_scanner.cpp", "csrc/bindings.cpp"],
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
