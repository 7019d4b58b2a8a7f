"""One leg of the resharding test (tests/train/test_sharded.py), in one process or under torchrun
(FSDP2 on gloo): ``OUT_DIR/job.json`` says what to do, in order:

First the actor is built as the trainer builds it (rank 0's weights, the others on the meta device,
shards broadcast from rank 0) and rank 0 writes ``OUT_DIR/initial.json``: how many of its tensors
(and buffers) equal the model's built in one process. Then:

* ``load``: a checkpoint to load into a fresh actor, then compare its full model and optimiser
  state with the full state saved in ``expect`` (rank 0 writes ``OUT_DIR/compare.json``: the
  names of every tensor that differs, and how many were compared);
* ``save_background``: a checkpoint root: start a background checkpoint of the state as it is
  now (`start_checkpoint`, under torch.distributed on its own gloo group; a start without that
  group must be refused), publish it after the ``train`` update below, so its writes overlap the
  update's collectives and it must hold the state of its start;
* ``train``: take one update step on this rank's rows;
* ``save``: a checkpoint root to save to, and ``save_full``: where rank 0 writes the full state
  (``torch.save`` of ``{"model", "optimizer"}``) that the next leg compares against.
"""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mempo.config import ActorConfig
from mempo.train.actor import Actor, init_distributed, shutdown_distributed
from mempo.train.checkpoint import (load_checkpoint, model_state_dict, optimizer_state_dict, save_checkpoint,
                                    start_checkpoint)
from support.dist_worker import make_batch, make_model


def _actor(rank: int, distributed: bool) -> Actor:
    """The actor on model 3; under torch.distributed built as the trainer builds it: rank 0 holds the
    weights, the other ranks a meta model that receives its shards from rank 0."""
    if rank == 0:
        model = make_model(3)
    else:
        with torch.device("meta"):
            model = make_model(3)
    return Actor(model, ActorConfig(lr=1e-2, kl_coef=0.0, weight_decay=0.1, micro_batch_tokens=None),
                 broadcast_from_rank0=distributed)


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
    actor = _actor(info.rank, info.distributed)
    initial = model_state_dict(actor.module)  # rank 0 (collective): equal to model 3, buffers too
    if info.rank == 0:
        reference = make_model(3)
        same = [k for k, v in reference.state_dict().items() if torch.equal(initial[k], v)]
        buffers = [n for n, b in actor.module.named_buffers() if torch.equal(b, dict(reference.named_buffers())[n])]
        (out_dir / "initial.json").write_text(json.dumps({"same": len(same), "of": len(reference.state_dict()),
                                                          "buffers": len(buffers)}))
    if job.get("load"):
        load_checkpoint(job["load"], actor.module, actor.optimizer, restore_rng=False)
        state = full_state(actor)
        if info.rank == 0:
            bad, count = differences(state, torch.load(job["expect"], weights_only=True))
            (out_dir / "compare.json").write_text(json.dumps({"different": bad, "compared": count,
                                                              "world": info.world_size}))
    pending = None
    if job.get("save_background"):
        group = None
        if info.distributed:
            try:
                start_checkpoint(job["save_background"], 1, actor.module, actor.optimizer, background=True)
                raise AssertionError("a background checkpoint without its own group was not refused")
            except ValueError as error:
                assert "needs process_group" in str(error)
            group = dist.new_group(backend="gloo")
        pending = start_checkpoint(job["save_background"], 1, actor.module, actor.optimizer, background=True,
                                   process_group=group)
    if job.get("train"):
        batch, advantages = make_batch()
        rows = {k: v[info.rank::info.world_size] for k, v in batch.items()}
        actor.update(rows, advantages[info.rank::info.world_size])
    if pending is not None:
        pending.publish()
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
