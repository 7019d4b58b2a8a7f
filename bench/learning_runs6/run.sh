#!/usr/bin/env bash
# The ablation's execution 6 (docs/experiments/E6-ablation-execution-6.md): from the shipped recipe's seed-2 SFT model (the
# strongest memory signal measured: bench/learning_runs6/demo_s2), RL as the demo ships it (k = 2 and 4 in turn,
# 36 steps), arms grpo, mempo_retrieved_min_c10 and mempo_complete_min_c10, seeds 0-7. Two workers of one
# thread each (seeds 0-3 and 4-7, seed by seed, every arm); every finished run is kept in bench/learning_runs6/,
# so a rerun continues. Then the tables: python bench/learning_runs5/summary.py bench/learning_runs6
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
PY=${PY:-.venv-test/bin/python}
R=bench/learning_runs6
if [ ! -d $R/demo_s2/model_sft ]; then  # the SFT model left the tree: remake it (seed 2, one thread)
  $PY tools/sft_seeds.py --seeds 2 --threads 1 --out scratch/ex6_sft.jsonl --models-dir scratch/ex6_models
  cp -r scratch/ex6_models/default_s2/model_sft $R/demo_s2/
fi
ARGS=(--demo-out $R/demo_s2 --runs $R --variants grpo --steps 36 --episodes 128 --ks 2 4 --threads 1
      "data.num_objectives=[2,4]")
worker() {
  for seed in "$@"; do
    for best in retrieved_min_c10 complete_min_c10; do
      $PY bench/bench_learning.py "${ARGS[@]}" --out scratch/ex6_${best}_s$seed --best $best --seeds $seed
    done
  done
}
worker 0 1 2 3 > scratch/ex6_worker0.log 2>&1 &
worker 4 5 6 7 > scratch/ex6_worker1.log 2>&1 &
wait
for best in retrieved_min_c10 complete_min_c10; do
  $PY bench/bench_learning.py "${ARGS[@]}" --out scratch/ex6_$best --best $best
  cp scratch/ex6_$best/results.md $R/results_$best.md
  cp scratch/ex6_$best/results.json $R/results_$best.json
  cp scratch/ex6_$best/ablation.png $R/ablation_$best.png
done
