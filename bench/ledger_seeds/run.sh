#!/usr/bin/env bash
# G02 (docs/experiments/G02-ledger-demo-seeds.md): the ledger demo from a fresh clone of this commit, model seeds
# 0, 1, 2 in that order, one at a time. Resumable: a seed whose report.md exists is skipped, a partial one is
# removed and run again. Usage: bash bench/ledger_seeds/run.sh RUNS_DIR   (outside the repository, e.g. /tmp/g02)
set -euo pipefail
RUNS=$(realpath -m -- "${1:?usage: run.sh RUNS_DIR}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
COMMIT=$(git -C "$REPO" rev-parse HEAD)
mkdir -p "$RUNS"
if [ ! -d "$RUNS/clone" ]; then
  git clone -q "$REPO" "$RUNS/clone.partial" && git -C "$RUNS/clone.partial" checkout -q "$COMMIT"
  mv "$RUNS/clone.partial" "$RUNS/clone"
fi
lscpu | grep -E '^(Model name|CPU\(s\))' > "$RUNS/machine.txt"
for seed in 0 1 2; do
  out="$RUNS/seed$seed"
  [ -f "$out/report.md" ] && { echo "seed $seed: done ($out/report.md)"; continue; }
  rm -rf "$out"
  start=$(date +%s)
  # seed 0 is the demo command itself (install included: the venv is made on its first use)
  extra=(); [ "$seed" = 0 ] || extra=("synthetic.model_seed=$seed")
  (cd "$RUNS" && MEMPO_VENV="$RUNS/venv" bash clone/tools/demo.sh --config clone/configs/ledger.yaml --out "$out" \
      --no-progress ${extra[@]+"${extra[@]}"}) > "$RUNS/seed$seed.log" 2>&1
  echo "seed $seed: $(( $(date +%s) - start )) s wall, install included where the venv was made" | tee -a "$RUNS/times.txt"
done
