"""Exploratory (issue 20): does the answer round read its own `<mem>`? From a `bench/bench_signal.py`
run's saved rollouts at k: in each trajectory that answered, every objective retrieved before its last
scored round (the answer round), by whether that round's `<mem>` kept the objective's gold and whether
the answer got the objective right. If the answer were read from the prompt (the previous `<mem>` and
the last search result), a dropped objective would be answered right as often as a kept one.

    PYTHONPATH=. python bench/exploratory/answer_reads.py MODEL_DIR ROLLOUTS_JSONL K

Results: docs/experiments/S4-k4-keeping-memories.md.
"""
import collections
import sys

from mempo.model.loading import pretrained_tokenizer
from mempo.protocol.grammar import extract_solution
from mempo.protocol.reward import em_check, memory_keeps, objectives_from_golds, retrieved_objectives, split_answer
from mempo.records.trajectory import read_trajectories_jsonl
from mempo.utils.tokens import decode_ids

tokenizer = pretrained_tokenizer(sys.argv[1])
k = int(sys.argv[3])
counts = collections.Counter()
for t in read_trajectories_jsonl(sys.argv[2]):
    answer = extract_solution(t.response_text(tokenizer))
    if answer is None or not t.scored_rounds():
        continue
    last = t.scored_rounds()[-1]
    seen = t.read_before_scored(tokenizer)[-1]
    mem = decode_ids(tokenizer, t.response_ids[last.mem_span[0]:last.mem_span[1]])
    objectives = objectives_from_golds(t.golds)
    parts = split_answer(answer, len(objectives))
    for j in retrieved_objectives(seen, t.golds):
        kept = memory_keeps(mem, seen, [objectives[j]])  # this objective alone: is its gold in the <mem>?
        counts[(kept, em_check(parts[j], objectives[j]))] += 1
for kept in (True, False):
    n = counts[(kept, True)] + counts[(kept, False)]
    print(f"k={k}: objectives {'kept' if kept else 'dropped'} by the answer round's <mem>: {n}, answered right "
          f"{counts[(kept, True)]} ({counts[(kept, True)] / max(n, 1):.2f})")
