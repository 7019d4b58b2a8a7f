"""The ``mempo sft`` and ``mempo train`` commands.

    mempo sft   --config CFG [--trajectories PATH] [--episodes N] [--out DIR] [--steps N | --epochs E]
                [--lr LR] [--batch-tokens N] [--resume] [key=value ...]
    mempo train --config CFG [--out DIR] [--resume] [--threads N] [key=value ...]

Settings come from the config file and the dotted overrides (``actor.lr=1e-5``); the flags are
shorthands applied after them (`_run_config`). Every user-fixable error is a
`mempo.errors.MempoError`: `mempo.apps.cli.main` prints it as one line and exits with code 2.
"""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Mapping, Optional

from mempo.config import ConfigError, MempoConfig, config_from_dict, config_to_dict, load_config
from mempo.utils.allocator import keep_freed_memory
from mempo.utils.log import log

__all__ = ["TRAIN_HELP", "SFT_HELP", "add_train_arguments", "add_sft_arguments", "run_train", "run_sft"]

TRAIN_HELP = "MemPO RL training (rollout, rewards, memory scoring, advantages, update)"
SFT_HELP = "SFT cold start on agent trajectories (loss on assistant tokens)"

#: `mempo sft` flags that set a config field: flag attribute -> "section.field".
SFT_FLAGS = {"trajectories": "sft.trajectories", "episodes": "synthetic.oracle_episodes", "steps": "sft.steps",
             "epochs": "sft.epochs", "lr": "sft.lr", "batch_tokens": "sft.batch_tokens"}



def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="YAML config (default: all defaults)")
    parser.add_argument("--out", help="run directory (sets trainer.out_dir)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")


def _threads(args: argparse.Namespace) -> None:
    if args.threads is not None:
        if args.threads < 1:
            raise ConfigError("--threads", f"must be a number of threads >= 1, got {args.threads}")
        import torch  # reason: the parser module stays light (`mempo --help` imports no torch)

        torch.set_num_threads(args.threads)


def _run_config(args: argparse.Namespace, sft_flags: Optional[Mapping[str, str]] = None) -> MempoConfig:
    """The config of a `train` / `sft` run: the file and the overrides, then the shorthand flags.

    ``--out`` sets ``trainer.out_dir``; ``--resume`` turns ``trainer.resume`` "never" into "auto"
    (continue from the newest intact checkpoint in the run directory; a new run when there is none;
    a checkpoint path named in the config stays); `sft`'s ``--trajectories``, ``--episodes``,
    ``--steps``, ``--epochs``, ``--lr`` and ``--batch-tokens`` set the ``sft`` fields of those names.
    Without ``--resume`` the config's ``trainer.resume`` applies, "never" by default: a run
    directory that already holds checkpoints is then refused. Sets the process's C allocator to keep
    freed memory (`mempo.utils.allocator.keep_freed_memory`).
    """
    _threads(args)
    keep_freed_memory()  # a training process: freed buffers are reused, not page-faulted in (no log: stderr
    #                      carries a user error as its one line)
    cfg = load_config(args.config, list(args.overrides))
    raw = config_to_dict(cfg)
    if args.out:
        raw["trainer"]["out_dir"] = args.out
    for flag, dotted in (sft_flags or {}).items():
        value = getattr(args, flag)
        if value is not None:
            section, name = dotted.split(".")
            raw[section][name] = value
    cfg = config_from_dict(raw)
    if args.resume and cfg.trainer.resume.strip() == "never":
        cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, resume="auto"))
    return cfg


# ------------------------------------------------------------------------------------------------
def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the run dir")


def run_train(args: argparse.Namespace) -> int:
    """`mempo train`: writes the final policy to ``<out>/model``, a plain HF directory, written
    atomically: streamed by rank 0 from the last step's sharded checkpoint (`export_checkpoint`: one
    safetensors file at a time, never the whole model in one process) while the other ranks wait;
    when the run stopped off a checkpoint (``max_steps``), gathered from the shards (`export_model`).
    An existing ``<out>/model`` that mempo did not write is refused before the run starts
    (`mempo.utils.atomic.check_directory_target`)."""
    cfg = _run_config(args)
    # reason: the parser module stays light (`mempo --help` imports no torch)
    import torch.distributed as dist
    from mempo.model.export import export_model
    from mempo.train.actor import shutdown_distributed
    from mempo.train.checkpoint import checkpoint_dir
    from mempo.train.export import export_checkpoint
    from mempo.train.trainer import train
    from mempo.utils.atomic import check_directory_target

    # the final model replaces <out>/model only when mempo wrote it: refused now, not after the training
    if Path(cfg.trainer.out_dir).is_dir():
        check_directory_target(Path(cfg.trainer.out_dir) / "model", "trainer.out_dir")
    result = train(cfg)
    final = Path(result.out_dir) / "model"
    # The final policy as a plain HF directory (full weights whatever the rank count), for `mempo eval
    # --model` and further training.
    provenance = {"written_by": "mempo train", "base_model": cfg.model.path, "steps": result.last_step}
    distributed = dist.is_available() and dist.is_initialized()
    last = checkpoint_dir(Path(result.out_dir) / "checkpoints", result.last_step)
    if result.checkpoint is not None and result.checkpoint == last:
        if not distributed or dist.get_rank() == 0:
            export_checkpoint(last, final, cfg, result.tokenizer, provenance=provenance, phase="final-model")
        if distributed:
            dist.barrier()
    else:
        export_model(result.model, result.tokenizer, final, phase="final-model", provenance=provenance)
    log(f"trained to step {result.last_step} (resumed from {result.resumed_from}); run dir {result.out_dir}; "
         f"final model in {final}")
    del result  # the (sharded) model goes before the process group (shutdown_distributed)
    shutdown_distributed()
    return 0


