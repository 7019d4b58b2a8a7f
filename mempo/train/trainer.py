"""The MemPO training loop: build what is missing, run `mempo.train.step.train_step`, log, checkpoint,
resume.

Conventions
-----------
* Building (`build_run`): tokenizer: given, else ``model.tokenizer``, else the model directory's,
  else for ``model.path == "builtin-tiny"`` a byte-level BPE trained on the synthetic world
  (`mempo.model.builtin.train_tokenizer`, saved atomically to ``<out>/tokenizer`` and reloaded on
  resume; an unreadable saved one is retrained, with a warning: training it is deterministic). Model:
  given, else `build_causal_lm` (builtin-tiny: seeded with ``trainer.seed``). Episodes: given, else
  ``data.source == "synthetic"``: ``world.episodes(data.num_objectives, pool, data.seed)`` of the
  synthetic world (`mempo.eval.synthetic_world`: ``data.world_seed``, ``world_entities`` or
  ``world_documents``, ``article_fillers``); ``"files"``: the QA records of
  ``data.train_files`` composed into k-objective episodes (`mempo.env.data.compose_episodes`, k =
  ``data.num_objectives``, seed ``data.seed``). Retriever: given, else `HTTPRetriever` when
  ``env.retriever == "http"``, else BM25 over ``env.corpus_path`` when set, else over the synthetic
  world's documents (``data.source == "files"`` without a corpus is a ConfigError naming
  ``env.corpus_path``; a missing corpus file is a CorpusError naming it). An HTTP retriever must
  answer its health check (``/health``) before anything is built: a RetrieverUnavailableError
  naming ``env.retriever_url`` and the URL otherwise. The builtin-tiny tokenizer is trained on the
  world's or the corpus's documents. A ``model.path`` / ``model.tokenizer`` that is not a saved
  model is a ConfigError naming the field (`mempo.train.actor.load_pretrained`); a ``--out`` that
  is a file too (`prepare_out_dir`). The reference policy is a frozen copy of the initial model (skipped when
  ``actor.kl_coef == 0``).
* Backend: `mempo.rollout.backends.factory.build_backend` from ``rollout.backend`` /
  ``rollout.sglang_url`` (SGLang loads ``model.path``; a server's weight versions go to
  ``<out>/sglang_weights``). Only the config chooses: a model directory is used the same way
  whoever wrote it. ``rollout.protocol_scaffold`` (default off) adds the answer-blind
  `mempo.model.builtin.ProtocolScaffold` to the HF backend of training rollouts (tests, tiny demos).
* Data order: step s (1-based) takes questions ``[(s-1)*B, s*B)`` of an endless stream made of
  epochs over the episode pool, each epoch shuffled with ``random.Random(data.seed, epoch)`` when
  ``data.shuffle``; a pure function of s, so the data position is exactly the step
  (``data_state = {"step", "position"}``). Distributed: rank k takes every world_size-th question.
* Checkpoints (`mempo.train.checkpoint`, atomic, with a manifest of digests) every
  ``trainer.save_every`` steps and at the end: model, optimiser, RNG states, data state; under
  ``<out>/checkpoints``. Resume: ``trainer.resume`` "never" (the default: a run directory that
  already holds checkpoints is refused with a ConfigError offering ``--resume`` or a new
  ``--out``, before anything is written), "auto" (``--resume``: the newest intact checkpoint,
  skipping damaged ones with a line naming the file; a new run when there is none), or a checkpoint
  path. Resuming under a config that differs from the saved ``config.yaml`` says which fields
  differ. The metrics file is cut back to the resumed step (`MetricsLogger(resume_step=...)`), so a
  resumed run's metrics.jsonl equals an uninterrupted run's (timing values aside).
  ``config.yaml`` and the tokenizer are written atomically (`mempo.utils.atomic`).
* Periodic evaluation (``trainer.eval_every`` > 0): after every eval_every-th step (and before that
  step's checkpoint), `periodic_eval` runs `mempo.eval.evaluate` with the ``eval`` section
  (objectives, policies, episodes, max_turns, temperature) on the current policy's own generation
  (the configured backend, never the protocol scaffold) and the run's retriever. Its episodes are drawn once by `build_run`: synthetic source:
  `mempo.eval.eval_episodes` (question seeds apart from training's); files source: the QA records
  of ``data.eval_files`` composed per k with seed ``data.seed + EVAL_SEED_OFFSET + k``. The numbers
  join that step's metrics row (logged even off the ``log_every`` grid) as
  ``eval/<name>@k<k>_<policy>`` (`mempo.eval.EvalReport.scalars`, e.g. ``eval/em@k2_memory``) plus
  ``time/eval``. Rank 0 evaluates (on the unsharded rollout copy when distributed). Generation
  reseeds torch per request, so evaluating does not change the training run's numbers.
* Determinism (`configure_determinism`, ``trainer.deterministic``): deterministic torch algorithms
  (``warn_only``: an op without a deterministic kernel warns, naming itself), on by default for CPU
  runs and off by default on CUDA; switched on for CUDA, ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` is set
  before CUDA starts (cuBLAS is otherwise not deterministic) and new tensors are not NaN-filled
  (``torch.utils.deterministic.fill_uninitialized_memory = False``: a memset of every new CUDA
  tensor costs bandwidth, and mempo's kernels write every output element). Seeds from
  ``trainer.seed`` (+ rank); the rollout of step s is seeded by (rollout.seed, s) only.
"""
from __future__ import annotations

