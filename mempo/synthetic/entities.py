"""The world's entities and their names: kinds and how many of each, unique pronounceable names, and
the filler sentences and word lists documents are written with.

Names are unique in the world even after answer normalisation
(`mempo.protocol.reward.normalize_answer`); rivers are named ``"<Word> River"``. Every draw comes
from the random generator passed in, in a fixed order, so a seed gives the same names.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Sequence

from mempo.protocol.reward import normalize_answer
from mempo.synthetic.grammar import ENTITY_KINDS, RELATIONS

__all__ = ["Entity", "Names", "filler_sentence", "kinds_of", "kind_counts", "make_entities"]


@dataclass(frozen=True)
class Entity:
    """One entity: its index in `World.entities`, kind, name and article document id."""

    index: int
    kind: str
    name: str
    doc_id: str


# ---------------------------------------------------------------------------------------------
# Names and word lists
# ---------------------------------------------------------------------------------------------

_ONSETS = ("b", "c", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "gr",
           "kr", "st", "tr", "sh", "th", "ch", "pl", "fr", "sk", "j", "w")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ai", "ei", "ou", "ia", "au")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "k", "th", "nd", "rt", "n", "sk")
_SHORT_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z")
_SHORT_VOWELS = ("a", "e", "i", "o", "u")
_SHORT_CODAS = ("", "", "n", "r", "l", "m", "k", "t")  # no final "s": the retriever's plural stemmer
# would make "Vavis" the same search term as "Vavi"
_COUNTRY_ENDINGS = ("ia", "land", "ora", "avia", "esh", "mark", "onia", "ar")
_COMPANY_SUFFIXES = ("Works", "Holdings", "Industries", "Trading", "Mills", "Foundry", "Labs", "Group",
                     "Shipping", "Textiles", "Motors", "Instruments", "Press", "Brewery", "Ceramics")
_UNIVERSITY_FORMS = ("University of {w}", "{w} Institute", "{w} College", "{w} Academy",
                     "{w} Polytechnic", "Royal University of {w}")
_BOOK_ADJECTIVES = ("Silent", "Glass", "Hidden", "Northern", "Last", "Burning", "Quiet", "Iron", "Paper",
                    "Broken", "Golden", "Distant", "Winter", "Hollow", "Crimson", "Seventh", "Salt", "Wild")
_BOOK_NOUNS = ("Harbor", "Orchard", "Lantern", "Garden", "Bridge", "Archive", "River", "Tower", "Letter",
               "Crossing", "Mirror", "Season", "Voyage", "Machine", "Chorus", "Atlas", "Kingdom", "Well")
OCCUPATIONS = ("engineer", "painter", "chemist", "merchant", "poet", "architect", "physician", "sailor",
                "botanist", "composer", "judge", "cartographer", "teacher", "printer", "astronomer")
TRAITS = ("patience", "a sharp wit", "careful notes", "long walks", "generosity", "stubbornness",
           "a love of music", "precise drawings", "early rising", "a large library")
PRODUCTS = ("steel tools", "woollen cloth", "glassware", "river barges", "clocks", "paper", "lamps",
             "bicycles", "printing presses", "pottery", "optical lenses", "rope")
EVENTS = ("harvest fair", "trade congress", "music festival", "flood", "election", "boat race",
           "book fair", "winter market", "science exhibition", "railway opening")
THINGS = ("bridges", "markets", "bell towers", "gardens", "bakeries", "canals", "theatres", "libraries")
ADJECTIVES = ("old", "busy", "quiet", "famous", "small", "large", "green", "narrow", "ancient", "modern")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")

# Sentences that never use a fact phrasing: fillers of articles, news and chronicles.
_GENERIC_FILLERS = (
    "Records from the period are incomplete, and several accounts disagree on the details.",
    "Local historians have written about this at length in regional journals.",
    "The subject is discussed in a number of guidebooks and school texts.",
    "Visitors often mention the {adj} streets and the {adj2} squares nearby.",
    "A small museum keeps letters, maps and photographs from that time.",
    "Several of these events were described in newspapers of the day.",
    "In {month} the weather is usually mild, and the roads are busy with travellers.",
    "Trade in {product} grew steadily over the following decades.",
    "Scholars still debate how much of the early history is reliable.",
    "The archives hold {n} boxes of documents that have not yet been catalogued.",
)


class Names:
    """Unique pronounceable names (unique after answer normalisation)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def word(self, min_syllables: int = 2, max_syllables: int = 3) -> str:
        rng = self.rng
        syllables = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS)
                            for _ in range(rng.randint(min_syllables, max_syllables)))
        return (syllables + rng.choice(_CODAS)).capitalize()

    def claim(self, name: str) -> bool:
        key = normalize_answer(name)
        if not key or key in self.used:
            return False
        self.used.add(key)
        return True

    def unique(self, make) -> str:
        for _ in range(1000):
            name = make()
            if self.claim(name):
                return name
        raise RuntimeError("could not generate a unique name")

    def short_word(self) -> str:
        """A one-word name of two simple syllables and an optional final consonant ("Tamor")."""
        rng = self.rng
        word = "".join(rng.choice(_SHORT_ONSETS) + rng.choice(_SHORT_VOWELS) for _ in range(2))
        return (word + rng.choice(_SHORT_CODAS)).capitalize()

    def for_kind(self, kind: str, style: str = "default") -> str:
        rng = self.rng
        if style == "short":  # one word each; rivers keep the " River" the grammar mentions them by
            if kind == "river":
                return self.unique(lambda: f"{self.short_word()} River")
            if kind in ENTITY_KINDS:
                return self.unique(self.short_word)
            raise ValueError(f"unknown entity kind {kind!r}")
        if kind == "person":
            return self.unique(lambda: f"{self.word(2, 2)} {self.word(2, 3)}")
        if kind == "city":
            return self.unique(lambda: self.word(2, 3))
        if kind == "country":
            return self.unique(lambda: self.word(1, 2) + rng.choice(_COUNTRY_ENDINGS))
        if kind == "river":
            return self.unique(lambda: f"{self.word(2, 2)} River")
        if kind == "company":
            return self.unique(lambda: f"{self.word(2, 3)} {rng.choice(_COMPANY_SUFFIXES)}")
        if kind == "university":
            return self.unique(lambda: rng.choice(_UNIVERSITY_FORMS).format(w=self.word(2, 3)))
        if kind == "book":
            def title() -> str:
                if rng.random() < 0.5:
                    return f"The {rng.choice(_BOOK_ADJECTIVES)} {rng.choice(_BOOK_NOUNS)}"
                return f"The {rng.choice(_BOOK_NOUNS)} of {self.word(2, 3)}"
            return self.unique(title)
        raise ValueError(f"unknown entity kind {kind!r}")



