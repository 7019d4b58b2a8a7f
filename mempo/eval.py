"""Multi-objective evaluation (`mempo eval`): EM, F1 and the token economy per (objectives, policy).

Conventions
-----------
* What is evaluated. ``episodes_by_k`` maps a number of objectives k to its episodes
  (`mempo.env.data.Episode`, e.g. from `eval_episodes`); every episode is run once (G = 1) under
  each context policy of ``cfg.eval.policies`` (``"memory"``: the paper's inference context,
  ``"full"``: the growing history) with `mempo.rollout.loop.RolloutEngine`, at most
  ``cfg.eval.max_turns`` rounds (64 by default), ``cfg.rollout.max_new_tokens_per_round`` ids per
  round, temperature ``cfg.eval.temperature`` (0: greedy). The backend context is limited to the
  model's ``max_position_embeddings`` (a round that would not fit ends the episode with
  ``"token_budget"``).
* Quality, per (k, policy), means over episodes: ``em`` / ``f1`` (the mean per-objective EM / token
  F1 of `mempo.reward.compute_score`, whatever the format), ``score`` (the outcome reward: EM only
  when the format is valid), ``format_rate`` (share of episodes with a valid format),
  ``answer_rate`` (share ending with ``<answer>``), ``mean_turns`` (rounds per episode).
* Token economy, counted with the model's tokenizer on the real ids: a round's prompt is the exact
  context it was generated from (`Trajectory.round_context_ids`: ``Round.prompt_ids`` under the
  memory policy, ``prompt_ids + response_ids[:start]`` under the full policy; the forced ``<mem>``
  is not counted). ``prompt_tokens_per_episode``: the mean over episodes of the sum over its rounds;
  ``peak_prompt_tokens``: the largest single round prompt over all episodes;
  ``mean_prompt_tokens_per_turn``: all round prompts / all rounds; ``generated_tokens_per_episode``:
  mean model-generated ids (mask 1) per episode.
* Output. `EvalReport` holds one `EvalRow` per (k, policy) plus ``metadata`` (model, tokenizer,
  settings, machine, wall time); ``write(out_dir, name)`` writes ``<name>.json`` (`EvalReport.load`
  reads it back) and ``<name>.md`` (a markdown table), and, if asked, the trajectories as jsonl.
  ``scalars()`` flattens the rows into metrics ``eval/<name>@k<k>_<policy>`` (the trainer's
  periodic evaluation logs them).
* `OracleBackend` plays the rule-based oracle agent (`mempo.env.oracle.OracleAgent`) as a
  generation backend (it decodes the ChatML prompt back into messages): the upper bound of a
  policy on the synthetic world, and the reference for the tests.

Heavy imports (torch, transformers) happen inside the functions that need them.
"""
from __future__ import annotations

import json
import math
import os
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

__all__ = ["EvalRow", "EvalReport", "evaluate", "summarize", "round_prompt_tokens", "eval_episodes",
           "build_world", "synthetic_world", "config_tools", "load_model_dir", "OracleBackend", "machine_facts",
           "EVAL_SEED_OFFSET", "SCALAR_NAMES"]

#: Evaluation episodes use question seed ``cfg.data.seed + EVAL_SEED_OFFSET + k`` (training uses others).
EVAL_SEED_OFFSET = 10_000

PathLike = Union[str, "os.PathLike[str]"]

#: `EvalRow` fields that `EvalReport.scalars` reports, and their metric names (the first five are in [0, 1]).
SCALAR_NAMES = {"em": "em", "f1": "f1", "score": "score", "format_rate": "format", "answer_rate": "answered",
                "mean_turns": "turns", "prompt_tokens_per_episode": "prompt_tokens",
                "peak_prompt_tokens": "peak_prompt_tokens", "generated_tokens_per_episode": "generated_tokens"}


