"""Drawing questions from a world: random walks along its facts, read out in the question grammar.

The sampler of seed s draws from ``random.Random(f"mempo-world/{world seed}/questions/{s}")``: per
question, its hops, whether it ends in a chronicle fact (then the walk runs backward from a drawn
chronicle fact), then the walk, which is dropped at a dead end, a repeated entity, an excluded
subject (``exclude_subjects``: held-out entities, `mempo.synthetic.heldout`) or a question already
drawn. A forward walk never uses a chronicle fact.
"""
from __future__ import annotations

import random
from typing import Any, Collection, Optional, Sequence, Union

from mempo.env.data import QARecord
from mempo.synthetic.grammar import RELATIONS, check_hops, gold_aliases, mention, pointer_sentence, question_text

__all__ = ["draw_questions", "inverse_index", "chain_forward", "chain_backward"]


def draw_questions(world: Any, num: int, hops: Union[int, Sequence[int], None] = None, seed: int = 0, *,
                   access_fraction: float = 0.0, id_prefix: Optional[str] = None,
                   exclude_subjects: Collection[str] = (), allow_fewer: bool = False) -> list[QARecord]:
    """`World.questions` (its docstring). exclude_subjects: entity names no hop of a drawn question
    may have as its subject (a walk through one is dropped); allow_fewer: return the questions drawn
    so far when the attempts run out or 20 x as many walks as questions drawn (plus 1,000) in a row
    drew none (a world left with fewer than `num`) instead of raising."""
    hops = check_hops(world.default_hops if hops is None else hops)
    choices = [hops] if isinstance(hops, int) else list(hops)
    if not 0 <= access_fraction <= 1:
        raise ValueError("access_fraction must be in [0, 1]")
    if access_fraction > 0 and not world.chronicle_facts:
        raise ValueError("this world has no chronicle facts (chronicle_fraction=0)")
    prefix = id_prefix or f"w{world.seed}-q{seed}"
    rng = random.Random(f"mempo-world/{world.seed}/questions/{seed}")
    inverse = inverse_index(world)
    chronicle_keys = sorted(world.chronicle_facts)
    records: list[QARecord] = []
    seen: set[str] = set()
    excluded = frozenset(exclude_subjects)
    attempts = last_drawn = 0
    while len(records) < num:
        attempts += 1
        if allow_fewer and attempts - last_drawn > 20 * len(records) + 1000:
            break  # new questions have become rare: keep what was drawn (a pool that may be reused)
        if attempts > 200 * num + 1000:
            if allow_fewer:
                break
            raise ValueError(f"could not draw {num} distinct questions from this world "
                             f"(got {len(records)}); use a larger world or fewer hops")
        target_hops = rng.choice(choices)
        needs_access = access_fraction > 0 and rng.random() < access_fraction
        if needs_access:
            chain = chain_backward(world, rng, rng.choice(chronicle_keys), target_hops, inverse)
        else:
            chain = chain_forward(world, rng, target_hops)
        if chain is None or any(world.entities[subject].name in excluded for _, subject in chain):
            continue
        question = _chain_question(world, chain)
        if question in seen:
            continue
        seen.add(question)
        last_drawn = attempts
        records.append(_record(world, f"{prefix}-{len(records)}", question, chain, needs_access))
    return records


def inverse_index(world: Any) -> dict[str, dict[int, list[int]]]:
    """``inverse[relation][value] = [subjects]`` for every entity-valued relation."""
    inverse: dict[str, dict[int, list[int]]] = {}
    for relation in RELATIONS.values():
        if relation.is_literal:
            continue
        table: dict[int, list[int]] = {}
        for subject, value in world.facts[relation.name].items():
            table.setdefault(value, []).append(subject)
        inverse[relation.name] = table
    return inverse


def chain_forward(world: Any, rng: random.Random, hops: int) -> Optional[list[tuple[str, int]]]:
    """[(relation, subject index)] for a random walk of ``hops`` steps, or None at a dead end."""
    current = rng.randrange(len(world.entities))
    chain: list[tuple[str, int]] = []
    visited = {current}
    for step in range(hops):
        last = step == hops - 1
        options = [r for r in RELATIONS.values()
                   if world.entities[current].kind in r.subject_kinds and current in world.facts[r.name]
                   and (last or not r.is_literal)
                   and (r.name, current) not in world.chronicle_facts]
        if not options:
            return None
        relation = rng.choice(options)
        chain.append((relation.name, current))
        if not relation.is_literal:
            current = world.facts[relation.name][current]
            if current in visited:
                return None
            visited.add(current)
    return chain


def chain_backward(world: Any, rng: random.Random, final: tuple[str, int], hops: int,
                    inverse: dict[str, dict[int, list[int]]]) -> Optional[list[tuple[str, int]]]:
    """[(relation, subject index)] of a walk of ``hops`` steps ending in the fact `final`, drawn
    backward along `inverse`, or None at a dead end."""
    chain = [final]
    current = final[1]
    visited = {current}
    for _ in range(hops - 1):
        options = [(name, subject) for name, table in inverse.items()
                   for subject in table.get(current, ()) if subject not in visited]
        if not options:
            return None
        name, subject = rng.choice(options)
        chain.insert(0, (name, subject))
        visited.add(subject)
        current = subject
    return chain


def _chain_question(world: Any, chain: list[tuple[str, int]]) -> str:
    start_entity = world.entities[chain[0][1]]
    return question_text(mention(start_entity.kind, start_entity.name), [name for name, _ in chain])


def _record(world: Any, record_id: str, question: str, chain: list[tuple[str, int]], needs_access: bool) -> QARecord:
    steps, support = [], []
    for relation_name, subject in chain:
        value = world.value_text(relation_name, subject)
        steps.append({"relation": relation_name, "subject": world.entities[subject].name, "value": value})
        located = world.chronicle_facts.get((relation_name, subject))
        sentence = world.fact_sentence(relation_name, subject)
        if located is None:
            support.append({"doc_id": world.entities[subject].doc_id, "sentence": sentence})
        else:
            doc_id, page = located
            title = world.chronicle_title(world.chronicle_of(doc_id))
            support.append({"doc_id": world.entities[subject].doc_id,
                            "sentence": pointer_sentence(RELATIONS[relation_name], world.entities[subject].name,
                                                         title, doc_id, page)})
            support.append({"doc_id": doc_id, "sentence": sentence, "page": page})
    final_relation, final_subject = chain[-1]
    relation = RELATIONS[final_relation]
    kind = relation.object_kind if relation.is_literal else world.entities[
        world.facts[final_relation][final_subject]].kind
    golds = gold_aliases(kind, world.value_text(final_relation, final_subject))
    metadata = {"hops": len(chain), "chain": steps, "support": support, "needs_access": needs_access,
                "world_seed": world.seed}
    return QARecord(record_id, question, golds, metadata)
