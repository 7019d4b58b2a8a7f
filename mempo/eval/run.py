"""`evaluate`: run every episode under every context policy and summarise each cell.

Cells are (dataset, k): a key of ``episodes_by_k`` is k (dataset ``""``) or (dataset, k); they run
in the order datasets first appear, k ascending, and each runs once per policy of
``cfg.eval.policies`` (``"memory"``: the paper's inference context, ``"full"``: the growing
history) with `mempo.rollout.loop.RolloutEngine` and `eval_rollout_config`'s settings; with
``cfg.eval.closed_book`` each policy runs a second time with tools over
`mempo.env.closed_book.ClosedBookRetriever` (every search finds nothing), a row of policy
``closed_book_policy(policy)`` (``"memory-closed-book"``: not written to the episode records, no
examples; its trajectories kept under that name). The backend
context is the model's ``max_position_embeddings`` (a round that would not fit ends the episode
with ``"token_budget"``). Generation sees only the prompt ids and the tool results: the golds go to
scoring and to the written records, nowhere else. Per (dataset, k) the report keeps the first
correct and the first failed episode (policies in order) as its examples. Every row counts its
tool calls and the failed ones; a cell with failed calls logs a warning naming the retriever, and
an evaluation whose every call failed says so in one line (`mempo eval` then exits with code 2
unless ``eval.allow_failed_tools``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from typing import Any, Callable, Iterator, Mapping, Optional, Sequence

from mempo.algo.outcome import score_outcomes
from mempo.config import MempoConfig
from mempo.config.schema import BUILTIN_TOOL_NAMES
from mempo.env.build import build_tools
from mempo.env.closed_book import ClosedBookRetriever
from mempo.eval.episodes import eval_rollout_config
from mempo.eval.records import EvalReport, EvalRow, Examples, is_correct, json_default
from mempo.eval.summary import render_episode, summarize
from mempo.rollout.backends.factory import hf_backend
from mempo.rollout.loop import RolloutEngine
from mempo.tools import Toolset
from mempo.utils.jsonl import JsonlWriter, jsonl_writer
from mempo.utils.machine import machine_facts
from mempo.utils.progress import progress
from mempo.utils.types import PathLike

__all__ = ["evaluate", "retriever_name", "closed_book_policy", "model_context_tokens", "CLOSED_BOOK_SUFFIX"]

#: What a closed-book row's policy adds to the policy it ran under.
CLOSED_BOOK_SUFFIX = "-closed-book"


def closed_book_policy(policy: str) -> str:
    """The row policy of `policy` evaluated closed-book: ``"memory"`` -> ``"memory-closed-book"``."""
    return policy + CLOSED_BOOK_SUFFIX


def evaluate(model: Any, tokenizer: Any, episodes_by_k: Mapping[Any, Sequence[Any]], retriever: Any,
             cfg: MempoConfig, *,
             backend: Any = None, policies: Optional[Sequence[str]] = None, max_new_tokens: Optional[int] = None,
             label: str = "", log: Optional[Callable[[str], None]] = None,
             show_progress: bool = True, keep_trajectories: bool = False,
             trajectories_path: Optional[PathLike] = None, tools: Optional[Toolset] = None,
             closed_book_tools: Optional[Toolset] = None) -> EvalReport:
    """Run every episode once under every policy and summarise per (dataset, k, policy): cells in the
    order datasets first appear, k ascending, each with the settings of `eval_rollout_config`.

    Args:
        model: a causal LM (generating through `mempo.rollout.backends.factory.hf_backend` unless
            ``backend`` is given); put in eval mode for the run, its training mode restored after.
        tokenizer: the model's tokenizer (prompts, token counts, decoded episode records).
        episodes_by_k: ``{k: episodes}`` or ``{(dataset, k): episodes}``.
        retriever: what the search / access tools query.
        cfg: a `mempo.config.MempoConfig` (``eval``, ``rollout``, ``env`` sections); ``eval.batch_episodes``
            episodes are generated together (one ``generate`` per round) and advance the progress bar.
        backend: a generation backend to use instead of the model (e.g.
            `mempo.synthetic.backend.OracleBackend`).
        policies: overrides ``cfg.eval.policies``.
        max_new_tokens: overrides ``cfg.rollout.max_new_tokens_per_round``.
        label: a name stored in the metadata (e.g. "before RL").
        log: a line printer (default: stderr).
        keep_trajectories: keep the trajectories on the report (``report.trajectories``).
        trajectories_path: write every episode's `EpisodeRecord` there as its cell finishes (jsonl;
            the file appears when the evaluation succeeds, never partly written).
        tools: the agent's tools (None: `mempo.env.build.build_tools` of ``cfg`` over `retriever`), e.g. a
            synthetic task's own (`mempo.apps.tasks`).
        closed_book_tools: the closed-book pass's tools (None: ``build_tools`` over a
            `ClosedBookRetriever`); needed with ``eval.closed_book`` when `tools` is given (ValueError).
    """
    log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    policies = list(policies or cfg.eval.policies)
    max_new = int(max_new_tokens or cfg.rollout.max_new_tokens_per_round)
    cells = _cells(episodes_by_k)
    if backend is None:
        backend = hf_backend(model, tokenizer)
    max_context = model_context_tokens(model)
    if tools is not None and cfg.eval.closed_book and closed_book_tools is None:
        raise ValueError("evaluate: with tools given and eval.closed_book on, give closed_book_tools (the same "
                         "tools finding nothing)")
    tools = tools if tools is not None else build_tools(cfg, retriever)
    closed_tools = None
    if cfg.eval.closed_book:
        closed_tools = closed_book_tools if closed_book_tools is not None else build_tools(cfg, ClosedBookRetriever())
    rows, kept, examples = [], {}, {}
    started = time.perf_counter()
    with _eval_mode(model), _record_file(trajectories_path) as records:
        for dataset, k, episodes in cells:
            found = Examples(None, None)
            name = " ".join(part for part in (label, dataset) if part)
            for policy in policies:
                rollout_cfg = eval_rollout_config(cfg, policy, max_new)
                passes = [(policy, tools)] + ([(closed_book_policy(policy), closed_tools)] if closed_tools else [])
                for row_policy, cell_tools in passes:
                    engine = RolloutEngine(backend, tokenizer, cell_tools, config=rollout_cfg,
                                           max_context_tokens=max_context)
                    cell_start = time.perf_counter()
                    trajectories = _roll_out(engine, episodes, cfg.eval.batch_episodes,
                                             f"eval{' ' + name if name else ''} k={k} {row_policy}", show_progress)
                    row = summarize(trajectories, k, row_policy, time.perf_counter() - cell_start, dataset=dataset,
                                    tokenizer=tokenizer)
                    rows.append(row)
                    if keep_trajectories:
                        kept[(dataset, k, row_policy)] = trajectories
                    if cell_tools is tools:  # a closed-book pass adds its row only: no records, no examples
                        found = _record_episodes(episodes, trajectories, tokenizer, dataset=dataset,
                                                 system_prompt=rollout_cfg.system_prompt, records=records, found=found)
                    log(_cell_line(name, row))
                    if row.failed_tool_calls:
                        log(f"eval{' ' + name if name else ''}: k={k} {row_policy}: warning: "
                            f"{row.failed_tool_calls} of {row.tool_calls} tool calls failed "
                            f"({tools_name(cell_tools, retriever)})")
            examples[(dataset, k)] = found
    metadata = {
        "label": label, "max_turns": cfg.eval.max_turns, "max_new_tokens": max_new,
        "temperature": cfg.eval.temperature, "policies": policies, "closed_book": cfg.eval.closed_book,
        "objectives": sorted({k for _, k, _ in cells}),
        "max_context_tokens": max_context, "backend": getattr(backend, "name", type(backend).__name__),
        "seconds": time.perf_counter() - started, "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": machine_facts(), **_model_facts(model, tokenizer),
    }
    metadata["tool_calls"] = sum(r.tool_calls for r in rows)
    metadata["failed_tool_calls"] = sum(r.failed_tool_calls for r in rows)
    metadata["retriever_name"] = retriever_name(retriever)
    metadata["tools_name"] = tools_name(tools, retriever)
    report = EvalReport(rows, metadata, kept, examples)
    if report.all_tool_calls_failed():
        log(f"eval{' ' + label if label else ''}: every tool call failed ({metadata['tool_calls']} calls, "
            f"{metadata['tools_name']}): these numbers measure the model without its tools' results")
    if records is not None:
        metadata["trajectories"] = {"path": str(records.path), "episodes": records.count}
    return report


def retriever_name(retriever: Any) -> str:
    """How warnings name a retriever: its class, and its URL when it has one (`HTTPRetriever`)."""
    url = getattr(retriever, "base_url", None)
    return f"{type(retriever).__name__}{' at ' + str(url) if url else ''}"


def tools_name(tools: Toolset, retriever: Any) -> str:
    """How warnings name what failed: the retriever (`retriever_name`) when the toolset has a built-in search
    tool, which queries it; else the tools by name (a user's tools, the ledger's: the retriever is unused)."""
    if set(tools.names) & set(BUILTIN_TOOL_NAMES):
        return f"retriever: {retriever_name(retriever)}"
    return f"tools: {', '.join(tools.names)}"


def _cells(episodes_by_k: Mapping[Any, Sequence[Any]]) -> list[tuple[str, int, list[Any]]]:
    """(dataset, k, episodes) per key (``k`` or ``(dataset, k)``): datasets in first-seen order, k ascending."""
    cells = []
    for key, episodes in episodes_by_k.items():
        dataset, k = key if isinstance(key, tuple) else ("", key)
        cells.append((str(dataset), int(k), list(episodes)))
    order = {name: i for i, name in enumerate(dict.fromkeys(c[0] for c in cells))}
    return sorted(cells, key=lambda c: (order[c[0]], c[1]))


def model_context_tokens(model: Any) -> Optional[int]:
    """The model's ``max_position_embeddings`` (None: no model, or it does not say)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "max_position_embeddings", None):
        return int(config.max_position_embeddings)
    return None


