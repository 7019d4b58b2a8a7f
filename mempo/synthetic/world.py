"""A synthetic world: entities, facts and a corpus with multi-hop questions whose answers are known.

Conventions
-----------
* Everything is deterministic from the seed (and the size arguments): the same arguments give the
  same entities, documents and questions, byte for byte; another seed gives another world. Nothing
  is downloaded; only the standard library is used (importing this module is light).
* Entities have a kind (`ENTITY_KINDS`: person, city, country, river, company, university, book)
  and a generated pronounceable name, unique in the world even after answer normalisation
  (`mempo.protocol.reward.normalize_answer`). Rivers are named ``"<Word> River"`` and mentioned as
  ``"the <Word> River"``.
* Facts are functional relations (`RELATIONS`): each subject has exactly one value (an entity or
  a year / a number). A fact is stated in the corpus by exactly one *fact sentence*
  (`Relation.fact`, the subject's full name, never a pronoun), in the subject's article, except
  for *chronicle facts*: a fraction of the "established" and "published" years is stated only in a
  long chronicle document, on a page >= 1 (never in the first 5,000 characters a search result
  shows), and the subject's article says where instead (the *pointer sentence*)::

      The establishment year of Velora Works is recorded in the Chronicle of Vorland
      (document chronicle-0001, page 2).

  (one line in the text). Reading such a fact needs ``<access> chronicle-0001 2 </access>``.
  Pages are ``page_chars`` characters (default 25,000, the access tool's page size); a chronicle
  page is exactly that long (the last page may be shorter) and no sentence crosses a page border.
* Documents (`World.documents`, in this order): one article per entity (ids ``person-000012``,
  ``city-000003`` ...; title = the entity's name), one chronicle per country (``chronicle-0001``,
  title ``"The Chronicle of <Country>"``, ``min_chronicle_pages`` pages or more), then distractors
  (``news-000042``): news items mentioning random entities in sentences that never use a fact
  phrasing, and *namesake* biographies of people whose names differ from a real person's by one
  letter (their fact-like sentences name the namesake, so they never match a real subject).
* Questions (`World.questions`) follow the question grammar: a relation's question template
  (`Relation.question`) around a subject that is a name or a nested noun phrase
  (`Relation.noun_phrase`), e.g. 2 hops: "In which city was the founder of Velora Works born?".
  `parse_question` inverts it exactly (used by the oracle agent); gold answers are the final
  value's aliases. Each hop needs one search (a chronicle fact: a search and an access).
* Sizes: ``num_entities`` articles + ``countries`` chronicles + ``round(distractor_ratio *
  num_entities)`` distractors, or pass ``num_documents`` to get exactly that many documents.
* Small worlds (`World.generate` options; each default keeps a world byte-identical to one
  generated without it): ``relations`` (a subset of `RELATIONS`; kinds no chosen relation uses
  are not generated), ``names="short"`` (one-word names that a BPE trained on the corpus keeps
  as one id or two), ``article_style="facts"`` (articles hold their fact sentences and
  ``article_fillers`` fillers only), ``chronicles=False``, and the defaults of the questions
  drawn from the world: ``question_hops`` and ``prompt_style`` (`mempo.env.data.PROMPT_STYLES`).
  E.g. for a few-million-parameter model on CPU::

      World.generate(0, 1000, relations=("birthplace", "birth_year", "alma_mater", "country",
                     "capital", "mayor", "location"), names="short", article_style="facts",
                     article_fillers=(0, 0), chronicles=False, chronicle_fraction=0.0,
                     distractor_ratio=0.0, question_hops=1, prompt_style="compact")
"""
from __future__ import annotations

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

from mempo.env.corpus import Document, write_corpus
from mempo.env.data import (
    PROMPT_STYLES, Episode, QARecord, compose_episodes, write_episodes_jsonl, write_qa_jsonl,
)
from mempo.protocol.reward import normalize_answer

__all__ = [
    "ENTITY_KINDS",
    "LITERAL_KINDS",
    "NAME_STYLES",
    "ARTICLE_STYLES",
    "Relation",
    "RELATIONS",
    "CHRONICLE_RELATIONS",
    "DEFAULT_PAGE_CHARS",
    "Entity",
    "World",
    "QuestionParse",
    "parse_question",
    "mention",
    "question_text",
    "leaf_name",
    "fact_pattern",
    "pointer_pattern",
    "pointer_sentence",
    "gold_aliases",
]

ENTITY_KINDS = ("person", "city", "country", "river", "company", "university", "book")
NAME_STYLES = ("default", "short")
ARTICLE_STYLES = ("full", "facts")
LITERAL_KINDS = ("year", "number")
DEFAULT_PAGE_CHARS = 25_000
_SEARCH_RESULT_CHARS = 5_000  # what the search tool shows of a document (chronicle facts lie beyond)


