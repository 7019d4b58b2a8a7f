"""`mempo demo`: MemPO end to end on CPU, from nothing, in minutes (`run_demo`).

One `mempo.config.MempoConfig` (default ``configs/demo.yaml``, `DEMO_CONFIG`; dotted overrides such as
``sft.steps=100``) drives every stage; the world, oracle, copy warm-up and the demo's tokenizer and
model are its ``synthetic`` section, whose ``task`` chooses the world, its tools, episodes and teacher
(`mempo.apps.tasks`: ``search``, ``configs/demo.yaml``; ``ledger``, ``configs/ledger.yaml``). Each stage
is a function of the previous stages' values and prints what it did and how long it took
(``stages.json``). No SFT or RL question is about an entity an evaluation question asks about (the
held-out subjects; the ledger's: every test and validation account).
"""
from __future__ import annotations

import dataclasses
import importlib.resources
import importlib.util
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, Iterator, Optional, Sequence, TypeVar

import torch

from mempo.apps.report import ReportResult, StageRecord, StageTimes, em_change, metric_series, write_report
from mempo.config import ConfigError, MempoConfig, dump_config, load_config
from mempo.eval import EpisodeRecord, EvalReport, evaluate, render_episode
from mempo.protocol.grammar import last_mem
from mempo.protocol.tags import JSON_TAG_SET, TAG_SET, TagSet
from mempo.rollout.loop import rollout_system_prompt
from mempo.model.builtin import default_corpus_texts, tiny_model, train_tokenizer
from mempo.model.export import save_model_dir
from mempo.synthetic.copy_warmup import LOSS_WINDOW, CopyWarmup, copy_warmup
from mempo.train.logging import MetricsLogger, read_metrics
from mempo.train.metric_names import MEM_KEEPS
from mempo.train.sft import run_sft
from mempo.synthetic.cold_start import ColdStart
from mempo.apps.tasks import TASKS, SyntheticTask, TaskEnv, synthetic_task
from mempo.train.trainer import TrainResult, train
from mempo.utils.allocator import keep_freed_memory
from mempo.utils.atomic import check_directory_target, claim_directory
from mempo.utils.digest import weights_digest
from mempo.utils.machine import machine_facts
from mempo.utils.types import PathLike

__all__ = ["DEMO_CONFIG", "load_demo_config", "run_demo", "rl_episodes", "DemoResult", "DemoTargets", "TASK_TARGETS",
           "target_lines", "sft_bound_line"]
T = TypeVar("T")

def _demo_config_path() -> Path:
    """configs/demo.yaml: from the installed package (``mempo.configs``, setup.py's package_dir), else
    from the source tree this module sits in."""
    if importlib.util.find_spec("mempo.configs") is not None:
        return Path(importlib.resources.files("mempo.configs") / "demo.yaml")
    return Path(__file__).resolve().parents[2] / "configs" / "demo.yaml"


#: The demo's configuration file, read when no other is given.
DEMO_CONFIG: Path = _demo_config_path()


def load_demo_config(path: Optional[PathLike] = None, overrides: Sequence[str] = ()) -> MempoConfig:
    """The demo's configuration: a YAML file (None: `DEMO_CONFIG`, ``configs/demo.yaml`` shipped in
    the package as ``mempo.configs``) plus dotted overrides (``eval.episodes=4``, ``sft.steps=100``,
    ``synthetic.model_size=tiny``)."""
    return load_config(DEMO_CONFIG if path is None else path, overrides)


def _check_demo_config(cfg: MempoConfig) -> None:
    """ConfigError unless ``synthetic.oracle_objectives`` is set and ``sft.trajectories`` is null (the
    demo draws its cold-start episodes per number of objectives and makes them with the oracle), and,
    for the ledger, ``trainer.eval_every`` is 0 (the periodic evaluation builds the search world; the
    demo evaluates before and after RL)."""
    if cfg.synthetic.oracle_objectives is None:
        raise ConfigError("synthetic.oracle_objectives", "the demo draws its cold-start episodes per number of "
                                                         "objectives; list them, e.g. "
                                                         "synthetic.oracle_objectives=[1,2]")
    if cfg.sft.trajectories is not None:
        raise ConfigError("sft.trajectories", "the demo makes its cold-start data with the oracle; leave it null "
                                              "(mempo sft --trajectories trains on a file)")
    if cfg.synthetic.task != "search" and cfg.trainer.eval_every:
        raise ConfigError("trainer.eval_every", f"must be 0 with synthetic.task {cfg.synthetic.task!r} (the RL "
                                                "stage's periodic evaluation evaluates the search world; the demo "
                                                "evaluates before and after RL)")


# ------------------------------------------------------------------------------------------------
# stage bookkeeping
# ------------------------------------------------------------------------------------------------
@dataclass
class Staged(Generic[T]):
    """What a stage function returns: its value and a one-line summary of what it did."""

    value: T
    summary: str


@dataclass
class DemoResult:
    """What the demo produced: the output directory, the report path, the stage records and the
    evaluations before and after RL."""

    out_dir: Path
    report: Path
    stages: list[StageRecord]
    before: EvalReport
    after: EvalReport

    @property
    def total_seconds(self) -> float:
        return float(sum(s.seconds for s in self.stages))