@contextlib.contextmanager
def _eval_mode(model: Any) -> Iterator[None]:
    """The model in eval mode for the block, back in training mode after when it was training."""
    was_training = getattr(model, "training", False)
    if model is not None and hasattr(model, "eval"):
        model.eval()
    try:
        yield
    finally:
        if was_training and hasattr(model, "train"):
            model.train()


@contextlib.contextmanager
def _record_file(path: Optional[PathLike]) -> Iterator[Optional[JsonlWriter]]:
    """The episode records' jsonl writer (`mempo.utils.jsonl.jsonl_writer`: the file replaces
    `path` when the evaluation succeeds, a failed one leaves none), or None without a path."""
    if path is None:
        yield None
        return
    with jsonl_writer(path, default=json_default) as writer:
        yield writer


def _roll_out(engine: RolloutEngine, episodes: Sequence[Any], chunk_size: int, title: str,
              show_progress: bool) -> list[Any]:
    """The scored trajectories of `episodes` (one each, in order), `chunk_size` episodes per engine
    run; `score_outcomes` (with the engine's ``score_mode``, ``outcome_reward`` and tags) gives their
    ``outcome``, which is all the records and rows read."""
    trajectories = []
    with progress(title, total=len(episodes), enabled=show_progress) as bar:
        for i in range(0, len(episodes), chunk_size):
            chunk = episodes[i:i + chunk_size]
            trajectories.extend(score_outcomes(engine.run(chunk), mode=engine.config.score_mode,
                                               reward=engine.config.outcome_reward, tags=engine.tags))
            bar.advance(len(chunk))
    return trajectories


