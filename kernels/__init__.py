"""Triton kernels of mempo (installed as `mempo.kernels`). One op per file.

Import these modules only through `mempo.ops`; they import triton at module load. Under the CPU
interpreter, `TRITON_INTERPRET=1` must be set before the first import.
"""
