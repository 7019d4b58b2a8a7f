"""mempo.train.run_metrics: a step's metrics over the whole run. Two gloo processes with unequal
shares (rank 0: 3 trajectories, rank 1: 1) give the weighted means, the summed counts and the
slowest rank's seconds that one process holding all four trajectories would report."""
import pytest

from mempo.train.run_metrics import reduce_run_metrics
from support.gloo import on_ranks

RANKS = [  # (metrics, weights) of each rank
    ({"reward/mean": 1.0, "memory/reward": 0.5, "memory/scored_rounds": 2.0, "rollout/tool_calls": 5.0,
      "time/step": 2.0, "train/tokens": 30.0, "perf/tokens_per_s": 15.0, "actor/loss": 0.25,
      "memory/keeps_facts": 1.0},
     {"trajectories": 3, "scored_rounds": 2, "memory_blocks": 1}),
    ({"reward/mean": 0.0, "memory/reward": 2.0, "memory/scored_rounds": 1.0, "rollout/tool_calls": 1.0,
      "time/step": 3.0, "train/tokens": 10.0, "perf/tokens_per_s": 3.3, "actor/loss": 0.25},
     {"trajectories": 1, "scored_rounds": 1, "memory_blocks": 0}),
]


def test_two_ranks_report_the_runs_values():
    results = on_ranks(reduce_run_metrics, RANKS)
    assert results[0] == results[1]
    run = results[0]
    assert run["reward/mean"] == pytest.approx(0.75)  # 3 of 4 trajectories scored 1
    assert run["memory/reward"] == pytest.approx((2 * 0.5 + 1 * 2.0) / 3)
    assert run["memory/scored_rounds"] == 3.0 and run["rollout/tool_calls"] == 6.0 and run["train/tokens"] == 40.0
    assert run["time/step"] == 3.0 and run["perf/tokens_per_s"] == pytest.approx(40.0 / 3.0)
    assert run["memory/keeps_facts"] == 1.0  # only rank 0 had a <mem> block
    assert run["actor/loss"] == 0.25  # global already: unchanged


def test_one_process_is_unchanged():
    metrics, weights = RANKS[0]
    assert reduce_run_metrics(metrics, weights) == metrics
