"""The memory reward of every scored round, from teacher scoring's results, by a named definition.

    gap_j(r)      = P_mem_j - P_cmp_j                              reward "prob" (the paper's)
                  = clip(l_mem_j - l_cmp_j, -c, c)                 reward "log"  (l: mean gold log-prob,
                                                                   threshold off; 0 when both are -inf)
    K_r           = {the whole answer}                             scored_objectives "all" (the paper's)
                  = {j : objective j's gold appeared in an         scored_objectives "retrieved"
                     <information> before round r}
                  = every objective when each one's gold           scored_objectives "complete" (a round
                     appeared before round r, else {}               with a question still to search is not
                                                                   scored: an agent that answers only when
                                                                   done reads no memory there,
                                                                   docs/experiments/S3-pending-rounds-complete.md)
    mem_reward[r] = mean_{j in K_r} gap_j(r)                       objective_reduce "mean" (default)
                  = min_{j in K_r} gap_j(r)                        objective_reduce "min" (per objective:
                                                                   the memory is as good as the worst-kept
                                                                   fact it should hold)
                  None when K_r is empty (the round is not scored)

P_cmp / l_cmp are those of full_ctx[r], the comparator (`mempo.algo.contexts.comparator_end`:
"paper" or "history_mem"). The default (prob, all, paper) is the paper's
mem_reward[r] = P(answer | mem_ctx[r]) - P(answer | full_ctx[r]). A round that is not scored keeps
its place in the list (one entry per `Trajectory.scored_rounds`) as None: `mempo.algo.advantages.
advantage_inputs` leaves it out of the memory pool and gives its ``<mem>`` span no memory advantage.
Rewards are Python floats; the trajectories are not changed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence

from mempo.protocol.reward import objectives_from_golds
from mempo.records.scoring import ScoringResult
from mempo.records.trajectory import Trajectory

__all__ = ["OBJECTIVE_REDUCES", "PER_OBJECTIVE", "REWARD_SPACES", "SCORED_OBJECTIVES", "RoundMemoryReward",
           "memory_rewards", "memory_rewards_of", "reward_gap", "round_memory_rewards"]

#: how one (mem, comparator) pair becomes a number; "prob" is the library default (the paper's)
REWARD_SPACES = ("prob", "log")
#: which objectives a round's reward averages over; "all" is the library default (the paper's)
SCORED_OBJECTIVES = ("all", "retrieved", "complete")
#: the scored_objectives values that score each objective apart (per-objective scoring results)
PER_OBJECTIVE = ("retrieved", "complete")
#: how the per-objective gaps of a round become one reward; "mean" is the library default
OBJECTIVE_REDUCES = ("mean", "min")


def memory_rewards(result: ScoringResult) -> list[float]:
    """``p_mem[r] - p_full[r]`` for every scored round of one scoring result (ValueError when the
    two lists differ in length)."""
    if len(result.p_mem) != len(result.p_full):
        raise ValueError(f"a scoring result has {len(result.p_mem)} p_mem values but {len(result.p_full)} p_full")
    # mem_reward[r] = P(answer | mem_ctx[r]) - P(answer | full_ctx[r])
    return [float(p_mem) - float(p_full) for p_mem, p_full in zip(result.p_mem, result.p_full)]


def memory_rewards_of(trajectories: Sequence[Trajectory], results: Sequence[ScoringResult]) -> list[list[float]]:
    """The memory rewards of each trajectory (``results[i]`` belongs to ``trajectories[i]``): a list
    per trajectory, one finite float per scored round. TypeError for a result that is not a
    `ScoringResult`; ValueError on a count mismatch or a non-finite reward."""
    if len(results) != len(trajectories):
        raise ValueError(f"{len(results)} scoring results for {len(trajectories)} trajectories")
    out = []
    for i, (trajectory, result) in enumerate(zip(trajectories, results)):
        if not isinstance(result, ScoringResult):
            raise TypeError(f"scoring result {i} is a {type(result).__name__}, "
                            "not a mempo.records.scoring.ScoringResult")
        rewards = memory_rewards(result)
        expected = len(trajectory.scored_rounds())
        if len(rewards) != expected:
            raise ValueError(f"trajectory {i} ({trajectory.uid}/{trajectory.sample_index}) has {expected} scored "
                             f"rounds but got {len(rewards)} memory rewards")
        if not all(math.isfinite(v) for v in rewards):
            raise ValueError(f"trajectory {i}: memory rewards must be finite, got {rewards}")
        out.append(rewards)
    return out


# ------------------------------------------------------------------------------------------------
# the definitions
# ------------------------------------------------------------------------------------------------
def reward_gap(p_mem: float, p_cmp: float, logp_mem: float, logp_cmp: float, reward: str = "prob",
               log_clip: float = 1.0) -> float:
    """gap of one (mem, comparator) pair: "prob" ``p_mem - p_cmp``; "log" ``clip(logp_mem - logp_cmp,
    -log_clip, log_clip)`` (mean gold log-probs; equal values, -inf and -inf included, give 0.0, so
    the result is finite). ValueError for another `reward` or a log_clip that is not > 0."""
    if reward == "prob":
        return float(p_mem) - float(p_cmp)
    if reward == "log":
        if not log_clip > 0 or not math.isfinite(log_clip):
            raise ValueError(f"log_clip must be a finite number > 0, got {log_clip!r}")
        if logp_mem == logp_cmp:
            return 0.0
        return min(max(float(logp_mem) - float(logp_cmp), -float(log_clip)), float(log_clip))
    raise ValueError(f"reward must be one of {REWARD_SPACES}, got {reward!r}")


@dataclass
class RoundMemoryReward:
    """The memory reward of one scored round and what it was computed from.

    round_index: `Round.index`. reward: mem_reward[r], or None when the round is not scored (no
    objective retrieved before it under scored_objectives "retrieved", not every one under
    "complete"). objectives: K_r, the objectives averaged over (all of them for "all").
    p_mem / p_cmp / logp_mem / logp_cmp: P and mean gold log-prob of the whole answer after mem_ctx /
    full_ctx.
    objective_*: the same per objective (empty lists unless scored per objective).
    """

    round_index: int
    reward: Optional[float]
    objectives: list[int]
    p_mem: float
    p_cmp: float
    logp_mem: float
    logp_cmp: float
    objective_p_mem: list[float] = field(default_factory=list)
    objective_p_cmp: list[float] = field(default_factory=list)
    objective_logp_mem: list[float] = field(default_factory=list)
    objective_logp_cmp: list[float] = field(default_factory=list)


def round_memory_rewards(trajectory: Trajectory, result: ScoringResult, retrieved: Optional[Sequence[Sequence[int]]],
                         *, scored_objectives: str = "all", reward: str = "prob",
                         log_clip: float = 1.0, objective_reduce: str = "mean") -> list[RoundMemoryReward]:
    """One `RoundMemoryReward` per scored round of `trajectory` (`Trajectory.scored_rounds`, in order).

    result: its `ScoringResult` (per-objective fields filled when scored_objectives is "retrieved" or
    "complete", `PER_OBJECTIVE`); retrieved: per scored round the objectives retrieved before it
    (`Trajectory.retrieved_objectives`), read for those two only. objective_reduce: "mean" or "min" of
    the per-objective gaps ("min" needs per-objective scoring: with "all" there is one gap). ValueError on
    an unknown name, a count mismatch, missing per-objective results or a non-finite reward.
    """
    if scored_objectives not in SCORED_OBJECTIVES:
        raise ValueError(f"scored_objectives must be one of {SCORED_OBJECTIVES}, got {scored_objectives!r}")
    if objective_reduce not in OBJECTIVE_REDUCES:
        raise ValueError(f"objective_reduce must be one of {OBJECTIVE_REDUCES}, got {objective_reduce!r}")
    if objective_reduce != "mean" and scored_objectives not in PER_OBJECTIVE:
        raise ValueError(f"objective_reduce {objective_reduce!r} reduces per-objective gaps: it needs "
                         f"scored_objectives 'retrieved' or 'complete', got {scored_objectives!r}")
    rounds = trajectory.scored_rounds()
    columns = (result.p_mem, result.p_full, result.mean_logp_mem, result.mean_logp_full)
    if any(len(c) != len(rounds) for c in columns):
        raise ValueError(f"trajectory {trajectory.uid}/{trajectory.sample_index} has {len(rounds)} scored rounds "
                         f"but its scoring result has {[len(c) for c in columns]} p_mem / p_full / mean_logp values")
    per_objective = scored_objectives in PER_OBJECTIVE
    if per_objective and (retrieved is None or len(retrieved) != len(rounds)
                          or len(result.objective_p_mem) != len(rounds)):
        raise ValueError(f"scored_objectives {scored_objectives!r} needs per-objective scoring results and the "
                         f"retrieved objectives of each of the {len(rounds)} scored rounds")
    every = list(range(len(objectives_from_golds(trajectory.golds))))
    out = []
    for k, round_ in enumerate(rounds):
        item = RoundMemoryReward(round_.index, None, [], result.p_mem[k], result.p_full[k], result.mean_logp_mem[k],
                                 result.mean_logp_full[k])
        if per_objective:
            item.objective_p_mem, item.objective_p_cmp = result.objective_p_mem[k], result.objective_p_full[k]
            item.objective_logp_mem = result.objective_mean_logp_mem[k]
            item.objective_logp_cmp = result.objective_mean_logp_full[k]
            seen = sorted(set(int(j) for j in retrieved[k]))
            # K_r: the retrieved objectives; "complete": all of them once every one is retrieved, else none
            item.objectives = seen if scored_objectives == "retrieved" else (every if seen == every else [])
            gaps = [reward_gap(item.objective_p_mem[j], item.objective_p_cmp[j], item.objective_logp_mem[j],
                               item.objective_logp_cmp[j], reward, log_clip) for j in item.objectives]
        else:
            item.objectives = every
            gaps = [reward_gap(item.p_mem, item.p_cmp, item.logp_mem, item.logp_cmp, reward, log_clip)]
        # mem_reward[r] = mean (or min) over j in K_r of gap_j(r); K_r empty: not scored (None)
        if not gaps:
            item.reward = None
        else:
            item.reward = min(gaps) if objective_reduce == "min" else sum(gaps) / len(gaps)
        if item.reward is not None and not math.isfinite(item.reward):
            raise ValueError(f"trajectory {trajectory.uid}/{trajectory.sample_index} round {round_.index}: the memory "
                             f"reward must be finite, got {item.reward}")
        out.append(item)
    return out
