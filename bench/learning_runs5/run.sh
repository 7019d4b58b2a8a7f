#!/usr/bin/env bash
# The ablation's execution 5 (docs/experiments/E5-ablation-execution-5.md): from execution 4's SFT model, RL as the demo
# ships it (k = 2 and 4 in turn, 36 steps), arms grpo, mempo_complete_min_c10 and mempo_retrieved_min_c10,
# seeds 0-7. Every finished run is kept in bench/learning_runs5/, so a rerun continues (the grpo runs of
# the first call are reused by the second).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
PY=${PY:-.venv-test/bin/python}
R=bench/learning_runs5
ARGS=(--demo-out bench/learning_runs4/demo256 --runs $R --variants grpo --steps 36 --episodes 256 --ks 2 4
      --threads 2 "data.num_objectives=[2,4]")
# Seed by seed, all three arms (an interrupted session leaves complete triples; order changed 2026-12-04
# 11:10, before any run: the protocol's runs are the same), then both calls over all seeds write the tables.
for seed in 0 1 2 3 4 5 6 7; do
  for best in complete_min_c10 retrieved_min_c10; do
    $PY bench/bench_learning.py "${ARGS[@]}" --out scratch/ex5_${best}_s$seed --best $best --seeds $seed
  done
done
for best in complete_min_c10 retrieved_min_c10; do
  $PY bench/bench_learning.py --demo-out bench/learning_runs4/demo256 --out scratch/ex5_$best --runs $R \
      --variants grpo --best $best --steps 36 --episodes 256 --ks 2 4 --threads 2 "data.num_objectives=[2,4]"
  cp scratch/ex5_$best/results.md $R/results_$best.md
  cp scratch/ex5_$best/results.json $R/results_$best.json
  cp scratch/ex5_$best/ablation.png $R/ablation_$best.png
done
