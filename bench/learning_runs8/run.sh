#!/usr/bin/env bash
# Execution 8 (issue 44; protocol: docs/experiments/E8-ablation-execution-8.md, committed before any run): execution
# 7's runner and rules (bench/learning_runs7/run.sh, ex7.py) on E8's recipe, configs/demo_k8_e8.yaml. Its files go
# to bench/learning_runs8/ (kept) and scratch/ex8/ (models, rollouts); resumable as execution 7's; stopping it
# stops every job it started.
#
#     bash bench/learning_runs8/run.sh          # then: python bench/learning_runs7/ex7.py summary bench/learning_runs8
set -euo pipefail
cd "$(dirname "$0")/../.."
export EXECUTION=8
source bench/learning_runs7/cpu_guard.sh  # one CPU model for every job (amendment A1)
CONFIG=configs/demo_k8_e8.yaml CPU_PIN="$here" CPU_PIN_FILE="$PINNED" exec bash bench/learning_runs7/run.sh
