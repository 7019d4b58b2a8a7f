"""Whether a verl run configuration can train what a mempo agent loop produces, before anything runs.

A mempo loop's rows carry the memory reward in ``extra_fields`` (`fields`); only mempo's trainers
read it: the V1 trainer ``mempo_sync`` (``trainer.v1.trainer_mode=mempo_sync``), or the legacy
trainer with the patched ``compute_advantage`` and ``algorithm.adv_estimator=mempo``
(``trainer.use_v1=false``). Under any other trainer the run would pay for every scoring prefill
and train plain GRPO without a word, so `consumer_problem` names the fix and the loops refuse to
start (`mempo.integrations.verl.agent_loop`). verl's asynchronous trainers (V1 ``colocate_async`` /
``separate_async``, ``experimental.fully_async_policy``, ``experimental.one_step_off_policy``) are
refused too: the weights change while a trajectory and its teacher scoring run.

`forced_exclusion_problem`: the trainers that cannot keep forced ``<mem>`` ids without an engine
log-prob out of rollout correction (a loop refuses those too). `outcome_reward_problem`: a mempo
outcome reward as verl's reward function (`mempo.integrations.verl.reward.outcome_reward_score`)
without a reward it can call. The whole check of a run configuration, which also validates the
loops' options and tools, is `mempo.integrations.verl.run_check`.
"""
from __future__ import annotations

import os
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from mempo.config import ConfigError
from mempo.integrations.verl import reward as reward_module

__all__ = ["ASYNC_TRAINER_MODES", "MEMPO_TRAINER_MODE", "MEMPO_ESTIMATOR", "consumer_problem",
           "forced_exclusion_problem", "mempo_loop_entries", "outcome_reward_problem", "select"]

MEMPO_TRAINER_MODE = "mempo_sync"
MEMPO_ESTIMATOR = "mempo"
#: verl 0.9.1's asynchronous V1 trainer modes (trainer/ppo/v1/trainer_{colocate,separate}_async.py)
ASYNC_TRAINER_MODES = ("colocate_async", "separate_async")
_LOOP_MODULE = "mempo.integrations.verl.agent_loop."


def select(config: Any, dotted: str, default: Any = None) -> Any:
    """``config``'s value at a dotted path (a DictConfig or nested mappings); `default` when absent or null."""
    if isinstance(config, DictConfig):
        value = OmegaConf.select(config, dotted, default=None)
    else:
        value = config
        for part in dotted.split("."):
            value = value.get(part) if hasattr(value, "get") else None
            if value is None:
                break
    return default if value is None else value


def consumer_problem(config: Any) -> Optional[str]:
    """One line naming the setting to change when the trainer of `config` (verl's full config) would
    not read a mempo loop's memory fields, or would run it asynchronously; None when it is mempo's."""
    if select(config, "async_training") is not None:
        return ("verl's fully async trainer (experimental.fully_async_policy) does not read the mempo loops' memory "
                "reward and changes the weights during a trajectory; run verl.trainer.main_ppo with "
                f"trainer.v1.trainer_mode={MEMPO_TRAINER_MODE}")
    if select(config, "rollout.nnodes") is not None:  # the separate rollout pool of one_step_off_policy
        return ("verl's one-step-off-policy trainer (experimental.one_step_off_policy) does not read the mempo loops' "
                f"memory reward; run verl.trainer.main_ppo with trainer.v1.trainer_mode={MEMPO_TRAINER_MODE}")
    if bool(select(config, "trainer.use_v1", True)):
        mode = str(select(config, "trainer.v1.trainer_mode", "sync"))
        if mode == MEMPO_TRAINER_MODE:
            return None
        why = ("an asynchronous trainer changes the weights during a trajectory and its teacher scoring, and "
               "does not read the memory reward") if mode in ASYNC_TRAINER_MODES else \
            "that trainer does not read the memory reward the mempo loops compute (the run would be plain GRPO)"
        return f"trainer.v1.trainer_mode={mode}: {why}; set trainer.v1.trainer_mode={MEMPO_TRAINER_MODE}"
    estimator = select(config, "algorithm.adv_estimator", "gae")
    estimator = str(getattr(estimator, "value", estimator))
    if estimator != MEMPO_ESTIMATOR:
        return (f"algorithm.adv_estimator={estimator} under trainer.use_v1=false does not read the memory reward the "
                f"mempo loops compute (the run would be plain {estimator}); set trainer.use_v1=true "
                f"trainer.v1.trainer_mode={MEMPO_TRAINER_MODE}, or algorithm.adv_estimator={MEMPO_ESTIMATOR}")
    return None


