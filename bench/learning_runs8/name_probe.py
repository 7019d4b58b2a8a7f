"""Exploratory, during execution 8's gate (not part of its protocol; it changes nothing in it): when an SFT model's
search names another person than its question's, whose name is it? Reads evaluation trajectories of the validation
split and the recipe's world; counts the searches that name a person other than the question's subject, and how many
of those name a held-out subject (validation or test split) against the share of held-out people in the world.

    mempo eval --config M/config.yaml --model M/model_sft --out OUT --name s0k2 --episodes 16 --no-progress \\
        'eval.objectives=[2]' eval.closed_book=false          # M: scratch/ex8/models/<seed's folder>
    PYTHONPATH=. python bench/learning_runs8/name_probe.py M/config.yaml OUT/s0k2_trajectories.jsonl ...
"""
import json
import sys
from pathlib import Path

from mempo.synthetic.grammar import parse_question
from probe_world import probe_world


def subject(question: str):
    """The entity a question of the world's grammar starts from; None for any other text."""
    try:
        return parse_question(question).start
    except ValueError:
        return None


def main(argv):
    _, world, held, people = probe_world(Path(argv[0]))
    named = {e.name for e in world.entities}
    print(f"world: {len(people)} people, {len(held & people)} of them held-out subjects "
          f"({len(held & people) / len(people):.2f})")
    for path in argv[1:]:
        rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
        searches = right = other = other_held = thing = unknown = 0
        for row in rows:
            asked = {subject(q) for q in row["questions"]}
            for turn in row["rounds"]:
                if turn["action"] != "search":
                    continue
                searches += 1
                name = subject(turn["action_argument"] or "")
                if name in asked:
                    right += 1
                elif name in people:
                    other += 1
                    other_held += name in held
                elif name in named:
                    thing += 1
                else:
                    unknown += 1
        print(f"{path}: {len(rows)} episodes, {searches} searches: {right} name a question's subject, {other} another "
              f"person ({other_held} of them held-out subjects), {thing} an entity of another kind, {unknown} no name "
              "of the world")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
