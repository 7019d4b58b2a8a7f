#!/usr/bin/env bash
# Execution 9 (issue 44; protocol: docs/experiments/E9-ablation-execution-9.md, committed before any run): execution
# 7's runner and rules (bench/learning_runs7/run.sh, ex7.py) on E9's recipe, configs/demo_k8_e9.yaml. Its files go
# to bench/learning_runs9/ (kept) and scratch/ex9/ (models, rollouts); resumable as execution 7's; stopping it
# (kill $(cat scratch/ex9/run.pid)) stops every job it started.
#
#     bash bench/learning_runs9/run.sh          # then: python bench/learning_runs7/ex7.py summary bench/learning_runs9
set -euo pipefail
cd "$(dirname "$0")/../.."
export EXECUTION=9
source bench/learning_runs7/cpu_guard.sh  # one CPU model for every job, as E8's amendment A1
CONFIG=configs/demo_k8_e9.yaml CPU_PIN="$here" CPU_PIN_FILE="$PINNED" exec bash bench/learning_runs7/run.sh
