"""Exploratory, after execution 7's gate (not part of its protocol): does a longer copy warm-up form copying
on the recipe's SFT seeds whose 2,000-step warm-up did not (copy loss over the last 50 steps 0.31-0.33 against
0.15-0.21 on the seeds whose memories kept golds)? Runs the recipe's stages up to the copy warm-up only
(`tools/sft_seeds.py`'s `before_sft`: world, splits, teacher, tokenizer, model, warm-up), no SFT, no split read.

    PYTHONPATH=. python bench/learning_runs7/copy_probe.py --seeds 2 3 --warmup-steps 4000 --out FILE

One JSON line per (seed, warm-up steps) is appended to ``--out``; pairs already there are skipped.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import sft_seeds  # noqa: E402  (tools/ is not a package)

from mempo.apps import demo  # noqa: E402


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--warmup-steps", type=int, nargs="+", required=True)
    parser.add_argument("--config", type=Path, default=Path("configs/demo_k8.yaml"))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    done = set()
    if args.out.exists():
        done = {(r["seed"], r["copy_warmup_steps"]) for r in map(json.loads, args.out.read_text().splitlines())}
    threads = demo._set_threads(args.threads)
    for seed in args.seeds:
        for steps in args.warmup_steps:
            if (seed, steps) in done:
                continue
            began = time.perf_counter()
            cfg = sft_seeds.seed_config(seed, [f"synthetic.copy_warmup_steps={steps}"], args.config)
            losses = sft_seeds.before_sft(cfg).copy_losses
            row = {"seed": seed, "copy_warmup_steps": steps, "config": str(args.config), "threads": threads,
                   "copy_loss_first": round(losses[0], 3),
                   "copy_loss_last50": sft_seeds.tail_mean(losses),
                   "copy_loss_by_500": [sft_seeds.tail_mean(losses[:i + 50]) for i in range(0, len(losses), 500)],
                   "seconds": round(time.perf_counter() - began, 1), **sft_seeds.cpu_facts()}
            with args.out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
