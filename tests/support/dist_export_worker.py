"""The distributed export, shared by the 1-process and 2-process tests (tests/model/test_export.py).

``torchrun --nproc_per_node=2 tests/support/dist_export_worker.py OUT_DIR`` (tests/ on PYTHONPATH)
trains the tiny model of `support.dist_worker` for two steps, every rank on its own rows (FSDP2 on
gloo), exports it with `mempo.model.export.export_model` to ``OUT_DIR/model`` (what ``mempo train``
does at the end), and
then every rank loads the directory back and compares, parameter by parameter, the shard it holds
with the same shard of the loaded full tensor (`distribute_tensor` with the parameter's own
placements): a check of the written weights that does not go through the gather being tested.
`run(out_dir)` in a plain process does the same on one rank (the loaded tensor against the whole
parameter). Rank 0 writes ``OUT_DIR/result.json``: world size, per-rank mismatching names, and
the number of elements in the written safetensors.
"""
import json
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from support.dist_worker import ROWS, _step, setup_rank
from mempo.train.actor import shutdown_distributed
from mempo.model.export import export_model


def _shard_like(full: torch.Tensor, parameter) -> torch.Tensor:
    if hasattr(parameter, "to_local"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(parameter.device), parameter.device_mesh, parameter.placements).to_local()
    return full


def run(out_dir) -> dict:
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    out_dir = Path(out_dir)
    rank, world, actor, batch, advantages, ref = setup_rank()
    for _ in range(2):
        _step(actor, batch, advantages, ref)
    export_model(actor.module, None, out_dir / "model", provenance={"rows": ROWS})
    loaded = dict(AutoModelForCausalLM.from_pretrained(out_dir / "model").named_parameters())
    mismatched = []
    for name, parameter in actor.module.named_parameters():
        own = parameter.to_local() if hasattr(parameter, "to_local") else parameter
        if name not in loaded or not torch.equal(_shard_like(loaded[name].detach(), parameter), own.detach()):
            mismatched.append(name)
    everyone = [None] * world
    if dist.is_initialized():
        dist.all_gather_object(everyone, mismatched)
    else:
        everyone = [mismatched]
    elements = 0
    for path in sorted((out_dir / "model").glob("*.safetensors")):
        with safe_open(str(path), "pt") as handle:
            elements += sum(math.prod(handle.get_slice(key).get_shape()) for key in handle.keys())
    result = {"world": world, "mismatched": everyone, "elements": elements,
              "parameters": int(sum(p.numel() for p in actor.module.parameters()))}
    if rank == 0:
        (out_dir / "result.json").write_text(json.dumps(result))
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1])
    shutdown_distributed()  # after run(): its sharded actors are gone (see shutdown_distributed)
