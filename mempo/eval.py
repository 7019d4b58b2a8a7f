"""Multi-objective evaluation (`mempo eval`): EM, F1 and the token economy per (dataset, objectives, policy).

Conventions
-----------
* What is evaluated. ``episodes_by_k`` maps a cell key to its episodes (`mempo.env.data.Episode`,
  or anything `mempo.rollout.loop.as_task` takes): either a number of objectives k (dataset ``""``:
  the synthetic world's `eval_episodes`, the trainer's periodic evaluation) or a pair
  ``(dataset, k)`` (`qa_eval_episodes`: QA files). Cells run in the order datasets first appear,
  k ascending. Every episode is run once under each context policy of ``cfg.eval.policies``
  (``"memory"``: the paper's inference context, ``"full"``: the growing history) with
  `mempo.rollout.loop.RolloutEngine` and the settings of `eval_rollout_config`: the ``rollout``
  section with G = 1, that policy, at most ``cfg.eval.max_turns`` rounds (64 by default),
  temperature ``cfg.eval.temperature`` (0: greedy) and no response budget (the rest, e.g.
  ``max_new_tokens_per_round``, top-p / top-k, the seed, the chat template and the system prompt,
  are the section's). The backend context is limited to the model's ``max_position_embeddings``
  (a round that would not fit ends the episode with ``"token_budget"``).
  Generation sees only the prompt ids (system + question) and the tool results: the golds go to
  scoring (``compute_score``) and to the written records, nowhere else.
* QA files (`qa_eval_episodes`, ``data.source: files``): the records of ``data.eval_files``
  (`mempo.env.data.load_qa_datasets`: Search-R1 jsonl / parquet) are grouped by dataset (the
  record's ``data_source``, else the file's stem); per dataset and k of ``cfg.eval.objectives``,
  ``cfg.eval.episodes`` episodes are composed as MEM1 does (`mempo.env.data.compose_episodes`: k
  distinct questions of that dataset per episode, drawn independently, seed
  `mempo.seeds.eval_question_seed` (``data.seed``, k); ids ``<dataset>-k<k>-s<seed>-<i>``). The
  retriever is the trainer's (`mempo.env.build.build_retriever`): the ``env.retriever: http``
  server (a Search-R1 retrieval server works as is), else BM25 over ``env.corpus_path``, else
  (synthetic data only) BM25 over the world's documents; an HTTP retriever passes its health
  check before any episode runs.
* Quality, per cell, means over episodes: ``em`` / ``f1`` (the mean per-objective EM / token F1 of
  `mempo.protocol.reward.compute_score`, whatever the format), ``score`` (the outcome reward: EM only when
  the format is valid), ``format_rate`` (share of episodes with a valid format), ``answer_rate``
  (share ending with ``<answer>``), ``mean_turns`` (rounds per episode); ``em_se`` / ``f1_se``: the
  standard errors of those means over episodes (sample std / sqrt(n)). An episode is *correct*
  when its score is 1 (valid format, every objective exact), else *failed*.
* Token economy, counted with the model's tokenizer on the real ids: a round's prompt is the exact
  context it was generated from (`Trajectory.round_context_ids`: ``Round.prompt_ids`` under the
  memory policy, ``prompt_ids + response_ids[:start]`` under the full policy; the forced ``<mem>``
  is not counted). ``prompt_tokens_per_episode``: the mean over episodes of the sum over its rounds;
  ``peak_prompt_tokens``: the largest single round prompt over all episodes;
  ``mean_prompt_tokens_per_turn``: all round prompts / all rounds; ``generated_tokens_per_episode``:
  mean model-generated ids (mask 1) per episode; ``full_context_tokens_per_episode``: what the full
  context of the *same* rounds would have held (``prompt_ids + response_ids[:start]`` per round,
  under either policy; equal to ``prompt_tokens_per_episode`` under the full policy), so the memory
  context's saving is measured on one set of decisions, not on two different runs.
* Episode records (`EpisodeRecord`, `render_episode`): one episode as readable text: the system
  and user messages, per round the assistant text (forced ``<mem>`` + what the model wrote,
  decoded), its action, the tool result (decoded ``<information>`` text) and, under the memory
  policy, the decoded prompt the round was generated from (the full policy's is the episode prompt
  plus the earlier rounds and tool results); then the final answer, the per-objective predictions,
  the golds and the scores, and the trajectory's ids (``Trajectory.to_dict``). ``evaluate(...,
  trajectories_path=P)`` writes every episode's record to the jsonl file P as its cell finishes
  (atomically: a temporary file renamed at the end). For every (dataset, k) the report keeps one
  correct and one failed episode (the first of each, policies in order) as ``examples``.
* Output. `EvalReport` holds one `EvalRow` per cell plus ``metadata`` (model, tokenizer, settings,
  machine, wall time, datasets); ``write(out_dir, name)`` writes ``<name>.json`` (`EvalReport.load`
  reads it back; each row keeps its ``dataset``) and ``<name>.md``: per dataset, one table per k
  (a row per policy) followed by its correct and its failed episode rendered as text (tool results
  and long texts shortened), or a line saying there is none. ``scalars()`` flattens the rows into
  metrics ``eval/<field>@k<k>_<policy>`` (dataset ``""``) or ``eval/<dataset>/<field>@k<k>_<policy>``,
  one per `SCALAR_FIELDS` field of `EvalRow` under that field's own name (the trainer's periodic
  evaluation logs them).
* The oracle as a policy is a backend like any other (`mempo.synthetic.backend.OracleBackend`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Optional, Sequence

from mempo.config import ConfigError, MempoConfig, RolloutConfig
from mempo.env.build import build_tools
from mempo.env.data import DataError, compose_episodes, load_qa_datasets, parse_episode_prompt
from mempo.protocol.reward import objectives_from_golds
from mempo.rollout.backends import make_backend
from mempo.utils.tokens import decode_ids
from mempo.rollout.loop import RolloutEngine, as_task
from mempo.seeds import eval_question_seed
from mempo.utils.progress import progress
from mempo.utils.machine import machine_facts
from mempo.utils.types import PathLike

__all__ = ["EvalRow", "EvalReport", "RoundRecord", "EpisodeRecord", "Examples", "evaluate", "summarize",
           "standard_error",
           "round_prompt_tokens", "render_episode", "eval_episodes", "qa_eval_episodes", "QAEvalSets",
           "eval_rollout_config", "SCALAR_FIELDS"]

#: The `EvalRow` fields `EvalReport.scalars` reports, each under its own name (the first five are in [0, 1]).
SCALAR_FIELDS = ("em", "f1", "score", "format_rate", "answer_rate", "mean_turns", "prompt_tokens_per_episode",
                 "peak_prompt_tokens", "generated_tokens_per_episode")

#: How the markdown report shortens what it shows of an example episode (characters).
TOOL_RESULT_CHARS = 300
TEXT_CHARS = 1500


# ------------------------------------------------------------------------------------------------
# rows and reports
# ------------------------------------------------------------------------------------------------
@dataclass
class EvalRow:
    """The metrics of one (dataset, objectives, policy) cell (module conventions for every field);
    ``dataset`` is ``""`` for episodes given by k alone (the synthetic world)."""

    objectives: int
    policy: str
    episodes: int
    em: float
    f1: float
    score: float
    format_rate: float
    answer_rate: float
    mean_turns: float
    prompt_tokens_per_episode: float
    peak_prompt_tokens: int
    mean_prompt_tokens_per_turn: float
    generated_tokens_per_episode: float
    seconds: float = 0.0
    finish_reasons: dict[str, int] = field(default_factory=dict)
    dataset: str = ""
    em_se: float = 0.0
    f1_se: float = 0.0
    full_context_tokens_per_episode: float = 0.0

    @property
    def token_ratio(self) -> Optional[float]:
        """Memory-context prompt tokens over the full context's of the same rounds (None: the full
        context was not counted)."""
        if not self.full_context_tokens_per_episode:
            return None
        return self.prompt_tokens_per_episode / self.full_context_tokens_per_episode

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "EvalRow":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in known})


_TABLE_COLUMNS = (
    ("k", "objectives", "{}"), ("policy", "policy", "{}"), ("episodes", "episodes", "{}"),
    ("EM", "em", "{:.3f}"), ("F1", "f1", "{:.3f}"), ("score", "score", "{:.3f}"),
    ("format", "format_rate", "{:.2f}"), ("answered", "answer_rate", "{:.2f}"), ("turns", "mean_turns", "{:.1f}"),
    ("prompt tok/episode", "prompt_tokens_per_episode", "{:.0f}"), ("peak prompt tok/turn", "peak_prompt_tokens", "{}"),
    ("gen tok/episode", "generated_tokens_per_episode", "{:.0f}"), ("seconds", "seconds", "{:.1f}"),
)


@dataclass
class RoundRecord:
    """One round of an `EpisodeRecord` as text (module conventions). ``prompt_tokens``: the ids of
    the context it was generated from; ``prompt``: that context decoded (memory policy only)."""

    index: int
    assistant: str
    action: Optional[str]
    action_argument: Optional[str]
    stop_reason: str
    tool_result: Optional[str]
    tool_ok: Optional[bool]
    prompt_tokens: int
    prompt: Optional[str] = None

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "RoundRecord":
        return cls(**{f.name: obj.get(f.name) for f in fields(cls)})


@dataclass
class EpisodeRecord:
    """One evaluated episode, readable (module conventions). ``golds[i]``: the aliases of
    objective i; ``predictions[i]``: the agent's answer to it (None: none given); ``trajectory``:
    `Trajectory.to_dict` (the ids), or None."""

    dataset: str
    objectives: int
    policy: str
    episode_id: str
    questions: list[str]
    golds: list[list[str]]
    system: str
    user: str
    rounds: list[RoundRecord]
    finish_reason: str
    final_answer: Optional[str]
    predictions: list[Optional[str]]
    em: float
    f1: float
    score: float
    format_ok: bool
    failed_rules: list[str] = field(default_factory=list)
    source_ids: list[str] = field(default_factory=list)
    trajectory: Optional[dict[str, Any]] = field(default=None, repr=False)

    @property
    def correct(self) -> bool:
        """Score 1: a valid format and every objective answered exactly."""
        return _correct(self.score, self.format_ok)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types (one line of the trajectories file)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "EpisodeRecord":
        values = {f.name: obj.get(f.name) for f in fields(cls) if f.name in obj}
        values["rounds"] = [RoundRecord.from_dict(r) for r in obj.get("rounds", [])]
        return cls(**values)

    def render(self, tool_chars: int = TOOL_RESULT_CHARS, text_chars: int = TEXT_CHARS) -> str:
        """The episode as plain text: messages, each round's assistant text and tool result (cut to
        ``tool_chars``; other texts to ``text_chars``), answers against golds, scores."""
        lines = [f"[system] {_shorten(self.system, text_chars)}", f"[user] {_shorten(self.user, text_chars)}"]
        for r in self.rounds:
            lines.append(f"[assistant, turn {r.index + 1}] {_shorten(r.assistant, text_chars)}")
            if r.tool_result is not None:
                lines.append(f"[{r.action or 'tool'} result{'' if r.tool_ok is not False else ', failed'}] "
                             f"{_shorten(r.tool_result, tool_chars)}")
        lines.append(f"[end] {self.finish_reason} after {len(self.rounds)} turn(s); final answer: "
                     f"{self.final_answer!r}")
        for i, (prediction, golds) in enumerate(zip(self.predictions, self.golds), 1):
            lines.append(f"  {i}. predicted {prediction!r}; gold {' | '.join(golds)}")
        rules = f" (failed rules: {', '.join(self.failed_rules)})" if self.failed_rules else ""
        lines.append(f"[score] EM {self.em:.2f}, F1 {self.f1:.2f}, score {self.score:.2f}, "
                     f"format {'ok' if self.format_ok else 'invalid'}{rules}")
        return "\n".join(lines)


def _correct(score: float, format_ok: bool) -> bool:
    return bool(format_ok) and score >= 1.0


def _shorten(text: str, limit: int) -> str:
    text = text.strip()
    if len(text) <= limit:
        return text
    return text[:limit] + f" [... {len(text) - limit} more characters]"


class Examples(NamedTuple):
    """One correct and one failed episode of a (dataset, k) table (None: there is none)."""

    correct: Optional[EpisodeRecord]
    failed: Optional[EpisodeRecord]


@dataclass
class EvalReport:
    """Rows per (dataset, objectives, policy), metadata and example episodes; `write` / `load`
    (module conventions). ``trajectories``: ``{(dataset, k, policy): [Trajectory]}`` when
    `evaluate` was asked to keep them; ``examples``: ``{(dataset, k): Examples}`` (not in the JSON)."""

    rows: list[EvalRow]
    metadata: dict[str, Any] = field(default_factory=dict)
    trajectories: dict[tuple[str, int, str], list[Any]] = field(default_factory=dict, repr=False, compare=False)
    examples: dict[tuple[str, int], Examples] = field(default_factory=dict, repr=False, compare=False)

    def row(self, objectives: int, policy: str = "memory", dataset: str = "") -> Optional[EvalRow]:
        """The row of (dataset, objectives, policy), or None."""
        return next((r for r in self.rows
                     if r.objectives == objectives and r.policy == policy and r.dataset == dataset), None)

    def datasets(self) -> list[str]:
        """The datasets of the rows, in row order."""
        return list(dict.fromkeys(r.dataset for r in self.rows))

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "metadata": self.metadata}

    def scalars(self, prefix: str = "eval/") -> dict[str, float]:
        """Every row's numbers as flat metrics ``<prefix>[<dataset>/]<field>@k<objectives>_<policy>``
        (fields: `SCALAR_FIELDS`), e.g. ``eval/em@k2_memory`` or ``eval/nq/format_rate@k2_memory``."""
        return {f"{prefix}{row.dataset + '/' if row.dataset else ''}{name}@k{row.objectives}_{row.policy}":
                float(getattr(row, name)) for row in self.rows for name in SCALAR_FIELDS}

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "EvalReport":
        return cls([EvalRow.from_dict(r) for r in obj.get("rows", [])], dict(obj.get("metadata", {})))

    @classmethod
    def load(cls, path: PathLike) -> "EvalReport":
        """Read a report written by `write` (the ``.json`` file)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def markdown(self, title: Optional[str] = None, *, examples: bool = True) -> str:
        """The rows as markdown: a title line, the main settings, then per dataset one table per k
        (a row per policy), each followed by its example episodes when ``examples``."""
        lines = [f"## {title}", ""] if title else []
        meta = self.metadata
        settings = [f"{k}={meta[k]}" for k in ("model", "max_turns", "max_new_tokens", "temperature") if k in meta]
        if settings:
            lines += ["Settings: " + ", ".join(settings) + ".", ""]
        infos = meta.get("datasets") or {}
        for dataset in self.datasets():
            level = "###"
            if dataset:
                info = infos.get(dataset) or {}
                where = f" ({info['questions']} questions from {', '.join(info['files'])})" if info else ""
                lines += [f"### Dataset `{dataset}`{where}", ""]
                level = "####"
            for k in dict.fromkeys(r.objectives for r in self.rows if r.dataset == dataset):
                rows = [r for r in self.rows if r.dataset == dataset and r.objectives == k]
                lines += [f"{level} {dataset + ', ' if dataset else ''}k = {k}", ""]
                lines += _table(rows) + [""]
                if examples and (dataset, k) in self.examples:
                    lines += _examples_markdown(self.examples[(dataset, k)])
        return "\n".join(lines).rstrip() + "\n"

    def write(self, out_dir: PathLike, name: str = "eval", *, title: Optional[str] = None) -> dict[str, Path]:
        """Write ``<name>.json`` and ``<name>.md`` (the trajectories are written by `evaluate`)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / f"{name}.json", "markdown": out / f"{name}.md"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n", encoding="utf-8")
        paths["markdown"].write_text(self.markdown(title or f"Evaluation: {name}"), encoding="utf-8")
        return paths


def _table(rows: Sequence[EvalRow]) -> list[str]:
    lines = ["| " + " | ".join(c[0] for c in _TABLE_COLUMNS) + " |",
             "|" + "|".join("---" for _ in _TABLE_COLUMNS) + "|"]
    for row in rows:
        cells = []
        for _, name, fmt in _TABLE_COLUMNS:
            value = getattr(row, name)
            cells.append(fmt.format(value) if value is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _examples_markdown(examples: Examples) -> list[str]:
    lines = []
    for kind, record in (("correct", examples.correct), ("failed", examples.failed)):
        if record is None:
            lines += [f"No {kind} episode in this table.", ""]
            continue
        text = record.render()
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
        lines += [f"A {kind} episode: `{record.episode_id}` ({record.policy} context, {len(record.rounds)} turns, "
                  f"EM {record.em:.2f}, F1 {record.f1:.2f}):", "", f"{fence}text", text, fence, ""]
    return lines


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


# ------------------------------------------------------------------------------------------------
# counting
# ------------------------------------------------------------------------------------------------
def round_prompt_tokens(trajectory: Any) -> list[int]:
    """Per round, the number of ids of the prompt it was generated from (forced prefix excluded)."""
    counts = []
    for r in trajectory.rounds:
        if r.prompt_ids is not None:
            counts.append(len(r.prompt_ids))
        else:
            counts.append(len(trajectory.prompt_ids) + r.start)
    return counts


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def standard_error(values: Sequence[float]) -> float:
    """The standard error of the mean: sample standard deviation / sqrt(n) (0 for n < 2)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def summarize(trajectories: Sequence[Any], objectives: int, policy: str, seconds: float = 0.0,
              dataset: str = "") -> EvalRow:
    """One `EvalRow` from the trajectories of one (dataset, objectives, policy) cell."""
    per_episode_tokens, all_rounds = [], []
    for t in trajectories:
        counts = round_prompt_tokens(t)
        per_episode_tokens.append(sum(counts))
        all_rounds.extend(counts)
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    outcome = [t.outcome or {} for t in trajectories]
    ems = [float(o.get("em", 0.0)) for o in outcome]
    f1s = [float(o.get("f1", 0.0)) for o in outcome]
    return EvalRow(
        objectives=int(objectives), policy=policy, episodes=len(trajectories),
        em=_mean(ems), f1=_mean(f1s), em_se=standard_error(ems), f1_se=standard_error(f1s),
        score=_mean([float(o.get("score", 0.0)) for o in outcome]),
        format_rate=_mean([1.0 if o.get("format_ok") else 0.0 for o in outcome]),
        answer_rate=_mean([1.0 if t.finish_reason == "answer" else 0.0 for t in trajectories]),
        mean_turns=_mean([len(t.rounds) for t in trajectories]),
        prompt_tokens_per_episode=_mean(per_episode_tokens),
        peak_prompt_tokens=int(max(all_rounds, default=0)),
        mean_prompt_tokens_per_turn=_mean(all_rounds),
        generated_tokens_per_episode=_mean([sum(t.response_mask) for t in trajectories]),
        full_context_tokens_per_episode=_mean([sum(len(t.prompt_ids) + r.start for r in t.rounds)
                                               for t in trajectories]),
        seconds=float(seconds), finish_reasons=reasons, dataset=dataset,
    )


