"""The ``mempo export`` command: a Hugging Face model directory from a sharded training checkpoint
(`mempo.train.export.export_checkpoint`: streamed, one safetensors file at a time).

    mempo export --checkpoint RUN/checkpoints[/step_N] --out MODEL_DIR [--config CONFIG.yaml]
                 [--tokenizer DIR] [--dtype bfloat16] [--max-shard-size 5GB]

The architecture comes from the run's ``config.yaml`` (next to ``checkpoints/``) unless --config is
given; the tokenizer from the run's ``tokenizer/`` (or --tokenizer, or the config's model).

``--out`` is written whole (`mempo.utils.atomic.atomic_directory`): it must be new, an empty
directory, or a directory mempo wrote (its ``.mempo-written`` marker) holding nothing else, which is
then replaced; a file, a run or checkpoint directory, the checkpoint's own tree, the working directory
and any other folder are refused in one line (`check_directory_target`) before anything is read.
"""
from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["HELP", "add_arguments", "run"]

HELP = "write a Hugging Face model directory from a sharded training checkpoint (streamed safetensors)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--checkpoint", required=True, help="a step_N checkpoint or a checkpoint root (its newest)")
    parser.add_argument("--out", required=True, help="the model directory to write: new, empty, or one mempo "
                                                     "wrote (replaced); never a run or checkpoint directory")
    parser.add_argument("--config", default=None, help="the run's YAML (default: config.yaml of the run directory)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the run's tokenizer/, "
                                                          "else the config's model)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="dtype of the written weights (default: as saved)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors file (default 5GB)")


def _run_dir(checkpoint: Path) -> Path:
    """The run directory of a checkpoint path (``<run>/checkpoints`` or ``<run>/checkpoints/step_N``)."""
    return checkpoint.parent.parent if checkpoint.name.startswith("step_") else checkpoint.parent


def run(args: argparse.Namespace) -> int:
    # reason: the command modules import their libraries inside run (`mempo --help` imports none)
    from mempo.config import ConfigError, load_config
    from mempo.model.loading import load_pretrained, pretrained_tokenizer
    from mempo.train.export import export_checkpoint
    from mempo.train.plan import parse_bytes
    from mempo.utils.atomic import check_directory_target

    checkpoint = Path(args.checkpoint)
    run_dir = _run_dir(checkpoint)
    config = Path(args.config) if args.config else run_dir / "config.yaml"
    # before any slow work: --out never replaces what mempo did not write (a run or checkpoint
    # directory, a user's folder or file) nor what this command reads
    root = checkpoint.parent if checkpoint.name.startswith("step_") else checkpoint
    reads = [root, config] + ([args.tokenizer] if args.tokenizer and Path(args.tokenizer).exists() else [])
    out = check_directory_target(args.out, "--out", keep=reads)
    max_shard_bytes = parse_bytes(args.max_shard_size, "--max-shard-size")
    if not config.is_file():
        raise ConfigError("--config", f"{config}: no such file (give the run's config with --config)")
    cfg = load_config(config, [])
    if args.tokenizer:
        tokenizer = load_pretrained(pretrained_tokenizer, args.tokenizer, "--tokenizer", "tokenizer")
    elif (run_dir / "tokenizer" / "tokenizer.json").is_file():
        tokenizer = pretrained_tokenizer(run_dir / "tokenizer")
    elif cfg.model.path != "builtin-tiny":
        source = cfg.model.tokenizer or cfg.model.path
        tokenizer = load_pretrained(pretrained_tokenizer, source, "model.tokenizer", "tokenizer")
    else:
        tokenizer = None
    written = export_checkpoint(checkpoint, out, cfg, tokenizer, dtype=args.dtype, max_shard_bytes=max_shard_bytes,
                                provenance={"written_by": "mempo export"}, field="--out")
    print(f"wrote {written}", flush=True)
    return 0