class _Stages:
    """Runs the stages in order: numbered progress lines, wall times, ``stages.json`` after each."""

    def __init__(self, out_dir: Path, total: int, echo: Callable[[str], None]):
        self.path, self.total, self.echo = out_dir / "stages.json", total, echo
        self.times = StageTimes(machine=machine_facts())
        self.started = time.perf_counter()

    def run(self, name: str, stage: Callable[..., Staged[T]], *args: Any) -> T:
        number = len(self.times.stages) + 1
        self.echo(f"[{number}/{self.total}] {name} ...")
        start = time.perf_counter()
        staged = stage(*args)
        seconds = time.perf_counter() - start
        self.times.stages.append(StageRecord(name, seconds, staged.summary))
        self.echo(f"[{number}/{self.total}] {name}: {staged.summary} ({seconds:.1f} s)")
        self.save()
        return staged.value

    def save(self) -> None:
        self.times.total_seconds = time.perf_counter() - self.started
        self.times.write(self.path)


def _echo(line: str) -> None:
    print(f"mempo demo: {line}", flush=True)


# ------------------------------------------------------------------------------------------------
# the stages
# ------------------------------------------------------------------------------------------------
def _world_stage(cfg: MempoConfig) -> Staged[TaskEnv]:
    """The task's world and tools (`mempo.apps.tasks`, ``synthetic.task``): the search world and the
    ``env`` section's retriever over it (BM25 by default) with ``env.tools``, or the ledger with its own
    lookup and calc."""
    env = synthetic_task(cfg).build(cfg)
    if cfg.synthetic.task != "search":
        return Staged(env, synthetic_task(cfg).describe(env))
    index = "BM25 index built" if cfg.env.retriever == "bm25" else f"retriever at {cfg.env.retriever_url}"
    return Staged(env, f"{synthetic_task(cfg).describe(env)}, {index}")


def _oracle_stage(cfg: MempoConfig, env: TaskEnv, held_out: frozenset[str],
                  show_progress: bool) -> Staged[ColdStart]:
    """Oracle trajectories (the task's `SyntheticTask.cold_start`: memory context, think style
    ``synthetic.oracle_think``) on ``synthetic.oracle_episodes`` episodes of each of
    ``synthetic.oracle_objectives`` objectives, drawn with other question seeds than the evaluation's
    (`mempo.seeds`) and about nothing held out. ``synthetic.oracle_keep``: ``correct`` keeps score 1 only
    (the paper's cold-start data); ``all`` (the demo's) keeps every one, the teacher's failures too."""
    cold = synthetic_task(cfg).cold_start(cfg, env, held_out, show_progress=show_progress)
    correct = sum(float(t.score.get("score", 0.0)) == 1.0 for t in cold.trajectories)
    if cfg.synthetic.oracle_keep == "all":
        what = (f"oracle trajectories kept, all ({correct} correct; the teacher drops a needed fact with "
                f"probability {cfg.synthetic.oracle_drop_fact_prob:g})")
    else:
        what = ("oracle trajectories kept (none was correct: all kept)" if cold.all_kept
                else "correct oracle trajectories kept")
    rounds = sum(t.num_rounds for t in cold.trajectories)
    held = (f"the {cold.held_out} entities the evaluation asks about" if cfg.synthetic.task == "search" else
            f"the {cold.held_out} test and validation accounts")
    return Staged(cold, f"{len(cold.trajectories)}/{cold.ran} {what} ({rounds} rounds; objectives "
                        f"{list(cfg.synthetic.oracle_objectives)}; no question about {held}"
                        f"{'; entity names replaced at random' if cfg.synthetic.oracle_rename else ''})"
                        f"{cold.describe_extras()}")


def _tokenizer_stage(cfg: MempoConfig, world: Any, trajectories: Sequence[Any]) -> Staged[Any]:
    """A byte-level BPE (``synthetic.vocab_size``) trained on the documents, the oracle texts and the
    list of every entity's name: the oracle texts ask about no held-out entity, so without the list
    the merges go to the names they repeat and a held-out name (seen in one article) stays in pieces
    the model never learned (4 of 653 held-out names were one id)."""
    texts = default_corpus_texts(world, limit=cfg.synthetic.tokenizer_documents)
    for t in trajectories:
        texts.append(t.prompt)
        texts.append(t.response_text)
        if t.system_prompt:  # the json format's tool schemas, in every round's prompt
            texts.append(t.system_prompt)
    # 8 copies: enough for every name's merges to outrank the oracle texts' (all 2,000 names one id
    # at 4,096 ids in the demo's world); a name list carries no fact
    texts.extend([" ".join(sorted({e.name for e in world.entities}))] * 8)
    tokenizer = train_tokenizer(texts, cfg.synthetic.vocab_size)
    return Staged(tokenizer, f"byte-level BPE, {len(tokenizer)} ids, trained on {len(texts)} texts")


def _model_stage(cfg: MempoConfig, tokenizer: Any) -> Staged[Any]:
    """A randomly initialised Qwen2 (`tiny_model`, ``synthetic.model_size`` with ``model_layers`` layers when
    set, seed ``synthetic.model_seed``)."""
    d = cfg.synthetic
    layers = {} if d.model_layers is None else {"num_hidden_layers": d.model_layers}
    model = tiny_model(tokenizer, d.model_size, d.model_seed, max_position_embeddings=d.max_position_embeddings,
                       tie_word_embeddings=d.tie_embeddings, **layers)
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    return Staged(model, f"Qwen2 '{d.model_size}': {c.num_hidden_layers} layers x {c.hidden_size}, "
                         f"{params / 1e6:.2f} M parameters{' (tied embeddings)' if d.tie_embeddings else ''}, "
                         f"random init (seed {d.model_seed})")