def filler_sentence(rng: random.Random) -> str:
    """A sentence that never uses a fact phrasing (articles, news and chronicles hold them)."""
    return rng.choice(_GENERIC_FILLERS).format(
        adj=rng.choice(ADJECTIVES), adj2=rng.choice(ADJECTIVES), month=rng.choice(MONTHS),
        product=rng.choice(PRODUCTS), n=rng.randint(3, 400))


def kinds_of(relations: set[str]) -> tuple[str, ...]:
    """The entity kinds the relations use as subject or value, in `ENTITY_KINDS` order."""
    used = {kind for name in relations for kind in RELATIONS[name].subject_kinds}
    used |= {RELATIONS[name].object_kind for name in relations if not RELATIONS[name].is_literal}
    return tuple(kind for kind in ENTITY_KINDS if kind in used)



def kind_counts(num_entities: int, kinds: Sequence[str] = ENTITY_KINDS) -> dict[str, int]:
    """Entities per kind. With every kind: the original shares; with fewer kinds, the same shares
    for those present and the rest to persons (else cities, else the largest kind)."""
    n = num_entities
    shares = {
        "country": min(60, max(2, n // 150)),
        "river": max(2, n * 4 // 100),
        "university": max(2, n * 5 // 100),
        "company": max(3, n * 14 // 100),
        "book": max(2, n * 10 // 100),
    }
    counts = {kind: shares[kind] for kind in kinds if kind in shares}
    if "city" in kinds:
        counts["city"] = max(counts.get("country", 0) + 1, n * 15 // 100)
    rest = next((kind for kind in ("person", "city") if kind in kinds), None)
    if rest is None:
        rest = max(counts, key=counts.get)
    counts[rest] = n - sum(v for kind, v in counts.items() if kind != rest)
    if counts[rest] < 4:
        raise ValueError(f"num_entities={n} is too small")
    return counts


def make_entities(rng: random.Random, counts: dict[str, int], names: str) -> tuple[list[Entity], dict[str, list[int]]]:
    """The entities, kind by kind in `ENTITY_KINDS` order (``counts[kind]`` of each, named with
    `Names`' `names` style), and the indices of each kind."""
    namer = Names(rng)
    entities: list[Entity] = []
    by_kind: dict[str, list[int]] = {kind: [] for kind in ENTITY_KINDS}
    for kind in ENTITY_KINDS:
        for number in range(counts.get(kind, 0)):
            index = len(entities)
            entities.append(Entity(index, kind, namer.for_kind(kind, names), f"{kind}-{number:06d}"))
            by_kind[kind].append(index)
    return entities, by_kind
