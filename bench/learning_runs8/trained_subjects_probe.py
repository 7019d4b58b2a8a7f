"""Exploratory, after execution 8's gate settled (not part of its protocol; it changes nothing in it): does an E8
SFT model fail only on the subjects the evaluation holds out? Greedy EM of one model at k = 2 and 8 on its own
validation split and on episodes whose every subject is one SFT questions may ask about (the recipe's world,
`mempo.synthetic.heldout.training_episodes`, question seed QUESTION_SEED, none of which any split uses), each
also closed book (a search that finds nothing: what the model answers from its weights alone).

    PYTHONPATH=. python bench/learning_runs8/trained_subjects_probe.py M [EPISODES]   # M: a scratch/ex8/models/ dir
"""
import sys
from pathlib import Path

import torch

from mempo.env.build import build_retriever
from mempo.eval import evaluate, validation_episodes
from mempo.synthetic.heldout import training_episodes
from probe_world import probe_world, sft_model

#: A question seed no split and no SFT draw of the recipe uses (theirs: `mempo.seeds`).
QUESTION_SEED = 90_210
KS = (2, 8)


def main(argv):
    model_dir, n = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 128
    torch.set_num_threads(1)
    cfg, world, held, _ = probe_world(model_dir / "config.yaml", ["eval.closed_book=true"])
    validation = validation_episodes(world, cfg, n, KS)
    episodes = {}
    for k in KS:
        episodes[("validation", k)] = validation[k]
        episodes[("trained subjects", k)] = training_episodes(world, k, n, QUESTION_SEED, held)
    retriever = build_retriever(cfg, world)
    model, tokenizer = sft_model(model_dir, cfg)
    report = evaluate(model, tokenizer, episodes, retriever, cfg, show_progress=False, label=model_dir.name)
    print(f"{model_dir}: {len(held)} held-out subjects; {n} episodes per cell; question seed {QUESTION_SEED}")
    for row in report.rows:
        print(f"{row.dataset:16s} k = {row.objectives}  {row.policy:18s} EM {row.em:.3f} ± {row.em_se:.3f}  "
              f"format {row.format_rate:.2f}  turns {row.mean_turns:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