def forced_exclusion_problem(config: Any, rollout: Any, forced_logprobs: str = "engine") -> Optional[str]:
    """Why trained forced ``<mem>`` ids cannot be kept out of rollout correction under `config`, or None.

    A training loop leaves them out of the correction (``mempo_forced_spans``) with
    ``forced_logprobs: exclude``, or at a sampling temperature other than 1 (the engines' prompt
    log-probs, at temperature 1, are not their rollout log-probs); only ``mempo_sync`` does that, and
    not in bypass mode (the rollout log-probs are then the PPO ratio's denominator). rollout: the
    loop's `mempo.config.RolloutConfig` (``train_forced_prefix``, ``forced_prefix``)."""
    temperature = float(select(config, "actor_rollout_ref.rollout.temperature", 1.0))
    excluded = forced_logprobs == "exclude" or temperature != 1.0
    if not (rollout.train_forced_prefix and rollout.forced_prefix and excluded
            and select(config, "actor_rollout_ref.rollout.calculate_log_probs", False)):
        return None
    if not bool(select(config, "trainer.use_v1", True)):
        why = "the legacy trainer (trainer.use_v1=false) cannot keep them out of rollout correction"
    elif select(config, "algorithm.rollout_correction.bypass_mode", False):
        why = "bypass mode uses the rollout log-probs as the PPO ratio's denominator"
    else:
        return None
    source = ("forced_logprobs: exclude gives them no rollout log-prob" if forced_logprobs == "exclude" else
              f"at actor_rollout_ref.rollout.temperature={temperature} they have no rollout log-prob from the "
              "engine (its prompt log-probs are at temperature 1)")
    return (f"trained forced <mem> ids: {source}, and {why}; use forced_logprobs: engine at temperature 1.0, "
            "or set rollout.train_forced_prefix: false")


def _is_mempo_reward_module(path: str) -> bool:
    """Whether verl's ``custom_reward_function.path`` (``pkg://`` module, ``file://`` or plain file path)
    names `mempo.integrations.verl.reward`."""
    if path.startswith("pkg://"):
        return path[len("pkg://"):].replace("/", ".").removesuffix(".py") == reward_module.__name__
    path = path.removeprefix("file://")
    return os.path.exists(path) and os.path.samefile(path, reward_module.__file__)


def outcome_reward_problem(config: Any) -> Optional[str]:
    """One line naming ``reward.custom_reward_function.reward_kwargs.outcome_reward`` when verl's reward
    function is mempo's `outcome_reward_score` and that setting names no reward it can call ("em",
    "f1", "em_retrieved" or a function's import path); None otherwise (verl copies a top-level
    ``custom_reward_function`` there, so either place is read)."""
    for prefix in ("reward.custom_reward_function", "custom_reward_function"):
        path = select(config, f"{prefix}.path")
        if path is None:
            continue
        if select(config, f"{prefix}.name") != "outcome_reward_score" or not _is_mempo_reward_module(str(path)):
            return None
        try:
            reward_module.check_outcome_reward(select(config, f"{prefix}.reward_kwargs.outcome_reward"))
        except ConfigError as error:
            return str(error)
        return None
    return None


def mempo_loop_entries(config: Any) -> list[dict]:
    """The mempo entries (``_target_`` in `mempo.integrations.verl.agent_loop`) of the run's agent-loop
    YAML (``actor_rollout_ref.rollout.agent.agent_loop_config_path``), as plain dicts, resolved
    (``${oc.env:...}`` read in this process); [] without a YAML. ConfigError naming the path when the
    file cannot be read."""
    path = select(config, "actor_rollout_ref.rollout.agent.agent_loop_config_path")
    if not path:
        return []
    try:
        entries = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except (OSError, ValueError, TypeError) as error:
        raise ConfigError("actor_rollout_ref.rollout.agent.agent_loop_config_path",
                          f"cannot read {path}: {error}") from None
    if not isinstance(entries, list):
        raise ConfigError("actor_rollout_ref.rollout.agent.agent_loop_config_path",
                          f"{path} must be a YAML list of agent-loop entries")
    return [e for e in entries if isinstance(e, dict) and str(e.get("_target_", "")).startswith(_LOOP_MODULE)]
