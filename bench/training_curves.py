"""The ablation's runs over training: per run, the means over its first and its last ``--window`` RL
steps of turns per episode, format rate and the share of judged ``<mem>`` blocks keeping every
retrieved gold, read from each run's ``metrics.jsonl`` in ``bench_learning.py``'s output; then per arm
the mean ± SE over the seeds. The run files kept under git hold training totals only; this reads the
per-step metrics, which stay in the output folder.

    python bench/training_curves.py --out scratch/ex3_out --json bench/learning_runs3/training_turns.json
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Optional, Sequence

from mempo.train.logging import read_metrics

# metric key in metrics.jsonl -> short name in the output
CURVES = {"rollout/turns": "turns", "reward/format_rate": "format_rate", "memory/keeps_facts": "keeps"}


def run_curves(metrics: Sequence[dict], window: int) -> dict[str, Optional[float]]:
    """``<name>_first`` and ``<name>_last``: the mean of the metric over the first / last `window`
    steps that logged it (None when none did)."""
    out: dict[str, Optional[float]] = {}
    for key, name in CURVES.items():
        values = [float(r[key]) for r in metrics if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
        out[f"{name}_first"] = statistics.fmean(values[:window]) if values else None
        out[f"{name}_last"] = statistics.fmean(values[-window:]) if values else None
    return out


def collect(out_dir: Path, window: int) -> dict[str, dict[str, Optional[float]]]:
    """``{"<arm>_s<seed>": run_curves(...)}`` for every ``<out>/<arm>/seed<s>/metrics.jsonl``."""
    runs = {}
    for path in sorted(out_dir.glob("*/seed*/metrics.jsonl")):
        arm, seed = path.parent.parent.name, path.parent.name[len("seed"):]
        runs[f"{arm}_s{seed}"] = run_curves(read_metrics(path), window)
    return runs


def markdown(runs: dict[str, dict[str, Optional[float]]], window: int) -> str:
    """Per arm (the run names' part before ``_s<seed>``): mean ± SE over its seeds of every column."""
    arms: dict[str, list[dict]] = {}
    for name, row in runs.items():
        arms.setdefault(name.rsplit("_s", 1)[0], []).append(row)
    columns = [f"{name}_{part}" for name in CURVES.values() for part in ("first", "last")]

    def cell(rows: list[dict], column: str) -> str:
        values = [r[column] for r in rows if r[column] is not None]
        if not values:
            return "-"
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else None
        return f"{statistics.fmean(values):.3f}" + (f" ± {se:.3f}" if se is not None else "")

    lines = ["| arm | seeds | " + " | ".join(c.replace("_first", f", first {window}")
                                              .replace("_last", f", last {window}") for c in columns) + " |",
             "|---|---|" + "---|" * len(columns)]
    for arm, rows in arms.items():
        lines.append(f"| {arm} | {len(rows)} | " + " | ".join(cell(rows, c) for c in columns) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="bench_learning.py's --out folder")
    parser.add_argument("--window", type=int, default=10, help="steps averaged at each end (default 10)")
    parser.add_argument("--json", type=Path, default=None, help="write the per-run values here")
    args = parser.parse_args(argv)
    if args.window < 1:
        parser.error(f"--window must be >= 1, got {args.window}")
    runs = collect(args.out, args.window)
    if not runs:
        print(f"{args.out}: no <arm>/seed<s>/metrics.jsonl", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    print(markdown(runs, args.window))
    return 0


if __name__ == "__main__":
    sys.exit(main())
