"""Execution 5's table (docs/experiments/E5-ablation-execution-5.md): per arm EM at k = 2 and 4 over the finished
seeds, the paired differences the protocol names (each arm - grpo; complete - retrieved), and the shares of
<mem> blocks keeping every retrieved fact and prompt tokens, which show how an arm's agent changed.

    python bench/learning_runs5/summary.py [RUNS_DIR]

RUNS_DIR: the folder of run files (default this one; execution 6's has the same arms: bench/learning_runs6).
"""
import json
import math
import statistics
import sys
from pathlib import Path

HERE = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent
ARMS = ("grpo", "mempo_complete_min_c10", "mempo_retrieved_min_c10")
PAIRS = (("mempo_complete_min_c10", "grpo"), ("mempo_retrieved_min_c10", "grpo"),
         ("mempo_complete_min_c10", "mempo_retrieved_min_c10"))


def mean_se(values):
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return statistics.mean(values), se


def main():
    seeds = sorted(int(p.stem.rsplit("_s", 1)[1]) for p in HERE.glob("grpo_s*.json"))
    seeds = [s for s in seeds if all((HERE / f"{a}_s{s}.json").exists() for a in ARMS)]  # complete triples
    runs = {a: {s: json.loads((HERE / f"{a}_s{s}.json").read_text()) for s in seeds} for a in ARMS}
    sft = json.loads((HERE / "sft.json").read_text())["rows"]
    print(f"seeds with all three arms: {seeds}\n")
    print("| arm | k | EM (mean ± SE) | per seed | keeps | prompt tokens |")
    print("|---|---|---|---|---|---|")
    for k in ("2", "4"):
        print(f"| sft | {k} | {sft[k]['em']:.3f} | | {sft[k]['memory_keeps']:.3f} | "
              f"{sft[k]['prompt_tokens_per_episode']:.0f} |")
        for arm in ARMS:
            em = [runs[arm][s]["rows"][k]["em"] for s in seeds]
            keeps = statistics.mean(runs[arm][s]["rows"][k]["memory_keeps"] for s in seeds)
            tokens = statistics.mean(runs[arm][s]["rows"][k]["prompt_tokens_per_episode"] for s in seeds)
            m, se = mean_se(em)
            print(f"| {arm} | {k} | {m:.3f} ± {se:.3f} | {' / '.join(f'{x:.3f}' for x in em)} | {keeps:.3f} | "
                  f"{tokens:.0f} |")
    print("\n| paired difference | k | mean ± SE | SE units | per seed |")
    print("|---|---|---|---|---|")
    for a, b in PAIRS:
        for k in ("2", "4"):
            d = [runs[a][s]["rows"][k]["em"] - runs[b][s]["rows"][k]["em"] for s in seeds]
            m, se = mean_se(d)
            print(f"| {a} - {b} | {k} | {m:+.3f} ± {se:.3f} | {m / se:+.1f} | {' / '.join(f'{x:+.3f}' for x in d)} |")
    for arm in ARMS:
        secs = [runs[arm][s]["rl_seconds"] for s in seeds]
        print(f"{arm}: RL seconds mean {statistics.mean(secs):.0f}")


if __name__ == "__main__":
    main()
