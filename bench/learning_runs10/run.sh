#!/usr/bin/env bash
# Execution 10 (issue 44; protocol: docs/experiments/E10-ablation-execution-10.md, committed before any run): E9's
# recipe (configs/demo_k8_e9.yaml), runner and rules with the gate extended to SFT seeds 0-11
# (ex7.SFT_SEEDS_BY_EXECUTION); seeds 0-5 are E9's rows, copied here unchanged, their models remade (and checked by
# digest) where a step needs them.
# Its files go to bench/learning_runs10/ (kept) and scratch/ex10/ (models, rollouts); stopping it
# (kill $(cat scratch/ex10/run.pid)) stops every job it started.
#
#     bash bench/learning_runs10/run.sh          # then: python bench/learning_runs7/ex7.py summary bench/learning_runs10
set -euo pipefail
cd "$(dirname "$0")/../.."
export EXECUTION=10
source bench/learning_runs7/cpu_guard.sh  # E9's CPU (cpu.txt copied from bench/learning_runs9/), as E8's amendment A1
CONFIG=configs/demo_k8_e9.yaml CPU_PIN="$here" CPU_PIN_FILE="$PINNED" exec bash bench/learning_runs7/run.sh
