"""A data-parallel training run of the tiny model, shared by the 1-process and 2-process actor tests.

``torchrun --nproc_per_node=2 tests/support/dist_worker.py OUT_DIR`` runs it on 2 ranks (FSDP2 on gloo);
`run(out_dir)` in a plain process runs it on one. Every rank trains on its own rows (rank r: rows
r, r + W, ...) of the same batch: 2 steps of (old log-probs, ppo_epochs=2 update with KL to the
initial policy), saves a checkpoint, takes a third step; then a freshly built actor loads the
checkpoint and takes the same third step. Rank 0 writes ``OUT_DIR/result.json``. With 2 ranks and
``micro_batch_tokens=24`` rank 0 runs 2 micro-batches and rank 1 runs 3 (one of them a row without
loss tokens), so rank 0 also runs a zero-weighted one.
"""
import json
import sys
from pathlib import Path
from typing import NamedTuple

import torch

from mempo.train.actor import Actor, init_distributed, shutdown_distributed
from mempo.train.checkpoint import load_checkpoint, save_checkpoint
from mempo.config import ActorConfig

VOCAB, ROWS, LENGTH = 128, 6, 14


def make_model(seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    config = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")


def make_batch():
    """6 rows of 14 tokens with right and left padding; response = the last part of each row."""
    g = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(0, VOCAB, (ROWS, LENGTH), generator=g)
    attention_mask = torch.ones(ROWS, LENGTH, dtype=torch.long)
    attention_mask[1, 10:] = 0
    attention_mask[2, 8:] = 0
    attention_mask[3, :4] = 0
    attention_mask[4, 7:] = 0
    response_mask = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
    response_mask[:, 6:] = True
    response_mask &= attention_mask.bool()
    response_mask[5, :] = False  # a row without loss tokens
    advantages = torch.randn(ROWS, LENGTH, generator=g)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "response_mask": response_mask}, advantages


def actor_config() -> ActorConfig:
    return ActorConfig(lr=1e-3, eps=1e-6, weight_decay=0.0, micro_batch_tokens=24, ppo_epochs=2, kl_coef=0.05,
                       loss_agg_mode="seq-mean-token-mean", clip_ratio_c=3.0, logprob_chunk_tokens=7)


def _local(tensor, rank, world):
    return tensor[rank::world]


def _step(actor, batch, advantages, ref):
    old = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"], response_mask=batch["response_mask"])
    return actor.update(batch, advantages, old.log_probs, ref)


class RankRun(NamedTuple):
    """This rank's part of the run: its rows of the batch, their advantages, the actor on model 0
    and the reference log-probs."""

    rank: int
    world: int
    actor: Actor
    batch: dict
    advantages: torch.Tensor
    ref: torch.Tensor


def setup_rank() -> RankRun:
    """Join the process group (a plain process: world 1) and build this rank's part of the run."""
    info = init_distributed()
    rank, world = info.rank, info.world_size
    full_batch, full_advantages = make_batch()
    batch = {k: _local(v, rank, world) for k, v in full_batch.items()}
    advantages = _local(full_advantages, rank, world)
    actor = Actor(make_model(0), actor_config())
    ref = actor.compute_log_probs(batch["input_ids"], batch["attention_mask"],
                                  response_mask=batch["response_mask"]).log_probs
    return RankRun(rank, world, actor, batch, advantages, ref)


def run(out_dir) -> dict:
    out_dir = Path(out_dir)
    rank, world, actor, batch, advantages, ref = setup_rank()
    metrics = [_step(actor, batch, advantages, ref) for _ in range(2)]
    save_checkpoint(out_dir / "ckpt", 2, actor.module, actor.optimizer, data_state={"rows": ROWS})
    third = _step(actor, batch, advantages, ref)
    restored = Actor(make_model(99), actor_config())
    state = load_checkpoint(out_dir / "ckpt", restored.module, restored.optimizer)
    third_restored = _step(restored, batch, advantages, ref)
    result = {"world": world, "metrics": metrics, "third": third, "third_restored": third_restored,
              "loaded_step": state.step}
    if rank == 0:
        (out_dir / "result.json").write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1])
    shutdown_distributed()  # after run(): its sharded actors are gone (see shutdown_distributed)
