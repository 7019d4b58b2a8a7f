"""The ``mempo demo`` command: MemPO end to end on CPU (`mempo.apps.demo`).

    mempo demo [--config configs/demo.yaml] [--out demo_out] [--no-progress] [section.field=value ...]

Without ``--config`` the demo reads ``configs/demo.yaml`` (`mempo.apps.demo.DEMO_CONFIG`, shipped in
the package). A bad config value or file is a `mempo.errors.MempoError`, printed by
`mempo.apps.cli.main` as one line (exit 2). The demo is imported inside `run`, so the parser stays
light.
"""
from __future__ import annotations

import argparse

__all__ = ["HELP", "add_arguments", "run"]

HELP = "the CPU demo: world, tokenizer, tiny Qwen2, SFT, MemPO RL, before/after evaluation, report"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None,
                        help="demo YAML (MempoConfig sections: the world, the oracle and the demo's model in "
                             "'synthetic', its SFT stage in 'sft'); default: configs/demo.yaml")
    parser.add_argument("--out", default="demo_out", help="output directory: new, empty or an earlier demo's "
                                                            "(default demo_out)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars (stage lines only)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. eval.episodes=4 trainer.total_steps=2")


def run(args: argparse.Namespace) -> int:
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.apps.demo import load_demo_config, run_demo

    run_demo(load_demo_config(args.config, args.overrides), args.out, show_progress=not args.no_progress)
    return 0