def render_episode(trajectory: Any, task: Any, tokenizer: Any, *, dataset: str = "", system_prompt: str = "",
                   with_ids: bool = True) -> EpisodeRecord:
    """The `EpisodeRecord` of one trajectory (module conventions).

    Args:
        trajectory: a scored `mempo.rollout.trajectory.Trajectory`.
        task: what it was sampled from (an `Episode`, or anything `as_task` takes): its prompt and,
            when it has them, its ``questions`` and ``source_ids``.
        tokenizer: the tokenizer the ids are decoded with (special tokens kept).
        system_prompt: the system message the rollout used.
        with_ids: keep the trajectory's ids (``Trajectory.to_dict``) in ``trajectory``.
    """
    item = as_task(task)
    questions = list(getattr(task, "questions", None) or [])
    if not questions:
        try:
            questions = parse_episode_prompt(item.prompt)
        except DataError:  # a bare question prompt
            questions = [item.prompt]
    golds = objectives_from_golds(trajectory.golds) if trajectory.golds is not None else []
    outcome = trajectory.outcome or {}
    predictions = [o.get("prediction") for o in outcome.get("per_objective", [])] or [None] * len(golds)
    counts = round_prompt_tokens(trajectory)
    rounds = []
    for r, count in zip(trajectory.rounds, counts):
        info = r.information
        rounds.append(RoundRecord(
            index=r.index, assistant=decode_ids(tokenizer, trajectory.response_ids[r.start:r.end]), action=r.action,
            action_argument=r.action_argument, stop_reason=r.stop_reason,
            tool_result=decode_ids(tokenizer, trajectory.response_ids[info[0]:info[1]]) if info is not None else None,
            tool_ok=r.tool_ok, prompt_tokens=count,
            prompt=decode_ids(tokenizer, r.prompt_ids) if r.prompt_ids is not None else None))
    return EpisodeRecord(
        dataset=dataset, objectives=len(golds) or len(questions), policy=trajectory.policy,
        episode_id=str(trajectory.episode_id or item.id), questions=questions, golds=golds, system=system_prompt,
        user=item.prompt, rounds=rounds, finish_reason=trajectory.finish_reason,
        final_answer=trajectory.final_answer, predictions=predictions, em=float(outcome.get("em", 0.0)),
        f1=float(outcome.get("f1", 0.0)), score=float(outcome.get("score", 0.0)),
        format_ok=bool(outcome.get("format_ok", False)), failed_rules=list(outcome.get("failed_rules", ())),
        source_ids=[str(s) for s in getattr(task, "source_ids", None) or []],
        trajectory=trajectory.to_dict() if with_ids else None)