# ------------------------------------------------------------------------------------------------
def add_sft_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)
    parser.add_argument("--trajectories", help="jsonl of oracle trajectories or {'messages': [...]} chats "
                                               "(sets sft.trajectories; default: the oracle makes them)")
    parser.add_argument("--episodes", type=int, help="oracle episodes when no trajectories file "
                                                     "(sets synthetic.oracle_episodes, default 16)")
    parser.add_argument("--steps", type=int, help="optimiser steps (sets sft.steps)")
    parser.add_argument("--epochs", type=float, help="passes over the data (sets sft.epochs; default 1 when no "
                                                     "steps are given)")
    parser.add_argument("--lr", type=float, help="learning rate (sets sft.lr, default 1e-4)")
    parser.add_argument("--batch-tokens", type=int, help="padded tokens per batch (sets sft.batch_tokens, "
                                                         "default 4096)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest SFT checkpoint in the run dir")


def _oracle_records(cfg: MempoConfig, run: Any) -> tuple[list, str]:
    """The oracle's SFT records for `run` (`mempo.config.SyntheticConfig`: by training episodes or by
    ``synthetic.oracle_objectives``) and a phrase saying what they are."""
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.env.build import build_tools
    from mempo.synthetic.oracle import run_oracle
    from mempo.eval import held_out_of_training
    from mempo.synthetic.cold_start import oracle_agent, oracle_cold_start

    s = cfg.synthetic
    if s.oracle_objectives is None:
        r = cfg.rollout
        tools = build_tools(cfg, run.retriever)
        records = [run_oracle(episode, tools, policy=r.context_policy, max_turns=r.max_turns,
                              agent=oracle_agent(cfg, max_turns=r.max_turns), system_prompt=r.system_prompt)
                   for episode in run.episodes[:s.oracle_episodes]]
        return records, f"oracle on {s.oracle_episodes} episodes"
    if run.world is None:
        raise ConfigError("synthetic.oracle_objectives", "draws synthetic-world episodes; it needs data.source "
                                                         "'synthetic' (or null: the training episodes)")
    cold = oracle_cold_start(run.world, build_tools(cfg, run.retriever), cfg,
                             held_out_of_training(run.world, cfg))
    return (cold.sft_records,
            f"oracle on {s.oracle_episodes} episodes of each of {list(s.oracle_objectives)} objectives"
            + cold.describe_extras())


def run_sft(args: argparse.Namespace) -> int:
    """`mempo sft`: trains on ``sft.trajectories``, else on what the oracle makes (`_oracle_records`).

    Checkpoints go to ``<out>/sft/checkpoints`` every ``trainer.save_every`` SFT steps and at the
    end (``trainer.keep_last`` kept), metrics to ``<out>/sft/metrics.jsonl``, the tuned model and
    tokenizer to ``<out>/model`` (a plain HF directory, usable as ``model.path``, written
    atomically; one there that mempo did not write is refused before the run starts). ``sft.steps``
    / ``sft.epochs`` bound the whole run, so a resumed run stops where an uninterrupted one would.
    """
    cfg = _run_config(args, SFT_FLAGS)
    # reason: the parser module stays light (`mempo --help` imports no torch)
    from mempo.model.export import save_model_dir
    from mempo.train.checkpoint import check_checkpoint_space, checkpoint_step, resume_checkpoint
    from mempo.train.logging import MetricsLogger
    from mempo.train.sft import load_sft_records, run_sft as train_sft
    from mempo.train.trainer import build_run, check_checkpoints_writable, prepare_out_dir, refuse_used_run_dir
    from mempo.utils.atomic import check_directory_target

    s = cfg.sft
    out = prepare_out_dir(cfg.trainer.out_dir)
    checkpoints = out / "sft" / "checkpoints"
    refuse_used_run_dir(cfg.trainer.resume, checkpoints, command="sft")
    check_directory_target(out / "model", "trainer.out_dir")  # the tuned model replaces only what mempo wrote
    check_checkpoints_writable(out, checkpoints)
    records = load_sft_records(s.trajectories) if s.trajectories else None
    run = build_run(cfg, out_dir=out)
    check_checkpoint_space(checkpoints, run.model)
    resume_from = resume_checkpoint(cfg.trainer.resume, checkpoints, log=log)
    source = s.trajectories
    if records is None:
        records, source = _oracle_records(cfg, run)
    resume_step = checkpoint_step(resume_from) if resume_from is not None else None
    with MetricsLogger(out / "sft", tensorboard=cfg.trainer.tensorboard, resume_step=resume_step) as logger:
        metrics = train_sft(cfg, run.model, run.tokenizer, records, seed=cfg.trainer.seed, logger=logger,
                            checkpoint_root=checkpoints, resume_from=resume_from)
    save_model_dir(out / "model", run.model, run.tokenizer,
                   provenance={"written_by": "mempo sft", "base_model": cfg.model.path, "sft_steps": metrics["steps"],
                               "trajectories": source})
    losses = (f"loss {metrics['first_loss']:.4f} -> {metrics['last_loss']:.4f}" if metrics["losses"]
              else "no step left to train")
    log(f"sft: {metrics['steps']} steps on {metrics['examples']} turns (resumed from {metrics['resumed_from']}), "
         f"{losses}; model saved to {out / 'model'}")
    return 0