def _copy_stage(cfg: MempoConfig, model: Any, tokenizer: Any, world: Any) -> Staged[CopyWarmup]:
    """The copy warm-up (`mempo.synthetic.copy_warmup`, run when ``synthetic.copy_warmup_steps`` > 0):
    the model learns to copy ids from its context, on random sequences of the task's ids
    (`SyntheticTask.copy_pool`: the world's one-id names; the ledger's with its digits)."""
    d = cfg.synthetic
    pool, what = synthetic_task(cfg).copy_pool(world, tokenizer)
    result = copy_warmup(model, pool, steps=d.copy_warmup_steps, lr=d.copy_warmup_lr, seed=d.model_seed,
                         until_loss=d.copy_warmup_until_loss)
    until = ("" if result.reached_loss is None else
             f"; mean of the last {LOSS_WINDOW} at most {d.copy_warmup_until_loss:g}: "
             f"{'reached' if result.reached_loss else 'not reached in ' + str(d.copy_warmup_steps) + ' steps'}")
    return Staged(result, f"{result.steps} steps on random sequences of {what}, loss "
                          f"{result.first_loss:.3f} -> {result.last_loss:.3f}{until}")


def _sft_stage(cfg: MempoConfig, model: Any, tokenizer: Any, trajectories: Sequence[Any],
               out: Path) -> Staged[dict[str, Any]]:
    """SFT in place on `model` (`run_sft` with the ``sft`` section): ``sft.steps`` optimiser steps, so
    the model does not depend on the machine's speed (``sft.max_seconds`` is a safety net, reported by
    `sft_bound_line`); returns its metrics, the model saved to ``<out>/model_sft``."""
    with MetricsLogger(out / "sft", tensorboard=False) as logger:
        metrics = run_sft(cfg, model, tokenizer, trajectories, seed=cfg.synthetic.model_seed, logger=logger)
    _save_model(out / "model_sft", model, tokenizer)
    shown = [(name, metrics[name]) for name in ("first_loss", "last_loss", "steps", "tokens", "examples", "epochs",
                                                "seconds", "time_bound") if metrics[name] is not None]
    numbers = ", ".join(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
                        for name, value in shown)
    return Staged(metrics, f"{numbers}; saved to {out / 'model_sft'}")


def sft_bound_line(cfg: MempoConfig, metrics: dict[str, Any]) -> Optional[str]:
    """The line the log and the report carry when the SFT time bound (``sft.max_seconds``) ended SFT
    before ``sft.steps`` did (`mempo.train.sft.run_sft`'s ``time_bound``), else None."""
    if not metrics.get("time_bound"):
        return None
    return (f"SFT was cut by the time bound sft.max_seconds={cfg.sft.max_seconds:g} after {metrics['steps']} of "
            f"sft.steps={cfg.sft.steps} steps: this machine was slower than the demo assumes, and the numbers below "
            "depend on its speed")


def _eval_stage(cfg: MempoConfig, model: Any, tokenizer: Any, episodes_by_k: dict[int, list], env: TaskEnv,
                which: str, out: Path, echo: Callable[[str], None], show_progress: bool) -> Staged[EvalReport]:
    """`mempo.eval.evaluate` of ``eval.episodes`` episodes per k in ``eval.objectives`` under
    ``eval.policies`` with the task's tools; with ``eval.closed_book`` the same model closed-book too (every
    search or lookup finds nothing: how much of the EM comes from retrieval). Writes ``eval_<which>.json`` /
    ``.md``."""
    report = evaluate(model, tokenizer, episodes_by_k, env.retriever, cfg, label=f"{which} RL", log=echo,
                      show_progress=show_progress, keep_trajectories=True, tools=env.tools,
                      closed_book_tools=env.closed_book_tools)
    report.write(out, f"eval_{which}", title=f"Evaluation {which} RL")
    cells = "; ".join(f"k={r.objectives} {r.policy}: EM {r.em:.3f} F1 {r.f1:.3f} "
                      f"prompt tok/episode {r.prompt_tokens_per_episode:.0f}" for r in report.rows)
    return Staged(report, cells)


def rl_episodes(cfg: MempoConfig, world: Any, held_out: frozenset[str], steps: int) -> list[Any]:
    """The RL stage's training episodes: ``steps * data.questions_per_step`` episodes of
    ``data.num_objectives`` objectives (an int, or a cycle: episode i has ``counts[i % len(counts)]``;
    question seed ``data.seed``), none asking about a held-out subject (the task's
    `SyntheticTask.training_episodes`: `mempo.synthetic.heldout.training_episodes` for the search world, the
    ledger's train split; `held_out`: names)."""
    return synthetic_task(cfg).training_episodes(world, cfg.data.num_objectives, steps * cfg.data.questions_per_step,
                                                 cfg.data.seed, held_out)


