#!/usr/bin/env bash
# The prepared GPU check (docs/TRAINING.md "GPU"; tools/gpu_check.py says what it checks). From the
# repository root, on one H200 with no network; the sections' time limits keep it within 8 minutes:
#     bash tools/gpu_check.sh [--only env,triton_ops,...]
# One RESULT line per check, then a summary; $OUT/gpu_check.json (OUT defaults to /tmp/gpu_check_out).
# On a machine without CUDA it runs in "plumbing" mode (tests/tools/test_gpu_check.py).
# Wheels the machine lacks (e.g. bm25s) are installed from .whl/ when that folder holds any.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/gpu_check_out}
PY=${PYTHON:-python3}
STAGE=${TMPDIR:-/tmp}/mempo_gpu_check
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$STAGE/wheels" .whl/*.whl \
    && export PYTHONPATH="$STAGE/wheels${PYTHONPATH:+:$PYTHONPATH}"
fi
# mempo with its kernels and C++ scanner: an installed (or editable) mempo as it is; otherwise (or with
# MEMPO_GPU_CHECK_STAGE=1) a staged copy of the tree (kernels/ as mempo/kernels, the scanner built with
# c++ and pybind11), the tree untouched.
if [ "${MEMPO_GPU_CHECK_STAGE:-0}" = 1 ] || ! "$PY" -P -c "import mempo.kernels, mempo._scanner" 2>/dev/null; then
  rm -rf "$STAGE/src" && mkdir -p "$STAGE/src"
  cp -r mempo "$STAGE/src/mempo" && cp -r kernels "$STAGE/src/mempo/kernels"
  EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
  # shellcheck disable=SC2046
  c++ -O3 -std=c++17 -shared -fPIC $("$PY" -m pybind11 --includes) -Icsrc csrc/span_scanner.cpp csrc/bindings.cpp \
      -o "$STAGE/src/mempo/_scanner$EXT" || echo "RESULT setup.scanner FAIL reason=c++_build_of_csrc_failed"
  export PYTHONPATH="$STAGE/src${PYTHONPATH:+:$PYTHONPATH}"
fi
# flash-attn 2: the real one when transformers finds it; otherwise the validation-only shim (tools/fa_shim).
if ! "$PY" -P -c "import sys, transformers.utils as u; sys.exit(0 if u.is_flash_attn_2_available() else 1)" 2>/dev/null; then
  export PYTHONPATH="$PWD/tools/fa_shim${PYTHONPATH:+:$PYTHONPATH}"
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
timeout "${MEMPO_GPU_CHECK_TIMEOUT:-490}" "$PY" -P tools/gpu_check.py "$@" 2>&1 | tee "$OUT/gpu_check.log"
