"""Exploratory, after E9's gate rows of seeds 2-3 (not part of its protocol; it changes nothing in it): in a recipe's
SFT trajectories, by the number of objectives and the answer's position, how often its item is in the last
`<mem>` and how often it is a gold (the oracle drops some facts on purpose and then answers ``unknown``). Asks whether
the SFT data teaches the first position anything the others are not taught, since some gate models never copy there
(bench/learning_runs9/answer_positions.txt). No training, no evaluation:

    PYTHONPATH=. python bench/learning_runs9/sft_answer_positions.py configs/demo_k8_e9.yaml \
        > bench/learning_runs9/smoke/sft_answer_positions_e9.txt
"""
import sys
from collections import Counter
from pathlib import Path

from names_written import sft_data

from mempo.protocol.grammar import last_mem
from mempo.protocol.reward import split_answer


def main(argv):
    cold = sft_data(Path(argv[0])).cold
    items, in_mem, right = Counter(), Counter(), Counter()  # by (objectives, answer position)
    for trajectory in cold.trajectories:
        memory = last_mem(r.assistant for r in trajectory.rounds)
        if memory is None or trajectory.final_answer is None:
            continue
        k = len(trajectory.golds)
        for position, (item, golds) in enumerate(zip(split_answer(trajectory.final_answer, k), trajectory.golds),
                                                 start=1):
            items[k, position] += 1
            in_mem[k, position] += item is not None and item in memory
            right[k, position] += item in golds
    print(f"{argv[0]}: {len(cold.trajectories)} trajectories; by objectives k, per answer position: the share whose "
          f"item is in the last <mem>, the share that is a gold")
    for k in sorted({k for k, _ in items}):
        positions = range(1, k + 1)
        print(f"k = {k}: {items[k, 1]} answers; in the last <mem> "
              f"{[round(in_mem[k, p] / items[k, p], 2) for p in positions]}; a gold "
              f"{[round(right[k, p] / items[k, p], 2) for p in positions]}")


if __name__ == "__main__":
    main(sys.argv[1:])
