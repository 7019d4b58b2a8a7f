"""Where things are: the repository root, tests/ and tests/support/; the environment under which a
subprocess (a torchrun worker, a `mempo` command) can import `support`."""
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Mapping, Optional

SUPPORT = Path(__file__).resolve().parent
TESTS = SUPPORT.parent
REPO = TESTS.parent


def python_path_env(env: Optional[Mapping[str, str]] = None, *first: Path) -> dict[str, str]:
    """A copy of `env` (default: os.environ) whose PYTHONPATH starts with `first` then tests/ (so
    that ``import support`` works in the subprocess), then what it held."""
    env = dict(os.environ if env is None else env)
    entries = [str(p) for p in first] + [str(TESTS)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(entries)
    return env


def load_script(relative: str) -> ModuleType:
    """A script of the repository that is not in a package (``tools/sft_seeds.py``, ``bench/bench_learning.py``)
    as a module named after its file, registered in sys.modules first (its dataclasses look their module up
    there)."""
    path = REPO / relative
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
