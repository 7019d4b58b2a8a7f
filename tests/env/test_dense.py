"""The dense retriever (`mempo.env.dense`) with a deterministic fake encoder; the faiss and
sentence-transformers paths skip when that extra is not installed.
"""
import hashlib
import os
import sys

import pytest

from mempo.env.bm25 import Tokenizer
from mempo.env.build import make_retriever
from mempo.env.dense import DenseRetriever

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
