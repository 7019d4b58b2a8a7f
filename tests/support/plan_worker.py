"""The planner's model-state check (tests/train/test_plan.py), in one process or under torchrun
(FSDP2 on gloo): for each of three builtin-tiny configs, build the actor as the trainer does, take
one update step, and count the bytes torch holds on this rank for parameters, gradients and
optimiser state (the storage of each local shard, FSDP2's padding included); rank 0 writes
``OUT_DIR/model_state.json``: {config name: {"measured": bytes (max over ranks), "predicted": bytes}}."""
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from mempo.config import load_config
from mempo.model.loading import build_causal_lm
from mempo.train.actor import Actor, init_distributed, shutdown_distributed
from mempo.train.plan import model_shape, model_state_bytes

CONFIGS = {  # name -> overrides of configs/tiny.yaml
    "tiny-64x2": ["model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2"],
    "wide-256x2": ["model.hidden_size=256", "model.intermediate_size=704", "model.num_hidden_layers=2",
                   "model.num_attention_heads=8", "model.num_key_value_heads=2"],
    "deep-96x6": ["model.hidden_size=96", "model.intermediate_size=256", "model.num_hidden_layers=6",
                  "model.num_attention_heads=6", "model.num_key_value_heads=3"],
}
VOCAB = 1000


def _storages(tensors) -> int:
    """Bytes of the distinct storages under `tensors` (FSDP2's gradients are views of one
    reduce-scatter output per layer group: counted once)."""
    seen = {}
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def measure(name: str, overrides: list, rank: int, distributed: bool) -> tuple[int, int]:
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml",
                      [*overrides, f"model.vocab_size={VOCAB}", "actor.kl_coef=0", "actor.micro_batch_tokens=null"])
    torch.manual_seed(0)
    model = build_causal_lm(cfg.model, on_meta=distributed and rank != 0)
    actor = Actor(model, cfg.actor, broadcast_from_rank0=distributed)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(rank))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[:, 0] = False
    actor.update({"input_ids": ids, "response_mask": mask}, torch.randn(2, 12))
    params = list(actor.module.parameters())
    held = _storages(params) + _storages([p.grad for p in params if p.grad is not None])
    held += _storages([v for state in actor.optimizer.state.values() for v in state.values()
                       if torch.is_tensor(v) and v.dim() > 0])
    world = dist.get_world_size() if distributed else 1
    predicted = model_state_bytes(model_shape(cfg, VOCAB), world, 4)
    if distributed:
        total = torch.tensor([held])
        dist.all_reduce(total, op=dist.ReduceOp.MAX)
        held = int(total.item())
    del actor
    return held, predicted


def run(out_dir: Path) -> dict:
    info = init_distributed()
    result = {}
    for name, overrides in CONFIGS.items():
        measured, predicted = measure(name, overrides, info.rank, info.distributed)
        result[name] = {"measured": measured, "predicted": predicted, "world": info.world_size}
    if info.rank == 0:
        (out_dir / "model_state.json").write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(Path(sys.argv[1]))
    shutdown_distributed()
