"""Build script: the only compiled part of mempo is the C++ tag scanner (csrc/), a pybind11 module.

No torch is needed at build time; the extension works on raw buffers (see csrc/bindings.cpp).
"""
from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import find_packages, setup

ext_modules = [
    Pybind11Extension(
        "mempo._scanner",
        sources=["csrc/span_scanner.cpp", "csrc/bindings.cpp"],
        include_dirs=["csrc"],
        cxx_std=17,
        extra_compile_args=["-O3"],
    ),
]

# kernels/ lives at the top of the repository (the design card's layout) and is installed as
# mempo.kernels, so that a built wheel carries the Triton kernels; configs/ likewise as mempo.configs
# (`mempo demo` reads its demo.yaml).
packages = find_packages(include=["mempo", "mempo.*"]) + ["mempo.kernels", "mempo.configs"]

setup(
    packages=packages,
    package_dir={"mempo": "mempo", "mempo.kernels": "kernels", "mempo.configs": "configs"},
    package_data={"mempo.configs": ["*.yaml"], "mempo.integrations.verl": ["*.yaml"]},
    ext_modules=ext_modules,
    cmdclass={"build_ext": build_ext},
)
