"""A training step's metrics over the whole run, not one rank: under torch.distributed each rank
rolls out and scores its own questions, so its means are its own; `reduce_run_metrics` turns them
into the run's (one all-reduce of weighted sums, one of maxima).

How each metric is reduced (a metric named nowhere here keeps this rank's value):

* means over the run's trajectories, scored rounds, ``<mem>`` blocks or loss tokens
  (`MEAN_WEIGHTS`: the metric and the count it averages over), weighted by each rank's count;
* counts summed over ranks (`SUMMED`);
* seconds: the slowest rank's (the ranks wait for each other at every collective), and
  ``perf/tokens_per_s`` the run's tokens over the slowest rank's step time;
* the actor's update metrics (``actor/``) are global already (`mempo.train.actor.Actor.update`).
"""
from __future__ import annotations

from typing import Mapping

import torch
import torch.distributed as dist

from mempo.train import metric_names as names

__all__ = ["MEAN_WEIGHTS", "SUMMED", "reduce_run_metrics"]

#: metric -> the count (a key of `reduce_run_metrics`'s `weights`) its rank value is a mean over
MEAN_WEIGHTS = {
    names.REWARD: "trajectories", names.EM: "trajectories", names.F1: "trajectories",
    names.FORMAT_RATE: "trajectories", "rollout/turns": "trajectories", "rollout/response_length": "trajectories",
    "rollout/generated_tokens": "trajectories", "rollout/answered_rate": "trajectories",
    names.MEM_REWARD: "scored_rounds", names.P_MEM: "scored_rounds", names.P_FULL: "scored_rounds",
    names.MEM_KEEPS: "memory_blocks", "adv/mean": "loss_tokens", "adv/abs_mean_mem": "memory_tokens",
    "adv/groups_with_variance": "trajectories",
}
#: counts: summed over ranks
SUMMED = ("rollout/tool_calls", "rollout/tool_errors", "memory/scored_rounds", "memory/unscored_rounds",
          "memory/keeps_blocks", "adv/loss_tokens", "adv/memory_tokens", "train/rows", names.TOKENS)


def reduce_run_metrics(metrics: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, float]:
    """The run's values of a step's `metrics` (this rank's), by the rules above. weights: this
    rank's counts by name (``trajectories``, ``scored_rounds``, ``memory_blocks``, ``loss_tokens``,
    ``memory_tokens``). A mean no rank has a value for (e.g. no ``<mem>`` block anywhere) is left
    out. Collective: every rank calls it once per step with the same metric names in its reach
    (missing ones count as absent). One process: `metrics` unchanged."""
    out = dict(metrics)
    if not (dist.is_available() and dist.is_initialized()):
        return out
    means = list(MEAN_WEIGHTS)
    packed = []
    for key in means:
        present = key in metrics
        weight = float(weights.get(MEAN_WEIGHTS[key], 0.0)) if present else 0.0
        packed += [weight * float(metrics[key]) if present else 0.0, weight, 1.0 if present else 0.0]
    for key in SUMMED:
        packed += [float(metrics.get(key, 0.0)), 1.0 if key in metrics else 0.0]
    sums = torch.tensor(packed, dtype=torch.float64)
    slow_keys = sorted(k for k in metrics if k.startswith(names.TIME_PREFIX))
    slowest = torch.tensor([float(metrics[k]) for k in slow_keys], dtype=torch.float64)
    dist.all_reduce(sums)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    values = sums.tolist()
    for index, key in enumerate(means):
        total, weight, seen = values[3 * index: 3 * index + 3]
        if weight > 0:
            out[key] = total / weight
        elif seen:  # present somewhere, weight 0 everywhere (e.g. no loss tokens): this rank's value stays
            pass
        else:
            out.pop(key, None)
    offset = 3 * len(means)
    for index, key in enumerate(SUMMED):
        total, seen = values[offset + 2 * index: offset + 2 * index + 2]
        if seen:
            out[key] = total
    out.update(zip(slow_keys, slowest.tolist()))
    seconds = out.get(names.STEP_SECONDS, 0.0)
    if "perf/tokens_per_s" in out and names.TOKENS in out:
        out["perf/tokens_per_s"] = out[names.TOKENS] / seconds if seconds > 0 else 0.0
    return out
