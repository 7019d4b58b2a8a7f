"""Exploratory, after execution 8's gate settled (not part of its protocol; it changes nothing in it): are the input
embeddings of the people SFT never asked about as distinct as those of the people it did? For each E8 SFT model:
the mean norm of the one-id names' embeddings, held-out and trained, and their mean cosine to the trained names'
centroid (a held-out name near the common direction is harder to tell from another for a copying head).

    PYTHONPATH=. python bench/learning_runs8/name_embeddings_probe.py M [M ...]   # M: a scratch/ex8/models/ dir
"""
import sys
from pathlib import Path

import torch

from probe_world import probe_world, sft_model


def one_id_names(tokenizer, names):
    """The ids of the names that are one id after a space (as in the world's text); longer ones left out."""
    ids = [tokenizer(" " + name, add_special_tokens=False)["input_ids"] for name in names]
    return [i[0] for i in ids if len(i) == 1]


def main(argv):
    torch.set_num_threads(1)
    for model_dir in map(Path, argv):
        cfg, _, held, people = probe_world(model_dir / "config.yaml")
        model, tokenizer = sft_model(model_dir, cfg)
        emb = model.get_input_embeddings().weight.detach()
        held_ids = one_id_names(tokenizer, sorted(people & held))
        trained_ids = one_id_names(tokenizer, sorted(people - held))
        centroid = emb[trained_ids].mean(0, keepdim=True)
        for label, ids in (("held-out", held_ids), ("trained", trained_ids)):
            cos = torch.nn.functional.cosine_similarity(emb[ids], centroid).mean().item()
            print(f"{model_dir.name} {label:9s} {len(ids):5d} names: mean norm {emb[ids].norm(dim=1).mean():.3f}, "
                  f"mean cosine to the trained centroid {cos:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
