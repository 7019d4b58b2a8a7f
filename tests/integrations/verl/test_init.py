"""The plugin's registrations: on a bare `import verl` in a fresh process, through the entry point that
pyproject.toml declares and through VERL_USE_EXTERNAL_MODULES; a broken part warns and the others stay."""
import os
import subprocess
import sys
import tomllib
import warnings

import pytest

pytest.importorskip("verl", reason="verl is not installed (pip install .[verl])")
pytestmark = pytest.mark.verl

from support.paths import REPO, python_path_env  # noqa: E402

import mempo.integrations.verl as plugin  # noqa: E402

#: a fresh process: import verl only, then require that it loaded the plugin and that all is registered
PROBE = ("import sys, verl\n"
         "assert 'mempo.integrations.verl' in sys.modules, 'import verl did not load the plugin'\n"
         "from mempo.integrations.verl.__main__ import main\n"
         "sys.exit(main())\n")


def _run(env, cwd):
    return subprocess.Popen([sys.executable, "-c", PROBE], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_registered_on_import_verl_by_entry_point_and_by_environment_variable(tmp_path):
    entry = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]["verl.plugins"]
    assert entry == {"mempo": "mempo.integrations.verl"}
    site = tmp_path / "site"  # a dist-info carrying pyproject's entry point, as `pip install mempo` writes it
    info = site / "mempo_entry_probe-0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mempo-entry-probe\nVersion: 0.0\n")
    (info / "entry_points.txt").write_text("[verl.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items()))
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    by_entry_point = python_path_env(base, site, REPO)
    by_variable = dict(python_path_env(base, REPO), VERL_USE_EXTERNAL_MODULES="mempo.integrations.verl")
    without = dict(by_entry_point, VERL_USE_EXTERNAL_PLUGINS="none")
    runs = [_run(env, tmp_path) for env in (by_entry_point, by_variable, without)]
    outputs = [run.communicate(timeout=600) for run in runs]
    for (out, err), run, how in zip(outputs[:2], runs[:2], ("entry point", "VERL_USE_EXTERNAL_MODULES")):
        assert run.returncode == 0, f"{how}: {out}\n{err[-3000:]}"
        for name in ("estimator 'mempo'", "agent loops 'mempo_agent', 'mempo_agent_eval'", "V1 trainer 'mempo_sync'",
                     "legacy compute_advantage patch"):
            assert f"ok   {name}" in out, (how, out)
    assert "entry point: mempo = mempo.integrations.verl" in outputs[0][0]
    assert runs[2].returncode != 0 and "import verl did not load the plugin" in outputs[2][1]


def test_a_broken_part_warns_and_the_others_register(monkeypatch):
    monkeypatch.setattr(plugin, "COMPONENTS", (("probe part", "mempo.integrations.verl.no_such_module"),
                                               ("estimator 'mempo'", "mempo.integrations.verl.estimator")))
    monkeypatch.setattr(plugin, "_STATUS", {})
    with pytest.warns(RuntimeWarning, match="probe part not registered .*ModuleNotFoundError"):
        plugin._register_all()
    status = plugin.registration_status()
    assert status["estimator 'mempo'"] == "registered" and status["probe part"].startswith("not registered")


def test_another_verl_version_registers_nothing_and_says_why(monkeypatch):
    original = plugin.check_verl_version

    def refuse():
        original("0.8.0")

    monkeypatch.setattr(plugin, "check_verl_version", refuse)
    monkeypatch.setattr(plugin, "_STATUS", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plugin._register_all()
    assert any("built against verl 0.9.1 and refuses verl 0.8.0" in str(w.message) for w in caught)
    assert all(v.startswith("not registered: mempo's verl integration was built against verl 0.9.1")
               for v in plugin.registration_status().values())


def test_the_checker_parses_its_arguments_and_a_failed_verl_import_is_one_line(tmp_path):
    """Issue 47 V22, V23: ``python -m mempo.integrations.verl`` ignored unknown options (and --help),
    and an ``import verl`` that fails (a module VERL_USE_EXTERNAL_MODULES names is missing) was a
    ModuleNotFoundError traceback."""
    base = {k: v for k, v in os.environ.items() if k not in ("VERL_USE_EXTERNAL_MODULES", "VERL_USE_EXTERNAL_PLUGINS")}
    env = python_path_env(base, REPO)
    command = [sys.executable, "-m", "mempo.integrations.verl"]
    runs = [subprocess.Popen(command + argv, env=dict(env, **extra), cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
            for argv, extra in ((["--definitely-not-an-option", "x"], {}), (["--help"], {}),
                                ([], {"VERL_USE_EXTERNAL_MODULES": "no_such_module_xyz"}))]
    (unknown, unknown_err), (usage, _), (failed, failed_err) = [run.communicate(timeout=600) for run in runs]
    assert runs[0].returncode == 2 and "unrecognized arguments: --definitely-not-an-option" in unknown_err
    assert "usage: python -m mempo.integrations.verl" in unknown_err and unknown == ""
    assert runs[1].returncode == 0 and usage.startswith("usage: python -m mempo.integrations.verl")
    assert runs[2].returncode == 1 and "Traceback" not in failed_err and failed == "", failed_err[-3000:]
    assert failed_err.strip().splitlines()[-1] == ("mempo verl check: cannot import verl: ModuleNotFoundError: "
                                                   "No module named 'no_such_module_xyz'")
