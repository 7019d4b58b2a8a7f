"""What an evaluation runs: its episodes and its agent-loop settings.

* Synthetic world (`eval_episodes`): ``cfg.eval.episodes`` episodes per k of ``cfg.eval.objectives``,
  question seed `mempo.seeds.eval_question_seed` (``data.seed``, k), keyed by k.
* QA files (`qa_eval_episodes`, ``data.source: files``): the records of ``data.eval_files``
  (`mempo.env.data.load_qa_datasets`: Search-R1 jsonl / parquet) grouped by dataset (the record's
  ``data_source``, else the file's stem); per dataset and k, ``cfg.eval.episodes`` episodes composed
  as MEM1 does (`mempo.env.data.compose_episodes`: k distinct questions of that dataset per episode,
  drawn independently, seed `mempo.seeds.eval_question_seed` (``data.seed``, k); ids
  ``<dataset>-k<k>-s<seed>-<i>``), keyed by (dataset, k).
* Settings (`eval_rollout_config`): the ``rollout`` section with G = 1, the context policy, at most
  ``cfg.eval.max_turns`` rounds, temperature ``cfg.eval.temperature`` (0: greedy) and no response
  budget; the rest (top-p / top-k, the seed, the chat template, the system prompt) is the section's.
"""
from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple, Optional, Sequence

from mempo.config import ConfigError, MempoConfig, RolloutConfig
from mempo.env.build import qa_prompt_style
from mempo.env.data import DataError, compose_episodes, load_qa_datasets
from mempo.seeds import eval_question_seed

__all__ = ["eval_episodes", "qa_eval_episodes", "QAEvalSets", "eval_rollout_config", "prompt_style"]


def prompt_style(cfg: MempoConfig) -> str:
    """The layout (`mempo.env.data.PROMPT_STYLES`) of the user turn of the config's episodes, in
    training and evaluation alike: the synthetic world's ``synthetic.world_prompt_style`` (None:
    ``"numbered"``; the ledger's ``"tools"``), `mempo.env.build.qa_prompt_style`'s for QA files."""
    if cfg.data.source == "synthetic":
        return cfg.synthetic.world_prompt_style or ("tools" if cfg.synthetic.task == "ledger" else "numbered")
    return qa_prompt_style(cfg)


def eval_episodes(world: Any, cfg: MempoConfig, num_episodes: Optional[int] = None,
                  objectives: Optional[Sequence[int]] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` of the synthetic `world` for every k of ``cfg.eval.objectives``
    (``cfg.eval.episodes`` each), drawn with question seed `mempo.seeds.eval_question_seed`
    (``data.seed``, k). A world too small for that many episodes is a ConfigError naming
    ``eval.episodes`` (and the world's size fields)."""
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
    """Episodes per (dataset, k) from the QA files ``cfg.data.eval_files``: ``num_episodes`` (default
    ``cfg.eval.episodes``) per k of ``objectives`` (default ``cfg.eval.objectives``), each of k
    distinct questions of that dataset drawn with seed `mempo.seeds.eval_question_seed`
    (``data.seed``, k); their reference answers from ``data.gold_field``. Raises `ConfigError` when no
    file is listed or a dataset holds fewer than k questions, `DataError` for a missing, malformed or
    empty file."""
    files = list(cfg.data.eval_files)
    if not files:
        raise ConfigError("data.eval_files", "must list at least one QA file (Search-R1 jsonl or parquet) to "
                                             "evaluate on (mempo eval --data files --files FILE ...)")
    try:
        datasets = load_qa_datasets(files, cfg.data.gold_field)
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
                                                   style=qa_prompt_style(cfg), id_prefix=name)
    infos = {name: {"questions": len(d.records), "files": list(d.files)} for name, d in datasets.items()}
    return QAEvalSets(episodes, infos)


def eval_rollout_config(cfg: MempoConfig, policy: str, max_new_tokens: Optional[int] = None) -> RolloutConfig:
    """The agent loop's settings of an evaluation under context policy `policy`: the ``rollout``
    section with one sample, the ``eval`` section's ``max_turns`` and ``temperature`` and no
    response budget. max_new_tokens: overrides ``max_new_tokens_per_round``."""
    return dataclasses.replace(
        cfg.rollout, context_policy=policy, group_size=1, max_turns=cfg.eval.max_turns,
        max_new_tokens_per_round=int(max_new_tokens or cfg.rollout.max_new_tokens_per_round),
        max_response_tokens=None, temperature=cfg.eval.temperature)
