#!/usr/bin/env bash
# G02 (docs/experiments/G02-ledger-demo-seeds.md): the ledger demo from a fresh clone of this commit, model seeds
# 0, 1, 2 in that order, one at a time; bench/demo_seeds/run.sh with the ledger's configuration (resumable).
# Usage: bash bench/ledger_seeds/run.sh RUNS_DIR   (outside the repository, e.g. /tmp/g02)
set -euo pipefail
exec bash "$(dirname "$0")/../demo_seeds/run.sh" "${1:?usage: run.sh RUNS_DIR}" --config configs/ledger.yaml
