#!/usr/bin/env bash
# The demo from a fresh clone of this commit, for several model seeds, one at a time (D13:
# docs/experiments/D13-demo-two-threads.md; G02 runs the ledger demo the same way).
#   bash bench/demo_seeds/run.sh RUNS_DIR [--config PATH] [--seeds "0 1 2"] [KEY=VALUE ...]
# RUNS_DIR lies outside the repository (e.g. /tmp/d13). --config is relative to the clone (default
# configs/demo.yaml); KEY=VALUE overrides go to every seed. Seed 0 is the demo command itself (install included:
# the venv is made on its first use); seed S > 0 adds synthetic.model_seed=S. Resumable: a seed whose report.md
# exists is skipped, a partial one is removed and run again. Wall times in RUNS_DIR/times.txt, the CPU in machine.txt.
set -euo pipefail
RUNS=$(realpath -m -- "${1:?usage: run.sh RUNS_DIR [--config PATH] [--seeds \"0 1 2\"] [KEY=VALUE ...]}")
shift
CONFIG=configs/demo.yaml
SEEDS="0 1 2"
OVERRIDES=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config) CONFIG=${2:?--config needs a path}; shift 2 ;;
    --seeds) SEEDS=${2:?--seeds needs a list}; shift 2 ;;
    *=*) OVERRIDES+=("$1"); shift ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
REPO=$(cd "$(dirname "$0")/../.." && pwd)
COMMIT=$(git -C "$REPO" rev-parse HEAD)
mkdir -p "$RUNS"
if [ ! -d "$RUNS/clone" ]; then
  git clone -q "$REPO" "$RUNS/clone.partial" && git -C "$RUNS/clone.partial" checkout -q "$COMMIT"
  mv "$RUNS/clone.partial" "$RUNS/clone"
fi
lscpu | grep -E '^(Model name|Model:|CPU\(s\))' > "$RUNS/machine.txt"
for seed in $SEEDS; do
  out="$RUNS/seed$seed"
  [ -f "$out/report.md" ] && { echo "seed $seed: done ($out/report.md)"; continue; }
  rm -rf "$out"
  start=$(date +%s)
  extra=(${OVERRIDES[@]+"${OVERRIDES[@]}"}); [ "$seed" = 0 ] || extra+=("synthetic.model_seed=$seed")
  (cd "$RUNS" && MEMPO_VENV="$RUNS/venv" bash clone/tools/demo.sh --config "clone/$CONFIG" --out "$out" \
      --no-progress ${extra[@]+"${extra[@]}"}) > "$RUNS/seed$seed.log" 2>&1
  echo "seed $seed: $(( $(date +%s) - start )) s wall, install included where the venv was made;" \
       "load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$RUNS/times.txt"
done
