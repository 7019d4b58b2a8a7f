"""Dense retrieval (registered as "dense", the optional ``[dense]`` extra): `DenseRetriever`, exact
inner-product search over L2-normalised float32 embeddings (cosine similarity) with faiss when it
imports, numpy otherwise. numpy, faiss and sentence-transformers are imported inside the functions
that use them.
"""
from typing import Any, Callable, Iterable, Sequence

from mempo.env.corpus import CorpusError, Document
from mempo.env.local import LocalRetriever, MemoryDocuments
from mempo.env.retriever import (
    DEFAULT_PAGE_CHARS, DEFAULT_TOPK, RetrieverError, check_page_chars, check_queries, check_topk,
    register_retriever,
)

__all__ = ["DenseRetriever"]


@register_retriever("dense")
class DenseRetriever(LocalRetriever):
    """Exact inner-product search over L2-normalised embeddings (cosine similarity) from any
    ``encode(texts) -> array`` function; `from_sentence_transformer` needs ``pip install .[dense]``.

    `encode(texts) -> array (len(texts), dim)` embeds documents (``title + "\\n" + text``) and
    queries; `query_prefix` / `doc_prefix` are prepended for models trained with them (e5:
    "query: " / "passage: "). faiss (`IndexFlatIP`) is used when it imports, numpy otherwise; both
    are exact, so results agree. Every query gets min(topk, num_docs) hits.
    """

    name = "dense"

    def __init__(self, documents: Iterable[Document], encode: Callable[[list[str]], Any], *,
                 batch_size: int = 64, query_prefix: str = "", doc_prefix: str = "",
                 page_chars: int = DEFAULT_PAGE_CHARS):
        import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

        self._docs = MemoryDocuments(documents)
        if len(self._docs) == 0:
            raise CorpusError("cannot index an empty corpus")
        self._encode = encode
        self.query_prefix, self.doc_prefix = query_prefix, doc_prefix
        self.page_chars = check_page_chars(page_chars)
        chunks = []
        docs = list(self._docs)
        for start in range(0, len(docs), batch_size):
            batch = docs[start:start + batch_size]
            chunks.append(self._embed([doc_prefix + d.title + "\n" + d.text for d in batch]))
        self._embeddings = np.concatenate(chunks, axis=0)
        try:
            import faiss  # reason: optional dependency (the dense extra)
        except ImportError:
            self._faiss_index = None
        else:
            self._faiss_index = faiss.IndexFlatIP(self._embeddings.shape[1])
            self._faiss_index.add(self._embeddings)

    def _embed(self, texts: list[str]):
        import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

        vectors = np.asarray(self._encode(texts), dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[0] != len(texts):
            raise RetrieverError(f"encode returned shape {vectors.shape} for {len(texts)} texts")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return np.ascontiguousarray(vectors / np.maximum(norms, 1e-12))

    @classmethod
    def from_sentence_transformer(cls, documents: Iterable[Document], model_path: str, *, device: str = "cpu",
                                  **kwargs: Any) -> "DenseRetriever":
        """Embed with a sentence-transformers model from a local path or the local HF cache only.

        Needs ``pip install .[dense]``; never downloads (``local_files_only=True``).
        """
        try:
            from sentence_transformers import SentenceTransformer  # reason: optional (the dense extra)
        except ImportError as exc:
            raise ImportError("dense retrieval needs sentence-transformers: pip install 'mempo[dense]'") from exc
        model = SentenceTransformer(model_path, device=device, local_files_only=True)
        return cls(documents, lambda texts: model.encode(texts, convert_to_numpy=True), **kwargs)

    def rank(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[tuple[int, float]]]:
        import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

        queries = check_queries(queries)
        k = min(check_topk(topk), self.num_docs)
        vectors = self._embed([self.query_prefix + q for q in queries])
        if self._faiss_index is not None:
            scores, rows = self._faiss_index.search(vectors, k)
        else:
            all_scores = vectors @ self._embeddings.T
            rows = np.argsort(-all_scores, axis=1, kind="stable")[:, :k]
            scores = np.take_along_axis(all_scores, rows, axis=1)
        return [[(int(row), float(score)) for row, score in zip(query_rows, query_scores) if row >= 0]
                for query_rows, query_scores in zip(rows, scores)]
