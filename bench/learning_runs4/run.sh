#!/usr/bin/env bash
# The ablation's execution 4 (docs/experiments/E4-ablation-execution-4.md): SFT model, signal benchmark, <best> by the
# rule, then the 24 runs. Every step is skipped when its output exists, so a rerun continues.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH=.
PY=${PY:-.venv-test/bin/python}
R=bench/learning_runs4
if [ ! -d $R/demo256/model_sft ]; then
  $PY tools/sft_seeds.py --seeds 0 --out scratch/ex4_sft.jsonl --models-dir scratch/ex4_models \
      --episodes-dir scratch/ex4_episodes eval.episodes=256
  mkdir -p $R/demo256 && cp -r scratch/ex4_models/eval.episodes-256_s0/. $R/demo256/
  cp scratch/ex4_sft.jsonl $R/sft_seeds_row.jsonl
fi
if [ ! -f $R/signal_results.json ]; then
  $PY bench/bench_signal.py --demo-out $R/demo256 --out scratch/ex4_signal --threads 2
  cp scratch/ex4_signal/results.json $R/signal_results.json
fi
BEST=$($PY -c "
import json
d = json.load(open('$R/signal_results.json'))
order = list(d['definitions'])  # the table's order (a dict of name -> overrides)
def mean_auc(name):
    return sum(d['signal'][name][f'k={k}']['all']['auc'] for k in (2, 4)) / 2
import sys; sys.path.insert(0, 'bench')
from bench_signal import DEFINITIONS
# highest mean AUC; ties to fewer overrides, then the table's order
print(sorted(order, key=lambda n: (-round(mean_auc(n), 12), len(DEFINITIONS[n]), order.index(n)))[0])")
echo "best: $BEST" | tee $R/best.txt
$PY bench/bench_learning.py --demo-out $R/demo256 --out scratch/ex4_out --runs $R --best "$BEST" --threads 2
