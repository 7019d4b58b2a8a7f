"""Exploratory (after execution 5's results; no rule): how each run's rollouts changed during RL. Per arm and
seed, the mean over the first and the last 6 RL steps of turns per episode and of the mean memory reward
(`memory/reward`, the scored rounds' reward before pooling; computed in every arm, weight 0 in grpo).

    python bench/learning_runs5/metrics_summary.py [RUNS_DIR]     (execution 6: bench/learning_runs6)
"""
import json
import statistics
import sys
from pathlib import Path

HERE = (Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent) / "metrics"
ARMS = ("grpo", "mempo_complete_min_c10", "mempo_retrieved_min_c10")


def window(rows, key, part):
    values = [r[key] for r in (rows[:6] if part == "first" else rows[-6:]) if key in r]
    return statistics.mean(values)


def main():
    print("| arm | seed | turns, first -> last 6 steps | memory reward, first -> last 6 steps |")
    print("|---|---|---|---|")
    for arm in ARMS:
        for path in sorted(HERE.glob(f"{arm}_s*.jsonl")):
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            seed = path.stem.rsplit("_s", 1)[1]
            t0, t1 = window(rows, "rollout/turns", "first"), window(rows, "rollout/turns", "last")
            m0, m1 = window(rows, "memory/reward", "first"), window(rows, "memory/reward", "last")
            print(f"| {arm} | {seed} | {t0:.2f} -> {t1:.2f} | {m0:+.2f} -> {m1:+.2f} |")


if __name__ == "__main__":
    main()
