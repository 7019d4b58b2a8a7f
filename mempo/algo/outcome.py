"""The outcome reward of a trajectory, computed after the rollout by training and evaluation alike.

    outcome = compute_score(protocol_text, golds, mode, format_kwargs)    "em" (default; no golds: {})
    score   = the mode's aggregate of the per-objective token F1           "f1"
    score   = the "em" score if every objective's gold was in a tool result   "em_retrieved"
              before the answer, else 0 (an answer with a question never searched)
    score   = reward(answer, example)                                     a user's (rollout.outcome_reward)

each 0 when the response breaks the protocol's format (`mempo.protocol.grammar.validate_format` under
the run's tags). ``protocol_text`` is the text the rollout built from its `AgentMemory` records (round
texts and tool texts as given, no chat glue), not a re-decoding of the ids. The scored trajectories are
new records (`dataclasses.replace`); the rollout's records are not changed.

A user's reward is ``reward(answer: Optional[str], example: dict) -> float``: `answer` is the final
``<answer>`` text (None when there is none), `example` the trajectory's example (`Trajectory.example`:
the episode's ``id``, ``prompt``, ``questions``, ``golds`` and its other fields; ``{"id", "prompt",
"golds"}`` at least). It is called once per trajectory, after the rollout, never by a generation
request. A raise, a NaN or infinity, or a value that is not a real number is an `OutcomeRewardError`
naming the function and the trajectory (the run stops: a silently wrong reward would train on it).
"""
from __future__ import annotations

import dataclasses
import math
from numbers import Real
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from mempo.config import ConfigError
from mempo.errors import MempoError
from mempo.protocol.grammar import extract_solution, validate_format
from mempo.protocol.reward import compute_score, response_retrieved_objectives
from mempo.protocol.tags import TAG_SET, TagSet
from mempo.records.trajectory import Trajectory
from mempo.utils.imports import is_import_path, load_object

__all__ = ["BUILTIN_REWARDS", "OutcomeRewardError", "OutcomeReward", "outcome", "resolve_outcome_reward",
           "reward_name", "score_outcomes", "text_outcome"]

BUILTIN_REWARDS = ("em", "f1", "em_retrieved")
OutcomeReward = Union[str, Callable[[Optional[str], dict], float]]


class OutcomeRewardError(MempoError, ValueError):
    """A user's outcome reward that raised or returned something other than a finite real number."""


def reward_name(reward: Any) -> str:
    """How errors name a reward function: ``module:qualname``."""
    return f"{getattr(reward, '__module__', '?')}:{getattr(reward, '__qualname__', type(reward).__name__)}"


def resolve_outcome_reward(spec: OutcomeReward) -> OutcomeReward:
    """``rollout.outcome_reward`` as `score_outcomes` takes it: a built-in name as it is, an import path
    as the function it names (a ConfigError naming ``rollout.outcome_reward`` when it does not import or
    is not callable), a callable as it is."""
    if callable(spec) or spec in BUILTIN_REWARDS:
        return spec
    if not is_import_path(spec):
        raise ConfigError("rollout.outcome_reward", f"must be one of {BUILTIN_REWARDS} or an import path "
                                                    f"'package.module:function', got {spec!r}")
    try:
        function = load_object(spec)
    except ValueError as error:
        raise ConfigError("rollout.outcome_reward", str(error)) from None
    if not callable(function):
        raise ConfigError("rollout.outcome_reward", f"{spec!r} is a {type(function).__name__}, not a function "
                                                    "reward(answer, example) -> float")
    return function


def _example(trajectory: Trajectory) -> dict[str, Any]:
    if trajectory.example is not None:
        return dict(trajectory.example)
    return {"id": trajectory.episode_id, "golds": trajectory.golds}


def _user_outcome(text: str, golds: Any, example: dict[str, Any], reward: Callable, mode: str,
                  format_kwargs: Mapping[str, Any], tags: TagSet, where: str, option: str) -> dict[str, Any]:
    answer = extract_solution(text, tags)
    try:
        value = reward(answer, example)
    except Exception as error:  # reason: a user's reward failing is reported as one line naming it
        detail = " ".join(f"{type(error).__name__}: {error}".split())[:300]
        raise OutcomeRewardError(f"{option}: {reward_name(reward)} raised on {where} ({detail})") from None
    if isinstance(value, bool) or not isinstance(value, Real):
        raise OutcomeRewardError(f"{option}: {reward_name(reward)} returned {type(value).__name__} "
                                 f"{str(value)[:60]!r} on {where}; it must return a float")
    value = float(value)
    if not math.isfinite(value):
        raise OutcomeRewardError(f"{option}: {reward_name(reward)} returned {value} on {where}; "
                                 "it must return a finite float")
    if golds is not None:  # EM / F1 against the golds stay as diagnostics
        result = compute_score(text, golds, mode=mode, format_kwargs=format_kwargs, tags=tags)
    else:
        report = validate_format(text, tags=tags, **format_kwargs)
        result = {"em": 0.0, "f1": 0.0, "format_ok": report.ok, "failed_rules": report.failed_rules,
                  "num_objectives": 0, "per_objective": [], "answer": answer}
    result.update(score=value if result["format_ok"] else 0.0, reward=value)
    return result


