"""Where things are: the repository root, tests/ and tests/support/; the environment under which a
subprocess (a torchrun worker, a `mempo` command) can import `support`."""
import os
from pathlib import Path
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
