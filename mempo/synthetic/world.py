"""A synthetic world: entities, facts and a corpus with multi-hop questions whose answers are known.

Everything is deterministic from the seed and the size arguments: the same arguments give the same
entities, documents and questions, byte for byte (standard library only; nothing is downloaded).
`World.generate` names the entities (`mempo.synthetic.entities`), draws their facts
(`mempo.synthetic.facts`) and records its parameters; documents (`mempo.synthetic.documents`: one
article per entity, one chronicle per country, then distractors) and questions
(`mempo.synthetic.questions`, in the grammar of `mempo.synthetic.grammar`) are rendered from them on
demand. Sizes: ``num_entities`` articles + one chronicle per country + ``round(distractor_ratio *
num_entities)`` distractors, or exactly ``num_documents`` documents.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Collection, Iterator, Optional, Sequence, Union

from mempo.env.corpus import Document, write_corpus
from mempo.env.data import (
    PROMPT_STYLES, Episode, QARecord, compose_episodes, write_episodes_jsonl, write_qa_jsonl,
)
from mempo.protocol.reward import normalize_answer
from mempo.synthetic.documents import article, chronicle, distractor, reverse_index
from mempo.synthetic.entities import Entity, kind_counts, kinds_of, make_entities
from mempo.synthetic.facts import draw_facts, place_chronicle_facts
from mempo.synthetic.grammar import (
    ARTICLE_STYLES, DEFAULT_PAGE_CHARS, ENTITY_KINDS, NAME_STYLES, RELATIONS, SEARCH_RESULT_CHARS, check_hops,
)
from mempo.synthetic.questions import draw_questions

__all__ = ["Entity", "World", "check_relations", "world_sizes"]


@dataclass
class World:
    """A generated world (build it with `World.generate`: deterministic from the seed and the sizes;
    documents and questions are rendered from it on demand).

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
        article_fillers, relations, question_hops = _checked_options(
            distractor_ratio=distractor_ratio, chronicle_fraction=chronicle_fraction, article_fillers=article_fillers,
            min_chronicle_pages=min_chronicle_pages, page_chars=page_chars, relations=relations, names=names,
            article_style=article_style, chronicles=chronicles, question_hops=question_hops, prompt_style=prompt_style)
        enabled = set(relations if relations is not None else RELATIONS)
        num_entities, counts, num_distractors = _sizes(num_entities, num_documents, distractor_ratio,
                                                       kinds_of(enabled), chronicles)
        rng = random.Random(f"mempo-world/{seed}/entities")  # names, then facts, then chronicle pages
        entities, by_kind = make_entities(rng, counts, names)
        facts = draw_facts(rng, by_kind, enabled.__contains__)
        chronicle_pages, chronicle_facts = place_chronicle_facts(
            rng, entities, facts, by_kind["country"], chronicle_fraction=chronicle_fraction, chronicles=chronicles,
            min_chronicle_pages=min_chronicle_pages)
        params = _params(num_entities=num_entities, num_documents=num_documents, distractor_ratio=distractor_ratio,
                         chronicle_fraction=chronicle_fraction, min_chronicle_pages=min_chronicle_pages,
                         page_chars=page_chars, article_fillers=article_fillers, relations=relations, names=names,
                         article_style=article_style, chronicles=chronicles, question_hops=question_hops,
                         prompt_style=prompt_style)
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

    def chronicle_of(self, doc_id: str) -> int:
        """The country index whose chronicle has id ``doc_id``."""
        return self.kind_indices("country")[int(doc_id.split("-")[1])]

    @property
    def default_hops(self) -> Union[int, tuple[int, ...]]:
        """The hops of questions drawn without ``hops``: the ``question_hops`` option, else 2."""
        hops = self.params.get("question_hops", 2)
        return hops if isinstance(hops, int) else tuple(hops)

    @property
    def num_documents(self) -> int:
        """Articles + chronicles + distractors."""
        return len(self.entities) + len(self.chronicle_pages) + self.num_distractors
    def kind_indices(self, kind: str) -> list[int]:
        """The indices of the entities of one kind, in index order (cached)."""
        key = "kind/" + kind
        if key not in self._cache:
            self._cache[key] = [e.index for e in self.entities if e.kind == kind]
        return self._cache[key]

    def normalized_names(self) -> set[str]:
        """Every entity name after answer normalisation (cached; namesakes avoid them)."""
        if "names" not in self._cache:
            self._cache["names"] = {normalize_answer(e.name) for e in self.entities}
        return self._cache["names"]

    # -- documents ----------------------------------------------------------------------------

    def documents(self) -> Iterator[Document]:
        """All documents, generated lazily in a fixed order (articles, chronicles, distractors;
        `mempo.synthetic.documents`)."""
        reverse = reverse_index(self)
        for entity in self.entities:
            yield article(self, entity, reverse)
        countries = [e for e in self.entities if e.kind == "country" and e.index in self.chronicle_pages]
        for number, country in enumerate(countries):
            yield chronicle(self, number, country)
        for number in range(self.num_distractors):
            yield distractor(self, number)

    # -- questions and episodes ---------------------------------------------------------------

    def questions(self, num: int, hops: Union[int, Sequence[int], None] = None, seed: int = 0, *,
                  access_fraction: float = 0.0, id_prefix: Optional[str] = None,
                  exclude_subjects: Collection[str] = (), allow_fewer: bool = False) -> list[QARecord]:
        """``num`` distinct multi-hop questions with their gold aliases.

        Args:
            num: how many questions.
            hops: hops per question (1 to 4), or a sequence to draw each question's hops from
                (None: the world's ``question_hops``, by default 2).
            seed: the question sampler's seed (independent of the world's seed).
            access_fraction: the share of questions whose last fact is a chronicle fact (needs
                an access); questions not drawn for access never end in a chronicle fact.
            id_prefix: question ids are ``f"{id_prefix}-{i}"`` (default ``"w<world seed>-q<seed>"``).
            exclude_subjects: entity names no hop of a question may have as its subject (held-out
                entities, `mempo.synthetic.heldout`).
            allow_fewer: return fewer than ``num`` questions when the world has no more (else a
                ValueError).

        Each record's metadata holds ``hops``, ``chain`` (per hop: relation, subject, value),
        ``support`` (per hop: the document id and the fact sentence it contains, plus the pointer
        sentence for a chronicle fact), ``needs_access`` and ``world_seed``.
        """
        return draw_questions(self, num, hops, seed, access_fraction=access_fraction, id_prefix=id_prefix,
                              exclude_subjects=exclude_subjects, allow_fewer=allow_fewer)

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
        counts = {kind: len(self.kind_indices(kind)) for kind in ENTITY_KINDS}
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


