"""From trajectories to the teacher-scoring requests, back to memory rewards, and on to advantage inputs.

Conventions
-----------
* :func:`scoring_requests` gives one ``ScoringRequest`` per trajectory, in order (also for a
  trajectory with no scored round: its ``rounds`` is empty), so results line up with trajectories.
  ``sequence_ids = prompt_ids + response_ids`` (the full context as generated). Each scored round
  (index >= 1 with a well-formed ``<mem>``, see :mod:`mempo.rollout.trajectory`) becomes a
  ``ScoredRound(full_end, mem_ctx_ids)``: ``full_ctx[r] = sequence_ids[:full_end]`` (no copy) and
  ``mem_ctx_ids = prompt_ids + response_ids[mem_span]`` (system + question, chat-formatted, then
  the round's ``<mem>...</mem>`` ids; the last tool result is not included, as in the reference).
  The answer continuation comes from ``answer_builder(golds, tokenizer) -> (answer_ids,
  answer_mask)``; the default, :func:`default_answer_builder`, is ``mempo.scoring.build_answer``
  around the first alias of every objective (several objectives: the sub-answers joined by "; ").
* The record types are ``mempo.scoring.ScoringRequest`` / ``ScoredRound`` (imported on first use;
  :mod:`mempo.scoring` imports torch only).
* :func:`attach_memory_rewards` stores one float per scored round on each trajectory
  (``Trajectory.memory_rewards``), checking counts and finiteness; it reads
  ``mempo.scoring.ScoringResult.mem_reward`` (or a plain list per trajectory).
* :func:`advantage_inputs` packs a batch (full-policy coordinates: one response per trajectory) in
  the CSR form of :func:`mempo.ops.mempo_advantage`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

from mempo.rollout.trajectory import Trajectory

__all__ = ["scoring_requests", "attach_memory_rewards", "advantage_inputs", "scoring_types",
           "default_answer_builder"]

AnswerBuilder = Callable[[Any, Any], tuple[Sequence[int], Sequence[int]]]


def scoring_types() -> tuple[type, type]:
    """``(mempo.scoring.ScoringRequest, mempo.scoring.ScoredRound)`` (imported on first use)."""
    from mempo.scoring import ScoredRound, ScoringRequest

    return ScoringRequest, ScoredRound


def default_answer_builder(golds: Any, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``mempo.scoring.build_answer`` (default template) around the first alias of each objective.

    ``golds`` as ``compute_score`` takes them (:func:`mempo.protocol.reward.objectives_from_golds`): one
    objective gives its first alias as the answer, k objectives give the list of first aliases
    (joined by "; ", only the aliases' tokens in the mask)."""
    from mempo.protocol.reward import objectives_from_golds
    from mempo.scoring import build_answer

    firsts = [aliases[0] for aliases in objectives_from_golds(golds)]
    return build_answer(tokenizer, firsts[0] if len(firsts) == 1 else firsts)


def scoring_requests(trajectories: Sequence[Trajectory], tokenizer: Any,
                     answer_builder: Optional[AnswerBuilder] = None) -> list:
    """One ``ScoringRequest`` per trajectory (module conventions).

    Args:
        trajectories: rollout output.
        tokenizer: passed to ``answer_builder``.
        answer_builder: ``(golds, tokenizer) -> (answer_ids, answer_mask)``, both lists of ints of
            one length (mask 1 on the gold answer's tokens); default :func:`default_answer_builder`.
            Called once per distinct ``golds``.
    """
    if answer_builder is None:
        answer_builder = default_answer_builder
    request_type, round_type = scoring_types()
    requests = []
    answers: dict[str, tuple[list[int], list[int]]] = {}
    for trajectory in trajectories:
        key = repr(trajectory.golds)
        if key not in answers:
            answer_ids, answer_mask = answer_builder(trajectory.golds, tokenizer)
            answer_ids, answer_mask = [int(t) for t in answer_ids], [int(m) for m in answer_mask]
            if len(answer_ids) != len(answer_mask):
                raise ValueError(f"answer_builder gave {len(answer_ids)} ids but {len(answer_mask)} mask values")
            answers[key] = (answer_ids, answer_mask)
        answer_ids, answer_mask = answers[key]
        rounds = [round_type(full_end=r.full_end, mem_ctx_ids=trajectory.mem_context_ids(r))
                  for r in trajectory.scored_rounds()]
        requests.append(request_type(sequence_ids=trajectory.sequence_ids, rounds=rounds,
                                     answer_ids=list(answer_ids), answer_mask=list(answer_mask)))
    return requests


