"""The oracle's cold-start data for SFT, from the ``synthetic`` section's ``oracle_*`` fields.

`oracle_cold_start` draws ``oracle_episodes`` synthetic-world episodes per number of objectives k of
``oracle_objectives``, with seed `mempo.seeds.sft_question_seed` (``data.seed``, k), by
`mempo.synthetic.heldout.training_episodes`: no question is about a held-out subject (an entity the
evaluation asks about); the teacher (`oracle_agent`) runs each under the memory context with the
given tools; ``oracle_keep: correct`` keeps only correct trajectories (score 1), as the paper's
cold-start data, all of them when none is (a tiny world can defeat the oracle); ``oracle_keep: all``
keeps every trajectory, the teacher's failures too. ``oracle_rename`` renames the kept trajectories'
entities (`mempo.synthetic.rename`, seed ``data.seed``): SFT then teaches copying names, not facts;
``copy_sft_examples`` copy-task records over every name go with them (`copy_records`), and
``scoring_sft_examples`` records of the teacher-scoring layout made from the kept trajectories
(`mempo.synthetic.scoring_records`).
"""
from __future__ import annotations

from typing import Any, Collection, Mapping, NamedTuple, Optional

from mempo.config import MempoConfig
from mempo.protocol.grammar import answer_template_text
from mempo.seeds import sft_question_seed
from mempo.synthetic.copy_warmup import copy_records
from mempo.synthetic.heldout import training_episodes
from mempo.synthetic.oracle import OracleAgent, OracleTrajectory, run_oracle
from mempo.synthetic.rename import rename_excluded, rename_trajectories
from mempo.synthetic.scoring_records import scoring_layout_records
from mempo.utils.progress import progress

__all__ = ["ColdStart", "oracle_agent", "oracle_cold_start"]


class ColdStart(NamedTuple):
    """`oracle_cold_start`'s result: ``trajectories`` to train on; ``ran``: oracle runs;
    ``held_out``: the held-out subjects no episode asks about; ``all_kept``: True when no run was
    correct and every one was kept (``oracle_keep: correct``); ``copy_records``: the copy task's chat
    records to train on with them (``synthetic.copy_sft_examples``; `copy_records`);
    ``scoring_records``: the teacher-scoring layout's (``synthetic.scoring_sft_examples``)."""

    trajectories: list[OracleTrajectory]
    ran: int
    held_out: int
    all_kept: bool
    copy_records: list[dict]
    scoring_records: list[dict]

    @property
    def sft_records(self) -> list:
        """Everything SFT trains on: the trajectories, then the copy-task and scoring-layout records."""
        return [*self.trajectories, *self.copy_records, *self.scoring_records]

    def describe_extras(self) -> str:
        """`` + n copy-task records + m scoring-layout records`` (the parts present; "" for none)."""
        return "".join(f" + {len(records)} {what} records" for records, what in
                       ((self.copy_records, "copy-task"), (self.scoring_records, "scoring-layout")) if records)


def oracle_agent(cfg: MempoConfig, max_turns: Optional[int] = None) -> OracleAgent:
    """The SFT teacher the ``synthetic`` section's ``oracle_*`` fields describe; max_turns: its turn
    budget (None: the agent's default)."""
    s = cfg.synthetic
    extra = {} if max_turns is None else {"max_turns": max_turns}
    return OracleAgent(think=s.oracle_think, memory_style=s.oracle_memory_style, query_style=s.oracle_query_style,
                       drop_fact_prob=s.oracle_drop_fact_prob, drop_seed=s.oracle_drop_seed,
                       lost_line=s.oracle_lost_line,
                       answer_template=(answer_template_text(cfg.scoring.answer_template)
                                        if s.oracle_answer_template else None), **extra)


def oracle_cold_start(world: Any, tools: Mapping[str, Any], cfg: MempoConfig, held_out: Collection[str] = (), *,
                      show_progress: bool = False) -> ColdStart:
    """The oracle's cold-start trajectories: ``synthetic.oracle_episodes`` episodes per number of
    objectives of ``synthetic.oracle_objectives``, none asking about a held-out subject
    (`mempo.synthetic.heldout.training_episodes`), each played by `oracle_agent` under the memory
    context; ``oracle_keep`` says which are kept.

    world: the synthetic world (`mempo.synthetic.build.synthetic_world`); tools: the agent's tools
    over its retriever (`mempo.env.build.build_tools`); held_out: entity names no question may
    have as a hop subject (the evaluation's: `mempo.synthetic.heldout.held_out_subjects`)."""
    s = cfg.synthetic
    if s.oracle_objectives is None:
        raise ValueError("oracle_cold_start draws episodes per synthetic.oracle_objectives, which is null")
    held = frozenset(held_out)
    episodes = [e for k in s.oracle_objectives
                for e in training_episodes(world, int(k), s.oracle_episodes, sft_question_seed(cfg.data.seed, k), held)]
    trajectories = []
    with progress("oracle", total=len(episodes), enabled=show_progress) as bar:
        for episode in episodes:
            trajectories.append(run_oracle(episode, tools, policy="memory", agent=oracle_agent(cfg),
                                           system_prompt=cfg.rollout.system_prompt))
            bar.advance()
    kept = [t for t in trajectories if s.oracle_keep == "all" or float(t.score.get("score", 0.0)) == 1.0]
    all_kept = not kept
    kept = kept or trajectories
    if s.oracle_rename:
        kept = rename_trajectories(kept, world.entities, rename_excluded(s.oracle_rename_pool, held),
                                   seed=cfg.data.seed)
    copies = copy_records([e.name for e in world.entities], s.copy_sft_examples, seed=s.model_seed,
                          system_prompt=cfg.rollout.system_prompt)
    scoring = scoring_layout_records(kept, s.scoring_sft_examples, seed=s.model_seed, layout=s.scoring_records_layout,
                                     memories=s.scoring_records_memories,
                                     template=answer_template_text(cfg.scoring.answer_template))
    return ColdStart(kept, len(trajectories), len(held), all_kept, copies, scoring)
