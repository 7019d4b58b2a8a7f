"""Exploratory, after E9's first gate rows (not part of its protocol; it changes nothing in it): what values an SFT
model writes into its `<mem>` fact lines, whether its last `<mem>` holds each question's gold, and, by the answer's
position, how often the answer is right, how often it is wrong though that `<mem>` held the gold and how often it is
a value the episode's search results hold (copied, right or not). Reads evaluation trajectories (the `mempo eval` line
in bench/learning_runs8/name_probe.py's docstring, or the gate's, scratch/ex9/sft_episodes/*.jsonl):

    python bench/learning_runs9/memory_values_probe.py OUT/s0k2_trajectories.jsonl ...
"""
import json
import re
import sys
from collections import Counter
from pathlib import Path

MEM = re.compile(r"<mem>(.*?)</mem>", re.S)
VALUE = re.compile(r"(?:studied at|in the city of) (\w+)\.")  # the world's two fact sentences, as `<mem>` copies them


def main(argv):
    for path in argv:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        kept = questions = 0
        written, right, lost, copied = Counter(), Counter(), Counter(), Counter()  # by answer position
        for row in rows:
            retrieved = " ".join(turn["tool_result"] or "" for turn in row["rounds"])
            mems = [m.group(1) for m in (MEM.search(turn["assistant"]) for turn in row["rounds"]) if m]
            last = mems[-1] if mems else ""
            predictions = list(row["predictions"] or []) + [""] * len(row["golds"])
            for position, (golds, predicted) in enumerate(zip(row["golds"], predictions), start=1):
                questions += 1
                in_mem = any(gold in last for gold in golds)
                kept += in_mem
                right[position] += predicted in golds
                lost[position] += in_mem and predicted not in golds
                copied[position] += bool(predicted) and predicted in retrieved
            written.update(v for mem in mems for v in VALUE.findall(mem))
        print(f"{path}: {len(rows)} episodes; the last <mem> holds the gold for {kept} of {questions} questions; "
              f"{len(written)} distinct values written, most often {written.most_common(3)}; by answer position, right "
              f"{[right[p] for p in sorted(right)]}, wrong though the last <mem> held the gold "
              f"{[lost[p] for p in sorted(lost)]}, a value the search results hold "
              f"{[copied[p] for p in sorted(copied)]}")


if __name__ == "__main__":
    main(sys.argv[1:])