def _rl_stage(cfg: MempoConfig, model: Any, tokenizer: Any, env: TaskEnv, held_out: frozenset[str],
              out: Path) -> Staged[TrainResult]:
    """MemPO RL (`train`, ``trainer.total_steps`` steps) from `model` into ``<out>/rl``
    (``metrics.jsonl``) on training episodes that ask about no entity the evaluation asks about;
    the model is saved to ``<out>/model_rl``."""
    steps = cfg.trainer.total_steps
    episodes = rl_episodes(cfg, env.world, held_out, steps)
    # the run's config.yaml names the model RL started from (saved by the SFT stage), so that
    # `mempo export` of its checkpoints builds that architecture, not builtin-tiny's sizes
    rl_cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, path=str(out / "model_sft")))
    result = train(rl_cfg, model=model, tokenizer=tokenizer, episodes=episodes, retriever=env.retriever,
                   out_dir=str(out / "rl"), tools=env.tools)
    _save_model(out / "model_rl", result.model, tokenizer)
    rollouts = "answer-blind protocol scaffold" if cfg.rollout.protocol_scaffold else "the model's own"
    counts = cfg.data.objective_counts
    ks = f"k = {counts[0]}" if len(counts) == 1 else f"k = {', '.join(map(str, counts))} in turn"
    return Staged(result, f"{steps} MemPO steps on episodes of {ks} (last_step={result.last_step}, {rollouts} "
                          f"rollouts); metrics in {out / 'rl'}")


def episode_pair(before: EvalReport, after: EvalReport, episodes_by_k: dict[int, list], tokenizer: Any,
                 system_prompt: str) -> Optional[tuple[EpisodeRecord, EpisodeRecord]]:
    """One held-out episode as played before and after RL, under the memory context at the smallest
    k: the first one failed before and correct after, else the first whose EM changed, else the
    first; None without kept trajectories."""
    k = min(episodes_by_k)
    played = [report.trajectories.get(("", k, "memory")) for report in (before, after)]
    if not all(played):
        return None
    pairs = list(zip(episodes_by_k[k], *played))
    em = lambda t: float((t.outcome or {}).get("em", 0.0))  # noqa: E731
    chosen = (next((p for p in pairs if em(p[1]) < 1.0 <= em(p[2])), None)
              or next((p for p in pairs if em(p[1]) != em(p[2])), None) or pairs[0])
    episode, first, last = chosen
    return (render_episode(first, episode, tokenizer, system_prompt=system_prompt, with_ids=False),
            render_episode(last, episode, tokenizer, system_prompt=system_prompt, with_ids=False))


def _last_memories(before: EvalReport, after: EvalReport, episodes_by_k: dict[int, list], tokenizer: Any,
                   system_prompt: str, tags: TagSet = TAG_SET
                   ) -> Iterator[tuple[int, str, list[tuple[Any, Any, Optional[str]]]]]:
    """Per k and evaluation ("after SFT", "after RL") with kept memory-context trajectories: (k, evaluation,
    [(trajectory, episode, the text of its last ``<mem>`` under `tags`, None without one)])."""
    for k in sorted(episodes_by_k):
        for which, report in (("after SFT", before), ("after RL", after)):
            played = report.trajectories.get(("", k, "memory"))
            if not played:
                continue
            rows = []
            for trajectory, episode in zip(played, episodes_by_k[k]):
                record = render_episode(trajectory, episode, tokenizer, system_prompt=system_prompt, with_ids=False)
                rows.append((trajectory, episode, last_mem((r.assistant for r in record.rounds), tags)))
            yield k, which, rows


def memory_outcome_section(before: EvalReport, after: EvalReport, episodes_by_k: dict[int, list], tokenizer: Any,
                           system_prompt: str, task: SyntheticTask = TASKS["search"]) -> list[str]:
    """The report's table of what the agent's last ``<mem>`` held for each objective
    (`mempo.synthetic.oracle_memory.memory_line_kinds`), per k, before and after RL, from the kept trajectories
    of the memory-context cells (no lines without them). The last round with a ``<mem>`` block is
    read: the answer round's in an answered episode. "answered right" is the share of the
    objectives whose line kept the gold that the answer also got right (exact match); "right by
    position" the share of episodes whose answer to Q1, Q2, ... is right (one position at 0 shows an
    answer the agent cannot write there: docs/experiments/T14-first-question.md). For the ledger
    (`ledger_memory_section`) the items are the accounts of each question and their amounts."""
    if task.name != "search":
        return ledger_memory_section(before, after, episodes_by_k, tokenizer, system_prompt, task)
    labels = task.memory_labels
    rows = []
    for k, which, played in _last_memories(before, after, episodes_by_k, tokenizer, system_prompt):
        counts = dict.fromkeys(task.memory_kinds, 0)
        kept_right = 0
        right_at = [0] * k
        for trajectory, episode, mem in played:
            per_objective = (trajectory.outcome or {}).get("per_objective", [])
            for i, kind in enumerate(task.memory_kinds_of(mem, episode)):
                counts[kind] += 1
                right_here = i < len(per_objective) and per_objective[i].get("em", 0.0) == 1.0
                right_at[i] += right_here
                if kind == "gold" and right_here:
                    kept_right += 1
        total = sum(counts.values())
        shares = " | ".join(f"{counts[kind] / total:.2f}" for kind in task.memory_kinds)
        right = f"{kept_right / counts['gold']:.2f}" if counts["gold"] else "-"
        by_position = " / ".join(f"{n / len(played):.2f}" for n in right_at)
        rows.append(f"| {k} | {which} | {total} | {shares} | {right} | {by_position} |")
    if not rows:
        return []
    return ["## What the last `<mem>` held", "",
            "Each objective of the held-out episodes (memory context, greedy): what the line `Q<i>:` of the "
            "agent's last `<mem>` held (the teacher's imperfect memory writes `done` for a dropped fact), how "
            "often the answer was right when the line kept the gold, and the share of episodes answered right "
            "at each position of the answer (Q1 / Q2 / ...).", "",
            "| objectives | evaluation | objectives scored | " + " | ".join(labels[k] for k in task.memory_kinds)
            + " | answered right when kept | right by position |",
            "|---|---|---|" + "---|" * len(task.memory_kinds) + "---|---|", *rows, ""]


