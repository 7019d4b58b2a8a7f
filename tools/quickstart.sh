#!/usr/bin/env bash
# The main job until the CPU training demo lands: install mempo (compiled scanner included) and run
# the quickstart, the numeric core end to end on a toy MemPO batch.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/env.sh "test"
cd /tmp  # run the installed package, not the source tree
python -m mempo.apps.quickstart
