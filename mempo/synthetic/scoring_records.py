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

``layout="later_round"`` puts an empty assistant turn and an empty user turn between the question
and the memory: a later round's place. Right after the question (``"question"``) the records share
round 1's layout, where the cold start always writes ``Q1: ?`` and searches, and a filled memory
followed by an answer there taught round 1 to answer (docs/experiments/T10-blank-layout-records.md).

``memories="complete"`` draws only the memories that hold a value for every question (no ``unknown``
in the answer): the rounds `scored_objectives: complete` scores. With every memory ("any"), the
records' ``unknown`` won the first answer position on the shipped recipe (docs/experiments/T16-later-round-records.md).
"""
from __future__ import annotations

import random
from typing import Sequence

from mempo.protocol.grammar import DEFAULT_ANSWER_TEMPLATE
from mempo.env.data import parse_episode_prompt
from mempo.protocol.grammar import parse_round
from mempo.synthetic.oracle import OracleTrajectory
from mempo.synthetic.oracle_memory import UNKNOWN, parse_oracle_memory

__all__ = ["RECORD_LAYOUTS", "RECORD_MEMORIES", "scoring_layout_records"]

_MEM_END = "</mem>"
#: Where a record puts the memory (module docstring).
RECORD_LAYOUTS = ("question", "later_round")
#: Which memories a record may hold (module docstring).
RECORD_MEMORIES = ("any", "complete")
# the empty turns of a later round's place; empty assistant text is not trained (`mempo.train.sft`)
_LATER_ROUND = ({"role": "assistant", "content": ""}, {"role": "user", "content": ""})


def scoring_layout_records(trajectories: Sequence[OracleTrajectory], count: int, *, seed: int = 0,
                           template: str = DEFAULT_ANSWER_TEMPLATE, layout: str = "question",
                           memories: str = "any") -> list[dict]:
    """`count` chat records of the scoring layout (module docstring), drawn without replacement from
    the rounds r >= 2 of `trajectories` that write a ``<mem>`` (all of them when there are fewer;
    with memories "complete" only those whose memory holds a value for every question).

    Each record is ``{"messages": [system, user, {"role": "assistant", "context": mem, "content":
    answer}]}`` (`mempo.train.sft`: the context is read, not trained), with layout "later_round" an
    empty assistant and an empty user message before the last one. Randomness:
    ``random.Random(f"mempo-scoring-records/{seed}")``. ValueError for count < 0, a template
    without exactly one ``{answer}``, a layout not in `RECORD_LAYOUTS` or memories not in `RECORD_MEMORIES`."""
    if layout not in RECORD_LAYOUTS:
        raise ValueError(f"scoring_layout_records: layout must be one of {RECORD_LAYOUTS}, got {layout!r}")
    if memories not in RECORD_MEMORIES:
        raise ValueError(f"scoring_layout_records: memories must be one of {RECORD_MEMORIES}, got {memories!r}")
    if count < 0:
        raise ValueError(f"scoring_layout_records needs count >= 0, got {count}")
    if template.count("{answer}") != 1:
        raise ValueError(f"template must contain '{{answer}}' exactly once, got {template!r}")
    # 1. candidates: (trajectory, round) for every round after the first whose text opens with a <mem>
    candidates = [(t, r) for t in trajectories for r in t.rounds[1:]
                  if r.assistant.lstrip().startswith("<mem>") and _MEM_END in r.assistant]
    if memories == "complete":  # 1b. a value for every question
        candidates = [(t, r) for t, r in candidates if UNKNOWN not in _answers(t, r)[2]]
    rng = random.Random(f"mempo-scoring-records/{seed}")
    chosen = rng.sample(candidates, min(count, len(candidates)))
    records = []
    for trajectory, round_ in chosen:
        first, mem, answers = _answers(trajectory, round_)
        answer = "; ".join(answers)
        before = [dict(m) for m in _LATER_ROUND] if layout == "later_round" else []
        records.append({"messages": first + before + [{"role": "assistant", "context": mem,
                                              "content": template.replace("{answer}", answer)}]})
    return records


def _answers(trajectory: OracleTrajectory, round_) -> tuple[list[dict], str, list[str]]:
    """(the first prompt's messages, round_'s memory verbatim through ``</mem>``, what that memory alone
    answers per question: its value, or ``unknown``)."""
    first = [dict(m) for m in trajectory.rounds[0].messages]  # system + the user question
    user = next(m["content"] for m in first if m["role"] == "user")
    # 2. the memory, verbatim through </mem>; 3. what it alone answers, question by question
    text = round_.assistant.lstrip()
    mem = text[:text.index(_MEM_END) + len(_MEM_END)]
    _, objectives = parse_oracle_memory(parse_round(mem).mem or "", parse_episode_prompt(user))
    return first, mem, [o.answer for o in objectives]
