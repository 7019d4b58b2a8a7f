"""MemPO inside unforked verl (built and tested against verl 0.9.1; another version is refused).

Importing this package registers, each part on its own so that one broken part warns and the rest
still register (verl swallows a failing plugin import at DEBUG level, so nothing would say why):

    "mempo"             advantage estimator (``algorithm.adv_estimator=mempo``)      `estimator`
    "mempo_agent"       agent loop: the <mem> protocol, your tools (mempo's and      `agent_loop`,
                        verl's), tags or JSON tool calls, teacher scoring            `tools`
    "mempo_agent_eval"  agent loop for validation: no teacher scoring                  `agent_loop`
    "mempo_sync"        V1 trainer (``trainer.v1.trainer_mode=mempo_sync``): verl's    `trainer_v1`
                        GRPO + the pooled memory advantage on the <mem> spans
    legacy patch        ``ray_trainer.compute_advantage`` reads the memory fields       `legacy`
                        (``trainer.use_v1=false``; other estimators are forwarded unchanged)
    reward function     verl's default ``default_compute_score`` scores mempo rows      `reward`
                        with mempo's EM (other rows are forwarded unchanged); a mempo
                        outcome reward as verl's custom_reward_function
                        (``outcome_reward_score``)

It is loaded on every ``import verl`` through the ``verl.plugins`` entry point of mempo's
pyproject (``VERL_USE_EXTERNAL_PLUGINS`` may name or disable it), or through
``VERL_USE_EXTERNAL_MODULES=mempo.integrations.verl`` (which reaches Ray workers only through the
driver's environment). ``python -m mempo.integrations.verl`` lists what is registered and exits 1
when something is missing. The agent loops are also reachable without any import hook through the
shipped ``agents.yaml`` (``AGENTS_YAML``; hydra imports the ``_target_`` in the worker).
"""
from __future__ import annotations

import importlib
import logging
import warnings
from pathlib import Path

from mempo.integrations.verl.version import VERL_VERSION, VerlVersionError, check_verl_version, installed_verl_version

__all__ = ["AGENTS_YAML", "COMPONENTS", "VERL_VERSION", "VerlVersionError", "check_verl_version",
           "installed_verl_version", "registration_status"]

#: the agent-loop file for ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
AGENTS_YAML = str(Path(__file__).with_name("agents.yaml"))

#: (component, module that registers it on import)
COMPONENTS = (
    ("estimator 'mempo'", "mempo.integrations.verl.estimator"),
    ("agent loops 'mempo_agent', 'mempo_agent_eval'", "mempo.integrations.verl.agent_loop"),
    ("V1 trainer 'mempo_sync'", "mempo.integrations.verl.trainer_v1"),
    ("legacy compute_advantage patch", "mempo.integrations.verl.legacy"),
    ("default reward function for mempo rows", "mempo.integrations.verl.reward"),
)

_logger = logging.getLogger(__name__)
_STATUS: dict[str, str] = {}


def registration_status() -> dict[str, str]:
    """{component: "registered" or why it is not} of this process's import of the package."""
    return dict(_STATUS)


def _register_all() -> None:
    try:
        check_verl_version()
    except (VerlVersionError, ImportError) as error:
        for name, _ in COMPONENTS:
            _STATUS[name] = f"not registered: {error}"
        warnings.warn(f"mempo.integrations.verl: nothing registered: {error}", RuntimeWarning, stacklevel=2)
        _logger.warning("mempo.integrations.verl: nothing registered: %s", error)
        return
    for name, module in COMPONENTS:
        try:
            imported = importlib.import_module(module)
            if hasattr(imported, "install"):
                imported.install()
            _STATUS[name] = "registered"
        except Exception as error:  # one broken part must not hide the others, nor vanish silently
            reason = f"{type(error).__name__}: {error}"
            _STATUS[name] = f"not registered: {reason}"
            warnings.warn(f"mempo.integrations.verl: {name} not registered ({reason})", RuntimeWarning, stacklevel=2)
            _logger.warning("mempo.integrations.verl: %s not registered (%s)", name, reason)


_register_all()
