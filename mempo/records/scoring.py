"""The records teacher scoring takes and returns: one request per trajectory, one result per request.

    full_ctx[r] = sequence_ids[:full_end]      mem_ctx[r] = mem_ctx_ids      both continued by answer_ids

full_ctx is the comparator context: the paper's (everything before round r) or, under
``scoring.comparator: history_mem``, everything through round r's ``</mem>``
(`mempo.algo.contexts`). With ``answer_objectives`` set, every context is also reduced per
objective (one CSR segment per objective's gold tokens).

Lists of Python ints and floats; results follow the order of ``request.rounds``. They are made by
`mempo.algo.contexts.scoring_requests`, filled by `mempo.scoring.score` and read by
`mempo.algo.memory_reward`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

__all__ = ["ScoredRound", "ScoringRequest", "ScoringResult"]


@dataclass
class ScoredRound:
    """One scored round r of a trajectory.

    full_end: full_ctx[r] = sequence_ids[:full_end] (1 <= full_end <= len(sequence_ids)): the
        comparator context, a prefix of the sequence.
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
    answer_objectives: None (one P per context), or per answer token the index of the objective whose
        gold it belongs to (0 <= j < num_objectives on gold tokens, -1 exactly where answer_mask is 0):
        every context is then also scored per objective.
    num_objectives: objectives of the answer (>= 1; read with answer_objectives only).
    """

    sequence_ids: list[int]
    rounds: list[ScoredRound]
    answer_ids: list[int]
    answer_mask: list[int]
    answer_objectives: Optional[list[int]] = None
    num_objectives: int = 1


@dataclass
class ScoringResult:
    """Teacher scoring of one request, per scored round in the order of ``request.rounds`` (Python numbers).

    p_full / p_mem: P(answer | full_ctx[r]) / P(answer | mem_ctx[r]); the empty value (default 0.0)
    when no token is kept. num_kept_full / num_kept_mem: gold tokens that passed the threshold.
    mean_logp_full / mean_logp_mem: the mean kept log-prob (0.0 when none is kept; -inf possible
    only without a threshold), P = exp of it.
    objective_*: per round, a list with one value per objective (same meanings, over that objective's
    gold tokens only); empty lists when the request has no ``answer_objectives``.
    """

    p_full: list[float] = field(default_factory=list)
    p_mem: list[float] = field(default_factory=list)
    num_kept_full: list[int] = field(default_factory=list)
    num_kept_mem: list[int] = field(default_factory=list)
    mean_logp_full: list[float] = field(default_factory=list)
    mean_logp_mem: list[float] = field(default_factory=list)
    objective_p_full: list[list[float]] = field(default_factory=list)
    objective_p_mem: list[list[float]] = field(default_factory=list)
    objective_mean_logp_full: list[list[float]] = field(default_factory=list)
    objective_mean_logp_mem: list[list[float]] = field(default_factory=list)
    objective_num_kept_full: list[list[int]] = field(default_factory=list)
    objective_num_kept_mem: list[list[int]] = field(default_factory=list)
