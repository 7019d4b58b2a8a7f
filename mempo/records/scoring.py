"""The records teacher scoring takes and returns: one request per trajectory, one result per request.

    full_ctx[r] = sequence_ids[:full_end]      mem_ctx[r] = mem_ctx_ids      both continued by answer_ids

Lists of Python ints and floats; results follow the order of ``request.rounds``. They are made by
`mempo.algo.contexts.scoring_requests`, filled by `mempo.scoring.score` and read by
`mempo.algo.memory_reward`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ScoredRound", "ScoringRequest", "ScoringResult"]


@dataclass
class ScoredRound:
    """One scored round r of a trajectory.

    full_end: full_ctx[r] = sequence_ids[:full_end] (1 <= full_end <= len(sequence_ids)).
    mem_ctx_ids: mem_ctx[r] = system + question + round r's "<mem>...</mem>", token ids (non-empty).
    """

    full_end: int
    mem_ctx_ids: list[int]


@dataclass
class ScoringRequest:
    """One trajectory to score.

    sequence_ids: prompt + response as generated (the full context, tool results included).
    rounds: the rounds to score, in order (may be empty: nothing is computed for this request).
    answer_ids: the scored continuation (template around the gold answer), non-empty.
    answer_mask: 1 on gold-answer tokens, 0 on template tokens; len(answer_mask) == len(answer_ids).
    """

    sequence_ids: list[int]
    rounds: list[ScoredRound]
    answer_ids: list[int]
    answer_mask: list[int]


@dataclass
class ScoringResult:
    """Teacher scoring of one request, per scored round in the order of ``request.rounds`` (Python numbers).

    p_full / p_mem: P(answer | full_ctx[r]) / P(answer | mem_ctx[r]); the empty value (default 0.0)
    when no token is kept. num_kept_full / num_kept_mem: gold tokens that passed the threshold.
    """

    p_full: list[float] = field(default_factory=list)
    p_mem: list[float] = field(default_factory=list)
    num_kept_full: list[int] = field(default_factory=list)
    num_kept_mem: list[int] = field(default_factory=list)