# ------------------------------------------------------------------------------------------------
# rows and reports
# ------------------------------------------------------------------------------------------------
@dataclass
class EvalRow:
    """The metrics of one (objectives, policy) cell (module conventions for every field)."""

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
class EvalReport:
    """Rows per (objectives, policy) and metadata; `write` / `load` (module conventions)."""

    rows: list[EvalRow]
    metadata: dict[str, Any] = field(default_factory=dict)
    trajectories: dict[tuple[int, str], list[Any]] = field(default_factory=dict, repr=False, compare=False)

    def row(self, objectives: int, policy: str = "memory") -> Optional[EvalRow]:
        """The row of (objectives, policy), or None."""
        return next((r for r in self.rows if r.objectives == objectives and r.policy == policy), None)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": [asdict(r) for r in self.rows], "metadata": self.metadata}

    def scalars(self, prefix: str = "eval/") -> dict[str, float]:
        """Every row's numbers as flat metrics ``<prefix><name>@k<objectives>_<policy>`` (names:
        `SCALAR_NAMES`), e.g. ``eval/em@k2_memory``, for a metrics logger."""
        return {f"{prefix}{name}@k{row.objectives}_{row.policy}": float(getattr(row, field_name))
                for row in self.rows for field_name, name in SCALAR_NAMES.items()}

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> "EvalReport":
        return cls([EvalRow.from_dict(r) for r in obj.get("rows", [])], dict(obj.get("metadata", {})))

    @classmethod
    def load(cls, path: PathLike) -> "EvalReport":
        """Read a report written by `write` (the ``.json`` file)."""
        return cls.from_dict(json.loads(Path(path).read_text(encoding="utf-8")))

    def markdown(self, title: Optional[str] = None) -> str:
        """The rows as a markdown table (with a title line and the main settings)."""
        lines = [f"## {title}", ""] if title else []
        meta = self.metadata
        settings = [f"{k}={meta[k]}" for k in ("model", "max_turns", "max_new_tokens", "temperature") if k in meta]
        if settings:
            lines += ["Settings: " + ", ".join(settings) + ".", ""]
        lines.append("| " + " | ".join(c[0] for c in _TABLE_COLUMNS) + " |")
        lines.append("|" + "|".join("---" for _ in _TABLE_COLUMNS) + "|")
        for row in self.rows:
            cells = []
            for _, name, fmt in _TABLE_COLUMNS:
                value = getattr(row, name)
                cells.append(fmt.format(value) if value is not None else "-")
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def write(self, out_dir: PathLike, name: str = "eval", *, title: Optional[str] = None,
              trajectories: bool = False) -> dict[str, Path]:
        """Write ``<name>.json`` and ``<name>.md`` (and ``<name>_trajectories.jsonl`` when asked)."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {"json": out / f"{name}.json", "markdown": out / f"{name}.md"}
        paths["json"].write_text(json.dumps(self.to_dict(), indent=2, default=_json_default) + "\n", encoding="utf-8")
        paths["markdown"].write_text(self.markdown(title or f"Evaluation: {name}"), encoding="utf-8")
        if trajectories and self.trajectories:
            from mempo.rollout.trajectory import write_trajectories_jsonl

            paths["trajectories"] = out / f"{name}_trajectories.jsonl"
            write_trajectories_jsonl(paths["trajectories"], [t for key in sorted(self.trajectories)
                                                             for t in self.trajectories[key]])
        return paths


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


def summarize(trajectories: Sequence[Any], objectives: int, policy: str, seconds: float = 0.0) -> EvalRow:
    """One `EvalRow` from the trajectories of one (objectives, policy) cell."""
    per_episode_tokens, all_rounds = [], []
    for t in trajectories:
        counts = round_prompt_tokens(t)
        per_episode_tokens.append(sum(counts))
        all_rounds.extend(counts)
    reasons: dict[str, int] = {}
    for t in trajectories:
        reasons[t.finish_reason] = reasons.get(t.finish_reason, 0) + 1
    outcome = [t.outcome or {} for t in trajectories]
    return EvalRow(
        objectives=int(objectives), policy=policy, episodes=len(trajectories),
        em=_mean([float(o.get("em", 0.0)) for o in outcome]),
        f1=_mean([float(o.get("f1", 0.0)) for o in outcome]),
        score=_mean([float(o.get("score", 0.0)) for o in outcome]),
        format_rate=_mean([1.0 if o.get("format_ok") else 0.0 for o in outcome]),
        answer_rate=_mean([1.0 if t.finish_reason == "answer" else 0.0 for t in trajectories]),
        mean_turns=_mean([len(t.rounds) for t in trajectories]),
        prompt_tokens_per_episode=_mean(per_episode_tokens),
        peak_prompt_tokens=int(max(all_rounds, default=0)),
        mean_prompt_tokens_per_turn=_mean(all_rounds),
        generated_tokens_per_episode=_mean([sum(t.response_mask) for t in trajectories]),
        seconds=float(seconds), finish_reasons=reasons,
    )


# ------------------------------------------------------------------------------------------------
# the oracle as a backend
# ------------------------------------------------------------------------------------------------
_CHATML_MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)<\|im_end\|>\n?", re.S)


class OracleBackend:
    """The rule-based oracle (`mempo.env.oracle.OracleAgent`) behind the generation-backend interface.

    It decodes each request's prompt (ChatML: the built-in template or an equal tokenizer template)
    back into chat messages, asks the oracle for the round, drops the forced prefix the prompt
    already ends with and returns the rest as ids (up to ``max_new_tokens``).
    """

    name = "oracle"

    def __init__(self, tokenizer: Any, *, max_turns: int = 64, agent: Any = None, forced_prefix: str = "<mem>"):
        from mempo.env.oracle import OracleAgent

        self.tokenizer = tokenizer
        self.agent = agent or OracleAgent(max_turns=max_turns)
        self.forced_prefix = forced_prefix

    def messages(self, prompt_ids: Sequence[int]) -> list[dict[str, str]]:
        from mempo.rollout.chat import decode_ids

        text = decode_ids(self.tokenizer, prompt_ids)
        return [{"role": role, "content": content} for role, content in _CHATML_MESSAGE.findall(text)]

    def generate(self, requests: Sequence[Any], sampling: Any) -> list[Any]:
        from mempo.rollout.backends.base import GenerationOutput
        from mempo.rollout.chat import encode_text

        outputs = []
        for request in requests:
            context = request.prompt_ids[:len(request.prompt_ids) - request.prefix_len]
            text = self.agent.respond(self.messages(context))
            if self.forced_prefix and text.startswith(self.forced_prefix):
                text = text[len(self.forced_prefix):]
            ids = encode_text(self.tokenizer, text)[:request.max_new_tokens]
            outputs.append(GenerationOutput(ids, "action"))
        return outputs

    def sync_weights(self, weights: Any = None) -> None:
        """Nothing to copy (the oracle has no weights)."""

    def close(self) -> None:
        """Nothing to release."""


# ------------------------------------------------------------------------------------------------
# data, model and machine helpers
# ------------------------------------------------------------------------------------------------
def synthetic_world(cfg: Any):
    """The synthetic world `cfg.data` describes (``world_seed``, ``world_entities`` or
    ``world_documents``, ``article_fillers``): the one world train, eval and the demo share."""
    from mempo.env.world import World

    data = cfg.data
    fillers = tuple(data.article_fillers) if data.article_fillers is not None else None
    return World.generate(data.world_seed, data.world_entities, num_documents=data.world_documents,
                          article_fillers=fillers)


def config_tools(retriever: Any, cfg: Any) -> dict:
    """The `search` / `access` tools over `retriever` with the ``env`` section's limits (``topk``,
    ``doc_chars``, ``page_chars``): the tools train, eval and the demo's oracle all use."""
    from mempo.env.tools import make_tools

    return make_tools(retriever, options={"search": {"topk": cfg.env.topk, "doc_chars": cfg.env.doc_chars},
                                          "access": {"page_chars": cfg.env.page_chars}})