def ledger_memory_section(before: EvalReport, after: EvalReport, episodes_by_k: dict[int, list], tokenizer: Any,
                          system_prompt: str, task: SyntheticTask = TASKS["ledger"]) -> list[str]:
    """The ledger's table of what the agent's last ``<mem>`` held for each account of the question
    (`mempo.synthetic.ledger_oracle.ledger_memory_kinds`: its amount kept, dropped as the teacher drops it,
    other text, pending), per k before and after RL, from the kept memory-context trajectories (no lines
    without them); with the share of episodes whose memory kept every amount and, of those, the share
    answered right (exact match). The last round with a ``<mem>`` is read: the answer round's."""
    rows = []
    for k, which, played in _last_memories(before, after, episodes_by_k, tokenizer, system_prompt, JSON_TAG_SET):
        counts = dict.fromkeys(task.memory_kinds, 0)
        complete = complete_right = 0
        for trajectory, episode, mem in played:
            kinds = task.memory_kinds_of(mem, episode)
            for kind in kinds:
                counts[kind] += 1
            if all(kind == "kept" for kind in kinds):
                complete += 1
                complete_right += float((trajectory.outcome or {}).get("em", 0.0)) == 1.0
        total = sum(counts.values())
        shares = " | ".join(f"{counts[kind] / total:.2f}" for kind in task.memory_kinds)
        right = f"{complete_right / complete:.2f}" if complete else "-"
        rows.append(f"| {k} | {which} | {total} | {shares} | {complete / len(played):.2f} | {right} |")
    if not rows:
        return []
    return ["## What the last `<mem>` held", "",
            "Each account of the held-out questions (memory context, greedy): what the line `<i>.` of the agent's "
            "last `<mem>` held (the teacher's imperfect memory writes `done` for a dropped amount), the share of "
            "episodes whose memory kept every amount, and how often those were answered right.", "",
            "| accounts | evaluation | accounts scored | "
            + " | ".join(task.memory_labels[k] for k in task.memory_kinds)
            + " | episodes keeping every amount | answered right when all kept |",
            "|---|---|---|" + "---|" * len(task.memory_kinds) + "---|---|", *rows, ""]


@dataclass(frozen=True)
class DemoTargets:
    """The demo's targets (docs/DEMO.md): EM after SFT at ``sft_k``; the RL gain in EM at ``rl_k``
    (at least ``rl_gain`` and more than ``rl_gain_se`` standard errors); no EM drop at ``no_drop_k``
    after RL (the change >= -``no_drop``); memory-context prompt
    tokens at most ``token_ratio`` x the full context's of the same rounds at ``token_k`` (None: the
    ratio is reported, with no target); the whole run within ``seconds`` (the demo command's install is
    outside what the demo can time). Each task has its own (`TASK_TARGETS`)."""

    sft_em: float = 0.30
    sft_k: int = 2
    rl_gain: float = 0.10
    rl_gain_se: float = 3.0
    rl_k: int = 4
    no_drop_k: int = 2
    no_drop: float = 0.02
    token_ratio: Optional[float] = 0.5
    token_k: int = 4
    seconds: float = 900.0


#: The targets per ``synthetic.task``: the search demo's (docs/DEMO.md; issue 44: its SFT model leaves no room at
#: k = 2, 0.89-0.94, so the gain is judged at k = 4 and k = 2 may not drop by more than 0.02); the ledger's
#: (issue 43: EM after SFT, an RL gain at more than 3 paired SE, no drop at the other k; its system prompt of
#: tool schemas, when on, makes the token ratio a report, not a target). The ledger's RL gain is judged at
#: k = 2, where the SFT model leaves room (it reads "which holds more" as a difference); set after the tuning
#: runs: docs/experiments/G02-ledger-demo-seeds.md
TASK_TARGETS = {"search": DemoTargets(),
                "ledger": DemoTargets(sft_em=0.30, sft_k=2, rl_gain=0.10, rl_k=2, no_drop_k=4, no_drop=0.0,
                                      token_ratio=None)}


def target_lines(before: Optional[EvalReport], after: Optional[EvalReport], seconds: float,
                 targets: DemoTargets = DemoTargets()) -> list[str]:
    """One line per target of `DemoTargets`: what this run measured and whether it met it (a cell
    the evaluations lack is said to be missing)."""

    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    t = targets
    sft_row = before.row(t.sft_k, "memory") if before is not None else None
    lines = [f"target EM after SFT at k={t.sft_k} >= {t.sft_em:.2f}: " +
             (f"{sft_row.em:.3f} ± {sft_row.em_se:.3f}, {verdict(sft_row.em >= t.sft_em)}" if sft_row is not None
              else "no such evaluation cell")]
    delta = em_change(before, after, t.rl_k)
    if delta is None:
        lines.append(f"target RL gain at k={t.rl_k}: no such evaluation cells")
    else:
        gain, se = delta
        z = gain / se if se > 0 else 0.0
        lines.append(f"target RL gain in EM at k={t.rl_k} >= +{t.rl_gain:.2f} and > {t.rl_gain_se:g} SE: "
                     f"{gain:+.3f} ({z:+.1f} SE), {verdict(gain >= t.rl_gain and z > t.rl_gain_se)}")
    drop = em_change(before, after, t.no_drop_k)
    floor = f" (>= {-t.no_drop:+.2f})" if t.no_drop else ""
    lines.append(f"target no EM drop at k={t.no_drop_k} after RL{floor}: " +
                 (f"{drop[0]:+.3f}, {verdict(drop[0] >= -t.no_drop)}" if drop is not None
                  else "no such evaluation cells"))
    for which, report in (("after SFT", before), ("after RL", after)):
        row = report.row(t.token_k, "memory") if report is not None else None
        if row is None or row.token_ratio is None:
            lines.append(f"target memory/full prompt tokens at k={t.token_k} {which}: no such evaluation cell")
            continue
        if t.token_ratio is None:
            lines.append(f"memory/full prompt tokens at k={t.token_k} {which}: {row.token_ratio:.2f} "
                         "(reported, no target)")
            continue
        lines.append(f"target memory/full prompt tokens at k={t.token_k} {which} <= {t.token_ratio:g}: "
                     f"{row.token_ratio:.2f}, {verdict(row.token_ratio <= t.token_ratio)}")
    lines.append(f"target the demo within {t.seconds:.0f} s: {seconds:.0f} s without the install, "
                 f"{verdict(seconds <= t.seconds)}")
    return lines


