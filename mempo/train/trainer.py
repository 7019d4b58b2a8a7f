"""The MemPO training loop: `build_run` assembles the run, `train` runs `mempo.train.step.train_step`
per step, logs, evaluates, checkpoints and resumes.

Conventions: steps are 1-based; step s takes questions ``[(s-1)*B, s*B)`` (B =
``data.questions_per_step``) of an endless, seeded stream over the episode pool, so the data position
is exactly the step. Seeds: ``trainer.seed`` (+ rank); the rollout of step s is seeded by
(rollout.seed, s) only (`mempo.seeds.training_rollout_seed`). Rank 0 writes and evaluates.
"""
from __future__ import annotations

import copy
import os
import random
import time
import warnings
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence

import numpy as np
import torch
import torch.distributed as dist

from mempo.config import ConfigError, MempoConfig, config_to_dict, dump_config, read_yaml_mapping
from mempo.algo.outcome import resolve_outcome_reward
from mempo.env.build import build_retriever, build_tools, qa_prompt_style
from mempo.tools import Toolset
from mempo.synthetic.build import synthetic_world
from mempo.synthetic.heldout import training_episodes
from mempo.env.corpus import iter_corpus
from mempo.env.data import check_qa_files, compose_episodes, load_qa
from mempo.eval import eval_episodes, evaluate, held_out_of_training
from mempo.model.builtin import default_corpus_texts, train_tokenizer
from mempo.model.loading import build_causal_lm, check_model_fits, load_pretrained, pretrained_tokenizer
from mempo.rollout.backends.factory import build_backend
from mempo.rollout.backends.scaffold import ProtocolScaffold
from mempo.rollout.loop import protocol_tags
from mempo.seeds import eval_question_seed
from mempo.train.actor import Actor, DistInfo, init_distributed
from mempo.train.checkpoint import (CheckpointError, PendingCheckpoint, apply_optimizer_defaults,
                                    check_checkpoint_root, check_checkpoint_space, has_checkpoints, load_checkpoint,
                                    resume_checkpoint, start_checkpoint)
from mempo.train.logging import MetricsLogger, StageTimer
from mempo.utils.log import log
from mempo.utils.progress import progress
from mempo.train.step import StepContext, check_rollout_logprobs, generation_weights, train_step
from mempo.utils.atomic import atomic_directory

__all__ = ["TrainResult", "Run", "build_run", "train", "periodic_eval", "step_episodes", "seed_everything",
           "configure_determinism", "prepare_out_dir", "refuse_used_run_dir", "check_checkpoints_writable"]


@dataclass
class TrainResult:
    """What `train` returns: the run directory, the last step reached, the metrics logged by this
    call (one dict per step), the last checkpoint written (or None), model and tokenizer."""

    out_dir: Path
    last_step: int
    metrics: list[dict] = field(default_factory=list)
    checkpoint: Optional[Path] = None
    resumed_from: Optional[int] = None
    model: Any = None
    tokenizer: Any = None


@dataclass
class Run:
    """Everything `build_run` assembled. world: the synthetic world (None for QA-file data, or when
    nothing needed it); eval_episodes: ``{k: episodes}`` of the periodic evaluation (empty when
    ``trainer.eval_every`` is 0); eval_backend: the backend it generates with (the training backend
    without logits processors)."""

    cfg: MempoConfig
    out_dir: Path
    tokenizer: Any
    model: Any
    episodes: list
    retriever: Any
    ctx: StepContext
    rank: int = 0
    world_size: int = 1
    eval_episodes: dict = field(default_factory=dict)
    eval_backend: Any = None
    world: Any = None


class _Actors(NamedTuple):
    """`_setup_actors`'s result: the trained actor and the frozen reference (None when kl_coef is 0)."""

    actor: Actor
    ref_actor: Optional[Actor]


