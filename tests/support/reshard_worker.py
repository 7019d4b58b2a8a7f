"""One leg of the resharding test (tests/train/test_sharded.py), in one process or under torchrun
(FSDP2 on gloo): ``OUT_DIR/job.json`` says what to do, in order:

* ``load``: a checkpoint to load into a fresh actor, then compare its full model and optimiser
  state with the full state saved in ``expect`` (rank 0 writes ``OUT_DIR/compare.json``: the
  names of every tensor that differs, and how many were compared);
* ``train``: take one update step on this rank's rows;
* ``save``: a checkpoint root to save to, and ``save_full``: where rank 0 writes the full state
  (``torch.save`` of ``{"model", "optimizer"}``) that the next leg compares against.
"""
import json
import sys
from pathlib import Path

import torch

from mempo.config import ActorConfig
from mempo.train.actor import Actor, init_distributed, shutdown_distributed
from mempo.train.checkpoint import load_checkpoint, model_state_dict, optimizer_state_dict, save_checkpoint
from support.dist_worker import make_batch, make_model


def _actor() -> Actor:
    return Actor(make_model(3), ActorConfig(lr=1e-2, kl_coef=0.0, weight_decay=0.1, micro_batch_tokens=None))


def full_state(actor: Actor) -> dict:
    """{"model", "optimizer"} full states on CPU (collective; rank 0 receives them)."""
    return {"model": model_state_dict(actor.module), "optimizer": optimizer_state_dict(actor.module, actor.optimizer)}


def differences(got: dict, expected: dict) -> tuple[list[str], int]:
    """Names of the tensors (and hyperparameters) of two full states that are not equal; how many
    tensors were compared."""
    bad, count = [], 0
    for name, tensor in expected["model"].items():
        count += 1
        if name not in got["model"] or not torch.equal(got["model"][name], tensor):
            bad.append(f"model {name}")
    for name, entries in expected["optimizer"]["state"].items():
        for entry, tensor in entries.items():
            count += 1
            other = got["optimizer"]["state"].get(name, {}).get(entry)
            if other is None or not torch.equal(torch.as_tensor(other), torch.as_tensor(tensor)):
                bad.append(f"optimizer {name}.{entry}")
    for a, b in zip(expected["optimizer"]["param_groups"], got["optimizer"]["param_groups"]):
        if {k: v for k, v in a.items() if k != "params"} != {k: v for k, v in b.items() if k != "params"}:
            bad.append("optimizer param_groups")
    return bad, count


def run(out_dir: Path) -> None:
    info = init_distributed()
    job = json.loads((out_dir / "job.json").read_text())
    actor = _actor()
    if job.get("load"):
        load_checkpoint(job["load"], actor.module, actor.optimizer, restore_rng=False)
        state = full_state(actor)
        if info.rank == 0:
            bad, count = differences(state, torch.load(job["expect"], weights_only=True))
            (out_dir / "compare.json").write_text(json.dumps({"different": bad, "compared": count,
                                                              "world": info.world_size}))
    if job.get("train"):
        batch, advantages = make_batch()
        rows = {k: v[info.rank::info.world_size] for k, v in batch.items()}
        actor.update(rows, advantages[info.rank::info.world_size])
    if job.get("save"):
        save_checkpoint(job["save"], 1, actor.module, actor.optimizer)
        state = full_state(actor)
        if info.rank == 0:
            torch.save(state, job["save_full"])
    del actor


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(Path(sys.argv[1]))
    shutdown_distributed()
