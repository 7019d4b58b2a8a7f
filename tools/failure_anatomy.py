"""Where the search world's agent loses each objective: the first stage that failed, from an evaluation's
episode records (`mempo eval` / the demo's ``<name>_trajectories.jsonl``, `mempo.eval.EpisodeRecord`).

    python tools/failure_anatomy.py demo_out/sft_trajectories.jsonl demo_out/rl_trajectories.jsonl
    python tools/failure_anatomy.py --json anatomy.json --k 4 a.jsonl b.jsonl

Per objective of each episode (one question of the world's grammar, `mempo.synthetic.grammar`), in this
order, the first that holds (`STAGES`):

1. ``right``: its answer is right (`mempo.protocol.reward.em_check`);
2. ``no_answer``: the episode ended without an answer (turn limit, malformed round);
3. ``not_searched``: no search named its subject (`query_parse`: a grammar question or a ``words`` query
   names its subject; any other query when the name is one of its words);
4. ``other_relation``: every search of its subject asked another relation (one `query_parse` reads);
5. ``not_retrieved``: no search result held its gold (`mempo.protocol.reward.retrieved_objectives`);
6. then what the last ``<mem>`` holds for it (`mempo.synthetic.oracle_memory.memory_line_kinds`):
   ``mem_dropped`` (a lost line, ``Q1: Bedur done``), ``mem_pending`` (``?`` or no line), ``mem_other``
   (another text: another entity's fact, another value), or ``mem_gold`` (the memory held the gold and
   the answer was still wrong).

Prints one row per file: the number of objectives, the share in each stage and, apart from the stages,
``no_answer_looped``: the share of objectives in episodes without an answer whose last round repeats the round
before it word for word (`looped`, `mempo.records.trajectory.ended_in_loop`: stuck under greedy decoding in the
memory context); ``--json`` writes them.
``--pairs``: the files are (before, after) pairs of evaluations of the same episodes (an SFT model and the RL
model trained from it); for each pair also the objectives right in both, lost by the second (by the stage
they fell to) and gained by it (by the stage they came from). Used in docs/experiments/D22-demo-failure-anatomy.md.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Iterable, Optional, Sequence

from mempo.eval.records import EpisodeRecord
from mempo.protocol.grammar import last_mem
from mempo.protocol.reward import em_check, retrieved_objectives
from mempo.records.trajectory import ended_in_loop
from mempo.synthetic.grammar import RELATIONS, QuestionParse, parse_question
from mempo.synthetic.oracle_memory import memory_line_kinds

STAGES = ("right", "no_answer", "not_searched", "other_relation", "not_retrieved",
          "mem_dropped", "mem_pending", "mem_other", "mem_gold")
#: the columns after the stages: a part of ``no_answer`` (`looped`)
EXTRA_COLUMNS = ("no_answer_looped",)


def query_parse(query: str) -> Optional[QuestionParse]:
    """What a search asked: a grammar question (the ``question`` query style) or ``<subject> <relation
    words>`` (``words``, `Relation.query`), read as a one-hop question; None for any other text."""
    try:
        return parse_question(query)
    except ValueError:
        pass
    for relation in RELATIONS.values():
        subject = query.strip().removesuffix(" " + relation.query)
        if subject != query.strip() and subject:
            return QuestionParse(start=subject, relations=(relation.name,))
    return None


def objective_stages(record: EpisodeRecord) -> list[str]:
    """The `STAGES` entry of each objective of `record`, in question order. ValueError when a question
    is not one of the world's grammar (the anatomy is the search world's)."""
    searches = [r.action_argument or "" for r in record.rounds if r.action == "search"]
    parsed = [query_parse(q) for q in searches]
    retrieved = set(retrieved_objectives(" ".join(r.tool_result or "" for r in record.rounds), record.golds))
    mem_kinds = memory_line_kinds(last_mem(r.assistant for r in record.rounds), record.golds)
    predictions = list(record.predictions or []) + [None] * len(record.golds)
    answered = record.finish_reason == "answer"
    stages = []
    for index, (question, golds, prediction, mem_kind) in enumerate(zip(record.questions, record.golds, predictions,
                                                                         mem_kinds)):
        asked = parse_question(question)
        # 1. the subject's searches: a query read by query_parse names its subject; any other names it as a word
        about = [p for q, p in zip(searches, parsed)
                 if (p.start == asked.start if p else re.search(rf"\b{re.escape(asked.start)}\b", q))]
        if answered and em_check(prediction, golds):
            stages.append("right")
        elif not answered:
            stages.append("no_answer")
        elif not about:
            stages.append("not_searched")
        # 2. a query query_parse cannot read counts as asking the right relation
        elif all(p is not None and p.relations != asked.relations for p in about):
            stages.append("other_relation")
        elif index not in retrieved:
            stages.append("not_retrieved")
        else:
            stages.append(f"mem_{mem_kind}")
    return stages


def looped(record: EpisodeRecord) -> bool:
    """Whether `record` ended without an answer on a round whose text repeats the round before it
    (`mempo.records.trajectory.ended_in_loop`, the rule of `Trajectory.looped`)."""
    return ended_in_loop(record.finish_reason, [r.assistant for r in record.rounds[-2:]])


def anatomy(records: Iterable[EpisodeRecord], k: Optional[int] = None) -> dict[str, float]:
    """``{"objectives": n, <stage>: share, ..., "no_answer_looped": share}`` over the objectives of `records`
    (those with ``k`` objectives only, when given); every stage of `STAGES` is present. ValueError for no
    objectives."""
    counts: Counter[str] = Counter()
    for record in records:
        if k is None or record.objectives == k:
            counts.update(objective_stages(record))
            counts["no_answer_looped"] += record.objectives if looped(record) else 0
    total = sum(counts[stage] for stage in STAGES)
    if not total:
        raise ValueError(f"no objectives to classify{'' if k is None else f' at k = {k}'}")
    return {"objectives": total, **{column: round(counts[column] / total, 4) for column in STAGES + EXTRA_COLUMNS}}


def transitions(before: Sequence[EpisodeRecord], after: Sequence[EpisodeRecord]) -> Counter[tuple[str, str]]:
    """``{(stage before, stage after): objectives}`` over the episodes both evaluations played (matched by
    ``episode_id``). ValueError when they share no episode."""
    later = {r.episode_id: r for r in after}
    pairs: Counter[tuple[str, str]] = Counter()
    for record in before:
        if record.episode_id in later:
            pairs.update(zip(objective_stages(record), objective_stages(later[record.episode_id])))
    if not pairs:
        raise ValueError("the two evaluations share no episode")
    return pairs


def transition_line(pairs: Counter[tuple[str, str]]) -> str:
    """Right in both; lost (right -> stage); gained (stage -> right); the largest three of each."""
    def largest(counts: Counter[str]) -> str:
        return f"{sum(counts.values())} ({', '.join(f'{stage} {n}' for stage, n in counts.most_common(3))})"

    lost = Counter({b: n for (a, b), n in pairs.items() if a == "right" and b != "right"})
    gained = Counter({a: n for (a, b), n in pairs.items() if b == "right" and a != "right"})
    return f"right in both {pairs[('right', 'right')]}; lost {largest(lost)}; gained {largest(gained)}"


def read_records(path: Path) -> list[EpisodeRecord]:
    """The episode records of a trajectories file, one JSON object per line."""
    return [EpisodeRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="evaluation trajectories files (.jsonl)")
    parser.add_argument("--k", type=int, default=None, help="only the episodes with this many objectives")
    parser.add_argument("--json", type=Path, default=None, help="write {file: row} here")
    parser.add_argument("--pairs", action="store_true", help="the files are (before, after) pairs: say what changed")
    args = parser.parse_args(argv)
    if args.pairs and len(args.files) % 2:
        parser.error(f"--pairs needs an even number of files, got {len(args.files)}")
    rows, records = {}, {}
    for path in args.files:
        if not path.is_file():
            parser.error(f"no such trajectories file: {path}")
        records[path] = [r for r in read_records(path) if args.k is None or r.objectives == args.k]
        rows[str(path)] = anatomy(records[path], args.k)
    columns = STAGES + EXTRA_COLUMNS
    print("| file | objectives | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    for name, row in rows.items():
        print(f"| {name} | {row['objectives']} | " + " | ".join(f"{row[c]:.3f}" for c in columns) + " |")
    for before, after in zip(args.files[::2], args.files[1::2]) if args.pairs else ():
        print(f"{before} -> {after}: {transition_line(transitions(records[before], records[after]))}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
