"""bench/conftest.py: a benchmark imports the installed mempo even when the runner puts the repository
root first on sys.path (`python -m pytest` from the root), and a run without an installed mempo stops
at once naming the install command.

Each case builds a stand-in checkout in tmp_path whose `mempo/` package says it is the source tree,
with the real bench/conftest.py copied next to a benchmark that reports which mempo it imported.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import _pytest
import iniconfig
import packaging
import pluggy
import py
import pygments
import pytest

from support.paths import REPO

BENCH = '''
import mempo


def test_which_mempo():
    assert not getattr(mempo, "SOURCE_TREE", False), f"imported the checkout's mempo: {mempo.__file__}"
'''


def checkout(root: Path, *, with_conftest: bool) -> Path:
    """A stand-in checkout: pyproject with the repository's pytest settings, a source-tree mempo, bench/."""
    (root / "mempo").mkdir(parents=True)
    (root / "mempo" / "__init__.py").write_text("SOURCE_TREE = True\n")
    (root / "bench").mkdir()
    (root / "bench" / "bench_where.py").write_text(BENCH)
    if with_conftest:
        shutil.copy(REPO / "bench" / "conftest.py", root / "bench" / "conftest.py")
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\npython_files = ["bench_*.py"]\n'
                                         'addopts = "-p no:cacheprovider --import-mode=importlib"\n')
    return root


def run_from_root(root: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    # `python -m pytest` puts the working directory, the checkout's root, first on sys.path
    return subprocess.run([sys.executable, *args, "-m", "pytest", "bench/bench_where.py", "-q"], cwd=root,
                          capture_output=True, text=True, timeout=300, env=env)


def test_a_benchmark_imports_the_installed_mempo_not_the_checkout(tmp_path):
    done = run_from_root(checkout(tmp_path / "fixed", with_conftest=True))
    assert done.returncode == 0, done.stdout + done.stderr
    # the same checkout without the conftest: the root on sys.path wins, which is what the conftest prevents
    control = run_from_root(checkout(tmp_path / "bare", with_conftest=False))
    assert control.returncode == 1 and "imported the checkout's mempo" in control.stdout, control.stdout


def test_without_an_installed_mempo_the_run_stops_naming_the_install(tmp_path):
    # an interpreter that sees pytest and its dependencies only (no site-packages, so no mempo)
    site = tmp_path / "site"
    site.mkdir()
    for module in (pytest, _pytest, pluggy, iniconfig, packaging, pygments, py):
        source = Path(module.__file__)
        if source.name == "__init__.py":
            os.symlink(source.parent, site / module.__name__)
        else:
            os.symlink(source, site / source.name)
    root = checkout(tmp_path / "checkout", with_conftest=True)
    done = run_from_root(root, "-S", env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "none is installed here: pip install" in output and "SOURCE_TREE" not in output, output
