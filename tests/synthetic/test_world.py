"""The synthetic world: determinism, sizes, chronicle layout, question grammar and gold support.

Worlds here are tiny (25-60 entities, about 50-120 documents) except one 20,000-document size check.
"""
import os
import subprocess
import sys

import pytest

from mempo.env.corpus import load_corpus
from mempo.env.data import load_episodes_jsonl, load_qa_jsonl, parse_episode_prompt
from mempo.synthetic.grammar import RELATIONS, fact_pattern, gold_aliases, parse_question, pointer_pattern
from mempo.synthetic.world import World
from mempo.protocol.reward import compute_score, normalize_answer


@pytest.fixture(scope="module")
def world():
    return World.generate(seed=0, num_entities=40, chronicle_fraction=0.5)


@pytest.fixture(scope="module")
def documents(world):
    return {doc.id: doc for doc in world.documents()}


def as_tuples(docs):
    return [(d.id, d.title, d.text) for d in docs]


def test_same_seed_gives_identical_world_and_questions():
    a, b = World.generate(seed=7, num_entities=30), World.generate(seed=7, num_entities=30)
    assert as_tuples(a.documents()) == as_tuples(b.documents())
    assert a.manifest() == b.manifest()
    assert [q.to_json() for q in a.questions(20, hops=(1, 2, 3), seed=3)] == \
        [q.to_json() for q in b.questions(20, hops=(1, 2, 3), seed=3)]
    # documents() can be iterated again with the same result
    assert as_tuples(a.documents()) == as_tuples(a.documents())