class _Backends(NamedTuple):
    """`_setup_backends`'s result: the training backend and the periodic evaluation's."""

    train: Any
    eval: Any


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (determinism is `configure_determinism`'s)."""
    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def configure_determinism(enabled: Optional[bool] = None, *, cuda: Optional[bool] = None) -> bool:
    """Deterministic torch algorithms per ``trainer.deterministic``; returns whether they are on.

    enabled None: on unless CUDA is used (on by default for CPU runs, off on CUDA). cuda: whether
    the run uses CUDA (None: ``torch.cuda.is_available()``). ``warn_only``: an op without a
    deterministic kernel warns, naming itself. Call it before CUDA starts (`build_run` does, first).
    """
    cuda = torch.cuda.is_available() if cuda is None else bool(cuda)
    on = (not cuda) if enabled is None else bool(enabled)
    if on and cuda and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        if torch.cuda.is_initialized():
            warnings.warn("trainer.deterministic: CUDA started before CUBLAS_WORKSPACE_CONFIG was set; cuBLAS "
                          "may stay non-deterministic (set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment)",
                          RuntimeWarning, stacklevel=2)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # cuBLAS is otherwise not deterministic
    torch.use_deterministic_algorithms(on, warn_only=True)
    # no NaN-fill of new CUDA tensors: a memset of each costs bandwidth, and mempo's kernels write
    # every output element
    torch.utils.deterministic.fill_uninitialized_memory = not cuda
    return on


def prepare_out_dir(path: Any, field_name: str = "trainer.out_dir") -> Path:
    """Create the run directory `path` (ConfigError naming `field_name` when it is a file or cannot
    be created)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ConfigError(field_name, f"{out} exists and is not a directory; give a directory for the run")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ConfigError(field_name, f"cannot create {out}: {error.strerror or error}") from None
    return out


def refuse_used_run_dir(resume: str, checkpoints: Path, command: str = "train") -> None:
    """Refuse a run before anything is built or written: a ConfigError when ``trainer.resume`` is
    "never" (the default) and `checkpoints` already holds checkpoints, offering ``--resume`` or a
    new ``--out``; a CheckpointError when it names a path that does not exist. (The other values:
    "auto", ``--resume``, takes the newest intact checkpoint, skipping damaged ones with a line
    naming the file and the reason: a digest, a manifest field of the wrong type, a step on which the
    directory name, manifest and state.json disagree, a model or optimiser state with missing or
    unexpected keys; it starts a new run when there is none; a path resumes from that checkpoint. A
    restore is all or nothing: the keys are checked before anything is loaded.)
    """
    mode = resume.strip()
    if mode == "never" and has_checkpoints(checkpoints):
        raise ConfigError("trainer.resume", f"{checkpoints} already holds checkpoints of an earlier run; "
                                            f"continue it with `mempo {command} --resume` (trainer.resume=auto) "
                                            "or give a new --out")
    if mode not in ("never", "auto") and not Path(mode).exists():
        raise CheckpointError(f"trainer.resume: {mode}: no such checkpoint directory")


def check_checkpoints_writable(out_dir: Path, checkpoints: Path) -> None:
    """Before anything is built: a CheckpointWriteError naming the path and the errno when the
    run's checkpoints could not be saved (`check_checkpoint_root`: ``latest`` a directory, a
    read-only or unwritable folder). An `out_dir` that is a file is left to `prepare_out_dir`,
    whose error names ``--out``."""
    if out_dir.is_dir() or not os.path.lexists(out_dir):
        check_checkpoint_root(checkpoints)


def step_episodes(episodes: Sequence[Any], step: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                  rank: int = 0, world_size: int = 1) -> list:
    """The questions of (1-based) step `step`, this rank's share: positions ``[(step-1)*batch_size,
    step*batch_size)`` of an endless stream of epochs over `episodes`, each epoch's order shuffled
    (when `shuffle`) by a ``random.Random`` seeded with `seed` and the epoch. A pure function of
    `step`, so a resumed run sees the same questions. Rank k takes every world_size-th question."""
    n = len(episodes)
    if n == 0:
        raise ValueError("no training episodes")
    out, orders = [], {}
    for position in range((step - 1) * batch_size, step * batch_size):
        epoch, offset = divmod(position, n)
        if epoch not in orders:
            order = list(range(n))
            if shuffle:
                random.Random(f"mempo-data/{seed}/{epoch}").shuffle(order)
            orders[epoch] = order
        out.append(episodes[orders[epoch][offset]])
    return out[rank::world_size]


# ------------------------------------------------------------------------------------------------
# setup: one function per part of the run, called by `build_run` in order
# ------------------------------------------------------------------------------------------------
def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _setup_tokenizer(cfg: MempoConfig, out_dir: Path, world: Any):
    """``model.tokenizer``, else ``model.path``'s (not a saved model: a ConfigError naming the field,
    `load_pretrained`); for ``model.path == "builtin-tiny"`` a byte-level BPE trained on the world's
    (or the corpus's) documents, saved atomically to ``<out>/tokenizer`` and reloaded on resume (an
    unreadable saved one is retrained, with a warning: training it is deterministic)."""
    if cfg.model.tokenizer:
        return load_pretrained(pretrained_tokenizer, cfg.model.tokenizer, "model.tokenizer", "tokenizer")
    if cfg.model.path != "builtin-tiny":
        return load_pretrained(pretrained_tokenizer, cfg.model.path, "model.path", "tokenizer")
    saved = out_dir / "tokenizer"
    if (saved / "tokenizer.json").is_file():
        try:
            return pretrained_tokenizer(saved)
        except Exception as error:  # a damaged save (e.g. torn by an old mempo writing it in place)
            log(f"{saved}: unreadable saved tokenizer ({type(error).__name__}); training it again")
    texts = default_corpus_texts(world)
    if world is None and cfg.env.corpus_path:  # files source: learn the corpus's words instead
        texts += [f"{doc.title}\n{doc.text}" for doc in islice(iter_corpus(cfg.env.corpus_path), 2000)]
    tokenizer = train_tokenizer(texts, vocab_size=1024)
    if _rank() == 0:
        with atomic_directory(saved, phase="tokenizer", field="trainer.out_dir") as staging:
            tokenizer.save_pretrained(staging)
    return tokenizer


def _sequence_tokens(cfg: MempoConfig) -> int:
    """The positions a training sequence may need besides its prompt: the response budget
    (``rollout.max_response_tokens``, else ``max_turns`` rounds of ``max_new_tokens_per_round``);
    a model with a shorter context is refused at start-up, and the rollout engine ends any round
    that would not fit the model's context with its prompt (``max_context_tokens``), as evaluation
    does."""
    r = cfg.rollout
    return r.max_response_tokens if r.max_response_tokens is not None else r.max_turns * r.max_new_tokens_per_round


def _setup_model(cfg: MempoConfig, tokenizer: Any, info: DistInfo):
    """`build_causal_lm` from the ``model`` section (builtin-tiny: seeded with ``trainer.seed``).
    Under torchrun only rank 0 builds or reads the weights; the other ranks build on the meta
    device and receive their shards from it (`_setup_actors`)."""
    torch.manual_seed(cfg.trainer.seed)
    return build_causal_lm(cfg.model, len(tokenizer), on_meta=info.distributed and info.rank != 0)


def _qa_pool(paths: Sequence[str], gold_field: Optional[str]) -> list:
    """The records of the QA files in order (each file once, none a directory: `check_qa_files`), their
    reference answers from ``data.gold_field``."""
    return [record for path in (check_qa_files(paths) if paths else []) for record in load_qa(path, gold_field)]


def _episode_pool(cfg: MempoConfig, world: Any) -> list:
    """The training episodes. ``data.source == "files"``: the QA records of ``data.train_files``
    composed into episodes of k = ``data.num_objectives`` questions (seed ``data.seed``; a list: mixed
    k, `compose_episodes`), as many as the pool holds questions for.
    "synthetic": ``max(4 * questions_per_step, 8)`` episodes of the world, seed ``data.seed``, none
    about an entity the ``eval`` section's episodes of either split ask about
    (`mempo.eval.held_out_of_training`; a world too small to draw the test episodes, which `mempo
    eval` refuses too, holds nothing out; one too small for the validation split is a ConfigError)."""
    d = cfg.data
    if d.source == "files":
        pool = _qa_pool(d.train_files, d.gold_field)
        cycle = d.objective_counts
        if len(pool) < max(cycle):
            raise ConfigError("data.train_files", f"hold {len(pool)} questions, fewer than "
                                                  f"data.num_objectives={d.num_objectives}")
        count = max(1, len(pool) * len(cycle) // sum(cycle))
        return compose_episodes(pool, d.num_objectives, count, d.seed, style=qa_prompt_style(cfg))
    try:
        held_out = held_out_of_training(world, cfg)  # both splits' entities: never trained on
    except ConfigError as error:  # a world too small for the test episodes: no evaluation to keep them from
        if error.field != "eval.episodes":
            raise  # a validation split the world cannot hold is the user's to fix, not to train past
        held_out = frozenset()
    try:
        return training_episodes(world, d.num_objectives, max(d.questions_per_step * 4, 8), d.seed, held_out)
    except ValueError as error:
        raise ConfigError("data.num_objectives",
                          f"the synthetic world (world_entities={cfg.synthetic.world_entities}) cannot make "
                          f"episodes of {d.num_objectives} objectives: {error}") from None


def _eval_episode_sets(cfg: MempoConfig, world: Any) -> dict[int, list]:
    """``{k: episodes}`` of the periodic evaluation, drawn once. Synthetic source:
    `mempo.eval.eval_episodes` (the split ``eval.split`` names; question seeds apart from training's);
    files source: the QA records of ``data.eval_files`` composed per k with seed
    `mempo.seeds.eval_question_seed`."""
    if cfg.data.source == "synthetic":
        return eval_episodes(world, cfg)
    pool = _qa_pool(cfg.data.eval_files, cfg.data.gold_field)
    sets = {}
    for k in cfg.eval.objectives:
        if len(pool) < k:
            raise ConfigError("eval.objectives", f"k={k} needs at least {k} questions; data.eval_files "
                                                 f"hold {len(pool)}")
        sets[int(k)] = compose_episodes(pool, k, cfg.eval.episodes, eval_question_seed(cfg.data.seed, k),
                                        style=qa_prompt_style(cfg), id_prefix="eval")
    return sets


def _setup_actors(cfg: MempoConfig, model: Any, info: DistInfo) -> _Actors:
    """The reference policy is a frozen copy of the initial model (skipped when ``actor.kl_coef ==
    0``). Under torchrun both are sharded from rank 0's weights (`Actor`'s ``broadcast_from_rank0``:
    one whole model on rank 0's host, two while the reference is copied), and no rank keeps an
    unsharded copy: HF generation gathers the actor for the rollout stage
    (`mempo.train.step.generation_weights`) and teacher scoring runs on the shards
    (`mempo.train.actor.Actor.sharded_inference`)."""
    if cfg.model.dtype != "float32" and info.rank == 0:
        log(f"model.dtype={cfg.model.dtype}: the master weights and the optimiser's updates are in {cfg.model.dtype}, "
            f"which loses updates smaller than its resolution (lr {cfg.actor.lr:g}); for fp32 master weights with "
            f"{cfg.model.dtype} compute set model.dtype=float32 and actor.param_dtype={cfg.model.dtype} (torchrun)")
    broadcast = info.distributed
    ref_actor = Actor(copy.deepcopy(model), cfg.actor, trainable=False, broadcast_from_rank0=broadcast) \
        if cfg.actor.kl_coef > 0 else None
    return _Actors(Actor(model, cfg.actor, broadcast_from_rank0=broadcast), ref_actor)


def _setup_backends(cfg: MempoConfig, model: Any, tokenizer: Any, out_dir: Path, tools: Any) -> _Backends:
    """`build_backend` from ``rollout.backend`` / ``rollout.sglang_url`` (SGLang loads ``model.path``;
    a server's weight versions go to ``<out>/sglang_weights``): only the config chooses, whoever
    wrote the model directory. ``rollout.protocol_scaffold`` (default off; tests, tiny demos) adds
    the answer-blind `ProtocolScaffold` to the training backend only, calling the first of `tools` in
    the run's action format; evaluation never gets it."""
    turns = min(cfg.rollout.max_turns, 3)
    processors = [ProtocolScaffold.for_tools(tokenizer, turns, tools, protocol_tags(cfg.rollout, tools))] \
        if cfg.rollout.protocol_scaffold else []
    options = dict(model_path=cfg.model.path, weights_dir=out_dir / "sglang_weights")
    backend = build_backend(cfg, model, tokenizer, logits_processors=processors, **options)
    eval_backend = backend if not processors else build_backend(cfg, model, tokenizer, **options)
    return _Backends(backend, eval_backend)


def build_run(cfg: MempoConfig, *, model=None, tokenizer=None, episodes=None, retriever=None, out_dir=None,
              tools: Optional[Toolset] = None) -> Run:
    """Assemble, in this order, determinism, world, retriever, episodes, process group, run directory,
    seeds, tokenizer, model, actors, backends and the step context; given parts are used as they
    are. The synthetic world (``data.source == "synthetic"``) is built only when something needs
    it (episodes, retriever or tokenizer not given, or the periodic evaluation on). Retriever:
    `mempo.env.build.build_retriever`, the one `mempo eval` uses (files source with neither corpus
    nor server: a ConfigError naming ``env.corpus_path``). Tools: `tools` when given (a synthetic task's
    own, `mempo.apps.tasks`), else `mempo.env.build.build_tools` over the retriever. A ``--out`` that
    is a file is a ConfigError (`prepare_out_dir`)."""
    configure_determinism(cfg.trainer.deterministic)
    evaluating = cfg.trainer.eval_every > 0
    world = None
    if cfg.data.source == "synthetic" and (episodes is None or retriever is None or tokenizer is None or evaluating):
        world = synthetic_world(cfg)
    if retriever is None:  # fail before anything is built or written
        retriever = build_retriever(cfg, world)
    if tools is None:
        tools = build_tools(cfg, retriever)  # a user's tools and reward import here, before anything slow
    resolve_outcome_reward(cfg.rollout.outcome_reward)
    episodes = list(episodes) if episodes is not None else _episode_pool(cfg, world)  # as early: no model needed
    info = init_distributed()
    out = prepare_out_dir(out_dir or cfg.trainer.out_dir)
    seed_everything(cfg.trainer.seed + info.rank)
    if tokenizer is None:
        tokenizer = _setup_tokenizer(cfg, out, world)
    if model is None:
        model = _setup_model(cfg, tokenizer, info)
    check_model_fits(model, tokenizer, _sequence_tokens(cfg))  # before anything slow
    eval_sets = _eval_episode_sets(cfg, world) if evaluating else {}
    actors = _setup_actors(cfg, model, info)
    backends = _setup_backends(cfg, actors.actor.module, tokenizer, out, tools)
    check_rollout_logprobs(cfg, backends.train)  # actor.rollout_is needs a backend that reports log-probs
    ctx = StepContext(cfg=cfg, actor=actors.actor, ref_actor=actors.ref_actor, backend=backends.train,
                      tokenizer=tokenizer, tools=tools)
    return Run(cfg, out, tokenizer, model, episodes, retriever, ctx, info.rank, info.world_size, eval_sets,
               backends.eval, world)


def periodic_eval(run: Run, step: int) -> dict[str, float]:
    """The ``eval`` section's evaluation (objectives, policies, episodes, max_turns, temperature) of
    the current policy after step `step`, on its own generation (the configured backend, never the
    protocol scaffold) and the run's retriever. Returns ``eval/<field>@k<k>_<policy>`` metrics
    (`mempo.eval.EvalReport.scalars`, e.g. ``eval/em@k2_memory``) and ``time/eval``. Generation
    reseeds torch per request, so evaluating does not change the training run's numbers. Under
    torchrun every rank calls it (the actor is gathered for it, `generation_weights`); rank 0
    evaluates and returns the metrics, the others {}."""
    began = time.perf_counter()
    with generation_weights(run.ctx):
        if run.rank != 0:
            return {}
        report = evaluate(run.ctx.scoring_model, run.tokenizer, run.eval_episodes, run.retriever, run.cfg,
                          backend=run.eval_backend, label=f"step {step}", log=log, show_progress=False)
    return {**report.scalars("eval/"), "time/eval": time.perf_counter() - began}


def train(cfg: MempoConfig, *, model=None, tokenizer=None, episodes=None, retriever=None, out_dir=None,
          max_steps: Optional[int] = None, tools: Optional[Toolset] = None) -> TrainResult:
    """Train for ``trainer.total_steps`` steps; returns a TrainResult.

    Checkpoints (`mempo.train.checkpoint`: atomic, with a manifest of digests; model, optimiser,
    RNG states, ``data_state = {"step", "position"}``) go under ``<out>/checkpoints`` every
    ``trainer.save_every`` steps and at the end. Resume per ``trainer.resume`` (`refuse_used_run_dir`);
    a resumed run under a config that differs from the saved ``config.yaml`` says which fields
    differ and trains with the new values (the optimiser's lr, betas, eps and weight_decay are set
    from ``actor`` after its saved state is restored, `apply_optimizer_defaults`), and its
    metrics.jsonl is cut back to the resumed step, so it equals an uninterrupted run's (timing
    values aside). ``config.yaml`` is written atomically. Before the first step the checkpoint
    root is checked (`check_checkpoints_writable`, `check_checkpoint_space`: ``latest`` a
    directory, a read-only folder, too little free space, a file-size limit); a save the file
    system refuses later ends the run with a CheckpointWriteError naming the path and the errno
    (one line, exit 2 from the CLI): nothing is retried (those refusals do not pass on a retry)
    and nothing further is written; the unpublished ``.tmp-`` directory is removed and the
    checkpoints before it stand, so ``--resume`` continues from the newest of them and repeats
    the lost steps exactly (their metrics rows are cut back). Every ``trainer.eval_every``-th
    step (before that step's checkpoint) rank 0 runs `periodic_eval`; its numbers join that step's
    metrics row, logged even off the ``log_every`` grid.

    max_steps: stop after this many steps in this call (tests; the schedule is unchanged). tools: the
    agent's tools (None: `mempo.env.build.build_tools` of the config over the retriever; `build_run`)."""
    t = cfg.trainer
    refuse_used_run_dir(t.resume, Path(out_dir or t.out_dir) / "checkpoints")  # before anything is written
    check_checkpoints_writable(Path(out_dir or t.out_dir), Path(out_dir or t.out_dir) / "checkpoints")
    run = build_run(cfg, model=model, tokenizer=tokenizer, episodes=episodes, retriever=retriever, out_dir=out_dir,
                    tools=tools)
    ckpt_root = run.out_dir / "checkpoints"
    check_checkpoint_space(ckpt_root, run.ctx.actor.module)  # collective; before any step is trained
    start, resumed = 0, None
    # collective; every rank hashes its files, rank 0 says what it skips
    path = resume_checkpoint(t.resume, ckpt_root, log=log, model=run.ctx.actor.module,
                             optimizer=run.ctx.actor.optimizer)
    if path is not None:
        state = load_checkpoint(path, run.ctx.actor.module, run.ctx.actor.optimizer, verify=False)
        apply_optimizer_defaults(run.ctx.actor.optimizer)  # the config's lr, betas, eps, weight_decay: what it says
        start = resumed = int(state.step)
        if run.rank == 0:
            log(f"resuming from {path} (step {start})")
            _report_config_changes(cfg, run.out_dir / "config.yaml")
    elif t.resume.strip() == "auto" and run.rank == 0:
        log(f"no checkpoint in {ckpt_root}: starting a new run")
    if run.rank == 0:
        dump_config(cfg, run.out_dir / "config.yaml")
    result = TrainResult(run.out_dir, start, resumed_from=resumed, model=run.model, tokenizer=run.tokenizer)
    # the background writer's collectives need a group of their own (created on every rank, once)
    writer_group = dist.new_group(backend="gloo") if t.async_save and run.world_size > 1 else None
    pending: Optional[PendingCheckpoint] = None
    timer = StageTimer()
    end = t.total_steps if max_steps is None else min(t.total_steps, start + max_steps)
    B = cfg.data.questions_per_step
    with MetricsLogger(run.out_dir, tensorboard=t.tensorboard, wandb=t.wandb, resume_step=resumed,
                       wandb_project=t.wandb_project) as logger, \
            progress("train", t.total_steps, enabled=t.progress and run.rank == 0) as bar:
        if start:
            bar.advance(start)
        try:
            for step in range(start + 1, end + 1):
                batch = step_episodes(run.episodes, step, B, shuffle=cfg.data.shuffle, seed=cfg.data.seed,
                                      rank=run.rank, world_size=run.world_size)
                metrics = train_step(run.ctx, batch, step, timer).metrics
                if pending is not None:  # the previous step's checkpoint, written while this step ran
                    result.checkpoint, pending = pending.publish(), None
                if metrics["rollout/tool_errors"] and metrics["rollout/tool_errors"] == metrics["rollout/tool_calls"]:
                    log(f"step {step}: all {int(metrics['rollout/tool_calls'])} tool calls failed "
                         f"(rollout/tool_errors; is the retriever up?)")
                evaluated = bool(t.eval_every) and step % t.eval_every == 0
                if evaluated:
                    metrics.update(periodic_eval(run, step))  # collective; rank 0's metrics
                if step % t.log_every == 0 or step == end or evaluated:
                    logger.log(step, metrics)
                result.metrics.append(dict(metrics, step=step))
                result.last_step = step
                if (t.save_every and step % t.save_every == 0) or step == t.total_steps:
                    pending = start_checkpoint(
                        ckpt_root, step, run.ctx.actor.module, run.ctx.actor.optimizer,
                        data_state={"step": step, "position": step * B}, extra={"seed": t.seed},
                        keep_last=t.keep_last, background=t.async_save, process_group=writer_group)
                    if not t.async_save or step == end:
                        result.checkpoint, pending = pending.publish(), None
                bar.advance(1)
        except BaseException:
            if pending is not None:  # a failing run: its writes end, it stays unpublished
                pending.abandon()
            raise
    if writer_group is not None:
        dist.destroy_process_group(writer_group)
    return result


def _report_config_changes(cfg: MempoConfig, saved: Path) -> None:
    """Say which fields of `cfg` differ from the run's saved config.yaml (a resumed run)."""
    if not saved.is_file():
        return
    try:
        before = _flat(read_yaml_mapping(saved))
    except ConfigError as error:
        log(f"cannot compare with the saved config: {error}")
        return
    now = _flat(config_to_dict(cfg))
    changed = [f"{key} ({before.get(key)!r} -> {value!r})" for key, value in now.items()
               if key not in ("trainer.resume", "trainer.out_dir") and before.get(key) != value]
    if changed:
        log(f"resuming under a config that differs from {saved} in: {', '.join(changed)}; the new values apply "
            f"(the optimizer's hyperparameters too), the RNG states are the checkpoint's")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"section.field": value} of a nested config mapping."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out

