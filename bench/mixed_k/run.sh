#!/usr/bin/env bash
# RL on mixed k against RL at k = 2 (docs/experiments/R1-mixed-k.md, protocol written before the runs):
# from the shipped demo's SFT model (seed 0), the demo's own scoring (retrieved_min_c10), seeds 0-2.
# DEMO_OUT: the output of `python -m mempo demo --config configs/demo.yaml --out DIR` (model_sft, config.yaml).
# Every finished run is kept in bench/mixed_k/<arm>/, so a rerun continues.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
PY=${PY:-.venv-test/bin/python}
DEMO_OUT=${DEMO_OUT:?set DEMO_OUT to the demo output directory}
for arm in k2:2 k2_4:[2,4]; do
  name=${arm%%:*}; ks=${arm#*:}
  $PY bench/bench_learning.py --demo-out "$DEMO_OUT" --out scratch/mixed_k_$name --runs bench/mixed_k/$name \
      --variants --best retrieved_min_c10 --seeds 0 1 2 --episodes 128 --threads 2 "data.num_objectives=$ks"
done
