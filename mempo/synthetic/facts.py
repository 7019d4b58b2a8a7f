"""The facts of a world: which value each subject has, and which facts only a chronicle states.

Draws come from the world's one entity generator (``random.Random(f"mempo-world/{seed}/entities")``,
after the names), in a fixed order: per kind, per subject, per relation. With every relation enabled
the draws are those of the original world; a subset skips the draws of the relations it leaves out.
A chronicle fact is written in the chronicle of its subject's home country (the country of the
company's headquarters, the university's location or the author's birthplace) on a page drawn from
1 to pages - 1, never page 0 (the part a search result shows).
"""
from __future__ import annotations

import math
import random
from typing import Callable, Optional

from mempo.synthetic.entities import Entity
from mempo.synthetic.grammar import CHRONICLE_RELATIONS, RELATIONS

__all__ = ["draw_facts", "place_chronicle_facts"]


def draw_facts(rng: random.Random, by_kind: dict[str, list[int]],
               on: Callable[[str], bool]) -> dict[str, dict[int, int]]:
    """``facts[relation][subject] = value`` (an entity index, or a year / number) for the relations
    `on` accepts, drawn from `rng`; by_kind: the entity indices of each kind."""
    # Facts. With every relation enabled the draws are those of the original world; a subset
    # skips the draws of the relations it leaves out (and of values of kinds it lacks).
    facts: dict[str, dict[int, int]] = {name: {} for name in RELATIONS}
    persons, cities, countries = by_kind["person"], by_kind["city"], by_kind["country"]
    rivers, companies, universities, books = (by_kind["river"], by_kind["company"], by_kind["university"],
                                              by_kind["book"])
    born: dict[int, int] = facts["birth_year"]  # years other dates follow (drawn when not stated)

    def birth_year(person: int) -> int:
        if person not in born:
            born[person] = rng.randint(1700, 1980)
        return born[person]

    for position, city in enumerate(cities):  # every country gets a city first: its capital
        if countries and (on("country") or on("capital")):
            country = countries[position] if position < len(countries) else rng.choice(countries)
            facts["country"][city] = country
            if position < len(countries):
                facts["capital"][country] = city
        if on("river"):
            facts["river"][city] = rng.choice(rivers)
        if on("mayor"):
            facts["mayor"][city] = rng.choice(persons)
    for person in persons:
        if on("birthplace"):
            facts["birthplace"][person] = rng.choice(cities)
        if on("birth_year"):
            facts["birth_year"][person] = rng.randint(1700, 1980)
        if on("alma_mater"):
            facts["alma_mater"][person] = rng.choice(universities)
    for company in companies:
        founder = rng.choice(persons) if persons else None
        if on("founder"):
            facts["founder"][company] = founder
        if on("headquarters"):
            facts["headquarters"][company] = rng.choice(cities)
        if on("established"):
            start = birth_year(founder) if founder is not None else rng.randint(1700, 1980)
            facts["established"][company] = start + rng.randint(20, 55)
    for university in universities:
        if on("location"):
            facts["location"][university] = rng.choice(cities)
        if on("established"):
            facts["established"][university] = rng.randint(1100, 1900)
    for book in books:
        author = rng.choice(persons) if persons else None
        if on("author"):
            facts["author"][book] = author
        if on("published"):
            start = birth_year(author) if author is not None else rng.randint(1700, 1980)
            facts["published"][book] = start + rng.randint(18, 70)
    for river in rivers:
        if on("length"):
            facts["length"][river] = rng.randint(40, 4000)
        if on("source"):
            facts["source"][river] = rng.choice(countries)
    for name in RELATIONS:  # drop the helper years of a world without birth years, and the other tables
        if not on(name):
            facts[name] = {}
    return facts


def place_chronicle_facts(rng: random.Random, entities: list[Entity], facts: dict[str, dict[int, int]],
                          countries: list[int], *, chronicle_fraction: float, chronicles: bool,
                          min_chronicle_pages: int) -> tuple[dict[int, int], dict[tuple[str, int], tuple[str, int]]]:
    """``(chronicle_pages, chronicle_facts)``: pages per country's chronicle (at least
    min_chronicle_pages, one more per 30 facts) and, per chronicle fact ``(relation, subject)``, its
    chronicle id and page. Each "established" / "published" fact is one with probability
    chronicle_fraction (at least one when > 0)."""
    # Chronicle facts: which facts, in which country's chronicle, on which page.
    candidates = [(name, subject) for name in CHRONICLE_RELATIONS for subject in sorted(facts[name])]
    chosen = [c for c in candidates if rng.random() < chronicle_fraction]
    if chronicle_fraction > 0 and not chosen and candidates:
        chosen = [rng.choice(candidates)]
    if chosen and not countries:
        raise ValueError(f"chronicle_fraction={chronicle_fraction} needs countries (each has the chronicle its "
                         f"facts are written in): add a relation with countries or set chronicle_fraction=0")

    def home_country(relation: str, subject: int) -> Optional[int]:
        if entities[subject].kind == "company":
            city = facts["headquarters"].get(subject)
        elif entities[subject].kind == "university":
            city = facts["location"].get(subject)
        else:
            city = facts["birthplace"].get(facts["author"].get(subject, -1))
        return facts["country"].get(city) if city is not None else None

    per_country: dict[int, list[tuple[str, int]]] = {c: [] for c in countries}
    for relation, subject in chosen:
        home = home_country(relation, subject)
        if home is None:  # a reduced world without the chain to a country: any chronicle
            home = countries[subject % len(countries)]
        per_country[home].append((relation, subject))
    chronicle_pages, chronicle_facts = {}, {}
    for number, country in enumerate(countries if chronicles else ()):
        pages = max(min_chronicle_pages, 1 + math.ceil(len(per_country[country]) / 30))
        chronicle_pages[country] = pages
        for relation, subject in per_country[country]:
            chronicle_facts[(relation, subject)] = (f"chronicle-{number:04d}", rng.randint(1, pages - 1))
    return chronicle_pages, chronicle_facts
