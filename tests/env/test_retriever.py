"""Corpus files, tokenisation, the BM25 retriever (build, search, paging, save/reload), the registry,
and the dense retriever's logic (with a deterministic fake encoder; the sentence-transformers path
skips when that extra is not installed).

The small generated corpus shared with the server and tool tests lives in tests/support/corpus.py.
"""
import hashlib
import json
import os
import subprocess
import sys
import threading

import pytest

from mempo.env.build import available_retrievers, make_retriever
from mempo.env.corpus import CorpusError, Document, corpus_fingerprint, load_corpus, write_corpus
from mempo.env.retriever import (
    BM25Retriever, DenseRetriever, DocumentNotFoundError, InvalidRequestError, PageOutOfRangeError, Tokenizer,
    load_or_build_bm25, s_stem,
)

# ------------------------------------------------------------------------------------------------
# corpus files
# ------------------------------------------------------------------------------------------------

def test_corpus_roundtrip(tmp_path, corpus):
    path = tmp_path / "corpus.jsonl"
    assert write_corpus(path, corpus) == len(corpus)
    assert load_corpus(path) == corpus
    assert len(corpus_fingerprint(path)) == 64


def test_corpus_accepts_search_r1_contents_and_integer_ids(tmp_path):
    path = tmp_path / "wiki.jsonl"
    path.write_text(json.dumps({"id": 7, "contents": '"Aaron"\nAaron is a prophet.\nSecond line.'}) + "\n\n"
                    + json.dumps({"id": "x", "text": "no title"}) + "\n", encoding="utf-8")
    assert load_corpus(path) == [Document("7", "Aaron", "Aaron is a prophet.\nSecond line."),
                                 Document("x", "", "no title")]


