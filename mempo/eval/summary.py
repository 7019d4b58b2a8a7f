"""From scored trajectories to evaluation records: a cell's `EvalRow` (`summarize`) and one
episode's `EpisodeRecord` (`render_episode`).

Token economy, counted with the model's tokenizer on the real ids: a round's prompt is the exact
context it was generated from (``Round.prompt_ids`` under the memory policy, ``prompt_ids +
response_ids[:start]`` under the full policy; the forced ``<mem>`` is not counted). The full
context of the same rounds (``prompt_ids + response_ids[:start]`` per round, under either policy)
is counted too, so the memory context's saving is measured on one set of decisions, not on two
different runs. Quality comes from the trajectory's ``outcome`` (`mempo.protocol.reward.compute_score`).
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from mempo.env.data import DataError, parse_episode_prompt
from mempo.eval.records import EpisodeRecord, EvalRow, RoundRecord
from mempo.protocol.reward import objectives_from_golds
from mempo.rollout.loop import as_task
from mempo.utils.tokens import decode_ids

__all__ = ["round_prompt_tokens", "standard_error", "summarize", "render_episode"]


def round_prompt_tokens(trajectory: Any) -> list[int]:
    """Per round, the number of ids of the prompt it was generated from (forced prefix excluded)."""
    counts = []
    for r in trajectory.rounds:
        if r.prompt_ids is not None:
            counts.append(len(r.prompt_ids))
        else:  # full policy: the episode prompt and everything before the round
            counts.append(len(trajectory.prompt_ids) + r.start)
    return counts


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean: sample standard deviation / sqrt(n) (0 for n < 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    # sqrt(sum (v - mean)^2 / (n - 1) / n)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def summarize(trajectories: Sequence[Any], objectives: int, policy: str, seconds: float = 0.0,
              dataset: str = "", tokenizer: Any = None) -> EvalRow:
    """One `EvalRow` from the scored trajectories of one (dataset, objectives, policy) cell: means
    over episodes; ``prompt_tokens_per_episode`` the mean of each episode's summed round prompts,
    ``peak_prompt_tokens`` the largest round prompt, ``mean_prompt_tokens_per_turn`` all round
    prompts over all rounds; ``answered_pending`` read through `tokenizer` (None without one)."""
    per_episode_tokens, all_rounds = [], []
    for t in trajectories:
        counts = round_prompt_tokens(t)
        per_episode_tokens.append(sum(counts))
        all_rounds.extend(counts)
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    outcome = [t.outcome or {} for t in trajectories]
    ems = [float(o.get("em", 0.0)) for o in outcome]
    f1s = [float(o.get("f1", 0.0)) for o in outcome]
    pending = ([p for t in trajectories for p in [t.answered_pending(tokenizer)] if p is not None]
               if tokenizer is not None else [])
    return EvalRow(
        objectives=int(objectives), policy=policy, episodes=len(trajectories),
        em=_mean(ems), f1=_mean(f1s), em_se=standard_error(ems), f1_se=standard_error(f1s),
        score=_mean([float(o.get("score", 0.0)) for o in outcome]),
        format_rate=_mean([1.0 if o.get("format_ok") else 0.0 for o in outcome]),
        answer_rate=_mean([1.0 if t.finish_reason == "answer" else 0.0 for t in trajectories]),
        mean_turns=_mean([len(t.rounds) for t in trajectories]),
        prompt_tokens_per_episode=_mean(per_episode_tokens),
        peak_prompt_tokens=int(max(all_rounds, default=0)),
        mean_prompt_tokens_per_turn=_mean(all_rounds),
        generated_tokens_per_episode=_mean([sum(t.response_mask) for t in trajectories]),
        full_context_tokens_per_episode=_mean([sum(len(t.prompt_ids) + r.start for r in t.rounds)
                                               for t in trajectories]),
        seconds=float(seconds), finish_reasons=reasons, dataset=dataset,
        tool_calls=sum(r.tool_ok is not None for t in trajectories for r in t.rounds),
        failed_tool_calls=sum(r.tool_ok is False for t in trajectories for r in t.rounds),
        answered_pending=_mean([float(p) for p in pending]) if pending else None,
        looped=_mean([1.0 if t.looped() else 0.0 for t in trajectories]),
    )


def render_episode(trajectory: Any, task: Any, tokenizer: Any, *, dataset: str = "", system_prompt: str = "",
                   with_ids: bool = True) -> EpisodeRecord:
    """The `EpisodeRecord` of one trajectory: the messages, per round the decoded assistant text, its
    action, the decoded tool result and (memory policy) the decoded prompt it was generated from,
    then the answers against the golds and the scores.

    Args:
        trajectory: a scored `Trajectory`.
        task: what it was sampled from (an `Episode`, or anything `as_task` takes): its prompt and,
            when it has them, its ``questions`` and ``source_ids``.
        tokenizer: the tokenizer the ids are decoded with (special tokens kept).
        system_prompt: the system message the rollout used.
        with_ids: keep the trajectory's ids (``Trajectory.to_dict``) in ``trajectory``.
    """
    item = as_task(task)
    questions = list(getattr(task, "questions", None) or [])
    if not questions:
        try:
            questions = parse_episode_prompt(item.prompt)
        except DataError:  # a bare question prompt
            questions = [item.prompt]
    golds = objectives_from_golds(trajectory.golds) if trajectory.golds is not None else []
    outcome = trajectory.outcome or {}
    predictions = [o.get("prediction") for o in outcome.get("per_objective", [])] or [None] * len(golds)
    counts = round_prompt_tokens(trajectory)
    rounds = []
    for r, count in zip(trajectory.rounds, counts):
        info = r.information
        rounds.append(RoundRecord(
            index=r.index, assistant=decode_ids(tokenizer, trajectory.response_ids[r.start:r.end]), action=r.action,
            action_argument=r.action_argument, stop_reason=r.stop_reason,
            tool_result=decode_ids(tokenizer, trajectory.response_ids[info[0]:info[1]]) if info is not None else None,
            tool_ok=r.tool_ok, prompt_tokens=count,
            prompt=decode_ids(tokenizer, r.prompt_ids) if r.prompt_ids is not None else None))
    return EpisodeRecord(
        dataset=dataset, objectives=len(golds) or len(questions), policy=trajectory.policy,
        episode_id=str(trajectory.episode_id or item.id), questions=questions, golds=golds, system=system_prompt,
        user=item.prompt, rounds=rounds, finish_reason=trajectory.finish_reason,
        final_answer=trajectory.final_answer, predictions=predictions, em=float(outcome.get("em", 0.0)),
        f1=float(outcome.get("f1", 0.0)), score=float(outcome.get("score", 0.0)),
        format_ok=bool(outcome.get("format_ok", False)), failed_rules=list(outcome.get("failed_rules", ())),
        source_ids=[str(s) for s in getattr(task, "source_ids", None) or []],
        trajectory=trajectory.to_dict() if with_ids else None)
