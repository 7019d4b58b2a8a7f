#!/usr/bin/env bash
# The test command (README, .ci/run): install mempo with its test extras into a virtual environment,
# then lint the tree (ruff, pinned in the `test` extra; configured in pyproject.toml) and run the CPU
# test tier (Triton kernels through the interpreter), the C++ unit tests, and the ASan/UBSan build of
# the scanner over its fuzz corpus. A lint finding fails the run before any test starts.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/env.sh "test,verl,demo"
python -P -c "import mempo, mempo._scanner, mempo.kernels; print('testing installed mempo at', mempo.__file__)"
ruff check .
# `pytest` (not `python -m pytest`) so that `import mempo` resolves to the installed wheel, not the tree.
pytest -q tests "$@"
bash tools/asan_fuzz.sh
