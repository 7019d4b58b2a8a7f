"""Triton kernels of mempo (installed as `mempo.kernels`). One op per file.

Import these modules only through `mempo.ops`; they import triton at module load. Under the CPU
interpreter, `TRITON_INTERPRET=1` must be set before the first import.

Conventions shared by every kernel: offsets that grow with a program id times a row stride are
computed in int64 (a [B, L] tensor passes 2**31 elements at B * L >= 2**31); every launcher
launches under `mempo.kernels._launch.launch_device` (Triton uses the current device and stream).
The advantage kernels (`group_zscore`, `round_keys`, `span_scatter`) read in bounds whatever the
input values and report invalid ones as bits OR-ed into an int32 flags word (atomically, only by a
program that finds one), which the op settles once: no launcher reads anything back.
"""