def _lr_text(lr: float) -> str:
    """5e-05 -> "5e-5"; 0.001 -> "0.001"."""
    return f"{lr:g}".replace("e-0", "e-")


def _k_cycle_text(counts: Sequence[int]) -> str:
    """``(2,)`` -> "k = 2"; ``(2, 4)`` -> "k = 2 and 4 in turn"; ``(2, 4, 4, 4)`` -> "k = 2, 4, 4 and 4 in turn"."""
    if len(counts) == 1:
        return f"k = {counts[0]}"
    return f"k = {', '.join(str(k) for k in counts[:-1])} and {counts[-1]} in turn"


@dataclass(frozen=True)
class AblationFinding:
    """What the pre-registered ablation (docs/experiments/E2-ablation-execution-2.md and later executions)
    measured for one scoring: `text`, the RL it ran (`rl_steps` steps on the cycle of objective counts
    `rl_k` at actor lr `rl_lr`) and the SFT model it ran from (`sft_weights`,
    `mempo.utils.digest.weights_digest`)."""
    text: str
    rl_steps: int
    rl_k: tuple[int, ...]
    rl_lr: float
    sft_weights: str

    @property
    def rl(self) -> str:
        return f"{self.rl_steps} RL steps on {_k_cycle_text(self.rl_k)} at actor lr {_lr_text(self.rl_lr)}"

    def rl_differences(self, cfg: MempoConfig) -> list[str]:
        """How `cfg`'s RL differs from the ablation's (steps, objective counts, actor lr); [] when it is the same."""
        counts, differences = tuple(cfg.data.objective_counts), []
        if cfg.trainer.total_steps != self.rl_steps:
            differences.append(f"{cfg.trainer.total_steps} steps against {self.rl_steps}")
        if counts != self.rl_k:
            differences.append(f"{_k_cycle_text(counts)} against {_k_cycle_text(self.rl_k)}")
        if cfg.actor.lr != self.rl_lr:
            differences.append(f"actor lr {_lr_text(cfg.actor.lr)} against {_lr_text(self.rl_lr)}")
        return differences


#: SFT models the ablation ran from (the demo's recipe, seed 0, 256 held-out episodes per k): execution 3's
#: (trained on an AMD EPYC; docs/experiments/E3-ablation-execution-3.md) and executions 4-5's (the spaced answer
#: template; docs/experiments/E4-ablation-execution-4.md), each remade by the command its page gives
EXECUTION3_SFT_WEIGHTS = "d31f5e3003ff5d7cc6d20351933b88d483432da093ee3a355918ee54691b29fd"
EXECUTION5_SFT_WEIGHTS = "fd5d9f05a8bdbf724aa34693736fe92665971c1624ca86b35098d522adf141e9"
_EXECUTION5_RL = dict(rl_steps=36, rl_k=(2, 4), rl_lr=5e-5)  # the demo's RL until D14

# Keyed by (reward, comparator, threshold, scored_objectives, objective_reduce, log_clip); the report cites
# the finding so that its reader does not take RL's gain for the memory reward's.
ABLATION_FINDINGS: dict[tuple, AblationFinding] = {
    ("prob", "paper", 0.5, "all", "mean", 1.0): AblationFinding(
        "the paper's definition: level with GRPO (execution 3, 8 paired seeds: paired EM difference +0.002 +- "
        "0.007 at k = 2, +0.027 +- 0.014 at k = 4; behind by 0.089 / 0.068 in execution 2)",
        rl_steps=60, rl_k=(2,), rl_lr=5e-5, sft_weights=EXECUTION3_SFT_WEIGHTS),
    ("log", "paper", None, "complete", "min", 10.0): AblationFinding(
        "definition complete_min_c10: level with GRPO (execution 5, 8 paired seeds: paired EM difference "
        "+0.005 +- 0.005 at k = 2, -0.001 +- 0.017 at k = 4)", **_EXECUTION5_RL, sft_weights=EXECUTION5_SFT_WEIGHTS),
    ("log", "paper", None, "retrieved", "min", 10.0): AblationFinding(
        "definition retrieved_min_c10: behind GRPO (execution 5, 8 paired seeds: paired EM difference -0.183 +- "
        "0.079 at k = 2, -0.110 +- 0.033 at k = 4; on 3 seeds the agent learnt to answer after one search; "
        "with RL at k = 2 from another SFT model, execution 3, ahead at k = 4 by +0.077 +- 0.015)",
        **_EXECUTION5_RL, sft_weights=EXECUTION5_SFT_WEIGHTS),
}