def _checked_options(*, distractor_ratio: float, chronicle_fraction: float,
                     article_fillers: Optional[tuple[int, int]], min_chronicle_pages: int, page_chars: int,
                     relations: Optional[Sequence[str]], names: str, article_style: str, chronicles: bool,
                     question_hops: Union[int, Sequence[int], None], prompt_style: Optional[str]):
    """`World.generate`'s options checked (ValueError naming the bad one); returns ``(article_fillers,
    relations, question_hops)`` normalised: a pair of ints, a tuple without repeats, an int or a tuple."""
    if distractor_ratio < 0 or not 0 <= chronicle_fraction <= 1:
        raise ValueError("need distractor_ratio >= 0 and 0 <= chronicle_fraction <= 1")
    if article_fillers is not None:
        article_fillers = (int(article_fillers[0]), int(article_fillers[1]))
        if not 0 <= article_fillers[0] <= article_fillers[1]:
            raise ValueError(f"article_fillers must be (least, most) with 0 <= least <= most, got {article_fillers}")
    if min_chronicle_pages < 2 or page_chars < 2 * SEARCH_RESULT_CHARS:
        raise ValueError(f"need min_chronicle_pages >= 2 and page_chars >= {2 * SEARCH_RESULT_CHARS}")
    relations = check_relations(relations)
    if names not in NAME_STYLES:
        raise ValueError(f"names must be one of {NAME_STYLES}, got {names!r}")
    if article_style not in ARTICLE_STYLES:
        raise ValueError(f"article_style must be one of {ARTICLE_STYLES}, got {article_style!r}")
    if not chronicles and chronicle_fraction > 0:
        raise ValueError("chronicles=False needs chronicle_fraction=0 (chronicle facts live in chronicles)")
    if question_hops is not None:
        question_hops = check_hops(question_hops)
    if prompt_style is not None and prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    return article_fillers, relations, question_hops


def check_relations(relations: Optional[Sequence[str]]) -> Optional[tuple[str, ...]]:
    """`relations` as a tuple without repeats (None: all, stays None); ValueError for an empty list
    or a name that is not a `RELATIONS` key."""
    if relations is None:
        return None
    relations = tuple(dict.fromkeys(str(r) for r in relations))
    unknown = [r for r in relations if r not in RELATIONS]
    if unknown or not relations:
        raise ValueError(f"relations must be a non-empty subset of {sorted(RELATIONS)}; "
                         f"unknown: {unknown}" if unknown else "relations must not be empty")
    return relations


def world_sizes(num_entities: Optional[int], num_documents: Optional[int], distractor_ratio: float,
                relations: Optional[Sequence[str]], chronicles: bool) -> tuple[int, dict[str, int], int]:
    """`World.generate`'s sizes for these options (`_sizes` over the entity kinds `relations` uses;
    None: all); ValueError where it would refuse them."""
    return _sizes(num_entities, num_documents, distractor_ratio,
                  kinds_of(set(relations if relations is not None else RELATIONS)), chronicles)


def _sizes(num_entities: Optional[int], num_documents: Optional[int], distractor_ratio: float,
           kinds: tuple[str, ...], chronicles: bool) -> tuple[int, dict[str, int], int]:
    """``(num_entities, entities per kind, distractors)``. With num_documents: about
    ``num_documents / (1 + distractor_ratio)`` entities (at least 20), one chronicle per country and
    distractors for the rest; else ``round(distractor_ratio * num_entities)`` distractors."""
    if num_documents is not None:
        num_entities = max(20, round(num_documents / (1.0 + distractor_ratio)))
    if num_entities is None or num_entities < 20:
        raise ValueError(f"num_entities must be >= 20, got {num_entities}")
    counts = kind_counts(num_entities, kinds)
    num_countries = counts.get("country", 0)
    num_chronicles = num_countries if chronicles else 0
    if num_documents is not None:
        num_distractors = num_documents - num_entities - num_chronicles
        if num_distractors < 0:
            raise ValueError(f"num_documents={num_documents} is too small for {num_entities} entities")
    else:
        num_distractors = round(distractor_ratio * num_entities)
    return num_entities, counts, num_distractors


def _params(*, num_entities: int, num_documents: Optional[int], distractor_ratio: float, chronicle_fraction: float,
            min_chronicle_pages: int, page_chars: int, article_fillers: Optional[tuple[int, int]],
            relations: Optional[tuple[str, ...]], names: str, article_style: str, chronicles: bool,
            question_hops: Union[int, tuple[int, ...], None], prompt_style: Optional[str]) -> dict[str, Any]:
    """The generation parameters ``world.json`` records."""
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
    return params
