#!/usr/bin/env bash
# Build the C++ span scanner with AddressSanitizer + UndefinedBehaviorSanitizer, run its unit
# tests (ctest), then the fuzz driver over csrc/fuzz/corpus plus N generated inputs.
# Exits non-zero on any failed test, invariant violation or sanitizer report.
#
# Usage: tools/asan_fuzz.sh [N_RANDOM_INPUTS=200000] [SEED=1]
# Build dir: build-asan/ (git-ignored). About 40 s from scratch on a 2-core machine.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${repo_root}/build-asan"
random_inputs="${1:-200000}"
seed="${2:-1}"

generator=()
if command -v ninja >/dev/null 2>&1; then
  generator=(-G Ninja)
fi

# halt_on_error/abort_on_error: the first report ends the process with a failing status;
# detect_leaks: LeakSanitizer runs at exit as part of ASan.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1:strict_string_checks=1"
ASAN_OPTIONS+=":detect_stack_use_after_return=1"
export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1"

cmake -S "${repo_root}" -B "${build_dir}" "${generator[@]}" \
  -DMEMPO_ASAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMPO_FUZZ_RANDOM_INPUTS=2000
cmake --build "${build_dir}" -j "$(nproc 2>/dev/null || echo 2)"

ctest --test-dir "${build_dir}" --output-on-failure

"${build_dir}/fuzz_span_scanner" "${repo_root}/csrc/fuzz/corpus" \
  --random "${random_inputs}" --seed "${seed}"

echo "asan_fuzz: all checks passed (ctest, corpus, ${random_inputs} random inputs, seed ${seed})"