@dataclass(frozen=True)
class Relation:
    """One functional relation of the world and the phrasings that state and ask it.

    ``fact``/``question``/``noun_phrase`` are templates with ``{s}`` (the subject: its name in
    ``fact``, its mention or a nested noun phrase in the others) and ``{o}`` (the value, in
    ``fact``). ``noun_phrase`` is None for relations whose value is a year or a number (they only
    end a chain). ``label`` names the relation in memories and pointer sentences; ``query`` holds
    the words a searcher adds to the subject's name.
    """

    name: str
    label: str
    subject_kinds: tuple[str, ...]
    object_kind: str
    fact: str
    question: str
    noun_phrase: Optional[str]
    query: str

    @property
    def is_literal(self) -> bool:
        """True when the value is a year or a number rather than an entity."""
        return self.object_kind in LITERAL_KINDS


RELATIONS: dict[str, Relation] = {r.name: r for r in (
    Relation("birthplace", "birthplace", ("person",), "city", "{s} was born in the city of {o}.",
             "In which city was {s} born?", "the birthplace of {s}", "born city"),
    Relation("birth_year", "birth year", ("person",), "year", "{s} was born in the year {o}.",
             "In which year was {s} born?", None, "born year"),
    Relation("alma_mater", "alma mater", ("person",), "university", "{s} studied at {o}.",
             "At which university did {s} study?", "the university where {s} studied", "studied at"),
    Relation("founder", "founder", ("company",), "person", "{s} was founded by {o}.",
             "Who founded {s}?", "the founder of {s}", "founded by"),
    Relation("headquarters", "headquarters", ("company",), "city", "{s} has its headquarters in {o}.",
             "In which city does {s} have its headquarters?", "the city where {s} has its headquarters",
             "headquarters"),
    Relation("established", "establishment year", ("company", "university"), "year",
             "{s} was established in {o}.", "In which year was {s} established?", None, "established"),
    Relation("country", "country", ("city",), "country", "{s} is a city in {o}.",
             "In which country is {s}?", "the country in which {s} lies", "city country"),
    Relation("river", "river", ("city",), "river", "{s} lies on the {o}.",
             "On which river does {s} lie?", "the river on which {s} lies", "lies on river"),
    Relation("mayor", "mayor", ("city",), "person", "The mayor of {s} is {o}.",
             "Who is the mayor of {s}?", "the mayor of {s}", "mayor"),
    Relation("capital", "capital", ("country",), "city", "The capital of {s} is {o}.",
             "What is the capital of {s}?", "the capital of {s}", "capital"),
    Relation("location", "location", ("university",), "city", "{s} is located in the city of {o}.",
             "In which city is {s} located?", "the city where {s} is located", "located city"),
    Relation("author", "author", ("book",), "person", "{s} was written by {o}.",
             "Who wrote {s}?", "the author of {s}", "written by"),
    Relation("published", "publication year", ("book",), "year", "{s} was first published in {o}.",
             "In which year was {s} first published?", None, "first published"),
    Relation("length", "length in kilometres", ("river",), "number", "The {s} is {o} kilometres long.",
             "How long, in kilometres, is {s}?", None, "kilometres long"),
    Relation("source", "source country", ("river",), "country", "The {s} rises in {o}.",
             "In which country does {s} rise?", "the country in which {s} rises", "rises in"),
)}

CHRONICLE_RELATIONS = ("established", "published")

_POINTER = "The {label} of {s} is recorded in {title} (document {doc_id}, page {page})."


# ---------------------------------------------------------------------------------------------
# Grammar helpers shared with the oracle
# ---------------------------------------------------------------------------------------------


def mention(kind: str, name: str) -> str:
    """How a named entity appears inside a question: ``"the Olvas River"`` for rivers, else the name."""
    return f"the {name}" if kind == "river" else name


def question_text(start: str, relations: Sequence[str]) -> str:
    """The grammar question applying ``relations`` (innermost first) to the mention ``start``:
    ``question_text("Tamor", ["birthplace", "country"])`` is "In which country is the birthplace of
    Tamor?" (`parse_question` inverts it)."""
    if not relations:
        raise ValueError("a question needs at least one relation")
    phrase = start
    for name in relations[:-1]:
        if RELATIONS[name].noun_phrase is None:
            raise ValueError(f"relation {name!r} (a year or a number) can only end a question")
        phrase = RELATIONS[name].noun_phrase.format(s=phrase)
    return RELATIONS[relations[-1]].question.format(s=phrase)


def leaf_name(text: str) -> str:
    """The entity name inside a question's innermost mention (drops a lower-case leading ``"the "``)."""
    return text[4:] if text.startswith("the ") and text[4:5].isupper() else text


def _template_regex(template: str, groups: dict[str, str]) -> str:
    parts = re.split(r"(\{s\}|\{o\})", template)
    return "".join(groups[p[1]] if p in ("{s}", "{o}") else re.escape(p) for p in parts)


def _value_regex(relation: Relation) -> str:
    return r"(?P<o>\d+)" if relation.is_literal else r"(?P<o>[^.;\n<>()]+?)"


_FACT_CACHE: dict[tuple[str, str], "re.Pattern[str]"] = {}


def fact_pattern(relation: Relation, subject: str) -> "re.Pattern[str]":
    """Regex finding the fact sentence of ``relation`` about the entity named ``subject``.

    Group ``o`` is the value. The subject must not be preceded by a letter or digit.
    """
    key = (relation.name, subject)
    pattern = _FACT_CACHE.get(key)
    if pattern is None:
        body = _template_regex(relation.fact, {"s": re.escape(subject), "o": _value_regex(relation)})
        pattern = re.compile(r"(?<![\w])" + body)
        if len(_FACT_CACHE) > 100_000:
            _FACT_CACHE.clear()
        _FACT_CACHE[key] = pattern
    return pattern