def build_world(cfg: Any):
    """`synthetic_world(cfg)` and a BM25 retriever over it."""
    from mempo.env.retriever import BM25Retriever

    world = synthetic_world(cfg)
    retriever = BM25Retriever.build(world.documents())
    return world, retriever


def eval_episodes(world: Any, cfg: Any, num_episodes: Optional[int] = None,
                  objectives: Optional[Sequence[int]] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` for every k of ``cfg.eval.objectives`` (``cfg.eval.episodes`` each), drawn
    with question seed ``cfg.data.seed + EVAL_SEED_OFFSET + k``."""
    n = int(num_episodes if num_episodes is not None else cfg.eval.episodes)
    ks = list(objectives if objectives is not None else cfg.eval.objectives)
    return {int(k): world.episodes(int(k), n, seed=cfg.data.seed + EVAL_SEED_OFFSET + int(k)) for k in ks}


def load_model_dir(path: PathLike, dtype: str = "float32"):
    """(model, tokenizer) from a directory holding a saved HF causal LM and its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=getattr(torch, dtype))
    model.eval()
    return model, tokenizer


def machine_facts() -> dict[str, Any]:
    """CPU count, torch / transformers / Python versions, platform, CUDA device (if any)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count(), "python": sys.version.split()[0],
                             "platform": platform.platform()}
    try:
        facts["cpu_affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        import torch

        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
        facts["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        facts["torch"] = None
    try:
        import transformers

        facts["transformers"] = transformers.__version__
    except ImportError:
        pass
    return facts


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
def evaluate(model: Any, tokenizer: Any, episodes_by_k: Mapping[int, Sequence[Any]], retriever: Any, cfg: Any, *,
             backend: Any = None, policies: Optional[Sequence[str]] = None, max_new_tokens: Optional[int] = None,
             chunk_size: int = 16, label: str = "", log: Optional[Callable[[str], None]] = None,
             show_progress: bool = True, keep_trajectories: bool = False) -> EvalReport:
    """Run every episode under every policy and summarise per (k, policy) (module conventions).

    Args:
        model: a causal LM (used through `make_backend("hf")` unless ``backend`` is given).
        tokenizer: the model's tokenizer (prompts and token counts).
        episodes_by_k: ``{objectives: episodes}``.
        retriever: what the search / access tools query.
        cfg: a `mempo.train.config.MempoConfig` (``eval``, ``rollout``, ``env`` sections).
        backend: a generation backend to use instead of the model (e.g. `OracleBackend`).
        policies: overrides ``cfg.eval.policies``.
        max_new_tokens: overrides ``cfg.rollout.max_new_tokens_per_round``.
        chunk_size: episodes per engine run (progress granularity; all of a chunk are batched).
        label: a name stored in the metadata (e.g. "before RL").
        log: a line printer (default: stderr).
        keep_trajectories: keep the trajectories on the report (``report.trajectories``).
    """
    from mempo.rollout.backends import make_backend
    from mempo.rollout.loop import RolloutConfig, RolloutEngine
    from mempo.train.logging import progress

    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    policies = list(policies or cfg.eval.policies)
    max_new = int(max_new_tokens or cfg.rollout.max_new_tokens_per_round)
    if backend is None:
        backend = make_backend("hf", model=model, tokenizer=tokenizer)
    max_context = None
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "max_position_embeddings", None):
        max_context = int(config.max_position_embeddings)
    tools = config_tools(retriever, cfg)
    was_training = getattr(model, "training", False)
    if model is not None and hasattr(model, "eval"):
        model.eval()
    rows, kept = [], {}
    started = time.perf_counter()
    try:
        for k in sorted(episodes_by_k):
            episodes = list(episodes_by_k[k])
            for policy in policies:
                rollout_cfg = RolloutConfig.evaluation(
                    policy=policy, max_turns=cfg.eval.max_turns, max_new_tokens=max_new,
                    temperature=cfg.eval.temperature, top_p=cfg.rollout.top_p, top_k=cfg.rollout.top_k,
                    seed=cfg.rollout.seed, max_context_tokens=max_context, tool_workers=4,
                    chat_template=cfg.rollout.chat_template)
                engine = RolloutEngine(backend, tokenizer, tools, config=rollout_cfg)
                cell_start = time.perf_counter()
                trajectories = []
                with progress(f"eval{' ' + label if label else ''} k={k} {policy}", total=len(episodes),
                              enabled=show_progress) as bar:
                    for i in range(0, len(episodes), max(1, chunk_size)):
                        chunk = episodes[i:i + max(1, chunk_size)]
                        trajectories.extend(engine.run(chunk))
                        bar.advance(len(chunk))
                row = summarize(trajectories, k, policy, time.perf_counter() - cell_start)
                rows.append(row)
                if keep_trajectories:
                    kept[(int(k), policy)] = trajectories
                log(f"eval{' ' + label if label else ''}: k={k} {policy}: EM {row.em:.3f} F1 {row.f1:.3f} "
                    f"format {row.format_rate:.2f} turns {row.mean_turns:.1f} prompt tok/episode "
                    f"{row.prompt_tokens_per_episode:.0f} peak {row.peak_prompt_tokens} ({row.seconds:.1f}s)")
    finally:
        if was_training and hasattr(model, "train"):
            model.train()
    metadata = {
        "label": label, "max_turns": cfg.eval.max_turns, "max_new_tokens": max_new,
        "temperature": cfg.eval.temperature, "policies": policies, "objectives": sorted(int(k) for k in episodes_by_k),
        "max_context_tokens": max_context, "backend": getattr(backend, "name", type(backend).__name__),
        "seconds": time.perf_counter() - started, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine_facts(), **_model_facts(model, tokenizer),
    }
    return EvalReport(rows, metadata, kept)


def finite_report(report: EvalReport) -> bool:
    """True when every numeric field of every row is finite."""
    for row in report.rows:
        for f in fields(row):
            value = getattr(row, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                return False
    return True
