"""Exploratory, after E9's gate rows of seeds 2-3 (not part of its protocol; it changes nothing in it): in a recipe's
SFT trajectories, by the number of objectives and the answer's position, how often its item is in the last
`<mem>` and how often it is a gold (the oracle drops some facts on purpose and then answers ``unknown``). Asks whether
the SFT data teaches the first position anything the others are not taught, since some gate models never copy there
(bench/learning_runs9/answer_positions.txt). No training, no evaluation:

    PYTHONPATH=. python bench/learning_runs9/sft_answer_positions.py configs/demo_k8_e9.yaml \
        > bench/learning_runs9/smoke/sft_answer_positions_e9.txt
"""
import re
import sys
from collections import Counter
from pathlib import Path

from mempo.apps.tasks import synthetic_task
from mempo.config import load_config
from mempo.eval import held_out_of_training

MEM = re.compile(r"<mem>(.*?)</mem>", re.S)
ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)


def main(argv):
    cfg = load_config(Path(argv[0]), [])
    task = synthetic_task(cfg)
    env = task.build(cfg)
    cold = task.cold_start(cfg, env, held_out_of_training(env.world, cfg))
    items, in_mem, right = Counter(), Counter(), Counter()  # by (objectives, answer position)
    for trajectory in cold.trajectories:
        mems = [m for r in trajectory.rounds for m in MEM.findall(r.assistant)]
        answer = ANSWER.search(trajectory.rounds[-1].assistant)
        if not mems or not answer:
            continue
        k = len(trajectory.golds)
        for position, (item, golds) in enumerate(zip(answer.group(1).split(";"), trajectory.golds), start=1):
            items[k, position] += 1
            in_mem[k, position] += item.strip() in mems[-1]
            right[k, position] += item.strip() in golds
    print(f"{argv[0]}: {len(cold.trajectories)} trajectories; by objectives k, per answer position: the share whose "
          f"item is in the last <mem>, the share that is a gold")
    for k in sorted({k for k, _ in items}):
        positions = range(1, k + 1)
        print(f"k = {k}: {items[k, 1]} answers; in the last <mem> "
              f"{[round(in_mem[k, p] / items[k, p], 2) for p in positions]}; a gold "
              f"{[round(right[k, p] / items[k, p], 2) for p in positions]}")


if __name__ == "__main__":
    main(sys.argv[1:])
