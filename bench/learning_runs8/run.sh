#!/usr/bin/env bash
# Execution 8 (issue 44; protocol: docs/experiments/E8-ablation-execution-8.md, committed before any run): execution
# 7's runner and rules (bench/learning_runs7/run.sh, ex7.py) on E8's recipe, configs/demo_k8_e8.yaml. Its files go
# to bench/learning_runs8/ (kept) and scratch/ex8/ (models, rollouts); resumable as execution 7's; stopping it
# stops every job it started.
#
#     bash bench/learning_runs8/run.sh          # then: python bench/learning_runs7/ex7.py summary bench/learning_runs8
set -euo pipefail
cd "$(dirname "$0")/../.."
# The SFT weights follow the CPU's float path, so every job of E8 runs on one CPU model: the one its first finished
# SFT row was made on (amendment A1), either of this workplace's two. bench/learning_runs8/cpu.txt names it from
# then on; refuse any other CPU at once rather than train models that belong to no registered run.
CPUINFO=${CPUINFO:-/proc/cpuinfo}          # read from elsewhere only by its test
PINNED=${PINNED:-bench/learning_runs8/cpu.txt}  # likewise
vendor=$(grep -m1 '^vendor_id' "$CPUINFO" | awk '{print $NF}'); model=$(grep -m1 -E '^model\s' "$CPUINFO" | awk '{print $NF}')
here="$vendor model $model"
case "$here" in
  "GenuineIntel model 167" | "AuthenticAMD model 17") ;;
  *) echo "run.sh: execution 8 runs on the Intel Xeon model 167 or the AMD EPYC model 17" \
          "(docs/experiments/E8-ablation-execution-8.md); this CPU is $here" >&2
     exit 2 ;;
esac
if [ -f "$PINNED" ] && [ "$(cat "$PINNED")" != "$here" ]; then
  echo "run.sh: execution 8's models were made on $(cat "$PINNED") ($PINNED); this CPU is $here" >&2
  exit 2
fi
EXECUTION=8 CONFIG=configs/demo_k8_e8.yaml CPU_PIN="$here" CPU_PIN_FILE="$PINNED" exec bash bench/learning_runs7/run.sh
