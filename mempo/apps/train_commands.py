"""The ``mempo sft`` and ``mempo train`` commands (registered on import; heavy imports inside the runners).

    mempo sft   --config CFG [--trajectories PATH] [--out DIR] [--steps N | --epochs E] [--lr LR] [--resume]
                [key=value ...]
    mempo train --config CFG [--out DIR] [--resume] [--threads N] [key=value ...]

Overrides are dotted config keys (``actor.lr=1e-5``). Every user-fixable error (a bad config value
or file, a bad option, a used run directory, a damaged checkpoint, a missing model or corpus, a chat
template that drops text, SGLang not installed) is a `mempo.errors.MempoError`: `mempo.apps.cli.main`
prints it as one line and exits with code 2. `sft` without ``--trajectories`` runs the oracle on
synthetic-world episodes (``data.*``) and trains on its trajectories; it saves the tuned model and
tokenizer to ``<out>/model``, a plain HF directory (`mempo.model.export`; ``mempo_provenance.json``
records what wrote it, and nothing reads it back), usable as ``model.path``. ``train`` writes the
final policy the same way to ``<out>/model``, whole also under torchrun (`export_model` gathers the
FSDP2 shards). Its
checkpoints (`mempo.train.sft.run_sft`) go to ``<out>/sft/checkpoints`` every ``trainer.save_every``
SFT steps and at the end (``trainer.keep_last`` kept), its metrics to ``<out>/sft/metrics.jsonl``.
``--resume`` sets ``trainer.resume=auto`` (continue from the newest intact checkpoint in the run
directory, ``<out>/sft/checkpoints`` for sft; a new run when there is none) unless the config names a
checkpoint path there; without it the config's ``trainer.resume`` applies, "never" by default: a
run directory that already holds checkpoints is then refused (`mempo.train.trainer.refuse_used_run_dir`).
The final model directories (``<out>/model``) are written atomically (`mempo.utils.atomic.atomic_directory`).
``--steps`` / ``--epochs`` bound the whole SFT run, so a resumed run stops where an uninterrupted
one would.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from mempo.apps.cli import register_command
from mempo.config import ConfigError, load_config


def _log(message: str) -> None:
    print(f"mempo: {message}", file=sys.stderr, flush=True)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: all defaults)")
    parser.add_argument("--out", help="run directory (default: trainer.out_dir)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def _threads(args: argparse.Namespace) -> None:
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError("--threads", f"must be a number of threads >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)


# ------------------------------------------------------------------------------------------------
def _train_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run dir")


def _run_config(args: argparse.Namespace):
    """The config of a `train` / `sft` run: `--out` as an override; `--resume` turns
    ``trainer.resume`` "never" into "auto" (a checkpoint path given in the config stays)."""
    _threads(args)
    extra = [f"trainer.out_dir={args.out}"] if args.out else []
    cfg = load_config(args.config, list(args.overrides) + extra)
    if args.resume and cfg.trainer.resume.strip() == "never":
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume="auto"))
    return cfg


def _train(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    from mempo.model.export import export_model
    from mempo.train.trainer import train

    result = train(cfg)
    final = Path(result.out_dir) / "model"
    # The final policy as a plain HF directory (full weights whatever the rank count), for `mempo eval
    # --model` and further training.
    export_model(result.model, result.tokenizer, final, phase="final-model",
                 provenance={"written_by": "mempo train", "base_model": cfg.model.path, "steps": result.last_step})
    _log(f"trained to step {result.last_step} (resumed from {result.resumed_from}); run dir {result.out_dir}; "
         f"final model in {final}")
    return 0


# ------------------------------------------------------------------------------------------------
def _sft_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--trajectories", help="jsonl of oracle trajectories or {'messages': [...]} chats "
                                               "(default: run the oracle on synthetic episodes)")
    parser.add_argument("--episodes", type=int, default=16, help="oracle episodes when no --trajectories (16)")
    parser.add_argument("--steps", type=int, help="optimiser steps")
    parser.add_argument("--epochs", type=float, help="passes over the data (default 1 when --steps is absent)")
    parser.add_argument("--lr", type=float, default=1e-4, help="learning rate (default 1e-4)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="padded tokens per batch (default 4096)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest SFT checkpoint in the run dir")


def _sft(args: argparse.Namespace) -> int:
    cfg = _run_config(args)
    if (args.steps is not None and args.steps < 1) or (args.epochs is not None and args.epochs <= 0) \
            or args.lr <= 0 or args.batch_tokens < 1:
        raise ConfigError("", "--steps, --epochs, --lr and --batch-tokens must be positive")
    from mempo.train.checkpoint import checkpoint_step, resume_checkpoint
    from mempo.model.export import save_model_dir
    from mempo.train.logging import MetricsLogger
    from mempo.train.sft import load_sft_records, run_sft
    from mempo.train.trainer import build_run, prepare_out_dir, refuse_used_run_dir

    out = prepare_out_dir(cfg.trainer.out_dir)
    checkpoints = out / "sft" / "checkpoints"
    refuse_used_run_dir(cfg.trainer.resume, checkpoints, command="sft")
    records = load_sft_records(args.trajectories) if args.trajectories else None
    run = build_run(cfg, out_dir=out)
    resume_from = resume_checkpoint(cfg.trainer.resume, checkpoints, log=_log)
    if records is None:
        from mempo.env.oracle import run_oracle_episodes

        records = run_oracle_episodes(run.episodes[:args.episodes], run.retriever,
                                      policy=cfg.rollout.context_policy, max_turns=cfg.rollout.max_turns)
    resume_step = checkpoint_step(resume_from) if resume_from is not None else None
    with MetricsLogger(out / "sft", tensorboard=cfg.trainer.tensorboard, resume_step=resume_step) as logger:
        metrics = run_sft(cfg, run.model, run.tokenizer, records, steps=args.steps, epochs=args.epochs,
                          lr=args.lr, batch_tokens=args.batch_tokens, logger=logger, seed=cfg.trainer.seed,
                          checkpoint_root=checkpoints, save_every=cfg.trainer.save_every,
                          keep_last=cfg.trainer.keep_last, resume_from=resume_from)
    save_model_dir(out / "model", run.model, run.tokenizer,
                   provenance={"written_by": "mempo sft", "base_model": cfg.model.path, "sft_steps": metrics["steps"],
                               "trajectories": args.trajectories or f"oracle on {args.episodes} episodes"})
    losses = (f"loss {metrics['first_loss']:.4f} -> {metrics['last_loss']:.4f}" if metrics["losses"]
              else "no step left to train")
    _log(f"sft: {metrics['steps']} steps on {metrics['examples']} turns (resumed from {metrics['resumed_from']}), "
         f"{losses}; model saved to {out / 'model'}")
    return 0


register_command("train", "MemPO RL training (rollout, rewards, memory scoring, advantages, update)",
                 _train_arguments, _train)
register_command("sft", "SFT cold start on agent trajectories (loss on assistant tokens)", _sft_arguments, _sft)