@pytest.mark.parametrize("lines, message", [
    (['{"id": "a", "text": "ok"}', "{not json"], ":2: not valid JSON"),
    (['[1, 2]'], ":1: expected a JSON object"),
    (['{"title": "t", "text": "x"}'], ":1: missing field 'id'"),
    (['{"id": "a"}'], ":1: missing field 'text'"),
    (['{"id": "a b", "text": "x"}'], ":1: field 'id' contains white space"),
    (['{"id": "", "text": "x"}'], ":1: field 'id' is empty"),
    (['{"id": "a", "text": 3}'], ":1: field 'text' must be a string"),
    (['{"id": "a", "text": "x", "title": null}'], ":1: field 'title' must be a string"),
    (['{"id": "a", "text": "x"}', "", '{"id": "a", "text": "y"}'], ":3: duplicate id 'a' (first seen on line 1)"),
])
def test_corpus_errors_name_file_and_line(tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(CorpusError) as info:
        load_corpus(path)
    assert str(info.value).startswith(str(path)) and message in str(info.value)


@pytest.mark.parametrize("bad_line", [150, 1, 400])
def test_non_utf8_corpus_error_names_the_right_line(tmp_path, bad_line):
    """The reader decodes each line alone: a text-mode reader decodes 8 KB ahead and blamed line 130
    for a bad byte on line 151 (issue 10, case 11). Lines end at b"\\n" only; CRLF files count alike."""
    good = [json.dumps({"id": f"d{i}", "text": "x" * 100}).encode() for i in range(400)]
    good[bad_line - 1] = b'{"id": "bad", "text": "caf\xe9"}'
    for newline in (b"\n", b"\r\n"):
        path = tmp_path / "latin1.jsonl"
        path.write_bytes(newline.join(good) + newline)
        with pytest.raises(CorpusError) as info:
            load_corpus(path)
        assert f"{path}:{bad_line}: not valid UTF-8" in str(info.value), str(info.value)
        assert "at byte 27 of the line" in str(info.value)
    # A bare \r (JSON white space) is no line end: universal newlines split this line in two.
    path.write_bytes(b'{"id": "a",\r "text": "x"}\n{"id": "b", "text": "y"}\n{not json\n')
    with pytest.raises(CorpusError, match=":3: not valid JSON"):
        load_corpus(path)


def test_corpus_missing_file_and_bad_write(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path / "absent.jsonl")
    target = tmp_path / "out.jsonl"
    with pytest.raises(CorpusError, match="duplicate id"):
        write_corpus(target, [Document("a", "", "x"), Document("a", "", "y")])
    assert not target.exists() and list(tmp_path.iterdir()) == []  # no partial file, no temp file left


# ------------------------------------------------------------------------------------------------
# tokenisation
# ------------------------------------------------------------------------------------------------

def test_tokenizer_is_stable():
    tok = Tokenizer()
    assert tok("The Cities of the WORLD's rivers, in 1990s! Don't") == ["city", "world", "river", "1990", "dont"]
    assert tok("ＦＵＬＬＷＩＤＴＨ café_bar") == ["fullwidth", "café", "bar"]
    words = ["ponies", "aies", "eies", "horses", "goes", "trees", "bus", "glass", "cats", "gas", "stone"]
    assert [s_stem(w) for w in words] == \
        ["pony", "aies", "eies", "horse", "goes", "trees", "bus", "glass", "cat", "gas", "stone"]
    assert Tokenizer(stemmer="none", stopwords="none")("The cats") == ["the", "cats"]
    with pytest.raises(ValueError):
        Tokenizer(stemmer="porter")


# ------------------------------------------------------------------------------------------------
# BM25
# ------------------------------------------------------------------------------------------------

def test_bm25_finds_needles(bm25):
    results = bm25.search(["zebulon3", "Zebulon7 river", "nothingmatcheshere"], topk=5)
    assert results[0][0].doc_id == "needle-3" and len(results[0]) == 1
    assert results[1][0].doc_id == "needle-7" and len(results[1]) == 5
    assert results[2] == []
    scores = [hit.score for hit in results[1]]
    assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
    hit = results[0][0]
    assert hit.title == "Needle 3" and "zebulon3" in hit.text


def test_bm25_title_is_indexed_and_topk_respected(bm25, corpus):
    assert bm25.search(["needle"], topk=3)[0][0].doc_id.startswith("needle-")
    assert len(bm25.search(["river"], topk=3)[0]) == 3
    assert len(bm25.search(["river"], topk=10_000)[0]) <= len(corpus)
    assert bm25.num_docs == len(corpus)


@pytest.mark.parametrize("queries, topk", [([], 5), (["  "], 5), ("river", 5), ([3], 5), (["river"], 0),
                                           (["river"], True), (["river"], 2.0)])
def test_bm25_rejects_bad_arguments(bm25, queries, topk):
    with pytest.raises(InvalidRequestError):
        bm25.search(queries, topk)


def test_access_pages(bm25, corpus):
    long_doc = next(d for d in corpus if d.id == "long-1")
    pages = [bm25.access("long-1", p) for p in range(3)]
    assert [p.num_pages for p in pages] == [3, 3, 3] and [p.page for p in pages] == [0, 1, 2]
    assert [len(p.text) for p in pages] == [25_000, 25_000, 10_000]
    assert "".join(p.text for p in pages) == long_doc.text and pages[0].title == "Long 1"
    with pytest.raises(PageOutOfRangeError) as info:
        bm25.access("long-1", 3)
    assert info.value.num_pages == 3 and "numbered 0 to 2" in str(info.value)
    small = bm25.access("needle-0", 0, page_chars=10)
    assert len(small.text) == 10 and small.num_pages > 1
    with pytest.raises(DocumentNotFoundError, match="unknown document id 'absent'"):
        bm25.access("absent")
    for bad in [(-1, None), (0, 0), ("1", None)]:
        with pytest.raises(InvalidRequestError):
            bm25.access("needle-0", bad[0], bad[1])


def test_empty_text_is_one_empty_page():
    retriever = BM25Retriever.build([Document("e", "Empty", ""), Document("f", "Full", "words here")])
    assert retriever.access("e").num_pages == 1 and retriever.access("e").text == ""
    assert retriever.search(["empty"])[0][0].doc_id == "e"  # the title is indexed


def test_build_rejects_bad_corpora():
    with pytest.raises(CorpusError, match="empty corpus"):
        BM25Retriever.build([])
    with pytest.raises(CorpusError, match="duplicate"):
        BM25Retriever.build([Document("a", "", "x"), Document("a", "", "y")])
    with pytest.raises(CorpusError, match="no indexable terms"):
        BM25Retriever.build([Document("a", "", "the of and")])


def test_save_and_reload_give_identical_results(tmp_path, bm25):
    bm25.save(tmp_path / "index")
    manifest = BM25Retriever.read_manifest(tmp_path / "index")
    assert manifest["num_docs"] == bm25.num_docs and manifest["tokenizer"] == {"stemmer": "s", "stopwords": "lucene"}
    queries = ["zebulon5", "river stone market", "Long start", "candle mirror window"]
    for mmap_arrays in (True, False):
        with BM25Retriever.load(tmp_path / "index", mmap_arrays=mmap_arrays) as loaded:
            assert loaded.search(queries, 7) == bm25.search(queries, 7)
            assert loaded.access("long-2", 2) == bm25.access("long-2", 2)
            with pytest.raises(DocumentNotFoundError):
                loaded.access("absent")
    with pytest.raises(CorpusError, match="no saved index"):
        BM25Retriever.load(tmp_path / "nothing")


def test_load_or_build_reuses_and_refreshes_the_index(tmp_path, corpus):
    path, index_dir = tmp_path / "corpus.jsonl", tmp_path / "index"
    write_corpus(path, corpus[:50])
    messages = []
    with load_or_build_bm25(path, index_dir, log=messages.append) as first:
        assert first.num_docs == 50
    assert any(m.startswith("built") for m in messages) and any(m.startswith("saved") for m in messages)
    messages.clear()
    with load_or_build_bm25(path, index_dir, log=messages.append) as second:
        assert second.search(["zebulon1"])[0][0].doc_id == "needle-1"
    assert len(messages) == 1 and messages[0].startswith("loaded")
    with load_or_build_bm25(None, index_dir) as third:  # an index alone is enough
        assert third.num_docs == 50
    write_corpus(path, corpus[:50])  # same bytes, new modification time: the SHA-256 still matches
    messages.clear()
    with load_or_build_bm25(path, index_dir, log=messages.append):
        assert messages[0].startswith("loaded")
    write_corpus(path, corpus[:60])  # the corpus changed: the index is rebuilt
    messages.clear()
    with load_or_build_bm25(path, index_dir, log=messages.append) as fourth:
        assert fourth.num_docs == 60
    assert "rebuilding" in messages[0]
    with pytest.raises(CorpusError, match="no corpus"):
        load_or_build_bm25(None, tmp_path / "empty")


def test_topk_selection_is_exact():
    import numpy as np

    from mempo.env.retriever import _topk_rows

    rng = np.random.default_rng(0)
    for _ in range(300):
        n, k = int(rng.integers(1, 3000)), int(rng.integers(1, 20))
        density = rng.random()
        scores = np.where(rng.random(n) < density, np.round(rng.random(n) * 3, 1), 0).astype(np.float32)
        positive = np.flatnonzero(scores > 0)
        expected = positive[np.lexsort((positive, -scores[positive]))][:k]  # best first, ties to the lower row
        assert np.array_equal(_topk_rows(scores, k, block=int(rng.integers(2, 70))), expected)


def test_concurrent_searches_match_sequential(bm25):
    queries = [f"zebulon{i % 10} river" for i in range(40)]
    expected = bm25.search(queries, 5)
    got = [None] * len(queries)

    def worker(i):
        got[i] = bm25.search([queries[i]], 5)[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(queries))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected


# ------------------------------------------------------------------------------------------------
# registry and import weight
# ------------------------------------------------------------------------------------------------

def test_registry(corpus):
    assert {"bm25", "http", "dense"} <= set(available_retrievers())
    retriever = make_retriever("bm25", documents=corpus[:20])
    assert isinstance(retriever, BM25Retriever) and retriever.num_docs == 20
    client = make_retriever("http", base_url="http://127.0.0.1:9", retries=0)
    assert client.base_url == "http://127.0.0.1:9"
    with pytest.raises(ValueError, match="unknown retriever 'nope'"):
        make_retriever("nope")


def test_import_mempo_env_stays_light():
    code = ("import sys, mempo.env, mempo.apps.cli\n"
            "mempo.apps.cli.build_parser()\n"
            "heavy = [m for m in ('fastapi', 'uvicorn', 'starlette', 'pydantic', 'bm25s', 'numpy', 'transformers', "
            "'sentence_transformers', 'faiss', 'torch') if m in sys.modules]\n"
            "print(','.join(heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"import mempo.env pulled in: {out.stdout.strip()}"


# ------------------------------------------------------------------------------------------------
# dense
# ------------------------------------------------------------------------------------------------

def hashed_bag_of_words(texts, dim=256):
    """Deterministic stand-in encoder: counts of hashed tokens."""
    import numpy as np

    out = np.zeros((len(texts), dim), dtype=np.float32)
    tok = Tokenizer()
    for row, text in enumerate(texts):
        for term in tok(text):
            out[row, int(hashlib.md5(term.encode()).hexdigest(), 16) % dim] += 1.0
    return out


def test_dense_retriever_logic_with_fake_encoder(corpus):
    dense = DenseRetriever(corpus, hashed_bag_of_words, batch_size=64)
    results = dense.search(["zebulon4", "Needle 8 zebulon8"], topk=4)
    assert results[0][0].doc_id == "needle-4" and len(results[0]) == 4
    assert results[1][0].doc_id == "needle-8"
    assert results[0][0].score == pytest.approx(max(h.score for h in results[0]))
    assert dense.access("long-0", 2).num_pages == 3
    assert len(dense.search(["river"], topk=10_000)[0]) == len(corpus)
    assert make_retriever("dense", documents=corpus[:5], encode=hashed_bag_of_words).num_docs == 5


def test_dense_faiss_matches_numpy(corpus, monkeypatch):
    pytest.importorskip("faiss", reason="faiss not installed (pip install 'mempo[dense]')")
    with_faiss = DenseRetriever(corpus, hashed_bag_of_words)
    monkeypatch.setitem(sys.modules, "faiss", None)  # force the numpy path
    without = DenseRetriever(corpus, hashed_bag_of_words)
    queries = ["zebulon2", "river market"]
    assert [[h.doc_id for h in r] for r in with_faiss.search(queries, 5)] == \
        [[h.doc_id for h in r] for r in without.search(queries, 5)]


def test_dense_sentence_transformer_path(corpus):
    """Runs where the dense extra is installed and MEMPO_DENSE_MODEL names a local model directory."""
    pytest.importorskip("sentence_transformers", reason="sentence-transformers not installed "
                                                        "(pip install 'mempo[dense]')")
    model_path = os.environ.get("MEMPO_DENSE_MODEL")
    if not model_path:
        pytest.skip("set MEMPO_DENSE_MODEL to a local sentence-transformers model (never downloaded in tests)")
    dense = DenseRetriever.from_sentence_transformer(corpus[:40], model_path)
    assert dense.search(["Needle 3 zebulon3"], topk=3)[0][0].doc_id.startswith("needle-")
