"""The documents of a world, rendered from its facts: entity articles, country chronicles and distractors.

Each document draws from its own generator, ``random.Random(f"mempo-world/{seed}/{kind}/{number}")``
(kind "article", "chronicle" or "distractor"), so any one can be rendered alone, lazily, and gives the
same text. An article states its subject's facts (a chronicle fact by its pointer sentence instead);
a chronicle page is exactly ``page_chars`` characters (the last may be shorter), its facts in the
first 80% of the page's sentences, no sentence across a page border; distractors are news items that
never use a fact phrasing (about a fifth are namesake biographies: a person whose name differs from
a real one by one letter, so their fact-like sentences never match a real subject).
"""
from __future__ import annotations

import random
from typing import Any

from mempo.env.corpus import Document
from mempo.protocol.reward import normalize_answer
from mempo.synthetic.entities import (
    ADJECTIVES, EVENTS, MONTHS, OCCUPATIONS, PRODUCTS, THINGS, TRAITS, Entity, filler_sentence,
)
from mempo.synthetic.grammar import ENTITY_KINDS, RELATIONS, pointer_sentence

__all__ = ["reverse_index", "article", "chronicle", "distractor", "namesake"]


def _rng(world: Any, tag: str, number: int) -> random.Random:
    return random.Random(f"mempo-world/{world.seed}/{tag}/{number}")


def reverse_index(world: Any) -> dict[str, dict[int, list[int]]]:
    """``reverse[relation][value] = [subjects]`` for the relations articles cross-reference."""
    reverse: dict[str, dict[int, list[int]]] = {}
    for name in ("founder", "author", "mayor", "birthplace", "location", "headquarters"):
        table: dict[int, list[int]] = {}
        for subject, value in world.facts[name].items():
            table.setdefault(value, []).append(subject)
        reverse[name] = table
    return reverse


def article(world: Any, entity: Entity, reverse: dict[str, dict[int, list[int]]]) -> Document:
    """The entity's article: an introduction (style "full"), its fact and pointer sentences,
    cross-references (full style) and fillers, shuffled."""
    rng = _rng(world, "article", entity.index)
    name, kind, ents = entity.name, entity.kind, world.entities
    subject = f"The {name}" if kind == "river" else name
    intro = {
        "person": f"{name} was a {rng.choice(OCCUPATIONS)} remembered for {rng.choice(TRAITS)}.",
        "city": f"{name} is known for its {rng.choice(ADJECTIVES)} {rng.choice(THINGS)}.",
        "country": f"{name} is a country with a long written history.",
        "river": f"{subject} is a river crossed by many {rng.choice(ADJECTIVES)} bridges.",
        "company": f"{name} is a firm that makes {rng.choice(PRODUCTS)}.",
        "university": f"{name} is a place of higher learning.",
        "book": f"{name} is a book that is still read in schools.",
    }[kind]
    facts = []
    for relation in RELATIONS.values():
        if kind not in relation.subject_kinds or entity.index not in world.facts[relation.name]:
            continue
        located = world.chronicle_facts.get((relation.name, entity.index))
        if located is None:
            facts.append(world.fact_sentence(relation.name, entity.index))
        else:
            doc_id, page = located
            title = world.chronicle_title(world.chronicle_of(doc_id))
            facts.append(pointer_sentence(relation, name, title, doc_id, page))
    extra = []
    if world.params.get("article_style", "full") == "facts":
        least, most = world.params.get("article_fillers") or (2, 5)
        sentences = facts + [filler_sentence(rng) for _ in range(rng.randint(least, most))]
        rng.shuffle(sentences)
        return Document(entity.doc_id, name, " ".join(sentences))
    if kind == "person":
        founded = reverse["founder"].get(entity.index, [])[:2]
        extra += [f"In later life {name} founded {ents[c].name}." for c in founded]
        extra += [f"{name} wrote {ents[b].name}." for b in reverse["author"].get(entity.index, [])[:2]]
        extra += [f"{name} served as the mayor of {ents[c].name}."
                  for c in reverse["mayor"].get(entity.index, [])[:2]]
    elif kind == "city":
        natives = reverse["birthplace"].get(entity.index, [])[:3]
        if natives:
            extra.append("Notable people from " + name + " include "
                         + ", ".join(ents[p].name for p in natives) + ".")
        campuses = reverse["location"].get(entity.index, [])[:2]
        offices = reverse["headquarters"].get(entity.index, [])[:2]
        extra += [f"{ents[u].name} has its campus in {name}." for u in campuses]
        extra += [f"{ents[c].name} keeps offices in {name}." for c in offices]
    least, most = world.params.get("article_fillers") or (2, 5)
    sentences = facts + extra + [filler_sentence(rng) for _ in range(rng.randint(least, most))]
    rng.shuffle(sentences)
    return Document(entity.doc_id, name, intro + " " + " ".join(sentences))