def pointer_sentence(relation: Relation, subject: str, title: str, doc_id: str, page: int) -> str:
    """The article sentence saying on which chronicle page a chronicle fact is stated."""
    return _POINTER.format(label=relation.label, s=subject, title=title, doc_id=doc_id, page=page)


def pointer_pattern(relation: Relation, subject: str) -> "re.Pattern[str]":
    """Regex finding the pointer sentence of a chronicle fact; groups ``doc_id`` and ``page``."""
    head = re.escape(f"The {relation.label} of {subject} is recorded in ")
    return re.compile(head + r"[^()\n]+? \(document (?P<doc_id>\S+), page (?P<page>\d+)\)\.")


def gold_aliases(kind: str, value: str) -> list[str]:
    """The accepted answers for a value of ``kind`` (the name first)."""
    if kind == "river":
        return [value, value[: -len(" River")]] if value.endswith(" River") else [value]
    if kind == "number":
        return [value, f"{value} km", f"{value} kilometres"]
    return [value]


_QUESTION_RES = [(r, re.compile(_template_regex(r.question, {"s": "(?P<s>.+)"}))) for r in RELATIONS.values()]
_NOUN_PHRASE_RES = [(r, re.compile(_template_regex(r.noun_phrase, {"s": "(?P<s>.+)"})))
                    for r in RELATIONS.values() if r.noun_phrase is not None]


@dataclass(frozen=True)
class QuestionParse:
    """A question read back: the named entity it starts from and the relations applied, innermost first."""

    start: str
    relations: tuple[str, ...]

    @property
    def hops(self) -> int:
        return len(self.relations)


def parse_question(question: str) -> QuestionParse:
    """Invert the question grammar: "Who is the mayor of the birthplace of X?" -> (X, birthplace, mayor).

    Raises ValueError when the text is not a grammar question or parses in more than one way.
    """
    matches = [(r, m) for r, m in ((r, rx.fullmatch(question.strip())) for r, rx in _QUESTION_RES) if m]
    if len(matches) != 1:
        raise ValueError(f"not a question of the world's grammar ({len(matches)} parses): {question!r}")
    relation, match = matches[0]
    chain = [relation.name]
    phrase = match.group("s")
    while True:
        inner = [(r, m) for r, m in ((r, rx.fullmatch(phrase)) for r, rx in _NOUN_PHRASE_RES) if m]
        if not inner:
            break
        if len(inner) > 1:
            raise ValueError(f"ambiguous noun phrase {phrase!r} in {question!r}")
        relation, match = inner[0]
        chain.append(relation.name)
        phrase = match.group("s")
    return QuestionParse(start=leaf_name(phrase), relations=tuple(reversed(chain)))


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
_OCCUPATIONS = ("engineer", "painter", "chemist", "merchant", "poet", "architect", "physician", "sailor",
                "botanist", "composer", "judge", "cartographer", "teacher", "printer", "astronomer")
_TRAITS = ("patience", "a sharp wit", "careful notes", "long walks", "generosity", "stubbornness",
           "a love of music", "precise drawings", "early rising", "a large library")
_PRODUCTS = ("steel tools", "woollen cloth", "glassware", "river barges", "clocks", "paper", "lamps",
             "bicycles", "printing presses", "pottery", "optical lenses", "rope")
_EVENTS = ("harvest fair", "trade congress", "music festival", "flood", "election", "boat race",
           "book fair", "winter market", "science exhibition", "railway opening")
_THINGS = ("bridges", "markets", "bell towers", "gardens", "bakeries", "canals", "theatres", "libraries")
_ADJECTIVES = ("old", "busy", "quiet", "famous", "small", "large", "green", "narrow", "ancient", "modern")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
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


class _Names:
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


# ---------------------------------------------------------------------------------------------
# The world
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Entity:
    """One entity: its index in `World.entities`, kind, name and article document id."""

    index: int
    kind: str
    name: str
    doc_id: str


