"""The ``mempo plan`` command: will a training config fit the GPUs (`mempo.train.plan`)?

    mempo plan --config CONFIG.yaml --nproc-per-node 8 [--nnodes 1] --gpu-memory 80GiB [section.field=value ...]

Prints, per GPU and per stage, the bytes of the run's layout, whether the largest stage fits, and
which knob to turn when it does not; exit code 0 when it fits, 1 when it does not.
"""
from __future__ import annotations

import argparse

__all__ = ["HELP", "add_arguments", "run"]

HELP = "print a training config's memory per GPU and per stage, whether it fits, and what to turn if not"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="training YAML (MempoConfig); default: all defaults")
    parser.add_argument("--nproc-per-node", type=int, default=1, help="GPUs per node (torchrun's --nproc-per-node)")
    parser.add_argument("--nnodes", type=int, default=1, help="nodes (torchrun's --nnodes)")
    parser.add_argument("--gpu-memory", default="80GiB", help="memory of one GPU, e.g. 80GiB, 141GB (default 80GiB)")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. actor.micro_batch_tokens=8192")


def run(args: argparse.Namespace) -> int:
    # reason: the command modules import their libraries inside run (`mempo --help` imports none)
    from mempo.config import load_config
    from mempo.train.plan import format_plan, parse_bytes, plan_memory

    cfg = load_config(args.config, args.overrides)
    plan = plan_memory(cfg, args.nproc_per_node, parse_bytes(args.gpu_memory), nnodes=args.nnodes)
    print(format_plan(plan), flush=True)
    return 0 if plan.fits else 1