import copy
import os
import random
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from mempo.utils.atomic import atomic_directory
from mempo.config import ConfigError, MempoConfig, config_to_dict, dump_config, read_yaml_mapping

__all__ = ["TrainResult", "Run", "build_run", "train", "periodic_eval", "step_episodes", "seed_everything",
           "configure_determinism", "prepare_out_dir", "refuse_used_run_dir"]


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
    """Everything `build_run` assembled. eval_episodes: ``{k: episodes}`` of the periodic evaluation
    (empty when ``trainer.eval_every`` is 0); eval_backend: the backend it generates with (the
    training backend without logits processors)."""

    cfg: MempoConfig
    out_dir: Path
    tokenizer: Any
    model: Any
    episodes: list
    retriever: Any
    ctx: Any
    rank: int = 0
    world_size: int = 1
    eval_episodes: dict = field(default_factory=dict)
    eval_backend: Any = None


def seed_everything(seed: int) -> None:
    """Seed python, numpy and torch (determinism is `configure_determinism`'s)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % (2 ** 32))
    torch.manual_seed(seed)


def configure_determinism(enabled: Optional[bool] = None, *, cuda: Optional[bool] = None) -> bool:
    """Deterministic torch algorithms per ``trainer.deterministic`` (module conventions); returns
    whether they are on. enabled None: on unless CUDA is used. cuda: whether the run uses CUDA
    (None: ``torch.cuda.is_available()``). Call it before CUDA starts (`build_run` does, first)."""
    import torch

    cuda = torch.cuda.is_available() if cuda is None else bool(cuda)
    on = (not cuda) if enabled is None else bool(enabled)
    if on and cuda and "CUBLAS_WORKSPACE_CONFIG" not in os.environ:
        if torch.cuda.is_initialized():
            warnings.warn("trainer.deterministic: CUDA started before CUBLAS_WORKSPACE_CONFIG was set; cuBLAS "
                          "may stay non-deterministic (set CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment)",
                          RuntimeWarning, stacklevel=2)
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    torch.use_deterministic_algorithms(on, warn_only=True)
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
    "never" and `checkpoints` already holds checkpoints (module conventions), a CheckpointError
    when it names a path that does not exist."""
    from mempo.train.checkpoint import CheckpointError, has_checkpoints

    mode = resume.strip()
    if mode == "never" and has_checkpoints(checkpoints):
        raise ConfigError("trainer.resume", f"{checkpoints} already holds checkpoints of an earlier run; continue it "
                                            f"with `mempo {command} --resume` (trainer.resume=auto) or give a new --out")
    if mode not in ("never", "auto") and not Path(mode).exists():
        raise CheckpointError(f"trainer.resume: {mode}: no such checkpoint directory")


def step_episodes(episodes: Sequence[Any], step: int, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                  rank: int = 0, world_size: int = 1) -> list:
    """The questions of (1-based) step `step` (module conventions), this rank's share."""
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


