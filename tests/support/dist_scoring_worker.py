"""Teacher scoring on the sharded actor (tests/test_scoring.py), under torchrun (FSDP2 on gloo):

``torchrun --nproc_per_node=2 tests/support/dist_scoring_worker.py OUT_DIR``

Every rank builds the same tiny Qwen2, keeps a whole copy and shards the other (`Actor`). Rank r
scores its own requests (rank 0: three trajectories under a small token budget, so many forwards;
rank 1: one short trajectory, then none at all) with every method inside
`Actor.sharded_inference`, and the same requests on its whole copy in one process. Before each of
its forwards every decoder layer must be sharded again (no layer stays gathered). Each rank writes
``OUT_DIR/rank<r>.json``: per case, the largest |P difference| against the whole copy, its own
forwards and the lockstep's rounds.
"""
import json
import random
import sys
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from mempo.config import ActorConfig
from mempo.records.scoring import ScoredRound, ScoringRequest
from mempo.scoring import METHODS, ScoringStats, score
from mempo.train.actor import Actor, init_distributed, shutdown_distributed

VOCAB = 97


def make_model():
    import transformers

    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                                      max_position_embeddings=512)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)  # peaked distributions: P values far from 0
    return model


def make_requests(count: int, seed: int) -> list[ScoringRequest]:
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        sequence = [rng.randrange(VOCAB) for _ in range(rng.randint(40, 90))]
        ends = sorted(rng.sample(range(10, len(sequence)), 3))
        rounds = [ScoredRound(end, sequence[:6] + [rng.randrange(VOCAB) for _ in range(rng.randint(2, 8))])
                  for end in ends]
        answer = [rng.randrange(VOCAB) for _ in range(6)]
        requests.append(ScoringRequest(sequence, rounds, answer, [0, 1, 1, 0, 1, 1]))
    return requests


def main(out_dir: Path) -> None:
    info = init_distributed()
    rank = info.rank
    whole = make_model().eval()
    actor = Actor(make_model(), ActorConfig(), trainable=False)
    layers = [m for m in actor.module.modules() if type(m).__name__ == "Qwen2DecoderLayer"]
    cases = {"rank0-many-rank1-one": make_requests(3, 10) if rank == 0 else make_requests(1, 20),
             "rank1-none": make_requests(2, 30) if rank == 0 else []}
    result = {}
    for case, requests in cases.items():
        for method in METHODS:
            for fused in (None, False):
                rounds = {"lockstep": 0}
                with actor.sharded_inference() as (model, lockstep):
                    def counted(has_forward: bool) -> bool:
                        rounds["lockstep"] += 1
                        sharded = all(isinstance(p, DTensor) for layer in layers for p in layer.parameters())
                        assert sharded, f"{case} {method}: a decoder layer stayed gathered between forwards"
                        return lockstep(has_forward)

                    stats = ScoringStats()
                    got = score(model, requests, method, threshold=None, token_budget=96, fused=fused,
                                stats=stats, lockstep=counted)
                want = score(whole, requests, method, threshold=None, token_budget=96, fused=fused)
                diff = max((abs(a - b) for g, w in zip(got, want)
                            for a, b in zip(g.p_full + g.p_mem, w.p_full + w.p_mem)), default=0.0)
                result[f"{case}/{method}/fused={fused}"] = {
                    "max_diff": diff, "forwards": stats.forwards, "lockstep_calls": rounds["lockstep"],
                    "p_min": min((p for g in got for p in g.p_full + g.p_mem), default=None)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]))
    shutdown_distributed()
