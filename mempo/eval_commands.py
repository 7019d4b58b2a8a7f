"""The ``mempo eval`` and ``mempo demo`` commands (registered with `mempo.cli.register_command`).

    mempo eval --config CONFIG.yaml --model MODEL_DIR --out OUT_DIR [section.field=value ...]
    mempo demo [--config configs/demo.yaml] [--out demo_out] [section.field=value ...]

``eval``: the model directory holds a saved HF causal LM and its tokenizer (``save_pretrained``;
e.g. ``demo_out/model_rl``); it generates through the backend ``rollout.backend`` names
(`mempo.rollout.backends.factory.build_backend`: HF, or SGLang loading the directory); the world is generated from ``cfg.data`` (``world_seed``,
``world_entities``) and the episodes from ``cfg.eval`` (`mempo.eval.eval_episodes`). Writes
``OUT_DIR/<name>.json`` and ``OUT_DIR/<name>.md`` (``--name``, default ``eval``).
``demo``: see `mempo.demo`. Heavy imports happen inside the run functions.
"""
from __future__ import annotations

import argparse
import sys

from mempo.cli import register_command

__all__: list[str] = []


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="training/eval YAML (MempoConfig); default: all defaults")
    parser.add_argument("--model", required=True, help="directory with a saved HF causal LM and its tokenizer")
    parser.add_argument("--out", required=True, help="output directory for <name>.json and <name>.md")
    parser.add_argument("--name", default="eval", help="output file stem (default eval)")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per number of objectives "
                                                                   "(default: eval.episodes)")
    parser.add_argument("--trajectories", action="store_true", help="also write the trajectories as jsonl")
    parser.add_argument("--no-progress", action="store_true", help="no progress display")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. eval.objectives=[2,4]")


def _eval(args: argparse.Namespace) -> int:
    import os

    from mempo.eval import build_world, eval_episodes, evaluate, load_model_dir
    from mempo.train.config import ConfigError, load_config

    try:
        cfg = load_config(args.config, args.overrides)
    except (ConfigError, OSError) as error:
        print(f"mempo eval: {error}", file=sys.stderr)
        return 2
    if not os.path.isdir(args.model):
        print(f"mempo eval: --model {args.model!r} is not a directory", file=sys.stderr)
        return 2
    if args.episodes is not None and args.episodes < 1:
        print("mempo eval: --episodes must be >= 1", file=sys.stderr)
        return 2
    from mempo.errors import MempoError
    from mempo.rollout.backends.factory import build_backend

    model, tokenizer = load_model_dir(args.model, cfg.model.dtype)
    try:  # rollout.backend chooses the generator, as in training
        backend = build_backend(cfg, model, tokenizer, model_path=args.model)
    except MempoError as error:
        print(f"mempo eval: {error}", file=sys.stderr)
        return 2
    world, retriever = build_world(cfg)
    episodes = eval_episodes(world, cfg, args.episodes)
    report = evaluate(model, tokenizer, episodes, retriever, cfg, backend=backend, label=args.name,
                      show_progress=not args.no_progress, keep_trajectories=args.trajectories)
    report.metadata["model_dir"] = os.path.abspath(args.model)
    paths = report.write(args.out, args.name, trajectories=args.trajectories)
    print(report.markdown(f"Evaluation of {args.model}"))
    print(f"wrote {', '.join(str(p) for p in paths.values())}")
    return 0


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from mempo.demo import add_arguments

    add_arguments(parser)


def _demo(args: argparse.Namespace) -> int:
    from mempo.demo import run_command

    return run_command(args)


register_command("eval", "evaluate a saved model on k-objective episodes (EM, F1, prompt tokens; memory vs full "
                         "context)", _eval_arguments, _eval)
register_command("demo", "the CPU demo: world, tokenizer, tiny Qwen2, SFT, MemPO RL, before/after evaluation, "
                         "report", _demo_arguments, _demo)