def _rewards_of(result: Any) -> list[float]:
    for name in ("mem_reward", "memory_rewards", "mem_rewards"):
        if isinstance(result, dict) and name in result:
            result = result[name]
            break
        if hasattr(result, name):
            result = getattr(result, name)
            break
    if hasattr(result, "tolist"):
        result = result.tolist()
    return [float(v) for v in result]


def attach_memory_rewards(trajectories: Sequence[Trajectory], results: Sequence[Any]) -> None:
    """Set ``memory_rewards`` of each trajectory from its scoring result.

    ``results[i]`` belongs to ``trajectories[i]``: a ``mempo.scoring.ScoringResult`` (its
    ``mem_reward`` list), a sequence (list, tensor, array) of one reward per scored round, or an
    object / dict with ``mem_reward``, ``memory_rewards`` or ``mem_rewards``. Raises
    ValueError on a count mismatch or a non-finite value.
    """
    if len(results) != len(trajectories):
        raise ValueError(f"{len(results)} scoring results for {len(trajectories)} trajectories")
    for i, (trajectory, result) in enumerate(zip(trajectories, results)):
        rewards = _rewards_of(result)
        expected = len(trajectory.scored_rounds())
        if len(rewards) != expected:
            raise ValueError(f"trajectory {i} ({trajectory.uid}/{trajectory.sample_index}) has {expected} scored "
                             f"rounds but got {len(rewards)} memory rewards")
        if not all(math.isfinite(v) for v in rewards):
            raise ValueError(f"trajectory {i}: memory rewards must be finite, got {rewards}")
        trajectory.memory_rewards = rewards


def advantage_inputs(trajectories: Sequence[Trajectory], *, pad_to: Optional[int] = None,
                     require_memory_rewards: bool = True):
    """The inputs of :func:`mempo.ops.mempo_advantage` for a batch of trajectories.

    Returns ``(scores, index, response_mask, mem_rewards, mem_offsets, mem_spans)``:
    scores float32 [B] (outcome scores); index: numpy object array [B] of group uids (verl's
    ``uid``); response_mask int64 [B, L] (right-padded with 0; L = longest response, or
    ``pad_to``); mem_rewards float32 [R]; mem_offsets int64 [B+1] (CSR over trajectories);
    mem_spans int64 [R, 2] (``<mem>`` span start/end in response coordinates).

    A trajectory without memory rewards raises ValueError, unless ``require_memory_rewards=False``
    (its scored rounds are then left out: plain GRPO for it).
    """
    import numpy as np
    import torch

    batch = len(trajectories)
    longest = max((len(t.response_ids) for t in trajectories), default=0)
    width = longest if pad_to is None else int(pad_to)
    if width < longest:
        raise ValueError(f"pad_to={pad_to} is shorter than the longest response ({longest})")
    scores = torch.tensor([t.score for t in trajectories], dtype=torch.float32)
    index = np.array([t.uid for t in trajectories], dtype=object)
    response_mask = torch.zeros((batch, width), dtype=torch.int64)
    rewards: list[float] = []
    spans: list[tuple[int, int]] = []
    offsets = [0]
    for row, trajectory in enumerate(trajectories):
        if trajectory.response_mask:
            response_mask[row, :len(trajectory.response_mask)] = torch.tensor(trajectory.response_mask)
        scored = trajectory.scored_rounds()
        if trajectory.memory_rewards is None:
            if scored and require_memory_rewards:
                raise ValueError(f"trajectory {row} ({trajectory.uid}/{trajectory.sample_index}) has no memory "
                                 "rewards; run the scoring and attach_memory_rewards first")
        else:
            if len(trajectory.memory_rewards) != len(scored):
                raise ValueError(f"trajectory {row}: {len(trajectory.memory_rewards)} memory rewards for "
                                 f"{len(scored)} scored rounds")
            rewards.extend(trajectory.memory_rewards)
            spans.extend(r.mem_span for r in scored)
        offsets.append(len(rewards))
    mem_rewards = torch.tensor(rewards, dtype=torch.float32)
    mem_offsets = torch.tensor(offsets, dtype=torch.int64)
    mem_spans = torch.tensor(spans, dtype=torch.int64).reshape(-1, 2)
    return scores, index, response_mask, mem_rewards, mem_offsets, mem_spans
