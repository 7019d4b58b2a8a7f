"""What retrievers holding their documents locally share: the document stores (`MemoryDocuments`, a
list in memory; `MappedDocuments`, a saved jsonl read through a memory map by byte offsets, written by
`save_documents`), `LocalRetriever` (id lookup, paged `access`, and `rank` / `hit`: a search in two
halves, so that a server can bound an answer by the documents' lengths before it reads them) and
`topk_rows` (exact top-k).

Rows are 0-based positions in index order; offsets are int64 byte positions (n + 1 of them);
lengths are int64 (title characters, text characters) per row (``documents.lengths.npy``).
numpy is imported inside the functions that use it, so `import mempo.env` stays light.
"""
import abc
import json
import mmap
import os
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from mempo.env.corpus import CorpusError, Document
from mempo.env.retriever import (
    DEFAULT_TOPK, DocumentNotFoundError, Hit, Page, Retriever, check_doc_id, check_page, check_page_chars, paginate,
)

__all__ = ["MemoryDocuments", "MappedDocuments", "save_documents", "LocalRetriever", "topk_rows"]


class MemoryDocuments:
    """Documents held in a Python list, looked up by position or id."""

    def __init__(self, documents: Sequence[Document]):
        self._docs = list(documents)
        self._row_of = {}
        for row, doc in enumerate(self._docs):
            if self._row_of.setdefault(doc.id, row) != row:
                raise CorpusError(f"duplicate document id {doc.id!r} (documents {self._row_of[doc.id]} and {row})")

    def __len__(self) -> int:
        return len(self._docs)

    def __getitem__(self, row: int) -> Document:
        return self._docs[row]

    def row_of(self, doc_id: str) -> Optional[int]:
        return self._row_of.get(doc_id)

    def chars(self, row: int) -> tuple[int, int]:
        """(title characters, text characters) of document `row`, without building anything."""
        doc = self._docs[row]
        return len(doc.title), len(doc.text)

    def __iter__(self):
        return iter(self._docs)

    def close(self) -> None:
        pass


class MappedDocuments:
    """Documents read on demand from a saved jsonl through a read-only memory map (thread-safe)."""

    def __init__(self, jsonl_path: Path, offsets_path: Path, ids_path: Path, lengths_path: Path):
        import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

        self._offsets = np.load(offsets_path)
        self._lengths = np.load(lengths_path, mmap_mode="r")
        if self._lengths.shape != (len(self._offsets) - 1, 2) or self._lengths.dtype != np.int64:
            raise CorpusError(f"{lengths_path}: shape {self._lengths.shape} {self._lengths.dtype}, expected "
                              f"({len(self._offsets) - 1}, 2) int64 (index corrupted)")
        with open(ids_path, "r", encoding="utf-8") as handle:
            ids = json.load(handle)
        if len(ids) + 1 != len(self._offsets):
            raise CorpusError(f"{ids_path}: {len(ids)} ids but {len(self._offsets) - 1} offsets (index corrupted)")
        if int(self._offsets[-1]) != os.path.getsize(jsonl_path):
            raise CorpusError(f"{jsonl_path}: {os.path.getsize(jsonl_path)} bytes, the offsets end at "
                              f"{int(self._offsets[-1])} (index corrupted)")
        self._row_of = {doc_id: row for row, doc_id in enumerate(ids)}
        self._file = open(jsonl_path, "rb")
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def __len__(self) -> int:
        return len(self._row_of)

    def __getitem__(self, row: int) -> Document:
        start, end = int(self._offsets[row]), int(self._offsets[row + 1])
        obj = json.loads(self._map[start:end])
        return Document(obj["id"], obj["title"], obj["text"])

    def row_of(self, doc_id: str) -> Optional[int]:
        return self._row_of.get(doc_id)

    def chars(self, row: int) -> tuple[int, int]:
        """(title characters, text characters) of document `row`, from the saved lengths (nothing read)."""
        title, text = self._lengths[row]
        return int(title), int(text)

    def __iter__(self):
        return (self[row] for row in range(len(self)))

    def close(self) -> None:
        self._map.close()
        self._file.close()


def save_documents(documents: Iterable[Document], index_dir: Path) -> int:
    """Write documents.jsonl, documents.offsets.npy, documents.lengths.npy and ids.json; returns the
    document count."""
    import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

    offsets, ids, lengths = [0], [], []
    with open(index_dir / "documents.jsonl", "wb") as handle:
        for doc in documents:
            line = (json.dumps(doc.to_json(), ensure_ascii=False) + "\n").encode("utf-8")
            handle.write(line)
            offsets.append(offsets[-1] + len(line))
            ids.append(doc.id)
            lengths.append((len(doc.title), len(doc.text)))
    np.save(index_dir / "documents.offsets.npy", np.asarray(offsets, dtype=np.int64))
    np.save(index_dir / "documents.lengths.npy", np.asarray(lengths, dtype=np.int64).reshape(-1, 2))
    with open(index_dir / "ids.json", "w", encoding="utf-8") as handle:
        json.dump(ids, handle, ensure_ascii=False)
    return len(ids)


class LocalRetriever(Retriever):
    """Shared `access` and id lookup for retrievers that hold their documents locally."""

    _docs: Union[MemoryDocuments, MappedDocuments]

    @property
    def num_docs(self) -> int:
        return len(self._docs)

    def document(self, doc_id: str) -> Document:
        """The whole document `doc_id`; raises `DocumentNotFoundError`."""
        row = self._docs.row_of(check_doc_id(doc_id))
        if row is None:
            raise DocumentNotFoundError(f"unknown document id {doc_id!r}")
        return self._docs[row]

    @abc.abstractmethod
    def rank(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[tuple[int, float]]]:
        """The first half of `search`: per query, (row, score) of its hits, best first; no document
        is read. `search(queries, topk)` equals ``[[self.hit(r, s) for r, s in ranked] for ranked in
        self.rank(queries, topk)]``. Each local retriever implements it (BM25, dense)."""

    def hit(self, row: int, score: float) -> Hit:
        """The second half of `search`: the Hit of document `row` (reads it)."""
        doc = self._docs[row]
        return Hit(doc.id, doc.title, doc.text, float(score))

    def doc_chars(self, row: int) -> tuple[int, int]:
        """(title characters, text characters) of document `row`, known without reading it."""
        return self._docs.chars(row)

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        return [[self.hit(row, score) for row, score in ranked] for ranked in self.rank(queries, topk)]

    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        page_chars = self.page_chars if page_chars is None else page_chars
        check_page(page)
        check_page_chars(page_chars)
        return paginate(self.document(doc_id), page, page_chars)

    def close(self) -> None:
        self._docs.close()


def topk_rows(scores, topk: int, block: int = 64):
    """Rows of the `topk` largest positive scores, best first; ties go to the lower row (exact).

    A lower bound on the k-th largest score comes cheaply from the k-th largest of the per-block
    maxima (k blocks each hold a score at least that high); only rows at or above it are sorted.
    """
    import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

    n = scores.shape[0]
    threshold = 0.0
    if n > topk * block:
        usable = n - n % block
        maxima = scores[:usable].reshape(-1, block).max(axis=1)
        if usable < n:
            maxima = np.append(maxima, scores[usable:].max())
        threshold = float(np.partition(maxima, maxima.size - topk)[maxima.size - topk])
    candidates = np.flatnonzero(scores >= threshold) if threshold > 0 else np.flatnonzero(scores > 0)
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order[:topk]]
