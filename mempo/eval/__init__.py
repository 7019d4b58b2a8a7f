"""Multi-objective evaluation (`mempo eval`, the trainer's periodic evaluation): EM, F1 and the token
economy per (dataset, objectives k, context policy).

* `mempo.eval.episodes`: what is evaluated: the synthetic world's episodes (`eval_episodes`, keyed by
  k: the test or the validation split, ``eval.split``; `held_out_of_training`: the entities neither
  split lets SFT or RL data ask about) or QA files' (`qa_eval_episodes`, keyed by (dataset, k)), and
  the agent-loop settings (`eval_rollout_config`: the ``rollout`` section with G = 1, ``eval.max_turns``,
  ``eval.temperature``, no response budget).
* `mempo.eval.run`: `evaluate` rolls every episode out once per policy of ``cfg.eval.policies`` and
  summarises each cell; it can write every episode's record to a jsonl file; with
  ``eval.closed_book`` every policy also runs with a search that finds nothing (rows of policy
  `closed_book_policy` (policy): how much of the EM comes from retrieval).
* `mempo.eval.summary`: scored trajectories to records: `summarize` (a cell's `EvalRow`: means over
  episodes, standard errors sample std / sqrt(n), prompt tokens counted on the exact ids each round
  was generated from) and `render_episode` (an `EpisodeRecord`: the episode as text).
* `mempo.eval.records`: `EvalRow`, `EpisodeRecord`, `EvalReport` (``<name>.json`` / ``<name>.md``;
  ``scalars()``: metrics ``eval/[<dataset>/]<field>@k<k>_<policy>`` for the `SCALAR_FIELDS`).

The oracle as a policy is a backend like any other (`mempo.synthetic.backend.OracleBackend`).
"""
from mempo.eval.episodes import (
    EVAL_SPLITS, QAEvalSets, eval_episodes, eval_rollout_config, held_out_of_training, qa_eval_episodes,
    validation_episodes,
)
from mempo.eval.records import (
    SCALAR_FIELDS, TEXT_CHARS, TOOL_RESULT_CHARS, EpisodeRecord, EvalReport, EvalRow, Examples, RoundRecord,
    finite_report,
)
from mempo.eval.run import CLOSED_BOOK_SUFFIX, closed_book_policy, evaluate
from mempo.eval.summary import render_episode, round_prompt_tokens, standard_error, summarize

__all__ = ["EvalRow", "EvalReport", "RoundRecord", "EpisodeRecord", "Examples", "evaluate", "summarize",
           "standard_error", "round_prompt_tokens", "render_episode", "eval_episodes", "validation_episodes",
           "held_out_of_training", "EVAL_SPLITS", "qa_eval_episodes", "QAEvalSets", "eval_rollout_config",
           "closed_book_policy", "CLOSED_BOOK_SUFFIX", "SCALAR_FIELDS", "TOOL_RESULT_CHARS", "TEXT_CHARS",
           "finite_report"]