def _build_tokenizer(cfg: MempoConfig, out_dir: Path, world: Any):
    from transformers import AutoTokenizer

    from mempo.model.loading import load_pretrained

    if cfg.model.tokenizer:
        return load_pretrained(AutoTokenizer.from_pretrained, cfg.model.tokenizer, "model.tokenizer", "tokenizer")
    if cfg.model.path != "builtin-tiny":
        return load_pretrained(AutoTokenizer.from_pretrained, cfg.model.path, "model.path", "tokenizer")
    saved = out_dir / "tokenizer"
    if (saved / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(saved)
        except Exception as error:  # a damaged save (e.g. torn by an old mempo writing it in place)
            _log(f"{saved}: unreadable saved tokenizer ({type(error).__name__}); training it again")
    from mempo.model.builtin import default_corpus_texts, train_tokenizer

    texts = default_corpus_texts(world)
    if world is None and cfg.env.corpus_path:  # files source: learn the corpus's words instead
        from itertools import islice

        from mempo.env.corpus import iter_corpus

        texts += [f"{doc.title}\n{doc.text}" for doc in islice(iter_corpus(cfg.env.corpus_path), 2000)]
    tokenizer = train_tokenizer(texts, vocab_size=1024)
    if _rank() == 0:
        with atomic_directory(saved, phase="tokenizer") as staging:
            tokenizer.save_pretrained(staging)
    return tokenizer


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _qa_pool(paths: Sequence[str]) -> list:
    from mempo.env.data import load_qa

    return [record for path in paths for record in load_qa(path)]


def _episode_pool(cfg: MempoConfig, world: Any) -> list:
    d = cfg.data
    if d.source == "files":
        from mempo.env.data import compose_episodes

        pool = _qa_pool(d.train_files)
        if len(pool) < d.num_objectives:
            raise ConfigError("data.train_files", f"hold {len(pool)} questions, fewer than "
                                                  f"data.num_objectives={d.num_objectives}")
        count = max(1, len(pool) // d.num_objectives)
        return compose_episodes(pool, d.num_objectives, count, d.seed)
    wanted = max(d.questions_per_step * 4, 8)
    for count in (wanted, wanted // 2, wanted // 4, d.questions_per_step):
        try:
            return world.episodes(d.num_objectives, max(count, 1), seed=d.seed)
        except ValueError:
            continue
    raise ValueError(f"the synthetic world (world_entities={d.world_entities}) cannot make "
                     f"{d.questions_per_step} episodes of {d.num_objectives} objectives")


def _eval_episode_sets(cfg: MempoConfig, world: Any) -> dict[int, list]:
    """``{k: episodes}`` of the periodic evaluation (module conventions)."""
    from mempo.eval import EVAL_SEED_OFFSET, eval_episodes

    if cfg.data.source == "synthetic":
        return eval_episodes(world, cfg)
    from mempo.env.data import compose_episodes

    pool = _qa_pool(cfg.data.eval_files)
    sets = {}
    for k in cfg.eval.objectives:
        if len(pool) < k:
            raise ConfigError("eval.objectives", f"k={k} needs at least {k} questions; data.eval_files "
                                                 f"hold {len(pool)}")
        sets[int(k)] = compose_episodes(pool, k, cfg.eval.episodes, cfg.data.seed + EVAL_SEED_OFFSET + k,
                                        id_prefix="eval")
    return sets


def build_run(cfg: MempoConfig, *, model=None, tokenizer=None, episodes=None, retriever=None, out_dir=None) -> Run:
    """Assemble tokenizer, model, episodes, retriever, actors, backend and the step context."""
    import torch

    from mempo.eval import config_tools
    from mempo.model.loading import build_causal_lm
    from mempo.rollout.backends.factory import build_backend
    from mempo.train.actor import Actor, init_distributed
    from mempo.train.step import StepContext

    if retriever is None and cfg.data.source == "files" and cfg.env.retriever == "bm25" and not cfg.env.corpus_path:
        raise ConfigError("env.corpus_path", "must name a corpus jsonl (mempo.env.corpus) when data.source is "
                                             "'files' and env.retriever is 'bm25'")
    configure_determinism(cfg.trainer.deterministic)
    if retriever is None and cfg.env.corpus_path and not Path(cfg.env.corpus_path).is_file():
        from mempo.env.corpus import CorpusError

        raise CorpusError(f"env.corpus_path: {cfg.env.corpus_path}: corpus file not found")
    if retriever is None and cfg.env.retriever == "http":  # fail before anything is built or written
        retriever = _healthy_http_retriever(cfg.env.retriever_url)
    info = init_distributed()
    out = prepare_out_dir(out_dir or cfg.trainer.out_dir)
    seed_everything(cfg.trainer.seed + info.rank)
    world = None
    evaluating = cfg.trainer.eval_every > 0
    if cfg.data.source == "synthetic" and (episodes is None or retriever is None or tokenizer is None or evaluating):
        from mempo.eval import synthetic_world

        world = synthetic_world(cfg)
    if tokenizer is None:
        tokenizer = _build_tokenizer(cfg, out, world)
    if model is None:
        torch.manual_seed(cfg.trainer.seed)  # the same initial weights on every rank
        model = build_causal_lm(cfg.model, len(tokenizer))
    if episodes is None:
        episodes = _episode_pool(cfg, world)
    if retriever is None:
        if cfg.env.corpus_path:
            from mempo.env.retriever import load_or_build_bm25

            retriever = load_or_build_bm25(cfg.env.corpus_path, None)
        else:
            from mempo.env.retriever import BM25Retriever

            retriever = BM25Retriever.build(list(world.documents()))
    eval_sets = _eval_episode_sets(cfg, world) if evaluating else {}
    tools = config_tools(retriever, cfg)
    ref_actor = None
    if cfg.actor.kl_coef > 0:
        ref_actor = Actor(copy.deepcopy(model), cfg.actor, trainable=False)
    # an unsharded copy under torchrun: HF generation and teacher scoring run per rank on it
    rollout_model = copy.deepcopy(model) if info.distributed else None
    actor = Actor(model, cfg.actor)
    gen_model = rollout_model if rollout_model is not None else actor.module
    if rollout_model is not None:
        rollout_model.to(actor.device)
    processors = []
    if cfg.rollout.protocol_scaffold:
        from mempo.model.builtin import ProtocolScaffold

        processors.append(ProtocolScaffold(tokenizer, turns=min(cfg.rollout.max_turns, 3)))
    backend_options = dict(model_path=cfg.model.path, weights_dir=out / "sglang_weights")
    backend = build_backend(cfg, gen_model, tokenizer, logits_processors=processors, **backend_options)
    eval_backend = backend if not processors else build_backend(cfg, gen_model, tokenizer, **backend_options)
    ctx = StepContext(cfg=cfg, actor=actor, ref_actor=ref_actor, backend=backend, tokenizer=tokenizer, tools=tools,
                      rollout_model=rollout_model, distributed=info.distributed)
    return Run(cfg, out, tokenizer, model, list(episodes), retriever, ctx, info.rank, info.world_size, eval_sets,
               eval_backend)


def _healthy_http_retriever(url: str):
    """An `HTTPRetriever` at `url` that passed `HTTPRetriever.check_health` (RetrieverUnavailableError
    naming ``env.retriever_url`` and the URL otherwise)."""
    from mempo.env.client import HTTPRetriever
    from mempo.env.retriever import RetrieverUnavailableError

    try:
        retriever = HTTPRetriever(url)
    except ValueError as error:
        raise ConfigError("env.retriever_url", str(error)) from None
    try:
        retriever.check_health()
    except RetrieverUnavailableError as error:
        raise RetrieverUnavailableError(f"env.retriever_url: {error} (checked before training)") from None
    return retriever


def periodic_eval(run: Run, step: int) -> dict[str, float]:
    """The ``eval`` section's evaluation of the current policy after step `step` (module
    conventions): ``eval/<name>@k<k>_<policy>`` metrics and ``time/eval``."""
    from mempo.eval import evaluate

    began = time.perf_counter()
    report = evaluate(run.ctx.scoring_model, run.tokenizer, run.eval_episodes, run.retriever, run.cfg,
                      backend=run.eval_backend, label=f"step {step}", log=_log, show_progress=False)
    return {**report.scalars("eval/"), "time/eval": time.perf_counter() - began}


def train(cfg: MempoConfig, *, model=None, tokenizer=None, episodes=None, retriever=None, out_dir=None,
          max_steps: Optional[int] = None) -> TrainResult:
    """Train for ``trainer.total_steps`` steps (module conventions); returns a TrainResult.

    max_steps: stop after this many steps in this call (tests; the schedule is unchanged)."""
    from mempo.train.checkpoint import load_checkpoint, resume_checkpoint, save_checkpoint
    from mempo.train.logging import MetricsLogger, StageTimer, progress
    from mempo.train.step import train_step

    t = cfg.trainer
    refuse_used_run_dir(t.resume, Path(out_dir or t.out_dir) / "checkpoints")  # before anything is written
    run = build_run(cfg, model=model, tokenizer=tokenizer, episodes=episodes, retriever=retriever, out_dir=out_dir)
    ckpt_root = run.out_dir / "checkpoints"
    start, resumed = 0, None
    path = resume_checkpoint(t.resume, ckpt_root, log=_log)  # collective; rank 0 verifies and says what it skips
    if path is not None:
        state = load_checkpoint(path, run.ctx.actor.module, run.ctx.actor.optimizer, verify=False)
        start = resumed = int(state.step)
        if run.rank == 0:
            _log(f"resuming from {path} (step {start})")
            _report_config_changes(cfg, run.out_dir / "config.yaml")
    elif t.resume.strip() == "auto" and run.rank == 0:
        _log(f"no checkpoint in {ckpt_root}: starting a new run")
    if run.rank == 0:
        dump_config(cfg, run.out_dir / "config.yaml")
    result = TrainResult(run.out_dir, start, resumed_from=resumed, model=run.model, tokenizer=run.tokenizer)
    timer = StageTimer()
    end = t.total_steps if max_steps is None else min(t.total_steps, start + max_steps)
    B = cfg.data.questions_per_step
    with MetricsLogger(run.out_dir, tensorboard=t.tensorboard, wandb=t.wandb, resume_step=resumed,
                       wandb_project=t.wandb_project) as logger, \
            progress("train", t.total_steps, enabled=t.progress and run.rank == 0) as bar:
        if start:
            bar.advance(start)
        for step in range(start + 1, end + 1):
            batch = step_episodes(run.episodes, step, B, shuffle=cfg.data.shuffle, seed=cfg.data.seed,
                                  rank=run.rank, world_size=run.world_size)
            metrics = train_step(run.ctx, batch, step, timer).metrics
            if metrics["rollout/tool_errors"] and metrics["rollout/tool_errors"] == metrics["rollout/tool_calls"]:
                _log(f"step {step}: all {int(metrics['rollout/tool_calls'])} tool calls failed "
                     f"(rollout/tool_errors; is the retriever up?)")
            evaluated = bool(t.eval_every) and step % t.eval_every == 0 and run.rank == 0
            if evaluated:
                metrics.update(periodic_eval(run, step))
            if step % t.log_every == 0 or step == end or evaluated:
                logger.log(step, metrics)
            result.metrics.append(dict(metrics, step=step))
            result.last_step = step
            if (t.save_every and step % t.save_every == 0) or step == t.total_steps:
                result.checkpoint = save_checkpoint(
                    ckpt_root, step, run.ctx.actor.module, run.ctx.actor.optimizer,
                    data_state={"step": step, "position": step * B}, extra={"seed": t.seed},
                    keep_last=t.keep_last)
            bar.advance(1)
    return result


def _report_config_changes(cfg: MempoConfig, saved: Path) -> None:
    """Say which fields of `cfg` differ from the run's saved config.yaml (a resumed run)."""
    if not saved.is_file():
        return
    try:
        before = _flat(read_yaml_mapping(saved))
    except ConfigError as error:
        _log(f"cannot compare with the saved config: {error}")
        return
    now = _flat(config_to_dict(cfg))
    changed = [f"{key} ({before.get(key)!r} -> {value!r})" for key, value in now.items()
               if key not in ("trainer.resume", "trainer.out_dir") and before.get(key) != value]
    if changed:
        _log(f"resuming under a config that differs from {saved} in: {', '.join(changed)}")


def _flat(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{"section.field": value} of a nested config mapping."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _log(message: str) -> None:
    print(f"mempo: {message}", file=sys.stderr, flush=True)
