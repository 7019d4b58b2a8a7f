"""The BM25 retriever (`mempo.env.bm25`): tokenisation, build, search, paging, save/reload,
`load_or_build_bm25`, concurrent searches.
"""
import threading

import pytest

from mempo.env.bm25 import BM25Retriever, Tokenizer, load_or_build_bm25, s_stem
from mempo.env.corpus import CorpusError, Document, write_corpus
from mempo.env.retriever import DocumentNotFoundError, InvalidRequestError, PageOutOfRangeError

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
# index integrity (issue 21, case 3): digests in the manifest, checked before the index is used
# ------------------------------------------------------------------------------------------------
def _zero_array(path):
    """Zero the values of a saved numpy array, keeping its header and size (np.load still works)."""
    import numpy as np

    array = np.load(path)
    np.save(path, np.zeros_like(array))


def _empty(path):
    path.write_bytes(b"")


def _blank_vocabulary(path):  # the same size, every term renamed: valid JSON, no query term found
    path.write_bytes(b" " * path.stat().st_size)


@pytest.mark.parametrize("name,damage", [
    ("bm25s/vocab.index.json", _empty),
    ("bm25s/data.csc.index.npy", _zero_array),
    ("documents.lengths.npy", _zero_array),
    ("ids.json", _blank_vocabulary),
], ids=["emptied-vocabulary", "zeroed-scores", "zeroed-lengths", "blanked-ids"])
def test_a_damaged_index_file_is_refused_naming_it(tmp_path, corpus, name, damage):
    """An emptied vocabulary or a zeroed array of the same size used to load and answer no hits
    for every query; now loading refuses in one line naming the file, before anything is served."""
    index_dir = BM25Retriever.build(corpus).save(tmp_path / "index")
    damage(index_dir / name)
    with pytest.raises(CorpusError) as error:
        BM25Retriever.load(index_dir).close()
    message = str(error.value)
    assert message.startswith(str(index_dir / name)) and "rebuild the index" in message and "\n" not in message


def test_the_manifest_lists_every_index_file_with_its_digest(tmp_path, corpus):
    import hashlib
    import json

    index_dir = BM25Retriever.build(corpus).save(tmp_path / "index")
    manifest = json.loads((index_dir / "mempo_index.json").read_text())
    assert manifest["format_version"] == 2
    on_disk = sorted(p.relative_to(index_dir).as_posix() for p in index_dir.rglob("*")
                     if p.is_file() and p.name != "mempo_index.json")
    assert sorted(manifest["files"]) == on_disk
    for name, record in manifest["files"].items():
        data = (index_dir / name).read_bytes()
        assert record == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest["files"]["ids.json"]["bytes"] = "many"
    (index_dir / "mempo_index.json").write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match=r"damaged index manifest \(entry 'ids.json'\)"):
        BM25Retriever.load(index_dir)
    # a manifest nested 5,000 deep was a RecursionError traceback at serve-retriever's start-up
    (index_dir / "mempo_index.json").write_text('{"format": "mempo.bm25", "x": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(CorpusError, match=r"damaged index manifest \(ValueError\)"):
        BM25Retriever.load(index_dir)


def test_a_format_1_index_is_rebuilt_from_its_corpus_or_refused(tmp_path, corpus):
    """Indexes written before digests (format 1): with the corpus given they are rebuilt (saying
    so); without it they are refused with one line that says to rebuild."""
    import json

    path = tmp_path / "corpus.jsonl"
    write_corpus(path, corpus)
    index_dir = tmp_path / "index"
    load_or_build_bm25(path, index_dir).close()
    manifest_path = index_dir / "mempo_index.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 1
    del manifest["files"]
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CorpusError, match=r"format version 1 is not 2 \(format 1 carries no digests.*--rebuild"):
        load_or_build_bm25(None, index_dir)
    said = []
    retriever = load_or_build_bm25(path, index_dir, log=said.append)
    assert any("format version 1" in line and "rebuilding" in line for line in said)
    assert retriever.num_docs == len(corpus)
    retriever.close()
    assert json.loads(manifest_path.read_text())["format_version"] == 2