def _record_episodes(episodes: Sequence[Any], trajectories: Sequence[Any], tokenizer: Any, *, dataset: str,
                     system_prompt: str, records: Optional[JsonlWriter], found: Examples) -> Examples:
    """Write every episode's `EpisodeRecord` to `records` (when given) and return `found` completed
    with the first correct and the first failed episode of these trajectories it still lacks."""
    correct, failed = found
    for episode, trajectory in zip(episodes, trajectories):
        correct_here = is_correct(trajectory.score, bool((trajectory.outcome or {}).get("format_ok")))
        wanted = (correct is None and correct_here) or (failed is None and not correct_here)
        if records is None and not wanted:
            continue
        record = render_episode(trajectory, episode, tokenizer, dataset=dataset, system_prompt=system_prompt,
                                with_ids=records is not None)
        if records is not None:
            records.write(record.to_dict())
        if wanted:
            example = dataclasses.replace(record, trajectory=None)  # the example shows text; the file has the ids
            if correct_here:
                correct = example
            else:
                failed = example
    return Examples(correct, failed)


def _cell_line(name: str, row: EvalRow) -> str:
    return (f"eval{' ' + name if name else ''}: k={row.objectives} {row.policy}: EM {row.em:.3f} F1 {row.f1:.3f} "
            f"format {row.format_rate:.2f} turns {row.mean_turns:.1f} prompt tok/episode "
            f"{row.prompt_tokens_per_episode:.0f} peak {row.peak_prompt_tokens} ({row.seconds:.1f}s)")


def _model_facts(model: Any, tokenizer: Any) -> dict[str, Any]:
    """The model's class, parameter count and size fields, and the tokenizer's vocabulary size."""
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
