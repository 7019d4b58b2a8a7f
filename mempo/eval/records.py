"""The records of an evaluation and how they are shown: `EvalRow` (one cell's numbers), `EpisodeRecord`
(one episode as text), `EvalReport` (the rows, metadata, examples; ``<name>.json`` and ``<name>.md``).

A cell is one (dataset, objectives k, context policy); ``dataset`` is ``""`` for episodes given by
k alone (the synthetic world). Quality numbers are means over the cell's episodes; token numbers
are counts of the model's tokenizer ids (how they are counted: `mempo.eval.summary`). An episode
is *correct* when its score is 1 (a valid format and every objective exact), else *failed*.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from mempo.utils.types import PathLike

__all__ = ["EvalRow", "RoundRecord", "EpisodeRecord", "Examples", "EvalReport", "SCALAR_FIELDS",
           "TOOL_RESULT_CHARS", "TEXT_CHARS", "is_correct", "finite_report", "json_default"]

#: The `EvalRow` fields `EvalReport.scalars` reports, each under its own name (the first five are in [0, 1]).
SCALAR_FIELDS = ("em", "f1", "score", "format_rate", "answer_rate", "mean_turns", "prompt_tokens_per_episode",
                 "peak_prompt_tokens", "generated_tokens_per_episode")

#: How the markdown report shortens what it shows of an example episode (characters).
TOOL_RESULT_CHARS = 300
TEXT_CHARS = 1500


@dataclass
class EvalRow:
    """The metrics of one (dataset, objectives, policy) cell, means over its episodes.

    ``em`` / ``f1``: mean per-objective EM / token F1 (whatever the format); ``score``: the outcome
    reward (EM only when the format is valid); ``format_rate``: share of episodes with a valid
    format; ``answer_rate``: share ending with ``<answer>``; ``mean_turns``: rounds per episode;
    ``em_se`` / ``f1_se``: standard errors of those means (sample std / sqrt(n)). Token counts:
    ``prompt_tokens_per_episode`` (sum over an episode's rounds of the prompt each was generated
    from), ``peak_prompt_tokens`` (the largest single round prompt), ``mean_prompt_tokens_per_turn``,
    ``generated_tokens_per_episode`` (mask-1 ids), ``full_context_tokens_per_episode`` (the full
    context of the same rounds). ``finish_reasons``: episodes per finish reason. ``tool_calls`` /
    ``failed_tool_calls``: the cell's tool calls and those that failed (``Round.tool_ok`` False: the
    retriever answered an error or nothing; a cell whose calls all failed measures a model without
    retrieval, and `evaluate` says so). ``answered_pending``: the share of the answered episodes
    answered with a question pending, some objective's gold in none of their search results
    (`Trajectory.answered_pending`: an answer that cannot be right on that question); None where no
    episode was answered, the episodes have no golds, or no tokenizer read the results. ``looped``: the
    share of the episodes that ended without an answer on a round repeating the round before it
    (`Trajectory.looped`: under greedy decoding in the memory context, stuck until the turn limit);
    None in rows written before it was counted.
    """

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
    tool_calls: int = 0
    failed_tool_calls: int = 0
    answered_pending: Optional[float] = None
    looped: Optional[float] = None

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
    ("format", "format_rate", "{:.2f}"), ("answered", "answer_rate", "{:.2f}"),
    ("answered pending", "answered_pending", "{:.2f}"), ("looped", "looped", "{:.2f}"),
    ("turns", "mean_turns", "{:.1f}"),
    ("prompt tok/episode", "prompt_tokens_per_episode", "{:.0f}"), ("peak prompt tok/turn", "peak_prompt_tokens", "{}"),
    ("gen tok/episode", "generated_tokens_per_episode", "{:.0f}"), ("tool calls", "tool_calls", "{}"),
    ("failed calls", "failed_tool_calls", "{}"), ("seconds", "seconds", "{:.1f}"),
)


@dataclass
class RoundRecord:
    """One round of an `EpisodeRecord` as text: ``assistant`` (the forced ``<mem>`` and what the
    model wrote, decoded), its action, the decoded tool result; ``prompt_tokens``: the ids of the
    context it was generated from; ``prompt``: that context decoded (memory policy only)."""

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
    """One evaluated episode, readable: the system and user messages, its rounds, the final answer,
    the scores. ``golds[i]``: the aliases of objective i; ``predictions[i]``: the agent's answer to
    it (None: none given); ``trajectory``: `Trajectory.to_dict` (the ids), or None."""

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
        return is_correct(self.score, self.format_ok)

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
        ``tool_chars``, as are each objective's prediction and gold aliases; other texts, the final
        answer included, to ``text_chars``), answers against golds, scores."""
        lines = [f"[system] {_shorten(self.system, text_chars)}", f"[user] {_shorten(self.user, text_chars)}"]
        for r in self.rounds:
            lines.append(f"[assistant, turn {r.index + 1}] {_shorten(r.assistant, text_chars)}")
            if r.tool_result is not None:
                lines.append(f"[{r.action or 'tool'} result{'' if r.tool_ok is not False else ', failed'}] "
                             f"{_shorten(r.tool_result, tool_chars)}")
        lines.append(f"[end] {self.finish_reason} after {len(self.rounds)} turn(s); final answer: "
                     f"{_shorten(repr(self.final_answer), text_chars)}")
        for i, (prediction, golds) in enumerate(zip(self.predictions, self.golds), 1):
            lines.append(f"  {i}. predicted {_shorten(repr(prediction), tool_chars)}; gold "
                         f"{_shorten(' | '.join(golds), tool_chars)}")
        rules = f" (failed rules: {', '.join(self.failed_rules)})" if self.failed_rules else ""
        lines.append(f"[score] EM {self.em:.2f}, F1 {self.f1:.2f}, score {self.score:.2f}, "
                     f"format {'ok' if self.format_ok else 'invalid'}{rules}")
        return "\n".join(lines)


