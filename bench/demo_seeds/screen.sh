#!/usr/bin/env bash
# D13's stage 2 (docs/experiments/D13-demo-two-threads.md): one RL setting from each seed's SFT model of a
# bench/demo_seeds/run.sh directory, RL seed 0, 128 test episodes per k at k = 2 and 4, two torch threads.
#   bash bench/demo_seeds/screen.sh RUNS_DIR NAME [KEY=VALUE ...]    (e.g. V1 actor.lr=0.0001)
# Writes RUNS_DIR/screen/NAME/seed<S>/ (bench_learning's results.json, runs/); resumable (bench_learning
# skips finished runs). Runs this checkout's bench_learning.py with the venv run.sh made (its mempo is the
# stage-1 commit's).
set -euo pipefail
RUNS=$(realpath -- "${1:?usage: screen.sh RUNS_DIR NAME [KEY=VALUE ...]}")
NAME=${2:?usage: screen.sh RUNS_DIR NAME [KEY=VALUE ...]}
shift 2
BENCH=$(cd "$(dirname "$0")/.." && pwd)
for dir in "$RUNS"/seed*/; do
  seed=$(basename "$dir")
  [ -f "$dir/report.md" ] || { echo "$seed: no finished demo, skipped"; continue; }
  out="$RUNS/screen/$NAME/$seed"
  mkdir -p "$RUNS/screen/$NAME"
  start=$(date +%s)
  "$RUNS/venv/bin/python" "$BENCH/bench_learning.py" --demo-out "$dir" --out "$out" --variants \
      --best complete_min_c10 --seeds 0 --episodes 128 --ks 2 4 --threads 2 "$@" > "$out.log" 2>&1 \
      || { echo "$NAME $seed: failed, see $out.log"; exit 1; }
  echo "$NAME $seed: $(( $(date +%s) - start )) s" | tee -a "$RUNS/screen/times.txt"
done
