"""Run a function on N gloo processes (torch.multiprocessing.spawn over loopback) and collect each
rank's return value: for collective code that needs no model (quicker than a torchrun launch)."""
import os
from typing import Any, Callable, Sequence

import torch.distributed as dist
import torch.multiprocessing as mp

from support.dist import free_port


def _worker(rank: int, port: int, function: Callable, rank_args: Sequence[tuple], out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=len(rank_args))
    try:
        out[rank] = function(*rank_args[rank])
    finally:
        dist.destroy_process_group()


def on_ranks(function: Callable, rank_args: Sequence[tuple]) -> list[Any]:
    """``function(*rank_args[r])`` on rank r of ``len(rank_args)`` gloo ranks; the return values by
    rank. `function` must be importable by name in a fresh process (a library function, not one
    defined in a test module)."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(free_port(), function, list(rank_args), out), nprocs=len(rank_args), join=True)
        return [out[rank] for rank in range(len(rank_args))]