def chronicle(world: Any, number: int, country: Entity) -> Document:
    """The chronicle of `country` (``chronicle-<number>``): pages of events, each padded to
    ``page_chars``, holding the chronicle facts placed on them."""
    rng = _rng(world, "chronicle", number)
    doc_id = f"chronicle-{number:04d}"
    title = f"The Chronicle of {country.name}"
    local_cities = [c for c, k in world.facts["country"].items() if k == country.index] or [country.index]
    on_page: dict[int, list[str]] = {}
    for (relation, subject), (fact_doc, page) in sorted(world.chronicle_facts.items()):
        if fact_doc == doc_id:
            on_page.setdefault(page, []).append(world.fact_sentence(relation, subject))
    year = 1100 + rng.randint(0, 50)
    pages = []
    for page in range(world.chronicle_pages[country.index]):
        sentences: list[str] = []
        if page == 0:
            sentences.append(f"{title} records the events of {country.name} year by year, as told by "
                             f"its town clerks.")
        length = sum(len(s) + 1 for s in sentences)
        budget = world.page_chars - 600 - sum(len(f) + 1 for f in on_page.get(page, []))
        while length < budget:
            year += rng.randint(0, 2)
            place = world.entities[rng.choice(local_cities)].name
            event = rng.choice((
                f"In {year}, the {rng.choice(EVENTS)} in {place} drew visitors from the whole country.",
                f"In {year}, merchants of {place} traded {rng.choice(PRODUCTS)} at the {rng.choice(EVENTS)}.",
                f"In {rng.choice(MONTHS)} {year}, a {rng.choice(ADJECTIVES)} storm damaged the "
                f"{rng.choice(THINGS)} of {place}.",
                f"In {year}, the clerks of {place} counted {rng.randint(100, 90000)} residents.",
                filler_sentence(rng),
            ))
            sentences.append(event)
            length += len(event) + 1
        # Facts sit in the first 80% of the page's sentences, never at a page border.
        for fact in on_page.get(page, []):
            sentences.insert(rng.randint(1, max(1, int(len(sentences) * 0.8))), fact)
        text = " ".join(sentences)
        while len(text) > world.page_chars - 1:  # drop trailing fillers until the page fits
            sentences.pop()
            text = " ".join(sentences)
        pages.append(text + " " * (world.page_chars - len(text) - 1) + "\n")
    return Document(doc_id, title, "".join(pages).rstrip())


def distractor(world: Any, number: int) -> Document:
    """News item ``news-<number>`` (or, one time in five, a namesake biography)."""
    rng = _rng(world, "distractor", number)
    ents = world.entities
    doc_id = f"news-{number:06d}"
    present = {kind for kind in ENTITY_KINDS if world.kind_indices(kind)}
    if rng.random() < 0.2 and {"person", "city"} <= present:
        return namesake(world, rng, doc_id)
    pick = lambda kind: ents[rng.choice(world.kind_indices(kind))].name  # noqa: E731
    year = rng.randint(1750, 2020)
    templates = tuple(template for kinds, template in (  # those whose kinds this world has (all, by default)
        (("person", "city"), lambda: f"{pick('person')} spoke at the {rng.choice(EVENTS)} in {pick('city')}."),
        (("company", "city"), lambda: f"{pick('company')} opened a new office near {pick('city')}."),
        (("university", "city"),
         lambda: f"Students of {pick('university')} visited {pick('city')} in {rng.choice(MONTHS)}."),
        (("book", "university"), lambda: f"A reading of {pick('book')} filled the hall of {pick('university')}."),
        (("river", "city"),
         lambda: f"Boats on the {pick('river')} carried {rng.choice(PRODUCTS)} to {pick('city')}."),
        (("country", "person"),
         lambda: f"Delegates from {pick('country')} met {pick('person')} to discuss {rng.choice(PRODUCTS)}."),
        (("person", "company"), lambda: f"{pick('person')} praised {pick('company')} for its {rng.choice(PRODUCTS)}."),
        ((), lambda: filler_sentence(rng)),
    ) if set(kinds) <= present)
    sentences = [rng.choice(templates)() for _ in range(rng.randint(4, 9))]
    headline = f"{rng.choice(EVENTS).capitalize()} report, {rng.choice(MONTHS)} {year}"
    return Document(doc_id, headline, " ".join(sentences))


def namesake(world: Any, rng: random.Random, doc_id: str) -> Document:
    """A biography of someone whose name differs from a real person's by one letter."""
    taken = world.normalized_names()
    original = world.entities[rng.choice(world.kind_indices("person"))]
    name = original.name
    for _ in range(20):
        position = rng.randrange(1, len(name))
        if name[position] == " ":
            continue
        letter = rng.choice("aeiounrlst")
        candidate = name[:position] + letter + name[position + 1:]
        if normalize_answer(candidate) not in taken:
            name = candidate
            break
    else:
        name = original.name + "a"
    city = world.entities[rng.choice(world.kind_indices("city"))].name
    sentences = [
        f"{name} was a {rng.choice(OCCUPATIONS)} who is often confused with {original.name}.",
        RELATIONS["birthplace"].fact.format(s=name, o=city),
        RELATIONS["birth_year"].fact.format(s=name, o=rng.randint(1700, 1990)),
        f"{name} was remembered for {rng.choice(TRAITS)}.",
        filler_sentence(rng),
    ]
    return Document(doc_id, name, " ".join(sentences))
