"""`support.dist_worker`'s data-parallel run with ``packing="packed"``: ``torchrun --nproc_per_node=2
tests/support/dist_packing_worker.py OUT_DIR`` (tests/ on PYTHONPATH: `support.dist.torchrun`) runs
the packed forward under FSDP2 (gloo) on 2 ranks."""
import dataclasses
import sys

import torch

from support import dist_worker

_padded_config = dist_worker.actor_config
dist_worker.actor_config = lambda: dataclasses.replace(_padded_config(), packing="packed")

if __name__ == "__main__":
    torch.set_num_threads(1)
    dist_worker.run(sys.argv[1])
    dist_worker.shutdown_distributed()  # after run(): its sharded actors are gone
