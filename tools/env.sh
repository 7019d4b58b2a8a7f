# Shared by tools/test.sh and tools/quickstart.sh: create (or reuse) a virtual environment and install
# mempo into it as a user would (a real `pip install`, compiled extension included).
# Usage: source tools/env.sh EXTRAS      e.g. "test,verl"
set -euo pipefail
MEMPO_VENV=${MEMPO_VENV:-.venv-test}
if [ ! -x "$MEMPO_VENV/bin/python" ]; then
  python3 -m venv "$MEMPO_VENV"
fi
# shellcheck disable=SC1091
. "$MEMPO_VENV/bin/activate"
python -m pip install -q --upgrade pip setuptools wheel pybind11
# The CPU build of torch 2.13.0 lies on this kind of machine's disk; a looser requirement could pull a
# multi-GB CUDA build, so it is installed first and pinned.
python -m pip install -q torch==2.13.0
python -m pip install -q ".[${1:-test}]"