@dataclass
class World:
    """A generated world (build it with `World.generate`; see the module docstring).

    ``facts[relation][subject_index]`` is the value: an entity index for entity-valued relations,
    an int for years and numbers. ``chronicle_facts[(relation, subject_index)]`` gives the
    chronicle document id and page of each chronicle fact.
    """

    seed: int
    entities: list[Entity]
    facts: dict[str, dict[int, int]]
    chronicle_facts: dict[tuple[str, int], tuple[str, int]]
    chronicle_pages: dict[int, int]  # country index -> number of pages of its chronicle
    num_distractors: int
    page_chars: int = DEFAULT_PAGE_CHARS
    params: dict[str, Any] = field(default_factory=dict)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    # -- construction -----------------------------------------------------------------------

    @classmethod
    def generate(cls, seed: int = 0, num_entities: Optional[int] = 25, *,
                 num_documents: Optional[int] = None, distractor_ratio: float = 1.0,
                 chronicle_fraction: float = 0.15, min_chronicle_pages: int = 3,
                 page_chars: int = DEFAULT_PAGE_CHARS,
                 article_fillers: Optional[tuple[int, int]] = None,
                 relations: Optional[Sequence[str]] = None, names: str = "default",
                 article_style: str = "full", chronicles: bool = True,
                 question_hops: Union[int, Sequence[int], None] = None,
                 prompt_style: Optional[str] = None) -> "World":
        """Generate a world deterministically from ``seed``.

        Args:
            seed: the world's seed.
            num_entities: entities (one article each); at least 20. Ignored when
                ``num_documents`` is given.
            num_documents: when given, the world has exactly this many documents: about
                ``num_documents / (1 + distractor_ratio)`` entities, one chronicle per country
                (when ``chronicles``) and distractors for the rest.
            distractor_ratio: distractor documents per entity.
            chronicle_fraction: the share of "established"/"published" facts stated only in a
                chronicle (at least one when > 0).
            min_chronicle_pages: the fewest pages a chronicle has (>= 2).
            page_chars: the access page size the chronicles are laid out for.
            article_fillers: ``(least, most)`` filler sentences per entity article (None: the
                default ``(2, 5)``; the world is then byte-identical to one generated without the
                option). Fewer fillers make shorter articles (short search results for small
                models, e.g. the CPU demo); facts, questions and other documents are unchanged.

        Options for small worlds (small models on CPU); every default leaves the world
        byte-identical to one generated without the option, manifest included:

            relations: the relation names (`RELATIONS` keys) the world has (None: all). Only
                their facts exist, are stated and are asked; entity kinds that none of them uses
                as subject or value are not generated (their share of ``num_entities`` goes to
                persons, else cities, else the largest kind). E.g. ``("birthplace", "birth_year",
                "country", "capital", "mayor")``: persons, cities and countries only.
            names: ``"default"`` (pronounceable names of one to three words, e.g. "Tusi
                Zumais", "Chaidratrond Polytechnic") or ``"short"``: every name is one word of
                two simple syllables ("Tamor", "Belis"; rivers "Tamor River"), which a byte-level
                BPE trained on the corpus keeps as one or two ids.
            article_style: ``"full"`` (an introduction, the fact sentences, cross-references
                such as "Notable people from X include ..." and fillers) or ``"facts"``: the
                fact (and pointer) sentences and the ``article_fillers`` fillers only.
            chronicles: False: no chronicle documents (needs ``chronicle_fraction=0``).
            question_hops: the default ``hops`` of `questions` and `episodes` (None: 2), e.g. 1
                for one search per question.
            prompt_style: the default ``style`` of `episodes` (None: ``"numbered"``; see
                `mempo.env.data.PROMPT_STYLES`; ``"compact"`` has a short instruction paragraph,
                ``"bare"`` none).
        """
        if distractor_ratio < 0 or not 0 <= chronicle_fraction <= 1:
            raise ValueError("need distractor_ratio >= 0 and 0 <= chronicle_fraction <= 1")
        if article_fillers is not None:
            article_fillers = (int(article_fillers[0]), int(article_fillers[1]))
            if not 0 <= article_fillers[0] <= article_fillers[1]:
                raise ValueError(f"article_fillers must be (least, most) with 0 <= least <= most, got {article_fillers}")
        if min_chronicle_pages < 2 or page_chars < 2 * _SEARCH_RESULT_CHARS:
            raise ValueError(f"need min_chronicle_pages >= 2 and page_chars >= {2 * _SEARCH_RESULT_CHARS}")
        if relations is not None:
            relations = tuple(dict.fromkeys(str(r) for r in relations))
            unknown = [r for r in relations if r not in RELATIONS]
            if unknown or not relations:
                raise ValueError(f"relations must be a non-empty subset of {sorted(RELATIONS)}; "
                                 f"unknown: {unknown}" if unknown else "relations must not be empty")
        if names not in NAME_STYLES:
            raise ValueError(f"names must be one of {NAME_STYLES}, got {names!r}")
        if article_style not in ARTICLE_STYLES:
            raise ValueError(f"article_style must be one of {ARTICLE_STYLES}, got {article_style!r}")
        if not chronicles and chronicle_fraction > 0:
            raise ValueError("chronicles=False needs chronicle_fraction=0 (chronicle facts live in chronicles)")
        if question_hops is not None:
            question_hops = _check_hops(question_hops)
        if prompt_style is not None and prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
        enabled = set(relations if relations is not None else RELATIONS)
        kinds = _kinds_of(enabled)
        if num_documents is not None:
            num_entities = max(20, round(num_documents / (1.0 + distractor_ratio)))
        if num_entities is None or num_entities < 20:
            raise ValueError(f"num_entities must be >= 20, got {num_entities}")
        counts = _kind_counts(num_entities, kinds)
        num_countries = counts.get("country", 0)
        num_chronicles = num_countries if chronicles else 0
        if num_documents is not None:
            num_distractors = num_documents - num_entities - num_chronicles
            if num_distractors < 0:
                raise ValueError(f"num_documents={num_documents} is too small for {num_entities} entities")
        else:
            num_distractors = round(distractor_ratio * num_entities)

        rng = random.Random(f"mempo-world/{seed}/entities")
        namer = _Names(rng)
        entities: list[Entity] = []
        by_kind: dict[str, list[int]] = {kind: [] for kind in ENTITY_KINDS}
        for kind in ENTITY_KINDS:
            for number in range(counts.get(kind, 0)):
                index = len(entities)
                entities.append(Entity(index, kind, namer.for_kind(kind, names), f"{kind}-{number:06d}"))
                by_kind[kind].append(index)

        # Facts. With every relation enabled the draws are those of the original world; a subset
        # skips the draws of the relations it leaves out (and of values of kinds it lacks).
        on = enabled.__contains__
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

        params = {"num_entities": num_entities, "num_documents": num_documents,
                  "distractor_ratio": distractor_ratio, "chronicle_fraction": chronicle_fraction,
                  "min_chronicle_pages": min_chronicle_pages, "page_chars": page_chars}
        # Options enter the parameters only when given: default worlds keep their manifest.
        if article_fillers is not None:
            params["article_fillers"] = list(article_fillers)
        if relations is not None:
            params["relations"] = list(relations)
        if names != "default":
            params["names"] = names
        if article_style != "full":
            params["article_style"] = article_style
        if not chronicles:
            params["chronicles"] = False
        if question_hops is not None:
            params["question_hops"] = question_hops if isinstance(question_hops, int) else list(question_hops)
        if prompt_style is not None:
            params["prompt_style"] = prompt_style
        return cls(seed=seed, entities=entities, facts=facts, chronicle_facts=chronicle_facts,
                   chronicle_pages=chronicle_pages, num_distractors=num_distractors, page_chars=page_chars,
                   params=params)

    # -- lookups ------------------------------------------------------------------------------

    def by_kind(self, kind: str) -> list[Entity]:
        """The entities of one kind, in index order."""
        return [e for e in self.entities if e.kind == kind]

    def value_text(self, relation: str, subject: int) -> str:
        """The value of a fact as it is written (a name, a year or a number)."""
        value = self.facts[relation][subject]
        return str(value) if RELATIONS[relation].is_literal else self.entities[value].name

    def fact_sentence(self, relation: str, subject: int) -> str:
        """The sentence stating a fact (in the subject's article, or in a chronicle)."""
        return RELATIONS[relation].fact.format(s=self.entities[subject].name, o=self.value_text(relation, subject))

    def chronicle_title(self, country: int) -> str:
        """How pointer sentences name a country's chronicle: ``"the Chronicle of <Country>"``."""
        return f"the Chronicle of {self.entities[country].name}"

    def _chronicle_of(self, doc_id: str) -> int:
        """The country index whose chronicle has id ``doc_id``."""
        return self._kind_indices("country")[int(doc_id.split("-")[1])]

    @property
    def default_hops(self) -> Union[int, tuple[int, ...]]:
        """The hops of questions drawn without ``hops``: the ``question_hops`` option, else 2."""
        hops = self.params.get("question_hops", 2)
        return hops if isinstance(hops, int) else tuple(hops)

    @property
    def num_documents(self) -> int:
        """Articles + chronicles + distractors."""
        return len(self.entities) + len(self.chronicle_pages) + self.num_distractors

    # -- documents ----------------------------------------------------------------------------

    def documents(self) -> Iterator[Document]:
        """All documents, generated lazily in a fixed order (articles, chronicles, distractors)."""
        reverse = self._reverse_index()
        for entity in self.entities:
            yield self._article(entity, reverse)
        countries = [e for e in self.entities if e.kind == "country" and e.index in self.chronicle_pages]
        for number, country in enumerate(countries):
            yield self._chronicle(number, country)
        for number in range(self.num_distractors):
            yield self._distractor(number)

    def _rng(self, tag: str, number: int) -> random.Random:
        return random.Random(f"mempo-world/{self.seed}/{tag}/{number}")

    def _reverse_index(self) -> dict[str, dict[int, list[int]]]:
        reverse: dict[str, dict[int, list[int]]] = {}
        for name in ("founder", "author", "mayor", "birthplace", "location", "headquarters"):
            table: dict[int, list[int]] = {}
            for subject, value in self.facts[name].items():
                table.setdefault(value, []).append(subject)
            reverse[name] = table
        return reverse

    def _filler(self, rng: random.Random) -> str:
        return rng.choice(_GENERIC_FILLERS).format(
            adj=rng.choice(_ADJECTIVES), adj2=rng.choice(_ADJECTIVES), month=rng.choice(_MONTHS),
            product=rng.choice(_PRODUCTS), n=rng.randint(3, 400))

    def _article(self, entity: Entity, reverse: dict[str, dict[int, list[int]]]) -> Document:
        rng = self._rng("article", entity.index)
        name, kind, ents = entity.name, entity.kind, self.entities
        subject = f"The {name}" if kind == "river" else name
        intro = {
            "person": f"{name} was a {rng.choice(_OCCUPATIONS)} remembered for {rng.choice(_TRAITS)}.",
            "city": f"{name} is known for its {rng.choice(_ADJECTIVES)} {rng.choice(_THINGS)}.",
            "country": f"{name} is a country with a long written history.",
            "river": f"{subject} is a river crossed by many {rng.choice(_ADJECTIVES)} bridges.",
            "company": f"{name} is a firm that makes {rng.choice(_PRODUCTS)}.",
            "university": f"{name} is a place of higher learning.",
            "book": f"{name} is a book that is still read in schools.",
        }[kind]
        facts = []
        for relation in RELATIONS.values():
            if kind not in relation.subject_kinds or entity.index not in self.facts[relation.name]:
                continue
            located = self.chronicle_facts.get((relation.name, entity.index))
            if located is None:
                facts.append(self.fact_sentence(relation.name, entity.index))
            else:
                doc_id, page = located
                title = self.chronicle_title(self._chronicle_of(doc_id))
                facts.append(pointer_sentence(relation, name, title, doc_id, page))
        extra = []
        if self.params.get("article_style", "full") == "facts":
            least, most = self.params.get("article_fillers") or (2, 5)
            sentences = facts + [self._filler(rng) for _ in range(rng.randint(least, most))]
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
        least, most = self.params.get("article_fillers") or (2, 5)
        sentences = facts + extra + [self._filler(rng) for _ in range(rng.randint(least, most))]
        rng.shuffle(sentences)
        return Document(entity.doc_id, name, intro + " " + " ".join(sentences))

    def _chronicle(self, number: int, country: Entity) -> Document:
        rng = self._rng("chronicle", number)
        doc_id = f"chronicle-{number:04d}"
        title = f"The Chronicle of {country.name}"
        local_cities = [c for c, k in self.facts["country"].items() if k == country.index] or [country.index]
        on_page: dict[int, list[str]] = {}
        for (relation, subject), (fact_doc, page) in sorted(self.chronicle_facts.items()):
            if fact_doc == doc_id:
                on_page.setdefault(page, []).append(self.fact_sentence(relation, subject))
        year = 1100 + rng.randint(0, 50)
        pages = []
        for page in range(self.chronicle_pages[country.index]):
            sentences: list[str] = []
            if page == 0:
                sentences.append(f"{title} records the events of {country.name} year by year, as told by "
                                 f"its town clerks.")
            length = sum(len(s) + 1 for s in sentences)
            budget = self.page_chars - 600 - sum(len(f) + 1 for f in on_page.get(page, []))
            while length < budget:
                year += rng.randint(0, 2)
                place = self.entities[rng.choice(local_cities)].name
                event = rng.choice((
                    f"In {year}, the {rng.choice(_EVENTS)} in {place} drew visitors from the whole country.",
                    f"In {year}, merchants of {place} traded {rng.choice(_PRODUCTS)} at the {rng.choice(_EVENTS)}.",
                    f"In {rng.choice(_MONTHS)} {year}, a {rng.choice(_ADJECTIVES)} storm damaged the "
                    f"{rng.choice(_THINGS)} of {place}.",
                    f"In {year}, the clerks of {place} counted {rng.randint(100, 90000)} residents.",
                    self._filler(rng),
                ))
                sentences.append(event)
                length += len(event) + 1
            # Facts sit in the first 80% of the page's sentences, never at a page border.
            for fact in on_page.get(page, []):
                sentences.insert(rng.randint(1, max(1, int(len(sentences) * 0.8))), fact)
            text = " ".join(sentences)
            while len(text) > self.page_chars - 1:  # drop trailing fillers until the page fits
                sentences.pop()
                text = " ".join(sentences)
            pages.append(text + " " * (self.page_chars - len(text) - 1) + "\n")
        return Document(doc_id, title, "".join(pages).rstrip())

    def _distractor(self, number: int) -> Document:
        rng = self._rng("distractor", number)
        ents = self.entities
        doc_id = f"news-{number:06d}"
        present = {kind for kind in ENTITY_KINDS if self._kind_indices(kind)}
        if rng.random() < 0.2 and {"person", "city"} <= present:
            return self._namesake(rng, doc_id)
        pick = lambda kind: ents[rng.choice(self._kind_indices(kind))].name  # noqa: E731
        year = rng.randint(1750, 2020)
        templates = tuple(template for kinds, template in (  # those whose kinds this world has (all, by default)
            (("person", "city"), lambda: f"{pick('person')} spoke at the {rng.choice(_EVENTS)} in {pick('city')}."),
            (("company", "city"), lambda: f"{pick('company')} opened a new office near {pick('city')}."),
            (("university", "city"),
             lambda: f"Students of {pick('university')} visited {pick('city')} in {rng.choice(_MONTHS)}."),
            (("book", "university"), lambda: f"A reading of {pick('book')} filled the hall of {pick('university')}."),
            (("river", "city"),
             lambda: f"Boats on the {pick('river')} carried {rng.choice(_PRODUCTS)} to {pick('city')}."),
            (("country", "person"),
             lambda: f"Delegates from {pick('country')} met {pick('person')} to discuss {rng.choice(_PRODUCTS)}."),
            (("person", "company"), lambda: f"{pick('person')} praised {pick('company')} for its {rng.choice(_PRODUCTS)}."),
            ((), lambda: self._filler(rng)),
        ) if set(kinds) <= present)
        sentences = [rng.choice(templates)() for _ in range(rng.randint(4, 9))]
        headline = f"{rng.choice(_EVENTS).capitalize()} report, {rng.choice(_MONTHS)} {year}"
        return Document(doc_id, headline, " ".join(sentences))

    def _kind_indices(self, kind: str) -> list[int]:
        key = "kind/" + kind
        if key not in self._cache:
            self._cache[key] = [e.index for e in self.entities if e.kind == kind]
        return self._cache[key]

    def _namesake(self, rng: random.Random, doc_id: str) -> Document:
        """A biography of someone whose name differs from a real person's by one letter."""
        if "names" not in self._cache:
            self._cache["names"] = {normalize_answer(e.name) for e in self.entities}
        taken = self._cache["names"]
        original = self.entities[rng.choice(self._kind_indices("person"))]
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
        city = self.entities[rng.choice(self._kind_indices("city"))].name
        sentences = [
            f"{name} was a {rng.choice(_OCCUPATIONS)} who is often confused with {original.name}.",
            RELATIONS["birthplace"].fact.format(s=name, o=city),
            RELATIONS["birth_year"].fact.format(s=name, o=rng.randint(1700, 1990)),
            f"{name} was remembered for {rng.choice(_TRAITS)}.",
            self._filler(rng),
        ]
        return Document(doc_id, name, " ".join(sentences))

    # -- questions and episodes ---------------------------------------------------------------

    def questions(self, num: int, hops: Union[int, Sequence[int], None] = None, seed: int = 0, *,
                  access_fraction: float = 0.0, id_prefix: Optional[str] = None) -> list[QARecord]:
        """``num`` distinct multi-hop questions with their gold aliases.

        Args:
            num: how many questions.
            hops: hops per question (1 to 4), or a sequence to draw each question's hops from
                (None: the world's ``question_hops``, by default 2).
            seed: the question sampler's seed (independent of the world's seed).
            access_fraction: the share of questions whose last fact is a chronicle fact (needs
                an access); questions not drawn for access never end in a chronicle fact.
            id_prefix: question ids are ``f"{id_prefix}-{i}"`` (default ``"w<world seed>-q<seed>"``).

        Each record's metadata holds ``hops``, ``chain`` (per hop: relation, subject, value),
        ``support`` (per hop: the document id and the fact sentence it contains, plus the pointer
        sentence for a chronicle fact), ``needs_access`` and ``world_seed``.
        """
        hops = _check_hops(self.default_hops if hops is None else hops)
        choices = [hops] if isinstance(hops, int) else list(hops)
        if not 0 <= access_fraction <= 1:
            raise ValueError("access_fraction must be in [0, 1]")
        if access_fraction > 0 and not self.chronicle_facts:
            raise ValueError("this world has no chronicle facts (chronicle_fraction=0)")
        prefix = id_prefix or f"w{self.seed}-q{seed}"
        rng = random.Random(f"mempo-world/{self.seed}/questions/{seed}")
        inverse = self._inverse_index()
        chronicle_keys = sorted(self.chronicle_facts)
        records: list[QARecord] = []
        seen: set[str] = set()
        attempts = 0
        while len(records) < num:
            attempts += 1
            if attempts > 200 * num + 1000:
                raise ValueError(f"could not draw {num} distinct questions from this world "
                                 f"(got {len(records)}); use a larger world or fewer hops")
            target_hops = rng.choice(choices)
            needs_access = access_fraction > 0 and rng.random() < access_fraction
            if needs_access:
                chain = self._chain_backward(rng, rng.choice(chronicle_keys), target_hops, inverse)
            else:
                chain = self._chain_forward(rng, target_hops)
            if chain is None:
                continue
            question = self._question_text(chain)
            if question in seen:
                continue
            seen.add(question)
            records.append(self._record(f"{prefix}-{len(records)}", question, chain, needs_access))
        return records

    def _inverse_index(self) -> dict[str, dict[int, list[int]]]:
        inverse: dict[str, dict[int, list[int]]] = {}
        for relation in RELATIONS.values():
            if relation.is_literal:
                continue
            table: dict[int, list[int]] = {}
            for subject, value in self.facts[relation.name].items():
                table.setdefault(value, []).append(subject)
            inverse[relation.name] = table
        return inverse

    def _chain_forward(self, rng: random.Random, hops: int) -> Optional[list[tuple[str, int]]]:
        """[(relation, subject index)] for a random walk of ``hops`` steps, or None at a dead end."""
        current = rng.randrange(len(self.entities))
        chain: list[tuple[str, int]] = []
        visited = {current}
        for step in range(hops):
            last = step == hops - 1
            options = [r for r in RELATIONS.values()
                       if self.entities[current].kind in r.subject_kinds and current in self.facts[r.name]
                       and (last or not r.is_literal)
                       and (r.name, current) not in self.chronicle_facts]
            if not options:
                return None
            relation = rng.choice(options)
            chain.append((relation.name, current))
            if not relation.is_literal:
                current = self.facts[relation.name][current]
                if current in visited:
                    return None
                visited.add(current)
        return chain

    def _chain_backward(self, rng: random.Random, final: tuple[str, int], hops: int,
                        inverse: dict[str, dict[int, list[int]]]) -> Optional[list[tuple[str, int]]]:
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

    def _question_text(self, chain: list[tuple[str, int]]) -> str:
        start_entity = self.entities[chain[0][1]]
        return question_text(mention(start_entity.kind, start_entity.name), [name for name, _ in chain])

    def _record(self, record_id: str, question: str, chain: list[tuple[str, int]], needs_access: bool) -> QARecord:
        steps, support = [], []
        for relation_name, subject in chain:
            value = self.value_text(relation_name, subject)
            steps.append({"relation": relation_name, "subject": self.entities[subject].name, "value": value})
            located = self.chronicle_facts.get((relation_name, subject))
            sentence = self.fact_sentence(relation_name, subject)
            if located is None:
                support.append({"doc_id": self.entities[subject].doc_id, "sentence": sentence})
            else:
                doc_id, page = located
                title = self.chronicle_title(self._chronicle_of(doc_id))
                support.append({"doc_id": self.entities[subject].doc_id,
                                "sentence": pointer_sentence(RELATIONS[relation_name], self.entities[subject].name,
                                                             title, doc_id, page)})
                support.append({"doc_id": doc_id, "sentence": sentence, "page": page})
        final_relation, final_subject = chain[-1]
        relation = RELATIONS[final_relation]
        kind = relation.object_kind if relation.is_literal else self.entities[
            self.facts[final_relation][final_subject]].kind
        golds = gold_aliases(kind, self.value_text(final_relation, final_subject))
        metadata = {"hops": len(chain), "chain": steps, "support": support, "needs_access": needs_access,
                    "world_seed": self.seed}
        return QARecord(record_id, question, golds, metadata)

    def episodes(self, num_objectives: int, num_episodes: int, seed: int = 0, *,
                 hops: Union[int, Sequence[int], None] = None, access_fraction: float = 0.0,
                 style: Optional[str] = None) -> list[Episode]:
        """``num_episodes`` episodes of ``num_objectives`` distinct questions each.

        The questions are ``self.questions(num_objectives * num_episodes, hops, seed,
        access_fraction=...)``, composed with `mempo.env.data.compose_episodes` (same seed,
        ``reuse_questions=False``: no question appears twice). ``hops`` None: the world's
        ``question_hops`` (default 2); ``style`` None: the world's ``prompt_style`` (default
        ``"numbered"``).
        """
        style = style if style is not None else self.params.get("prompt_style", "numbered")
        pool = self.questions(num_objectives * num_episodes, hops, seed, access_fraction=access_fraction,
                              id_prefix=f"w{self.seed}-k{num_objectives}-q{seed}")
        return compose_episodes(pool, num_objectives, num_episodes, seed, reuse_questions=False, style=style,
                                id_prefix=f"w{self.seed}")

    # -- files ------------------------------------------------------------------------------

    def manifest(self) -> dict[str, Any]:
        """Seed, generation parameters and counts (what ``world.json`` holds)."""
        counts = {kind: len(self._kind_indices(kind)) for kind in ENTITY_KINDS}
        return {"format": "mempo-world/1", "seed": self.seed, "params": dict(self.params),
                "entities": counts, "chronicles": len(self.chronicle_pages),
                "chronicle_facts": len(self.chronicle_facts), "distractors": self.num_distractors,
                "num_documents": self.num_documents, "page_chars": self.page_chars}

    def write(self, directory: Union[str, Path], *, questions: Optional[Sequence[QARecord]] = None,
              episodes: Optional[Sequence[Episode]] = None) -> dict[str, Path]:
        """Write ``corpus.jsonl`` (streamed, atomic), ``world.json`` and, when given,
        ``questions.jsonl`` / ``episodes.jsonl`` into ``directory``; returns their paths by name."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = {"corpus": directory / "corpus.jsonl", "manifest": directory / "world.json"}
        write_corpus(paths["corpus"], self.documents())
        paths["manifest"].write_text(json.dumps(self.manifest(), indent=2) + "\n", encoding="utf-8")
        if questions is not None:
            paths["questions"] = directory / "questions.jsonl"
            write_qa_jsonl(paths["questions"], questions)
        if episodes is not None:
            paths["episodes"] = directory / "episodes.jsonl"
            write_episodes_jsonl(paths["episodes"], episodes)
        return paths


def _kinds_of(relations: set[str]) -> tuple[str, ...]:
    """The entity kinds the relations use as subject or value, in `ENTITY_KINDS` order."""
    used = {kind for name in relations for kind in RELATIONS[name].subject_kinds}
    used |= {RELATIONS[name].object_kind for name in relations if not RELATIONS[name].is_literal}
    return tuple(kind for kind in ENTITY_KINDS if kind in used)


def _check_hops(hops: Union[int, Sequence[int]]) -> Union[int, tuple[int, ...]]:
    """``hops`` as an int or a non-empty tuple of ints in 1..4 (ValueError otherwise)."""
    choices = [hops] if isinstance(hops, int) else list(hops)
    if not choices or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 or h > 4 for h in choices):
        raise ValueError(f"hops must be in 1..4, got {hops!r}")
    return hops if isinstance(hops, int) else tuple(choices)


def _kind_counts(num_entities: int, kinds: Sequence[str] = ENTITY_KINDS) -> dict[str, int]:
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