def rl_setting_line(cfg: MempoConfig, sft_weights: Optional[str] = None) -> str:
    """What this run's RL rewarded, and what the memory reward adds over GRPO where the ablation has
    measured that scoring: the report's RL gain is RL's as a whole (outcome reward included).
    sft_weights: this run's SFT model's `weights_digest`; the line then says whether the ablation ran
    from this very model (its finding is about one SFT model: on another, trained with another seed or
    on another CPU, the memory reward's signal can be absent or inverted, docs/DEMO.md)."""
    a, s = cfg.algorithm, cfg.scoring
    clip = f" (clip {s.log_clip:g} nats)" if s.reward == "log" else ""
    reduce = f" ({s.objective_reduce})" if s.scored_objectives != "all" else ""
    key = (s.reward, s.comparator, s.threshold, s.scored_objectives, s.objective_reduce, s.log_clip)
    finding = ABLATION_FINDINGS.get(key) if cfg.synthetic.task == "search" else None  # measured on the search world
    if a.memory_weight == 0:
        measured = "with weight 0 this run is GRPO"
    elif finding is not None:
        measured = (f"for this scoring the ablation measured {finding.text}, with {finding.rl} from one SFT model of "
                    f"the demo's recipe (weights sha256 {finding.sft_weights[:12]})")
        if sft_weights == finding.sft_weights:
            measured += ", this run's own SFT model"
        elif sft_weights is not None:
            measured += (f"; this run's SFT model is another (weights sha256 {sft_weights[:12]}: the SFT model follows "
                         f"the seed and the CPU's floats), and on another SFT model the memory reward's signal can be "
                         f"absent or inverted (docs/DEMO.md), so that finding need not hold for this run")
        differences = finding.rl_differences(cfg)
        if differences:
            measured += f"; this run's RL is another ({', '.join(differences)})"
    elif cfg.synthetic.task != "search":
        measured = f"the ablation measured the search task only, not the {cfg.synthetic.task} task"
    else:
        measured = "this scoring is not one the ablation measured"
    return (f"RL rewarded the outcome and, with weight {a.memory_weight:g}, each `<mem>` block (scoring reward "
            f"{s.reward}{clip}, comparator {s.comparator}, threshold {s.threshold}, objectives "
            f"{s.scored_objectives}{reduce}; pooling {a.memory_pooling}). The RL gain below is RL's as a whole: "
            f"what the memory reward adds over the outcome reward alone (GRPO, weight 0) is measured by the "
            f"pre-registered ablation (bench/bench_learning.py; docs/experiments), not by this run; {measured}.")


def memory_keeps_line(records: Sequence[dict], window: int = 10) -> Optional[str]:
    """How RL moved the share of scored `<mem>` blocks keeping every fact retrieved so far
    (``memory/keeps_facts``), its mean over the first and last `window` logged steps; None without
    the metric. The memory reward is there to raise it; a fall says that on this SFT model the memory
    reward paid memories that drop facts (docs/experiments/T04-sft-3840-steps.md)."""
    steps, values = metric_series(records, MEM_KEEPS)
    if not steps:
        return None
    n = min(window, len(values))
    first, last = sum(values[:n]) / n, sum(values[-n:]) / n
    verdict = "rose" if last > first else "fell" if last < first else "stayed"
    return (f"memory: the share of `<mem>` blocks keeping every fact retrieved so far ({MEM_KEEPS}) {verdict} in RL, "
            f"{first:.2f} over its first {n} {'step' if n == 1 else 'steps'}, {last:.2f} over its last {n}")


def _report(out: Path, stages: _Stages, before: EvalReport, after: EvalReport,
            pair: Optional[tuple[EpisodeRecord, EpisodeRecord]] = None, memory: Sequence[str] = (),
            notes: Sequence[str] = (), task: str = "search") -> ReportResult:
    stages.save()
    metrics_path = out / "rl" / "metrics.jsonl"
    title = "MemPO CPU demo report" + ("" if task == "search" else f" ({task} task)")
    targets = target_lines(before, after, stages.times.total_seconds, TASK_TARGETS[task])
    return write_report(out, before=before, after=after, metrics_path=metrics_path if metrics_path.is_file() else None,
                        stages=stages.times, machine=stages.times.machine, title=title,
                        episode_pair=pair, notes=[*notes, *targets], sections=[memory] if memory else [])


def _report_stage(out: Path, stages: _Stages, before: EvalReport, after: EvalReport,
                  pair: Optional[tuple[EpisodeRecord, EpisodeRecord]], memory: Sequence[str],
                  notes: Sequence[str], task: str) -> Staged[ReportResult]:
    """``report.md`` + PNG plots (`write_report`); its first lines are the run against the task's
    targets (`TASK_TARGETS`, `target_lines`)."""
    result = _report(out, stages, before, after, pair, memory, notes, task)
    return Staged(result, f"{result.path} and {len(result.plots)} plots ({', '.join(sorted(result.plots))})")


