"""Exploratory (issue 20): is the memory reward blind in the rounds whose `<mem>` still has a question
to search? In the scoring layout (question, this round's `<mem>`, the answer template) an SFT agent that
only ever answered with every `Q<j>:` line filled may go on as if to search whatever the memory holds.
From a `bench/bench_signal.py` run's saved rollouts at k: every scored round with a keeps label and a
retrieved objective, split by whether its `<mem>` has a pending line (`Q<j>: ?`); per part, the AUC
(keeps vs drops) of `retrieved_min_c10` (the library's scoring, `bench_signal.definition_rewards`) and
of its memory side alone (min_j max(l_mem_j, -10), no comparator), the median worst-objective gold
log-prob after mem_ctx for keeps / drops, and the model's most likely token where the first retrieved
objective's answer starts (a name, or the start of a search question such as " In").

    PYTHONPATH=. python bench/exploratory/pending_auc.py DEMO_OUT SIGNAL_RUN_DIR K

Results: docs/experiments/S3-pending-rounds-complete.md; outputs `pending_auc_k<K>.txt` in
bench/signal_runs/ex4_demo256/ (run on a copy of that folder's rollouts, the same files).
"""
import collections
import re
import statistics
import sys
from pathlib import Path

import torch

from saved_signal_run import b, load_saved_signal_run
from mempo.algo.contexts import build_objective_answer, mem_ctx_ids
from mempo.protocol.grammar import answer_template_text
from mempo.protocol.reward import objectives_from_golds

k = int(sys.argv[3])
cfg, tok, model, trajs, details = load_saved_signal_run(Path(sys.argv[1]), Path(sys.argv[2]), k=k)
template = answer_template_text(cfg.scoring.answer_template)
PENDING = re.compile(r"^Q\d+:\s*\?\s*$", re.M)


def first_answer_top1(t, rnd, objective):
    """The model's most likely token where `objective`'s gold starts in the scored answer after mem_ctx."""
    answer_ids, labels = build_objective_answer(tok, [a[0] for a in objectives_from_golds(t.golds)], template)
    at = labels.index(objective)
    ids = mem_ctx_ids(t, rnd) + answer_ids[:at]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return tok.decode([int(logits.argmax())])


parts = collections.defaultdict(list)  # part -> (reward, nocmp, worst l_mem, keep, top1)
for t, rounds in zip(trajs, details):
    keeps = t.memory_keeps(tok) or [None] * len(rounds)
    for rnd, item, keep in zip(t.scored_rounds(), rounds, keeps):
        if keep is None or not item.objectives or item.reward is None:
            continue
        mem_text = tok.decode(t.response_ids[rnd.mem_span[0]:rnd.mem_span[1]])
        part = "pending" if PENDING.search(mem_text) else "complete"
        worst = min(item.objective_logp_mem[j] for j in item.objectives)
        row = (item.reward, max(worst, -10.0), worst, bool(keep), first_answer_top1(t, rnd, min(item.objectives)))
        parts[part].append(row)
        parts["all"].append(row)

lines = [f"k = {k}: {sys.argv[2]} (model {sys.argv[1]}/model_sft); retrieved_min_c10",
         "| part | rounds | keeps / drops | AUC retrieved_min_c10 | AUC no comparator "
         "| median worst l_mem keeps / drops | top-1 tokens where the first retrieved answer starts |",
         "|---|---|---|---|---|---|---|"]
for part in ("all", "complete", "pending"):
    rows = parts.get(part, [])
    if not rows:
        continue
    labels = [r[3] for r in rows]
    auc_r, auc_n = (b.auc([r[i] for r in rows], labels) for i in (0, 1))

    def med(values):
        return f"{statistics.median(values):.2f}" if values else "n/a"
    top = collections.Counter(r[4] for r in rows).most_common(3)
    lines.append(f"| {part} | {len(rows)} | {sum(labels)} / {len(labels) - sum(labels)} | "
                 f"{'n/a' if auc_r is None else f'{auc_r:.3f}'} | {'n/a' if auc_n is None else f'{auc_n:.3f}'} | "
                 f"{med([r[2] for r in rows if r[3]])} / {med([r[2] for r in rows if not r[3]])} | "
                 + ", ".join(f"{tok_!r} {n / len(rows):.2f}" for tok_, n in top) + " |")
print("\n".join(lines))
