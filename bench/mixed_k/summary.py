"""The table of docs/experiments/R1-mixed-k.md: per arm EM change from the SFT model, paired M - A, RL seconds."""
import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).parent
ARMS = {"A": "k2", "M": "k2_4"}
SEEDS = (0, 1, 2)


def mean_se(values):
    return statistics.mean(values), statistics.stdev(values) / math.sqrt(len(values))


def main():
    runs = {a: [json.loads((HERE / d / f"mempo_retrieved_min_c10_s{s}.json").read_text()) for s in SEEDS]
            for a, d in ARMS.items()}
    sft = json.loads((HERE / "k2" / "sft.json").read_text())
    sft_rows = sft.get("rows", sft)
    print("| k | SFT | A (k = 2) after RL | M ([2, 4]) after RL | M - A paired | per seed M - A |")
    print("|---|---|---|---|---|---|")
    for k in ("2", "4"):
        a = [r["rows"][k]["em"] for r in runs["A"]]
        m = [r["rows"][k]["em"] for r in runs["M"]]
        d = [x - y for x, y in zip(m, a)]
        (am, ase), (mm, mse), (dm, dse) = mean_se(a), mean_se(m), mean_se(d)
        print(f"| {k} | {sft_rows[k]['em']:.3f} | {am:.3f} ± {ase:.3f} | {mm:.3f} ± {mse:.3f} | "
              f"{dm:+.3f} ± {dse:.3f} ({dm / dse:+.1f} SE) | {' / '.join(f'{x:+.3f}' for x in d)} |")
    for arm, rs in runs.items():
        secs = [r["rl_seconds"] for r in rs]
        print(f"{arm}: RL seconds {' / '.join(f'{s:.0f}' for s in secs)} (mean {statistics.mean(secs):.0f})")


if __name__ == "__main__":
    main()
