#!/usr/bin/env bash
# The main command: install mempo (with the demo extras) and run the CPU demo end to end: synthetic
# world, tokenizer, a small Qwen2 from scratch, SFT on oracle trajectories, MemPO RL, evaluation before
# and after RL, report (markdown + PNG plots) in ./demo_out. Extra arguments go to `mempo demo`
# (e.g. `bash tools/demo.sh --out /tmp/demo trainer.total_steps=2`).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
source tools/env.sh "demo"
python -P -c "import mempo, mempo._scanner; print('running installed mempo at', mempo.__file__)"
OUT="$REPO/demo_out"
cd /tmp  # run the installed package, not the source tree
mempo demo --config "$REPO/configs/demo.yaml" --out "$OUT" "$@"
