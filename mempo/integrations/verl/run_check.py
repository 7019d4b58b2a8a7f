"""Whether a verl run configuration can train mempo: ``python -m mempo.integrations.verl --config
RUN.yaml [key=value ...]`` (`check_run_config` on `load_run_config`).

The checks: the trainer that consumes the mempo loops' rows (`run_config.consumer_problem`), the
estimator under ``mempo_sync``, ``algorithm.mempo`` (`estimator.memory_config`), mempo's outcome
reward as verl's reward function (`run_config.outcome_reward_problem`), verl's tools
(``multi_turn.tool_config_path`` / ``function_tool_path``, loaded as verl's worker loads them), and
every mempo entry of the agent-loop YAML: its options as the loop validates them
(`agent_loop.loop_settings`), its tools (``env.tools`` with verl's, `tools.loop_toolset`: imports,
names, schemas; no retriever is reached) and whether forced ``<mem>`` ids without an engine log-prob
can be kept out of rollout correction (`run_config.forced_exclusion_problem`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence

import verl
import yaml
from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf, open_dict

from mempo.config import ConfigError
from mempo.integrations.verl.agent_loop import loop_settings
from mempo.integrations.verl.estimator import memory_config
from mempo.integrations.verl.run_config import (MEMPO_TRAINER_MODE, consumer_problem, forced_exclusion_problem,
                                                mempo_loop_entries, outcome_reward_problem, select)
from mempo.integrations.verl.tools import FUNCTION_TOOL_PATH, TOOL_CONFIG_PATH, load_verl_tools, loop_toolset

__all__ = ["check_run_config", "load_run_config"]


def check_run_config(config: Any) -> list[str]:
    """Every problem of a verl run configuration for mempo, one line each ([] when it can run): the
    trainer (`consumer_problem`), ``algorithm.adv_estimator`` under ``mempo_sync``,
    ``algorithm.mempo``, the outcome reward (`outcome_reward_problem`), verl's tools, and each mempo
    entry of the agent-loop YAML (its options and tools, as the loop reads them; needs verl importable)."""
    problems = []
    consumer = consumer_problem(config)
    if consumer:
        problems.append(consumer)
    algorithm = select(config, "algorithm")
    estimator = select(config, "algorithm.adv_estimator", "gae")
    estimator = str(getattr(estimator, "value", estimator))
    if consumer is None and bool(select(config, "trainer.use_v1", True)) and estimator != "grpo":
        problems.append(f"algorithm.adv_estimator={estimator}: the {MEMPO_TRAINER_MODE} trainer adds the memory "
                        "advantage to verl's GRPO; set algorithm.adv_estimator=grpo")
    try:
        memory_config(algorithm)
    except ValueError as error:
        problems.append(str(error))
    reward = outcome_reward_problem(config)
    if reward:
        problems.append(reward)
    verl_tools: list = []
    try:
        verl_tools = load_verl_tools(select(config, TOOL_CONFIG_PATH), select(config, FUNCTION_TOOL_PATH))
    except ConfigError as error:
        problems.append(str(error))  # the entries' own tools are still checked
    try:
        entries = mempo_loop_entries(config)
    except ConfigError as error:
        return problems + [str(error)]
    if not entries:
        problems.append("actor_rollout_ref.rollout.agent.agent_loop_config_path: no mempo agent loop in it; give "
                        "mempo's agents.yaml (python -c \"import mempo.integrations.verl as m; print(m.AGENTS_YAML)\")")
    response_length = int(select(config, "actor_rollout_ref.rollout.response_length", 1))
    for entry in entries:
        options = {k: v for k, v in entry.items() if k not in ("name", "_target_")}
        name = str(entry.get("name", "?"))
        try:
            score_memory = bool(getattr(get_class(str(entry["_target_"])), "score_memory", True))
            settings = loop_settings(options, entry=name, score_memory=score_memory, response_length=response_length)
            forced = forced_exclusion_problem(config, settings.rollout, settings.forced_logprobs) if score_memory \
                else None
            if forced:
                problems.append(f"{name}.rollout.train_forced_prefix: {forced}")
            loop_toolset(settings.env, settings.rollout.action_format, verl_tools, entry=name)
        except (ConfigError, ValueError, ImportError) as error:
            problems.append(str(error))
    return list(dict.fromkeys(problems))  # a verl tool's problem is found once per entry: said once


def load_run_config(config_file: Optional[str] = None, overrides: Sequence[str] = ()) -> DictConfig:
    """verl 0.9.1's default trainer config (its generated ``_generated_ppo_trainer.yaml``), with
    `config_file` (a YAML of the keys it sets) merged on top, then hydra-style ``key=value``
    overrides (``+key=value`` adds a key; values parsed as YAML). ConfigError naming the file or the
    override that cannot be read."""
    config = OmegaConf.load(Path(verl.__file__).parent / "trainer" / "config" / "_generated_ppo_trainer.yaml")
    if config_file is not None:
        try:
            config = OmegaConf.merge(config, OmegaConf.load(config_file))
        except (OSError, ValueError, TypeError) as error:
            raise ConfigError("--config", f"cannot read {config_file}: {error}") from None
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.lstrip("+")
        if not sep or not key:
            raise ConfigError(item, "an override is key=value (hydra style, e.g. trainer.v1.trainer_mode=mempo_sync)")
        try:
            parsed = yaml.safe_load(value) if value else None
            with open_dict(config):
                OmegaConf.update(config, key, parsed, force_add=True)
        except (ValueError, TypeError, yaml.YAMLError) as error:
            raise ConfigError(key, f"cannot set {value!r}: {error}") from None
    return config
