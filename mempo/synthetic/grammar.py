"""The synthetic world's grammar: its relations, how a fact is stated, how a question asks it.

A relation (`RELATIONS`) is functional: each subject has one value, an entity or a year / a number.
A fact is stated by its *fact sentence* (`Relation.fact`, the subject's full name, never a pronoun);
a chronicle fact's article says instead on which chronicle page it is (`pointer_sentence`). A
question applies relations innermost first to a named entity (`question_text`): 2 hops, "In which
city was the founder of Velora Works born?"; `parse_question` inverts it exactly (the oracle reads
questions with it, never the world). Gold answers are the final value's aliases (`gold_aliases`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional, Sequence, Union

__all__ = [
    "ENTITY_KINDS", "LITERAL_KINDS", "NAME_STYLES", "ARTICLE_STYLES", "DEFAULT_PAGE_CHARS", "Relation", "RELATIONS",
    "CHRONICLE_RELATIONS", "QuestionParse", "parse_question", "mention", "question_text", "leaf_name",
    "fact_pattern", "pointer_pattern", "pointer_sentence", "gold_aliases", "check_hops",
]

ENTITY_KINDS = ("person", "city", "country", "river", "company", "university", "book")
NAME_STYLES = ("default", "short")
ARTICLE_STYLES = ("full", "facts")
LITERAL_KINDS = ("year", "number")
DEFAULT_PAGE_CHARS = 25_000
SEARCH_RESULT_CHARS = 5_000  # what the search tool shows of a document (chronicle facts lie beyond)


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



def check_hops(hops: Union[int, Sequence[int]]) -> Union[int, tuple[int, ...]]:
    """``hops`` as an int or a non-empty tuple of ints in 1..4 (ValueError otherwise)."""
    choices = [hops] if isinstance(hops, int) else list(hops)
    if not choices or any(isinstance(h, bool) or not isinstance(h, int) or h < 1 or h > 4 for h in choices):
        raise ValueError(f"hops must be in 1..4, got {hops!r}")
    return hops if isinstance(hops, int) else tuple(choices)