# ------------------------------------------------------------------------------------------------
# the demo
# ------------------------------------------------------------------------------------------------
def run_demo(cfg: MempoConfig, out_dir: PathLike, *, echo: Callable[[str], None] = _echo,
             show_progress: bool = True) -> DemoResult:
    """Run the stages into `out_dir` (world, oracle, tokenizer, model, [copy-warmup], sft,
    eval-before, rl, eval-after, report); returns a `DemoResult`. The config is written to
    ``<out>/config.yaml``; it needs ``synthetic.oracle_objectives`` set and ``sft.trajectories`` null.

    The demo owns `out_dir`: it must be new, empty, or written by an earlier demo (its
    ``.mempo-written`` marker, `mempo.utils.atomic.claim_directory`; any other directory is refused
    before anything is written). A re-run first removes its stage directories (``rl/``: the RL run
    with its checkpoints, ``sft/``: the SFT metrics) and rewrites every file it writes (``model_sft/``
    and ``model_rl/`` replaced atomically), so it starts fresh instead of being refused as a used run
    directory (``trainer.resume`` stays "never"). Nothing else there is touched."""
    _check_demo_config(cfg)
    out = claim_directory(out_dir, "--out", "mempo demo")
    for model_dir in ("model_sft", "model_rl"):  # replaced at the end of their stages: checked now
        check_directory_target(out / model_dir, "--out")
    for stage_dir in ("rl", "sft"):  # the demo's own stage directories: a re-run starts fresh
        shutil.rmtree(out / stage_dir, ignore_errors=True)
    cfg = dataclasses.replace(cfg, trainer=dataclasses.replace(cfg.trainer, out_dir=str(out / "rl")))
    dump_config(cfg, out / "config.yaml")
    threads = _set_threads(cfg.synthetic.torch_threads)
    echo(f"torch threads: {threads} (CPUs: {os.cpu_count()}, load average {os.getloadavg()[0]:.2f})")
    echo(f"allocator: {keep_freed_memory()}")  # before the stages: their buffers are reused, not page-faulted in
    stages = _Stages(out, 10 if cfg.synthetic.copy_warmup_steps else 9, echo)

    task = synthetic_task(cfg)
    env = stages.run("world", _world_stage, cfg)
    episodes_by_k = task.eval_episodes(env.world, cfg)
    held_out = task.held_out(env.world, cfg)  # both splits' names, whichever is evaluated
    cold = stages.run("oracle", _oracle_stage, cfg, env, held_out, show_progress)
    tokenizer = stages.run("tokenizer", _tokenizer_stage, cfg, env.world, cold.trajectories)
    model = stages.run("model", _model_stage, cfg, tokenizer)
    if cfg.synthetic.copy_warmup_steps:
        stages.run("copy-warmup", _copy_stage, cfg, model, tokenizer, env.world)
    sft_metrics = stages.run("sft", _sft_stage, cfg, model, tokenizer, cold.sft_records, out)
    bound = sft_bound_line(cfg, sft_metrics)
    notes = ([bound] if bound else []) + [rl_setting_line(cfg, weights_digest(out / "model_sft"))]
    if bound:
        echo(bound)
    before = stages.run("eval-before", _eval_stage, cfg, model, tokenizer, episodes_by_k, env, "before",
                        out, echo, show_progress)
    trained = stages.run("rl", _rl_stage, cfg, model, tokenizer, env, held_out, out)
    after = stages.run("eval-after", _eval_stage, cfg, trained.model, tokenizer, episodes_by_k, env,
                       "after", out, echo, show_progress)
    rl_metrics = out / "rl" / "metrics.jsonl"
    keeps = memory_keeps_line(read_metrics(rl_metrics)) if rl_metrics.is_file() else None
    notes += [keeps] if keeps else []
    system = rollout_system_prompt(cfg.rollout, env.tools)  # the system message the agent loop wrote
    pair = episode_pair(before, after, episodes_by_k, tokenizer, system)
    memory = memory_outcome_section(before, after, episodes_by_k, tokenizer, system, task)
    report = stages.run("report", _report_stage, out, stages, before, after, pair, memory, notes, task.name)
    # again, so that the stage table includes the report stage itself
    _report(out, stages, before, after, pair, memory, notes, task.name)
    echo(f"done in {time.perf_counter() - stages.started:.1f} s; report: {report.path}")
    return DemoResult(out, report.path, list(stages.times.stages), before, after)


# ------------------------------------------------------------------------------------------------
# machine helpers
# ------------------------------------------------------------------------------------------------
def _busy_cpus(window: float = 0.5) -> float:
    """CPUs kept busy by other processes right now: /proc/stat sampled over `window` seconds (the
    1-minute load average lags: it still counts a run that ended a minute ago). Falls back to the
    load average where /proc/stat is missing."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields), idle

    try:
        total0, idle0 = sample()
        time.sleep(window)
        total1, idle1 = sample()
        cpus = os.cpu_count() or 1
        return cpus * (1.0 - (idle1 - idle0) / max(1, total1 - total0))
    except (OSError, ValueError, IndexError):
        try:
            return float(os.getloadavg()[0])
        except (AttributeError, OSError):
            return 0.0


def _set_threads(requested: int) -> int:
    if requested and requested > 0:
        torch.set_num_threads(int(requested))
    else:
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count() or 1
        torch.set_num_threads(max(1, min(torch.get_num_threads(), cpus - int(round(_busy_cpus())))))
    return torch.get_num_threads()


def _save_model(path: Path, model: Any, tokenizer: Any) -> None:
    """A plain HF directory (`mempo.model.export.save_model_dir`) with the demo as its provenance."""
    save_model_dir(path, model, tokenizer, provenance={"written_by": "mempo demo", "stage": path.name})
