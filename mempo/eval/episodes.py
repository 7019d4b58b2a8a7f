"""What an evaluation runs: its episodes and its agent-loop settings.

* Synthetic world (`eval_episodes`): the split ``cfg.eval.split`` names, keyed by k. The test split:
  ``cfg.eval.episodes`` episodes per k of ``cfg.eval.objectives``, question seed
  `mempo.seeds.eval_question_seed` (``data.seed``, k). The validation split (`validation_episodes`):
  ``cfg.eval.validation_episodes`` per k, question seed `mempo.seeds.validation_question_seed`, no
  hop subject of any test episode (disjoint by entity). SFT and RL data leave out the subjects of both
  (`held_out_of_training`), whichever split an evaluation reads.
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
from mempo.seeds import eval_question_seed, validation_question_seed
from mempo.synthetic.heldout import held_out_subjects

__all__ = ["EVAL_SPLITS", "eval_episodes", "validation_episodes", "held_out_of_training",
           "qa_eval_episodes", "QAEvalSets", "eval_rollout_config", "prompt_style"]

#: The held-out splits of a synthetic world (``eval.split``).
EVAL_SPLITS = ("test", "validation")


def prompt_style(cfg: MempoConfig) -> str:
    """The layout (`mempo.env.data.PROMPT_STYLES`) of the user turn of the config's episodes, in
    training and evaluation alike: the synthetic world's ``synthetic.world_prompt_style`` (None:
    ``"numbered"``; the ledger's ``"tools"``), `mempo.env.build.qa_prompt_style`'s for QA files."""
    if cfg.data.source == "synthetic":
        return cfg.synthetic.world_prompt_style or ("tools" if cfg.synthetic.task == "ledger" else "numbered")
    return qa_prompt_style(cfg)


def eval_episodes(world: Any, cfg: MempoConfig, num_episodes: Optional[int] = None,
                  objectives: Optional[Sequence[int]] = None, split: Optional[str] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` of the synthetic `world`'s split `split` (None: ``cfg.eval.split``): the test
    split (`_test_episodes`) or `validation_episodes` (num_episodes / objectives: theirs). ValueError
    for a split not in `EVAL_SPLITS`."""
    split = cfg.eval.split if split is None else split
    if split == "test":
        return _test_episodes(world, cfg, num_episodes, objectives)
    if split == "validation":
        return validation_episodes(world, cfg, num_episodes, objectives)
    raise ValueError(f"split must be one of {EVAL_SPLITS}, got {split!r}")


def _test_episodes(world: Any, cfg: MempoConfig, num_episodes: Optional[int] = None,
                   objectives: Optional[Sequence[int]] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` of the synthetic `world`'s test split for every k of ``cfg.eval.objectives``
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


def validation_episodes(world: Any, cfg: MempoConfig, num_episodes: Optional[int] = None,
                        objectives: Optional[Sequence[int]] = None) -> dict[int, list[Any]]:
    """``{k: episodes}`` of the synthetic `world`'s validation split: per k of `objectives` (default
    ``cfg.eval.objectives``; each must be one of them, whose validation subjects training leaves out),
    the first `num_episodes` (default all) of the ``cfg.eval.validation_episodes`` episodes drawn with
    question seed `mempo.seeds.validation_question_seed` (``data.seed``, k) among the questions none of
    whose hop subjects a test episode has; no question twice within a k. Deterministic in (world,
    ``data.seed``, ``eval`` section). ConfigError naming ``eval.validation_episodes`` when it
    is 0, below `num_episodes` or too many for the world, ``eval.objectives`` for a k outside it."""
    held = cfg.eval.validation_episodes
    if held < 1:
        raise ConfigError("eval.validation_episodes", "is 0: no validation episodes are held out (set it, per k)")
    n = held if num_episodes is None else int(num_episodes)
    if not 1 <= n <= held:
        raise ConfigError("eval.validation_episodes", f"{held} validation episodes per k are held out; "
                                                      f"{n} asked for")
    ks = [int(k) for k in (objectives if objectives is not None else cfg.eval.objectives)]
    outside = [k for k in ks if k not in cfg.eval.objectives]
    if outside:
        raise ConfigError("eval.objectives", f"the validation split holds out k in {list(cfg.eval.objectives)}; "
                                             f"k={outside} asked for")
    return {k: episodes[:n] for k, episodes in _validation_draw(world, cfg, ks).items()}


def _validation_draw(world: Any, cfg: MempoConfig, ks: Sequence[int]) -> dict[int, list[Any]]:
    """Every validation episode of each k of `ks` (`validation_episodes`' draw: ``eval.validation_episodes``
    per k)."""
    test_subjects = held_out_subjects(_test_episodes(world, cfg))
    n = cfg.eval.validation_episodes
    style = world.params.get("prompt_style", "numbered")
    sets = {}
    for k in ks:
        seed = validation_question_seed(cfg.data.seed, k)
        try:
            pool = world.questions(k * n, None, seed, id_prefix=f"w{world.seed}-k{k}-q{seed}",
                                   exclude_subjects=test_subjects)
        except ValueError as error:
            raise ConfigError("eval.validation_episodes",
                              f"{n} episodes of {k} objectives asking about no test entity: {error} "
                              "(synthetic.world_entities sets the world's size)") from None
        sets[k] = compose_episodes(pool, k, n, seed, reuse_questions=False, style=style, id_prefix=f"w{world.seed}")
    return sets


def held_out_of_training(world: Any, cfg: MempoConfig) -> frozenset[str]:
    """The entity names no SFT or RL question may have as a hop subject (`mempo.synthetic.heldout`):
    the subjects of the test split and, with ``eval.validation_episodes`` > 0, of the validation split
    (every k of ``eval.objectives``), whichever split ``eval.split`` evaluates.
    ConfigError as `eval_episodes` (either split) for a world too small for them."""
    held = held_out_subjects(_test_episodes(world, cfg))
    if cfg.eval.validation_episodes:
        held |= held_out_subjects(_validation_draw(world, cfg, cfg.eval.objectives))
    return held


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
                                                     f"{name!r} ({', '.join(dataset.files)}) has "
                                                     f"{len(dataset.records)}")
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
