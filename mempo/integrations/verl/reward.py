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
``solution_str`` for a row from another loop.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from mempo.protocol.reward import SCORE_MODES
from mempo.protocol.reward import compute_score as score_text

__all__ = ["PROTOCOL_TEXT_KEY", "SCORE_MODE_KEY", "compute_score", "gold_answers", "install", "is_installed"]

#: the ``extra_fields`` / ``extra_info`` keys a mempo loop writes for the reward function
PROTOCOL_TEXT_KEY, SCORE_MODE_KEY = "mempo_protocol_text", "mempo_score_mode"


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


def compute_score(data_source: Any = None, solution_str: str = "", ground_truth: Any = None,
                  extra_info: Optional[Mapping[str, Any]] = None, **unused: Any) -> dict[str, float]:
    """verl's reward-function contract -> ``{"score", "acc", "mempo_em", "mempo_f1",
    "mempo_format_ok"}`` (floats; ``score`` is the outcome, ``acc`` the same value for verl's
    metrics). The text is ``extra_info["mempo_protocol_text"]`` when a mempo loop wrote it, else
    `solution_str`; the score mode is ``extra_info["mempo_score_mode"]`` (the loop's
    ``rollout.score_mode``; "mean" otherwise). `mempo.protocol.reward.compute_score` does the rest."""
    info = extra_info or {}
    text = info.get(PROTOCOL_TEXT_KEY)
    mode = str(info.get(SCORE_MODE_KEY) or "mean")
    if mode not in SCORE_MODES:
        raise ValueError(f"extra_info['{SCORE_MODE_KEY}'] must be one of {SCORE_MODES}, got {mode!r}")
    outcome = score_text(str(solution_str if text is None else text), gold_answers(ground_truth), mode=mode)
    return {"score": float(outcome["score"]), "acc": float(outcome["score"]), "mempo_em": float(outcome["em"]),
            "mempo_f1": float(outcome["f1"]), "mempo_format_ok": float(bool(outcome["format_ok"]))}


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
