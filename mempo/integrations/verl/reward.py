"""mempo's outcome reward (EM on the ``<answer>``, format-gated) as a verl reward function, and the
default one for the rows a mempo agent loop produced.

    reward.custom_reward_function.path=<this file> reward.custom_reward_function.name=compute_score

The mempo loops leave ``reward_score`` unset, so verl's reward loop scores every trajectory
(``RewardLoopWorker`` -> the reward manager -> its ``compute_score``): a user's
``reward.custom_reward_function`` or reward model gives the outcome, and the memory reward (the
loop's ``extra_fields``, read by mempo's trainer) is kept whatever gives it. Without either,
verl's default ``verl.utils.reward_score.default_compute_score`` is called; the plugin wraps it
(`install`) so that a row carrying a mempo loop's fields (``extra_info["mempo_protocol_text"]``:
verl's naive reward manager merges the loop's ``extra_fields`` into ``extra_info``) is scored by
`compute_score` here, and every other row by verl's function, unchanged.

The golds are ``reward_model.ground_truth`` (`gold_answers`: an alias, a list of aliases, one alias
list per objective, or Search-R1's ``{"target": aliases}``); the scored text is the loop's protocol
text (its round and tool texts as generated, `mempo.algo.outcome`), or verl's decoded
``solution_str`` for a row from another loop; the format check uses the loop's tags (its
``rollout.action_format`` and tool names, ``extra_info["mempo_action_format"]`` / ``["mempo_tools"]``).

A mempo outcome reward, ``reward(answer, example) -> float`` named by import path (or "em" / "f1" /
"em_retrieved"), is verl's reward function through `outcome_reward_score`::

    reward.custom_reward_function.path=pkg://mempo.integrations.verl.reward
    reward.custom_reward_function.name=outcome_reward_score
    +reward.custom_reward_function.reward_kwargs.outcome_reward=my_task:reward

(verl passes ``reward_kwargs`` to the function; `mempo.integrations.verl.run_config.outcome_reward_problem`
checks the setting when a loop starts and in ``python -m mempo.integrations.verl --config``.)
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional

from mempo.algo.outcome import resolve_outcome_reward, text_outcome
from mempo.config import ConfigError
from mempo.env.data import parse_episode_prompt
from mempo.errors import MempoError
from mempo.protocol.reward import SCORE_MODES, objectives_from_golds
from mempo.protocol.reward import compute_score as score_text
from mempo.protocol.tags import TagSet, tag_set_for

__all__ = ["ACTION_FORMAT_KEY", "OUTCOME_REWARD_OPTION", "PROMPT_KEY", "PROTOCOL_TEXT_KEY", "SCORE_MODE_KEY",
           "TOOLS_KEY", "check_outcome_reward", "compute_score", "gold_answers", "install", "is_installed",
           "outcome_reward_score", "row_tags"]

#: the ``extra_fields`` / ``extra_info`` keys a mempo loop writes for the reward function
PROTOCOL_TEXT_KEY, SCORE_MODE_KEY = "mempo_protocol_text", "mempo_score_mode"
PROMPT_KEY, ACTION_FORMAT_KEY, TOOLS_KEY = "mempo_prompt", "mempo_action_format", "mempo_tools"
#: where verl's config names the mempo reward `outcome_reward_score` calls
OUTCOME_REWARD_OPTION = "reward.custom_reward_function.reward_kwargs.outcome_reward"
#: what verl adds to ``extra_info`` besides the loop's fields (its naive reward manager)
_VERL_INFO_KEYS = ("num_turns", "rollout_reward_scores")


def gold_answers(ground_truth: Any) -> Any:
    """The golds of ``reward_model.ground_truth``: aliases, per-objective alias lists, or Search-R1's
    ``{"target": [aliases]}`` (numpy arrays as parquet gives them become lists); ValueError naming
    the field when there is none."""
    truth = ground_truth
    if isinstance(truth, Mapping):
        truth = truth.get("target")
    if truth is None:
        raise ValueError("the sample has no reward_model.ground_truth (the gold answer string; a dict needs "
                         "a 'target' key)")
    if hasattr(truth, "tolist"):
        truth = truth.tolist()
    return truth


def row_tags(extra_info: Optional[Mapping[str, Any]]) -> TagSet:
    """The tag set a mempo loop's row was generated under: ``extra_info["mempo_action_format"]`` over
    ``extra_info["mempo_tools"]`` (`mempo.protocol.tags.tag_set_for`); the tags format of the built-in
    tools for a row without them. ValueError naming the key for a value that is not a tag set."""
    info = extra_info or {}
    action_format = info.get(ACTION_FORMAT_KEY) or "tags"
    tools = info.get(TOOLS_KEY)
    tools = ("search", "access") if tools is None else tuple(tools.tolist() if hasattr(tools, "tolist") else tools)
    try:
        return tag_set_for(str(action_format), tools)
    except ValueError as error:
        raise ValueError(f"extra_info['{ACTION_FORMAT_KEY}'] / ['{TOOLS_KEY}']: {error}") from None


def _mode(info: Mapping[str, Any]) -> str:
    mode = str(info.get(SCORE_MODE_KEY) or "mean")
    if mode not in SCORE_MODES:
        raise ValueError(f"extra_info['{SCORE_MODE_KEY}'] must be one of {SCORE_MODES}, got {mode!r}")
    return mode


def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                  extra_info: Optional[Mapping[str, Any]] = None, **unused: Any) -> dict[str, float]:
    """verl's reward-function contract -> ``{"score", "acc", "mempo_em", "mempo_f1",
    "mempo_format_ok"}`` (floats; ``score`` is the outcome, ``acc`` the same value for verl's
    metrics). The text is ``extra_info["mempo_protocol_text"]`` when a mempo loop wrote it, else
    `solution_str`; the score mode is ``extra_info["mempo_score_mode"]`` (the loop's
    ``rollout.score_mode``; "mean" otherwise); the tags `row_tags`.
    `mempo.protocol.reward.compute_score` does the rest."""
    info = extra_info or {}
    text = info.get(PROTOCOL_TEXT_KEY)
    outcome = score_text(str(solution_str if text is None else text), gold_answers(ground_truth), mode=_mode(info),
                         tags=row_tags(info))
    return {"score": float(outcome["score"]), "acc": float(outcome["score"]), "mempo_em": float(outcome["em"]),
            "mempo_f1": float(outcome["f1"]), "mempo_format_ok": float(bool(outcome["format_ok"]))}


def _reward(spec: Any) -> Any:
    if spec is None:
        raise ConfigError(OUTCOME_REWARD_OPTION, "must name the reward outcome_reward_score calls: 'em', 'f1', "
                                                 "'em_retrieved' or 'package.module:function' "
                                                 "(reward(answer, example) -> float)")
    return _resolved(str(spec))


@functools.lru_cache(maxsize=16)
def _resolved(spec: str) -> Any:
    try:
        return resolve_outcome_reward(spec)
    except ConfigError as error:
        raise ConfigError(OUTCOME_REWARD_OPTION, error.reason) from None


def check_outcome_reward(spec: Any) -> None:
    """ConfigError naming `OUTCOME_REWARD_OPTION` unless `spec` is "em", "f1", "em_retrieved" or the import
    path of a function (`mempo.algo.outcome.resolve_outcome_reward`)."""
    _reward(spec)


def outcome_reward_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                         extra_info: Optional[Mapping[str, Any]] = None, *, outcome_reward: Any = None,
                         **unused: Any) -> dict[str, float]:
    """A mempo outcome reward as verl's reward function (module docstring): `outcome_reward` (verl's
    ``reward_kwargs``) is "em", "f1", "em_retrieved" or ``"package.module:function"``, called as mempo
    calls it, ``reward(answer, example)`` (`mempo.algo.outcome.text_outcome`): `answer` the ``<answer>`` of
    the loop's protocol text (`solution_str` for another loop's row) under the row's tags (`row_tags`);
    `example` the dataset's ``extra_info`` fields with ``id``, ``prompt`` (the question the loop ran),
    ``questions`` (its numbered questions, else [prompt]), ``golds`` (one alias list per objective of
    ``reward_model.ground_truth``; None without it) and ``data_source``. A format break scores 0, as in
    `mempo train`. -> ``{"score", "acc", "mempo_reward", "mempo_em", "mempo_f1", "mempo_format_ok"}``.
    ConfigError naming `OUTCOME_REWARD_OPTION` for a bad setting; `OutcomeRewardError` naming the
    function for a raise, a NaN or a value that is not a real number; ValueError for a built-in reward
    without golds."""
    reward = _reward(outcome_reward)
    info = dict(extra_info or {})
    text = info.get(PROTOCOL_TEXT_KEY)
    text = str(solution_str if text is None else text)
    golds = None
    if ground_truth is not None or not callable(reward):
        golds = objectives_from_golds(gold_answers(ground_truth))
    prompt = info.get(PROMPT_KEY)
    try:
        questions = parse_episode_prompt(prompt) if prompt is not None else []
    except MempoError:  # a prompt without a numbered question list is one question
        questions = [prompt]
    fields = {k: v for k, v in info.items() if not str(k).startswith("mempo_") and k not in _VERL_INFO_KEYS}
    example = {**fields, "id": fields.get("id", fields.get("index")), "prompt": prompt, "questions": questions,
               "golds": golds, "data_source": data_source}
    where = f"the row of data source {data_source!r}, id {example['id']!r}"
    result = text_outcome(text, golds, example, mode=_mode(info), reward=reward, tags=row_tags(info), where=where,
                          option=OUTCOME_REWARD_OPTION)
    score = float(result["score"])
    return {"score": score, "acc": score, "mempo_reward": float(result.get("reward", score)),
            "mempo_em": float(result["em"]), "mempo_f1": float(result["f1"]),
            "mempo_format_ok": float(bool(result["format_ok"]))}


def _is_mempo_row(extra_info: Any) -> bool:
    return isinstance(extra_info, Mapping) and extra_info.get(PROTOCOL_TEXT_KEY) is not None


def install() -> None:
    """Wrap ``verl.utils.reward_score.default_compute_score`` (idempotent; verl's own is kept as
    ``_verl_default_compute_score``): a mempo row goes to `compute_score`, any other to verl's."""
    from verl.utils import reward_score  # reason: verl is optional; the plugin calls this under it

    if hasattr(reward_score, "_verl_default_compute_score"):
        return
    verl_default = reward_score.default_compute_score

    def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, *args, **kwargs):
        if _is_mempo_row(extra_info):
            return compute_score(data_source, solution_str, ground_truth, extra_info)
        return verl_default(data_source, solution_str, ground_truth, extra_info, *args, **kwargs)

    default_compute_score.__doc__ = f"mempo rows: {__name__}.compute_score; others: verl's default_compute_score."
    default_compute_score._mempo = True
    reward_score._verl_default_compute_score = verl_default
    reward_score.default_compute_score = default_compute_score


def is_installed() -> bool:
    """Whether verl's default reward function is the wrapper of `install`."""
    from verl.utils import reward_score  # reason: as in `install`

    return bool(getattr(reward_score.default_compute_score, "_mempo", False))