def test_world_does_not_depend_on_the_hash_seed():
    code = ("import hashlib, json; from mempo.synthetic.world import World; "
            "w = World.generate(3, 40, chronicle_fraction=0.3); h = hashlib.sha256(); "
            "[h.update(json.dumps(d.to_json()).encode()) for d in w.documents()]; "
            "[h.update(json.dumps(e.to_json()).encode()) for e in w.episodes(3, 4, seed=2, hops=(1, 2, 3), "
            "access_fraction=0.3)]; print(h.hexdigest())")
    digests = {subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(digests) == 1


def test_different_seed_gives_different_world_and_questions():
    a, b = World.generate(seed=1, num_entities=30), World.generate(seed=2, num_entities=30)
    assert [d.text for d in a.documents()] != [d.text for d in b.documents()]
    assert {e.name for e in a.entities} != {e.name for e in b.entities}
    assert [q.question for q in a.questions(10, seed=0)] != [q.question for q in a.questions(10, seed=1)]


def test_sizes_and_ids(world, documents):
    tiny = World.generate(seed=0, num_entities=25)
    docs = list(tiny.documents())
    assert 45 <= len(docs) <= 60 and len(docs) == tiny.num_documents
    assert len({d.id for d in docs}) == len(docs)
    assert all(d.id and not any(ch.isspace() for ch in d.id) for d in docs)
    exact = World.generate(seed=0, num_documents=333)
    assert sum(1 for _ in exact.documents()) == 333 == exact.num_documents
    kinds = {e.kind for e in world.entities}
    assert kinds == {"person", "city", "country", "river", "company", "university", "book"}
    names = [normalize_answer(e.name) for e in world.entities]
    assert len(set(names)) == len(names)  # unique even after answer normalisation


def test_bad_arguments():
    with pytest.raises(ValueError):
        World.generate(seed=0, num_entities=5)
    with pytest.raises(ValueError):
        World.generate(seed=0, num_documents=10)
    tiny = World.generate(seed=0, num_entities=25, chronicle_fraction=0.0)
    assert not tiny.chronicle_facts
    with pytest.raises(ValueError, match="chronicle"):
        tiny.questions(2, access_fraction=0.5)
    with pytest.raises(ValueError, match="hops"):
        tiny.questions(2, hops=0)


def test_chronicles_are_long_and_their_facts_need_a_later_page(world, documents):
    page_chars = world.page_chars
    chronicles = [d for d in documents.values() if d.id.startswith("chronicle-")]
    assert chronicles and all(len(d.text) > 2 * page_chars for d in chronicles)
    assert world.chronicle_facts
    for (relation, subject), (doc_id, page) in world.chronicle_facts.items():
        sentence = world.fact_sentence(relation, subject)
        text = documents[doc_id].text
        assert sentence in text[page * page_chars:(page + 1) * page_chars]
        assert text.index(sentence) >= 5_000  # beyond what a search result shows
        article = documents[world.entities[subject].doc_id].text
        assert sentence not in article
        pointer = pointer_pattern(RELATIONS[relation], world.entities[subject].name).search(article)
        assert pointer and (pointer.group("doc_id"), int(pointer.group("page"))) == (doc_id, page)


def test_question_grammar_round_trips(world):
    for record in world.questions(60, hops=(1, 2, 3, 4), seed=5, access_fraction=0.2):
        parsed = parse_question(record.question)
        chain = record.metadata["chain"]
        assert parsed.relations == tuple(step["relation"] for step in chain)
        assert parsed.start == chain[0]["subject"]
        assert parsed.hops == record.metadata["hops"] == len(chain)
    with pytest.raises(ValueError):
        parse_question("What is the meaning of life?")


def test_gold_answers_are_supported_by_the_corpus(world, documents):
    records = world.questions(60, hops=(1, 2, 3), seed=11, access_fraction=0.3)
    assert any(r.metadata["needs_access"] for r in records)
    all_text = [d.text for d in documents.values()]
    for record in records:
        chain = record.metadata["chain"]
        for support in record.metadata["support"]:
            assert support["sentence"] in documents[support["doc_id"]].text
        assert record.golden_answers[0] == chain[-1]["value"]
        for step in chain:  # every statement of the fact in the corpus gives the same value
            pattern = fact_pattern(RELATIONS[step["relation"]], step["subject"])
            values = {m.group("o") for text in all_text for m in pattern.finditer(text)}
            assert values == {step["value"]}, (record.question, step, values)
        for step, nxt in zip(chain, chain[1:]):
            assert nxt["subject"] == step["value"]


def test_gold_aliases():
    assert gold_aliases("river", "Olvas River") == ["Olvas River", "Olvas"]
    assert gold_aliases("number", "812")[:2] == ["812", "812 km"]
    assert gold_aliases("person", "Anika Dorsel") == ["Anika Dorsel"]


@pytest.mark.parametrize("k", range(1, 11))
def test_episodes_with_k_objectives(world, k):
    episodes = world.episodes(k, 2, seed=k)
    assert len(episodes) == 2
    for episode in episodes:
        assert episode.num_objectives == k == len(episode.golds) == len(set(episode.questions))
        assert parse_episode_prompt(episode.prompt) == episode.questions
        response = ("<mem>m</mem><think>t</think><answer>"
                    + "; ".join(golds[0] for golds in episode.golds) + "</answer>")
        assert compute_score(response, episode.golds)["score"] == 1.0
    assert [e.to_json() for e in episodes] == [e.to_json() for e in world.episodes(k, 2, seed=k)]


def test_write(tmp_path, world):
    questions = world.questions(5, seed=0)
    episodes = world.episodes(3, 2, seed=0)
    paths = world.write(tmp_path / "w", questions=questions, episodes=episodes)
    assert as_tuples(load_corpus(paths["corpus"])) == as_tuples(world.documents())
    assert [q.to_json() for q in load_qa_jsonl(paths["questions"])] == [q.to_json() for q in questions]
    assert [e.to_json() for e in load_episodes_jsonl(paths["episodes"])] == [e.to_json() for e in episodes]
    assert '"num_documents"' in paths["manifest"].read_text()


def test_twenty_thousand_documents_generate():
    big = World.generate(seed=1, num_documents=20_000)
    assert sum(1 for _ in big.documents()) == 20_000


def test_import_is_light():
    code = ("import sys, mempo.synthetic.world, mempo.env.data; "
            "heavy = [m for m in ('torch', 'numpy', 'bm25s', 'fastapi', 'transformers', 'pyarrow') "
            "if m in sys.modules]; "
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_article_fillers_option():
    default = World.generate(seed=5, num_entities=30)
    explicit = World.generate(seed=5, num_entities=30, article_fillers=(2, 5))
    assert as_tuples(default.documents()) == as_tuples(explicit.documents())  # the default is (2, 5)
    assert "article_fillers" not in default.manifest()["params"]  # default manifests are unchanged
    short = World.generate(seed=5, num_entities=30, article_fillers=(0, 0))
    assert short.manifest()["params"]["article_fillers"] == [0, 0]
    long_docs, short_docs = ({d.id: d for d in w.documents()} for w in (default, short))
    assert long_docs.keys() == short_docs.keys()
    for doc_id, doc in short_docs.items():
        if doc_id.split("-")[0] in ("chronicle", "news"):
            assert doc == long_docs[doc_id]  # only the entity articles change
        else:
            assert len(doc.text) < len(long_docs[doc_id].text)
    for q in short.questions(10, hops=(1, 2), seed=1):  # every fact is still stated once
        for hop in q.metadata["support"]:
            assert hop["sentence"] in short_docs[hop["doc_id"]].text
    with pytest.raises(ValueError):
        World.generate(seed=5, num_entities=30, article_fillers=(3, 1))


# ---------------------------------------------------------------------------------------------
# Options for small worlds (relations, names, article_style, chronicles, question_hops, prompt_style)
# ---------------------------------------------------------------------------------------------

SMALL_RELATIONS = ("birthplace", "birth_year", "country", "capital", "mayor")


def small_world(**options):
    params = dict(relations=SMALL_RELATIONS, names="short", article_style="facts", article_fillers=(0, 0),
                  chronicles=False, chronicle_fraction=0.0, distractor_ratio=0.0, question_hops=1,
                  prompt_style="compact")
    params.update(options)
    return World.generate(seed=3, num_entities=120, **params)


def world_digest(w):
    import hashlib
    import json

    h = hashlib.sha256()
    for d in w.documents():
        h.update(json.dumps(d.to_json(), sort_keys=True).encode())
    h.update(json.dumps(w.manifest(), sort_keys=True).encode())
    for q in w.questions(12, hops=(1, 2, 3), seed=1, access_fraction=0.3):
        h.update(json.dumps(q.to_json(), sort_keys=True).encode())
    for e in w.episodes(2, 4, seed=2):
        h.update(json.dumps(e.to_json(), sort_keys=True).encode())
    return h.hexdigest()


def test_default_world_is_unchanged_by_the_options():
    # The digest of this world as generated before the options existed (documents, manifest,
    # questions, episodes): the defaults must keep every existing world byte for byte.
    default = World.generate(5, 30, chronicle_fraction=0.3)
    assert world_digest(default) == "4c7b156f430a5dcdded1f78aa56a739e2d0d0f40f9d71cbd411471a936f7190d"
    explicit = World.generate(5, 30, chronicle_fraction=0.3, relations=None, names="default", article_style="full",
                              chronicles=True, question_hops=None, prompt_style=None)
    assert world_digest(explicit) == world_digest(default)
    assert set(default.manifest()["params"]) == {"num_entities", "num_documents", "distractor_ratio",
                                                 "chronicle_fraction", "min_chronicle_pages", "page_chars"}


def test_relation_subset_keeps_only_those_facts_and_kinds():
    w = small_world()
    assert {e.kind for e in w.entities} == {"person", "city", "country"}
    assert len(w.entities) == 120
    assert {name for name, table in w.facts.items() if table} == set(SMALL_RELATIONS)
    documents = {d.id: d for d in w.documents()}
    assert len(documents) == 120 == w.num_documents  # no chronicles, no distractors
    stated = 0
    for entity in w.entities:
        text = documents[entity.doc_id].text
        for relation in RELATIONS.values():
            has_fact = entity.index in w.facts[relation.name]
            assert has_fact == (relation.name in SMALL_RELATIONS and entity.kind in relation.subject_kinds) or \
                (relation.name == "capital" and entity.kind == "country")
            if has_fact:
                assert w.fact_sentence(relation.name, entity.index) in text
                stated += 1
        assert len(fact_sentences(text)) == sum(entity.index in w.facts[r] for r in RELATIONS)
    assert stated == sum(len(table) for table in w.facts.values())
    relations_asked = {hop["relation"] for q in w.questions(80, hops=(1, 2), seed=4) for hop in q.metadata["chain"]}
    assert relations_asked <= set(SMALL_RELATIONS) and len(relations_asked) >= 4
    only_rivers = World.generate(seed=1, num_entities=40, relations=("length",), chronicle_fraction=0.0)
    assert {e.kind for e in only_rivers.entities} == {"river"} and len(only_rivers.facts["length"]) == 40
    with pytest.raises(ValueError, match="unknown"):
        World.generate(seed=0, num_entities=40, relations=("birthplace", "shoe_size"))
    with pytest.raises(ValueError, match="empty"):
        World.generate(seed=0, num_entities=40, relations=())


def fact_sentences(text):
    return [s for s in text.split(". ") if s]


def test_relation_subset_with_chronicles_and_dates():
    # established years of companies follow the founder's birth year even when birth years are
    # not a relation of the world; chronicle facts still work in a reduced world
    w = World.generate(seed=2, num_entities=60, relations=("founder", "established", "headquarters", "country"),
                       chronicle_fraction=0.5)
    assert {e.kind for e in w.entities} == {"person", "company", "university", "city", "country"}
    assert not w.facts["birth_year"] and w.facts["established"] and w.chronicle_facts
    assert {kind for kind in ("company", "university")
            if any(w.entities[s].kind == kind for _, s in w.chronicle_facts)} == {"company", "university"}
    documents = {d.id: d for d in w.documents()}
    for q in w.questions(10, hops=(1, 2), seed=0, access_fraction=0.5):
        for hop in q.metadata["support"]:
            assert hop["sentence"] in documents[hop["doc_id"]].text
    with pytest.raises(ValueError, match="needs countries"):
        World.generate(seed=2, num_entities=60, relations=("founder", "established"), chronicle_fraction=0.5)
    no_countries = World.generate(seed=2, num_entities=60, relations=("founder", "established"), chronicle_fraction=0)
    assert not no_countries.chronicle_facts and len(no_countries.facts["established"]) > 0


def test_short_names_are_one_word_and_unique():
    w = small_world(relations=None, chronicles=True, chronicle_fraction=0.1)
    names = [e.name for e in w.entities]
    for entity in w.entities:
        words = entity.name.split()
        if entity.kind == "river":
            assert len(words) == 2 and words[1] == "River"
        else:
            assert len(words) == 1 and entity.name.isalpha() and entity.name[0].isupper()
        assert 4 <= len(words[0]) <= 7
    assert len({normalize_answer(n) for n in names}) == len(names)
    for q in w.questions(40, hops=(1, 2, 3), seed=2):  # the grammar still parses
        parsed = parse_question(q.question)
        assert parsed.start == q.metadata["chain"][0]["subject"]
    default_names = [e.name for e in World.generate(seed=3, num_entities=120).entities]
    assert sum(len(n) for n in names) < 0.6 * sum(len(n) for n in default_names)
    with pytest.raises(ValueError, match="names"):
        World.generate(seed=0, num_entities=40, names="long")


def test_short_names_take_few_ids_of_a_bpe_trained_on_the_corpus():
    from mempo.model.builtin import default_corpus_texts, train_tokenizer

    ids = {}
    for label, w in (("short", small_world()), ("default", World.generate(seed=3, num_entities=120))):
        tokenizer = train_tokenizer(default_corpus_texts(w), vocab_size=1024)
        ids[label] = [len(tokenizer.encode(" " + e.name, add_special_tokens=False)) for e in w.entities]
    mean = {label: sum(counts) / len(counts) for label, counts in ids.items()}
    assert mean["short"] <= 2.0 and max(ids["short"]) <= 3 and mean["default"] >= 3 * mean["short"], mean


def test_facts_article_style_states_the_facts_only():
    w = small_world(article_fillers=(0, 0))
    for entity, doc in zip(w.entities, w.documents()):
        expected = sorted(w.fact_sentence(r, entity.index) for r in RELATIONS if entity.index in w.facts[r])
        assert sorted(s.rstrip(".") + "." for s in fact_sentences(doc.text)) == expected
        assert doc.title == entity.name
    with_fillers = small_world(article_fillers=(1, 1))
    for doc, short in zip(with_fillers.documents(), w.documents()):
        assert len(fact_sentences(doc.text)) == len(fact_sentences(short.text)) + 1
    with pytest.raises(ValueError, match="article_style"):
        World.generate(seed=0, num_entities=40, article_style="long")


def test_no_chronicles():
    w = World.generate(seed=1, num_documents=150, chronicles=False, chronicle_fraction=0.0)
    docs = list(w.documents())
    assert len(docs) == 150 == w.num_documents
    assert not any(d.id.startswith("chronicle-") for d in docs)
    assert w.manifest()["chronicles"] == 0 and w.manifest()["params"]["chronicles"] is False
    with pytest.raises(ValueError, match="chronicle_fraction"):
        World.generate(seed=1, num_entities=40, chronicles=False)  # chronicle_fraction defaults to 0.15
    with pytest.raises(ValueError, match="chronicle facts"):
        w.questions(3, access_fraction=0.5)


def test_question_hops_and_prompt_style_defaults():
    w = small_world(question_hops=(1, 2))
    hops = {q.metadata["hops"] for q in w.questions(40, seed=0)}
    assert hops == {1, 2}
    assert {q.metadata["hops"] for q in w.questions(10, hops=3, seed=0)} == {3}  # explicit hops win
    one_hop = small_world()
    assert all(e.metadata["records"][i]["hops"] == 1 for e in one_hop.episodes(3, 5, seed=1) for i in range(3))
    assert one_hop.manifest()["params"]["question_hops"] == 1
    episodes = one_hop.episodes(2, 3, seed=1)
    assert all(e.prompt.startswith("Answer with the search tool.") for e in episodes)
    assert [parse_episode_prompt(e.prompt) for e in episodes] == [e.questions for e in episodes]
    numbered = one_hop.episodes(2, 3, seed=1, style="numbered")
    assert [e.questions for e in numbered] == [e.questions for e in episodes]
    assert all(len(a.prompt) < len(b.prompt) for a, b in zip(episodes, numbered))
    assert World.generate(seed=0, num_entities=40).default_hops == 2
    for bad in (0, 5, (), (1, 7), True):
        with pytest.raises(ValueError, match="hops"):
            World.generate(seed=0, num_entities=40, question_hops=bad)
    with pytest.raises(ValueError, match="prompt_style"):
        World.generate(seed=0, num_entities=40, prompt_style="terse")


def test_small_world_gold_answers_are_supported():
    w = small_world(question_hops=(1, 2))
    documents = {d.id: d for d in w.documents()}
    for q in w.questions(60, seed=5):
        for hop in q.metadata["support"]:
            assert hop["sentence"] in documents[hop["doc_id"]].text
        assert q.golden_answers[0] == q.metadata["chain"][-1]["value"]