def is_correct(score: float, format_ok: bool) -> bool:
    """An episode is correct when its format is valid and its score reaches 1."""
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
    """Rows per (dataset, objectives, policy), metadata and example episodes.

    ``rows``: one `EvalRow` per cell, datasets in first-seen order, k ascending, policies in order;
    ``metadata``: model, tokenizer, settings, machine, wall time, datasets; ``trajectories``:
    ``{(dataset, k, policy): [Trajectory]}`` when `evaluate` was asked to keep them; ``examples``:
    ``{(dataset, k): Examples}``. Only rows and metadata go to the JSON (`write` / `load`).
    """

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

    def all_tool_calls_failed(self) -> bool:
        """True when the rows' episodes made tool calls and every one of them failed."""
        calls = sum(r.tool_calls for r in self.rows)
        return calls > 0 and sum(r.failed_tool_calls for r in self.rows) == calls

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
        (a row per policy), each followed by its correct and its failed episode rendered as text
        (tool results and long texts shortened) when ``examples``, or a line saying there is none."""
        lines = [f"## {title}", ""] if title else []
        meta = self.metadata
        settings = [f"{k}={meta[k]}" for k in ("model", "split", "max_turns", "max_new_tokens", "temperature")
                    if k in meta]
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
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2, default=json_default) + "\n", encoding="utf-8")
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
        # a fence longer than any backtick run in the text, so the episode cannot close it
        fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
        lines += [f"A {kind} episode: `{record.episode_id}` ({record.policy} context, {len(record.rounds)} turns, "
                  f"EM {record.em:.2f}, F1 {record.f1:.2f}):", "", f"{fence}text", text, fence, ""]
    return lines


def json_default(value: Any) -> Any:
    """`json.dumps`'s ``default`` for reports and records: tensor / numpy scalars as numbers, sets
    and tuples as lists, anything else as its string."""
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


def finite_report(report: EvalReport) -> bool:
    """True when every numeric field of every row is finite."""
    for row in report.rows:
        for f in fields(row):
            value = getattr(row, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                return False
    return True
