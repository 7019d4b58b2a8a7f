"""SFT records of the teacher-scoring layout, from the oracle's cold-start trajectories.

Teacher scoring measures P(answer | mem_ctx) with mem_ctx = the question, then one round's
``<mem>`` (`mempo.algo.contexts`). No rollout round has that layout past the first round: a round
r >= 2 follows the previous round and its tool result, never the bare question, and a model
cold-started on rollout rounds reads its memory there unevenly (`bench/bench_signal.py`'s
`memory_read`; docs/ALGORITHM.md 4f). Each record here is that layout with the answer the memory
alone gives:

    messages  = the trajectory's first prompt (system, user question)
    context   = round r's ``<mem>...</mem>`` (r >= 2: round 1's memory holds nothing yet, and a
                round-1 record would teach answering before any search), read, not trained
    content   = the scoring template with, per question, the value the memory holds, or
                ``unknown`` for a question it leaves open or lost (`ObjectiveState.answer`)

The answer is read from the teacher's own memory, never from a gold the memory lacks.
"""
from __future__ import annotations

import random
from typing import Sequence

from mempo.algo.contexts import DEFAULT_ANSWER_TEMPLATE
from mempo.env.data import parse_episode_prompt
from mempo.protocol.grammar import parse_round
from mempo.synthetic.oracle import OracleTrajectory
from mempo.synthetic.oracle_memory import parse_oracle_memory

__all__ = ["scoring_layout_records"]

_MEM_END = "</mem>"


def scoring_layout_records(trajectories: Sequence[OracleTrajectory], count: int, *, seed: int = 0,
                           template: str = DEFAULT_ANSWER_TEMPLATE) -> list[dict]:
    """`count` chat records of the scoring layout (module docstring), drawn without replacement from
    the rounds r >= 2 of `trajectories` that write a ``<mem>`` (all of them when there are fewer).

    Each record is ``{"messages": [system, user, {"role": "assistant", "context": mem, "content":
    answer}]}`` (`mempo.train.sft`: the context is read, not trained). Randomness:
    ``random.Random(f"mempo-scoring-records/{seed}")``. ValueError for count < 0 or a template
    without exactly one ``{answer}``."""
    if count < 0:
        raise ValueError(f"scoring_layout_records needs count >= 0, got {count}")
    if template.count("{answer}") != 1:
        raise ValueError(f"template must contain '{{answer}}' exactly once, got {template!r}")
    # 1. candidates: (trajectory, round) for every round after the first whose text opens with a <mem>
    candidates = [(t, r) for t in trajectories for r in t.rounds[1:]
                  if r.assistant.lstrip().startswith("<mem>") and _MEM_END in r.assistant]
    rng = random.Random(f"mempo-scoring-records/{seed}")
    chosen = rng.sample(candidates, min(count, len(candidates)))
    records = []
    for trajectory, round_ in chosen:
        first = [dict(m) for m in trajectory.rounds[0].messages]  # system + the user question
        user = next(m["content"] for m in first if m["role"] == "user")
        # 2. the memory, verbatim through </mem>; 3. what it alone answers, question by question
        text = round_.assistant.lstrip()
        mem = text[:text.index(_MEM_END) + len(_MEM_END)]
        _, objectives = parse_oracle_memory(parse_round(mem).mem or "", parse_episode_prompt(user))
        answer = "; ".join(o.answer for o in objectives)
        records.append({"messages": first + [{"role": "assistant", "context": mem,
                                              "content": template.replace("{answer}", answer)}]})
    return records
