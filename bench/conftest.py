"""Benchmarks time the installed mempo, never the source tree next to them.

`pytest bench/ --benchmark-only` runs from the repository root, where a runner that puts the working
directory on sys.path (`python -m pytest`, an IDE, ``PYTHONPATH=.``) would import `mempo` from the
checkout, whose C++ scanner (`mempo._scanner`) is built only in an install. So the entries of sys.path
that are the repository root are dropped before any benchmark module imports mempo: `import mempo`
then resolves to the installed package (an editable install still maps it to this tree). Without an
install the run stops at once with the command that makes one.
"""
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _is_repository_root(entry: str) -> bool:
    try:
        return Path(entry or ".").resolve() == REPO  # "" is the working directory
    except OSError:
        return False


if "mempo" not in sys.modules:
    sys.path[:] = [entry for entry in sys.path if not _is_repository_root(entry)]
    if importlib.util.find_spec("mempo") is None:
        raise pytest.UsageError(f"the benchmarks time the installed mempo and none is installed here: "
                                f"pip install {REPO} (README, Install)")