def text_outcome(text: str, golds: Any, example: Mapping[str, Any], *, mode: str = "mean",
                 format_kwargs: Optional[Mapping[str, Any]] = None, reward: OutcomeReward = "em",
                 tags: TagSet = TAG_SET, where: str = "a trajectory",
                 option: str = "rollout.outcome_reward") -> dict[str, Any]:
    """The outcome of a protocol text (what `outcome` computes for a trajectory, for a caller that holds
    the text, its golds and its example but no `Trajectory`, such as verl's reward function). where:
    how an error names the scored item; option: the setting an error names (the one that chose the
    reward). {} for a built-in reward without golds; `OutcomeRewardError` for a user's reward that fails."""
    reward = resolve_outcome_reward(reward)
    if golds is None and not callable(reward):
        return {}
    format_kwargs = dict(format_kwargs or {})
    if callable(reward):
        return _user_outcome(text, golds, dict(example), reward, mode, format_kwargs, tags, where, option)
    result = compute_score(text, golds, mode=mode, format_kwargs=format_kwargs, tags=tags)
    if reward == "f1":
        f1 = [item["f1"] for item in result["per_objective"]]
        aggregate = {"mean": sum(f1) / len(f1), "all": float(all(v == 1.0 for v in f1)), "sum": float(sum(f1))}[mode]
        result["score"] = aggregate if result["format_ok"] else 0.0
    elif reward == "em_retrieved":
        # an answer given before every objective's gold was in some tool result earns nothing, even
        # where it is right: answering early with a question never searched is no shortcut (D22)
        retrieved = response_retrieved_objectives(text, golds, tags)
        result["all_retrieved"] = len(retrieved) == result["num_objectives"]
        result["score"] = result["score"] if result["all_retrieved"] else 0.0
    return result


def outcome(trajectory: Trajectory, *, mode: str = "mean", format_kwargs: Optional[Mapping[str, Any]] = None,
            reward: OutcomeReward = "em", tags: TagSet = TAG_SET) -> dict[str, Any]:
    """The outcome of one trajectory under `reward` (see the module docstring): `compute_score`'s dict,
    with ``score`` replaced by the F1 aggregate ("f1"), 0 where a gold was in no tool result
    ("em_retrieved", which adds ``all_retrieved``), or the user's value (a callable; its raw value
    also as ``reward``). {} for a built-in reward and a trajectory without golds. ValueError for a
    trajectory with no protocol text to score; `OutcomeRewardError` for a user's reward that fails."""
    reward = resolve_outcome_reward(reward)
    if trajectory.golds is None and not callable(reward):
        return {}
    if trajectory.protocol_text is None:
        raise ValueError(f"trajectory {trajectory.uid}/{trajectory.sample_index} has no protocol_text to score")
    return text_outcome(trajectory.protocol_text, trajectory.golds, _example(trajectory), mode=mode,
                        format_kwargs=format_kwargs, reward=reward, tags=tags,
                        where=f"trajectory {trajectory.uid}/{trajectory.sample_index}")


def score_outcomes(trajectories: Sequence[Trajectory], *, mode: str = "mean",
                   format_kwargs: Optional[Mapping[str, Any]] = None, reward: OutcomeReward = "em",
                   tags: TagSet = TAG_SET) -> list[Trajectory]:
    """The scored copies of ``trajectories``, in order: each with ``outcome`` set (`outcome`).

    mode: how per-objective values become the score (``rollout.score_mode``: "mean", "all", "sum");
    format_kwargs: keyword arguments of the format check (None: its defaults, which every command uses);
    reward: ``rollout.outcome_reward`` ("em", "f1", "em_retrieved", an import path or a function); tags: the
    run's tag set (`mempo.rollout.loop.protocol_tags`, ``RolloutEngine.tags``).
    """
    reward = resolve_outcome_reward(reward)
    return [dataclasses.replace(t, outcome=outcome(t, mode=mode, format_kwargs=format_kwargs, reward=reward,
                                                   tags=tags))
            for t in trajectories]
