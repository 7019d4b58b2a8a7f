#!/usr/bin/env bash
# The main command: install mempo (with the demo extras) and run the CPU demo end to end: synthetic
# world, tokenizer, a small Qwen2 from scratch, SFT on oracle trajectories, MemPO RL, evaluation before
# and after RL, report (markdown + PNG plots) in ./demo_out. Extra arguments go to `mempo demo`
# (e.g. `bash tools/demo.sh --out /tmp/demo trainer.total_steps=2`; the ledger task:
# `bash tools/demo.sh --config configs/ledger.yaml --out demo_ledger`).
set -euo pipefail
CALLER=$(pwd)
cd "$(dirname "$0")/.."
REPO=$(pwd)
source tools/env.sh "demo"
python -P -c "import mempo, mempo._scanner; print('running installed mempo at', mempo.__file__)"
# --config and --out are taken relative to where the command was typed (the demo runs from /tmp)
CONFIG="$REPO/configs/demo.yaml"
OUT="$REPO/demo_out"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --config|--out)
      [ $# -ge 2 ] || { echo "tools/demo.sh: $1 needs a path" >&2; exit 2; }
      path=$(cd "$CALLER" && realpath -m -- "$2")
      if [ "$1" = --config ]; then CONFIG=$path; else OUT=$path; fi
      shift 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
cd /tmp  # run the installed package, not the source tree
mempo demo --config "$CONFIG" --out "$OUT" ${ARGS[@]+"${ARGS[@]}"}