# ------------------------------------------------------------------------------------------------
# episode sets, model and settings
# ------------------------------------------------------------------------------------------------
def eval_episodes(world: Any, cfg: MempoConfig, num_episodes: Optional[int] = None,
                  objectives: Optional[Sequence[int]] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` for every k of ``cfg.eval.objectives`` (``cfg.eval.episodes`` each), drawn
    with question seed `mempo.seeds.eval_question_seed` (``data.seed``, k). A world too small for
    that many episodes is a ConfigError naming ``eval.episodes`` (and the world's size fields)."""
    n = int(num_episodes if num_episodes is not None else cfg.eval.episodes)
    ks = list(objectives if objectives is not None else cfg.eval.objectives)
    sets = {}
    for k in ks:
        try:
            sets[int(k)] = world.episodes(int(k), n, seed=eval_question_seed(cfg.data.seed, k))
        except ValueError as error:
            raise ConfigError("eval.episodes", f"{n} episodes of {k} objectives: {error} (synthetic.world_entities / "
                                               "synthetic.world_documents set the world's size)") from None
    return sets


class QAEvalSets(NamedTuple):
    """`qa_eval_episodes`'s result: ``episodes``: ``{(dataset, k): episodes}``; ``datasets``:
    ``{dataset: {"questions": pool size, "files": [paths]}}`` (first-seen order)."""

    episodes: dict[tuple[str, int], list[Any]]
    datasets: dict[str, dict[str, Any]]


def qa_eval_episodes(cfg: MempoConfig, num_episodes: Optional[int] = None,
                     objectives: Optional[Sequence[int]] = None) -> QAEvalSets:
    """Episodes per (dataset, k) from the QA files ``cfg.data.eval_files`` (module conventions):
    ``num_episodes`` (default ``cfg.eval.episodes``) per k of ``objectives`` (default
    ``cfg.eval.objectives``). Raises `ConfigError` when no file is listed or a dataset holds fewer
    than k questions, `DataError` for a missing, malformed or empty file."""
    files = list(cfg.data.eval_files)
    if not files:
        raise ConfigError("data.eval_files", "must list at least one QA file (Search-R1 jsonl or parquet) to "
                                             "evaluate on (mempo eval --data files --files FILE ...)")
    try:
        datasets = load_qa_datasets(files)
    except DataError as error:
        raise DataError(f"data.eval_files: {error}") from None
    n = int(num_episodes if num_episodes is not None else cfg.eval.episodes)
    ks = [int(k) for k in (objectives if objectives is not None else cfg.eval.objectives)]
    episodes: dict[tuple[str, int], list[Any]] = {}
    for name, dataset in datasets.items():
        for k in ks:
            if len(dataset.records) < k:
                raise ConfigError("eval.objectives", f"k={k} needs at least {k} questions per dataset; dataset "
                                                     f"{name!r} ({', '.join(dataset.files)}) has {len(dataset.records)}")
            episodes[(name, k)] = compose_episodes(dataset.records, k, n, eval_question_seed(cfg.data.seed, k),
                                                   id_prefix=name)
    infos = {name: {"questions": len(d.records), "files": list(d.files)} for name, d in datasets.items()}
    return QAEvalSets(episodes, infos)


def eval_rollout_config(cfg: MempoConfig, policy: str, max_new_tokens: Optional[int] = None) -> RolloutConfig:
    """The agent loop's settings of an evaluation under context policy `policy`: the ``rollout``
    section with one sample, the ``eval`` section's ``max_turns`` and ``temperature`` and no
    response budget (module conventions). max_new_tokens: overrides ``max_new_tokens_per_round``."""
    return dataclasses.replace(
        cfg.rollout, context_policy=policy, group_size=1, max_turns=cfg.eval.max_turns,
        max_new_tokens_per_round=int(max_new_tokens or cfg.rollout.max_new_tokens_per_round),
        max_response_tokens=None, temperature=cfg.eval.temperature)




def _model_facts(model: Any, tokenizer: Any) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    if model is not None and hasattr(model, "parameters"):
        facts["model"] = type(model).__name__
        facts["parameters"] = int(sum(p.numel() for p in model.parameters()))
        config = getattr(model, "config", None)
        for name in ("num_hidden_layers", "hidden_size", "vocab_size", "max_position_embeddings"):
            if config is not None and getattr(config, name, None) is not None:
                facts[name] = int(getattr(config, name))
    try:
        facts["tokenizer_vocab"] = int(len(tokenizer))
    except TypeError:
        size = getattr(tokenizer, "get_vocab_size", None)
        if size is not None:
            facts["tokenizer_vocab"] = int(size())
    return facts


# ------------------------------------------------------------------------------------------------
# evaluate
# ------------------------------------------------------------------------------------------------
def _cells(episodes_by_k: Mapping[Any, Sequence[Any]]) -> list[tuple[str, int, list[Any]]]:
    """(dataset, k, episodes) per key (``k`` or ``(dataset, k)``): datasets in first-seen order, k ascending."""
    cells = []
    for key, episodes in episodes_by_k.items():
        dataset, k = key if isinstance(key, tuple) else ("", key)
        cells.append((str(dataset), int(k), list(episodes)))
    order = {name: i for i, name in enumerate(dict.fromkeys(c[0] for c in cells))}
    return sorted(cells, key=lambda c: (order[c[0]], c[1]))


class _RecordWriter:
    """Episode records appended to ``<path>.tmp`` as cells finish, renamed to ``path`` by `close`
    (a failed evaluation leaves no partial file behind)."""

    def __init__(self, path: PathLike):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(self.path.name + ".tmp")
        self.handle = open(self.tmp, "w", encoding="utf-8")
        self.count = 0

    def write(self, record: EpisodeRecord) -> None:
        self.handle.write(json.dumps(record.to_dict(), ensure_ascii=False, default=_json_default) + "\n")
        self.count += 1

    def close(self, ok: bool) -> None:
        self.handle.close()
        if ok:
            os.replace(self.tmp, self.path)
        elif self.tmp.exists():
            self.tmp.unlink()


def evaluate(model: Any, tokenizer: Any, episodes_by_k: Mapping[Any, Sequence[Any]], retriever: Any,
             cfg: MempoConfig, *,
             backend: Any = None, policies: Optional[Sequence[str]] = None, max_new_tokens: Optional[int] = None,
             chunk_size: int = 16, label: str = "", log: Optional[Callable[[str], None]] = None,
             show_progress: bool = True, keep_trajectories: bool = False,
             trajectories_path: Optional[PathLike] = None) -> EvalReport:
    """Run every episode under every policy and summarise per (dataset, k, policy) (module conventions).

    Args:
        model: a causal LM (used through `make_backend("hf")` unless ``backend`` is given).
        tokenizer: the model's tokenizer (prompts, token counts, decoded episode records).
        episodes_by_k: ``{k: episodes}`` or ``{(dataset, k): episodes}``.
        retriever: what the search / access tools query.
        cfg: a `mempo.config.MempoConfig` (``eval``, ``rollout``, ``env`` sections).
        backend: a generation backend to use instead of the model (e.g.
            `mempo.synthetic.backend.OracleBackend`).
        policies: overrides ``cfg.eval.policies``.
        max_new_tokens: overrides ``cfg.rollout.max_new_tokens_per_round``.
        chunk_size: episodes per engine run (progress granularity; all of a chunk are batched).
        label: a name stored in the metadata (e.g. "before RL").
        log: a line printer (default: stderr).
        keep_trajectories: keep the trajectories on the report (``report.trajectories``).
        trajectories_path: write every episode's `EpisodeRecord` there (jsonl, atomic).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    policies = list(policies or cfg.eval.policies)
    max_new = int(max_new_tokens or cfg.rollout.max_new_tokens_per_round)
    cells = _cells(episodes_by_k)
    if backend is None:
        backend = make_backend("hf", model=model, tokenizer=tokenizer)
    max_context = None
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "max_position_embeddings", None):
        max_context = int(config.max_position_embeddings)
    tools = build_tools(cfg, retriever)
    was_training = getattr(model, "training", False)
    if model is not None and hasattr(model, "eval"):
        model.eval()
    rows, kept, examples = [], {}, {}
    writer = _RecordWriter(trajectories_path) if trajectories_path is not None else None
    started = time.perf_counter()
    ok = False
    try:
        for dataset, k, episodes in cells:
            correct = failed = None
            name = " ".join(part for part in (label, dataset) if part)
            for policy in policies:
                rollout_cfg = eval_rollout_config(cfg, policy, max_new)
                engine = RolloutEngine(backend, tokenizer, tools, config=rollout_cfg, max_context_tokens=max_context)
                cell_start = time.perf_counter()
                trajectories = []
                with progress(f"eval{' ' + name if name else ''} k={k} {policy}", total=len(episodes),
                              enabled=show_progress) as bar:
                    for i in range(0, len(episodes), max(1, chunk_size)):
                        chunk = episodes[i:i + max(1, chunk_size)]
                        trajectories.extend(engine.run(chunk))
                        bar.advance(len(chunk))
                row = summarize(trajectories, k, policy, time.perf_counter() - cell_start, dataset=dataset)
                rows.append(row)
                if keep_trajectories:
                    kept[(dataset, k, policy)] = trajectories
                for episode, trajectory in zip(episodes, trajectories):
                    is_correct = _correct(trajectory.score, bool((trajectory.outcome or {}).get("format_ok")))
                    wanted = (correct is None and is_correct) or (failed is None and not is_correct)
                    if writer is None and not wanted:
                        continue
                    record = render_episode(trajectory, episode, tokenizer, dataset=dataset,
                                            system_prompt=rollout_cfg.system_prompt, with_ids=writer is not None)
                    if writer is not None:
                        writer.write(record)
                    if wanted:
                        record.trajectory = None  # the example shows text; the file has the ids
                        if is_correct:
                            correct = record
                        else:
                            failed = record
                log(f"eval{' ' + name if name else ''}: k={k} {policy}: EM {row.em:.3f} F1 {row.f1:.3f} "
                    f"format {row.format_rate:.2f} turns {row.mean_turns:.1f} prompt tok/episode "
                    f"{row.prompt_tokens_per_episode:.0f} peak {row.peak_prompt_tokens} ({row.seconds:.1f}s)")
            examples[(dataset, k)] = Examples(correct, failed)
        ok = True
    finally:
        if writer is not None:
            writer.close(ok)
        if was_training and hasattr(model, "train"):
            model.train()
    metadata = {
        "label": label, "max_turns": cfg.eval.max_turns, "max_new_tokens": max_new,
        "temperature": cfg.eval.temperature, "policies": policies,
        "objectives": sorted({k for _, k, _ in cells}),
        "max_context_tokens": max_context, "backend": getattr(backend, "name", type(backend).__name__),
        "seconds": time.perf_counter() - started, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine_facts(), **_model_facts(model, tokenizer),
    }
    if writer is not None:
        metadata["trajectories"] = {"path": str(writer.path), "episodes": writer.count}
    return EvalReport(rows, metadata, kept, examples)


def finite_report(report: EvalReport) -> bool:
    """True when every numeric field of every row is finite."""
    for row in report.rows:
        for f in fields(row):
            value = getattr(row, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                return False
    return True
