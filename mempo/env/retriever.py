"""Retrievers: one interface for "search a corpus" and "read a document page by page" (`Retriever`),
BM25 (the embedded default) and dense retrieval, and their registry: `RETRIEVERS`, filled with the
`register_retriever(name)` decorator ("bm25" and "dense" here, "http" in `mempo.env.client`); build
one by name with `mempo.env.build.make_retriever`.

Importing this module is cheap (`import mempo.env` and `mempo --help` must not load numpy): numpy,
bm25s, faiss and sentence-transformers are imported inside the functions that use them.
"""
import abc
import functools
import json
import math
import mmap
import os
import re
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from mempo.env.corpus import CorpusError, Document, corpus_fingerprint, iter_corpus
from mempo.errors import MempoError
from mempo.utils.registry import Registry
from mempo.utils.types import PathLike

__all__ = [
    "DEFAULT_TOPK", "DEFAULT_PAGE_CHARS", "MAX_QUERY_CHARS", "Hit", "Page", "Retriever", "RetrieverError",
    "InvalidRequestError",
    "DocumentNotFoundError", "PageOutOfRangeError", "RetrieverUnavailableError", "register_retriever", "RETRIEVERS",
    "Tokenizer", "s_stem", "paginate", "BM25Retriever",
    "load_or_build_bm25", "DenseRetriever", "check_queries", "check_topk", "check_page", "check_page_chars",
]

DEFAULT_TOPK = 5
DEFAULT_PAGE_CHARS = 25_000
MAX_QUERY_CHARS = 2048  # longest query the server and the search tool accept (characters)


# ----------------------------------------------------------------------------------------------
# Records and errors
# ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Hit:
    """One search result: the document's id, title, whole text, and its retrieval score."""
    doc_id: str
    title: str
    text: str
    score: float


@dataclass(frozen=True)
class Page:
    """One page of a document: `page` is 0-based, `num_pages` >= 1, `text` at most page_chars long."""
    doc_id: str
    title: str
    page: int
    num_pages: int
    text: str


class RetrieverError(MempoError):
    """Base class of every retrieval failure (bad request, unknown document, server unavailable)."""


class InvalidRequestError(RetrieverError, ValueError):
    """The arguments are not acceptable (empty or blank query, topk < 1, bad page, over a limit)."""


class DocumentNotFoundError(RetrieverError, LookupError):
    """No document has the requested id."""


class PageOutOfRangeError(RetrieverError, IndexError):
    """The document exists but has no page with the requested number; `num_pages` says how many it has."""

    def __init__(self, message: str, num_pages: Optional[int] = None):
        super().__init__(message)
        self.num_pages = num_pages


class RetrieverUnavailableError(RetrieverError):
    """A remote retriever could not be reached, timed out, failed (5xx) or answered garbage."""


# ----------------------------------------------------------------------------------------------
# Argument checks shared by the retrievers, the server and the client
# ----------------------------------------------------------------------------------------------

def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_queries(queries: object, *, max_queries: Optional[int] = None,
                  max_query_chars: Optional[int] = None) -> list[str]:
    """Return `queries` as a list, or raise `InvalidRequestError` saying which query is wrong."""
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise InvalidRequestError(f"queries must be a list of strings, got {type(queries).__name__}")
    if not queries:
        raise InvalidRequestError("queries is empty: give at least one query")
    if max_queries is not None and len(queries) > max_queries:
        raise InvalidRequestError(f"too many queries: {len(queries)} > limit {max_queries}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise InvalidRequestError(f"queries[{i}] must be a string, got {type(query).__name__}")
        if not query.strip():
            raise InvalidRequestError(f"queries[{i}] is blank")
        if max_query_chars is not None and len(query) > max_query_chars:
            raise InvalidRequestError(f"queries[{i}] is too long: {len(query)} characters > limit {max_query_chars}")
    return list(queries)


def check_topk(topk: object, *, topk_max: Optional[int] = None) -> int:
    """Return `topk` if it is an integer in [1, topk_max], else raise `InvalidRequestError`."""
    if not _is_int(topk):
        raise InvalidRequestError(f"topk must be an integer, got {type(topk).__name__}")
    if topk < 1:
        raise InvalidRequestError(f"topk must be >= 1, got {topk}")
    if topk_max is not None and topk > topk_max:
        raise InvalidRequestError(f"topk {topk} is over the limit {topk_max}")
    return topk


def check_page(page: object) -> int:
    """Return `page` if it is an integer >= 0, else raise `InvalidRequestError`."""
    if not _is_int(page):
        raise InvalidRequestError(f"page must be an integer, got {type(page).__name__}")
    if page < 0:
        raise InvalidRequestError(f"page must be >= 0, got {page}")
    return page


def check_page_chars(page_chars: object, *, limit: Optional[int] = None) -> int:
    """Return `page_chars` if it is an integer in [1, limit], else raise `InvalidRequestError`."""
    if not _is_int(page_chars) or page_chars < 1:
        raise InvalidRequestError(f"page_chars must be a positive integer, got {page_chars!r}")
    if limit is not None and page_chars > limit:
        raise InvalidRequestError(f"page_chars {page_chars} is over the limit {limit}")
    return page_chars


def check_doc_id(doc_id: object) -> str:
    """Return `doc_id` if it is a non-empty string, else raise `InvalidRequestError`."""
    if not isinstance(doc_id, str):
        raise InvalidRequestError(f"doc_id must be a string, got {type(doc_id).__name__}")
    if not doc_id:
        raise InvalidRequestError("doc_id is empty")
    return doc_id


def paginate(doc: Document, page: int, page_chars: int) -> Page:
    """Cut `doc.text` into pages of `page_chars` characters and return page `page` (0-based)."""
    page, page_chars = check_page(page), check_page_chars(page_chars)
    num_pages = max(1, math.ceil(len(doc.text) / page_chars))
    if page >= num_pages:
        raise PageOutOfRangeError(
            f"page {page} is out of range for document {doc.id!r}: it has {num_pages} page(s), "
            f"numbered 0 to {num_pages - 1}", num_pages=num_pages)
    start = page * page_chars
    return Page(doc.id, doc.title, page, num_pages, doc.text[start:start + page_chars])


# ----------------------------------------------------------------------------------------------
# The interface and its registry
# ----------------------------------------------------------------------------------------------

class Retriever(abc.ABC):
    """What the tools need from a corpus: ranked search and paged access.

    Every failure is a `RetrieverError`: bad arguments (empty query list, blank or non-string query,
    topk < 1, negative or non-integer page) raise `InvalidRequestError`, an unknown id
    `DocumentNotFoundError`, a page past the end `PageOutOfRangeError`. The HTTP client
    (`mempo.env.client`) raises the same classes for its server's answers, plus
    `RetrieverUnavailableError`, so in-process and HTTP retrievers are interchangeable.
    """

    name: str = "retriever"
    page_chars: int = DEFAULT_PAGE_CHARS

    @property
    @abc.abstractmethod
    def num_docs(self) -> int:
        """Number of documents in the corpus."""

    @abc.abstractmethod
    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        """One ranked list per query, best first, at most `topk` hits each (fewer when fewer documents
        match). A `Hit` carries the document's whole text; cutting it for the agent (5,000
        characters by default) is the search tool's job."""

    @abc.abstractmethod
    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        """Page `page` (0-based) of document `doc_id`, cut into pages of `page_chars` characters
        (default self.page_chars, 25,000). A document has at least one page (an empty text is one
        empty page)."""

    def check_health(self) -> Optional[dict]:
        """Raise `RetrieverUnavailableError` (naming where) if the retriever cannot serve now.

        Call once before work that needs it (training, evaluation). An in-process retriever is
        always ready (None); `HTTPRetriever` asks its server (`/health`) and returns the answer.
        """
        return None

    def close(self) -> None:
        """Release files or connections held by the retriever (no-op by default)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


RETRIEVERS = Registry("retriever")


def register_retriever(name: str):
    """Decorator registering a retriever factory (class or function returning a Retriever) under `name`."""
    return RETRIEVERS.register(name)


# ----------------------------------------------------------------------------------------------
# Tokenisation
# ----------------------------------------------------------------------------------------------

_TOKEN_RE = re.compile(r"[^\W_]+(?:['\u2019][^\W_]+)*")
_POSSESSIVE_RE = re.compile(r"['\u2019]s$")

# Lucene's EnglishAnalyzer default stop set.
LUCENE_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then there these "
    "they this to was will with".split())


@functools.lru_cache(maxsize=1 << 18)
def s_stem(word: str) -> str:
    """Harman's S stemmer as Lucene's EnglishMinimalStemmer, keeping words of <= 3 characters whole."""
    if len(word) <= 3 or word[-1] != "s" or word[-2] in "us":
        return word
    if word[-2] == "e":
        if word[-3] == "i" and word[-4] not in "ae":
            return word[:-3] + "y"
        if word[-3] in "iaoe":
            return word
    return word[:-1]


@dataclass(frozen=True)
class Tokenizer:
    """Text -> index terms; stored with an index, so queries are tokenised like the documents.

    1. NFKC-normalise and case-fold;
    2. words = runs of Unicode letters and digits (``[^\\W_]+``), joined across inner apostrophes; a
       final 's is dropped and other apostrophes removed ("world's" -> "world", "don't" -> "dont");
    3. drop Lucene's 33 English stop words (``stopwords="none"`` keeps them);
    4. Harman's S stemmer as Lucene's EnglishMinimalStemmer implements it, plural endings only:
       -ies -> -y (not -eies, -aies), else a final -s is dropped unless the word ends in -us, -ss,
       -ies, -aes, -ees or -oes ("ponies" -> "pony", "horses" -> "horse", "goes" stays); words of 3
       characters or fewer are kept whole (``stemmer="none"`` skips this step).
    """
    stemmer: str = "s"          # "s" (Harman S stemmer) or "none"
    stopwords: str = "lucene"   # "lucene" (33 English words) or "none"

    def __post_init__(self):
        if self.stemmer not in ("s", "none"):
            raise ValueError(f"stemmer must be 's' or 'none', got {self.stemmer!r}")
        if self.stopwords not in ("lucene", "none"):
            raise ValueError(f"stopwords must be 'lucene' or 'none', got {self.stopwords!r}")

    def words(self, text: str) -> list[str]:
        """Normalised, case-folded words of `text` (before apostrophes, stop words and stemming)."""
        return _TOKEN_RE.findall(unicodedata.normalize("NFKC", text).casefold())

    def term(self, word: str) -> Optional[str]:
        """The index term of one word from `words`, or None for a stop word."""
        if "'" in word or "\u2019" in word:
            word = _POSSESSIVE_RE.sub("", word).replace("'", "").replace("\u2019", "")
        if self.stopwords == "lucene" and word in LUCENE_STOPWORDS:
            return None
        return s_stem(word) if self.stemmer == "s" else word

    def __call__(self, text: str) -> list[str]:
        """The index terms of `text`, in order."""
        terms = (self.term(w) for w in self.words(text))
        return [t for t in terms if t is not None]

    def to_json(self) -> dict:
        return {"stemmer": self.stemmer, "stopwords": self.stopwords}

    @classmethod
    def from_json(cls, obj: dict) -> "Tokenizer":
        return cls(stemmer=obj["stemmer"], stopwords=obj["stopwords"])


# ----------------------------------------------------------------------------------------------
# Document stores: in memory, or a memory-mapped jsonl with byte offsets
# ----------------------------------------------------------------------------------------------

class _MemoryDocuments:
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

    def __iter__(self):
        return iter(self._docs)

    def close(self) -> None:
        pass


class _MappedDocuments:
    """Documents read on demand from a saved jsonl through a read-only memory map (thread-safe)."""

    def __init__(self, jsonl_path: Path, offsets_path: Path, ids_path: Path):
        import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

        self._offsets = np.load(offsets_path)
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

    def __iter__(self):
        return (self[row] for row in range(len(self)))

    def close(self) -> None:
        self._map.close()
        self._file.close()


def _save_documents(documents: Iterable[Document], index_dir: Path) -> int:
    """Write documents.jsonl, documents.offsets.npy and ids.json; returns the document count."""
    import numpy as np  # reason: `import mempo.env` and `mempo --help` stay without numpy

    offsets, ids = [0], []
    with open(index_dir / "documents.jsonl", "wb") as handle:
        for doc in documents:
            line = (json.dumps(doc.to_json(), ensure_ascii=False) + "\n").encode("utf-8")
            handle.write(line)
            offsets.append(offsets[-1] + len(line))
            ids.append(doc.id)
    np.save(index_dir / "documents.offsets.npy", np.asarray(offsets, dtype=np.int64))
    with open(index_dir / "ids.json", "w", encoding="utf-8") as handle:
        json.dump(ids, handle, ensure_ascii=False)
    return len(ids)


class _LocalRetriever(Retriever):
    """Shared `access` and id lookup for retrievers that hold their documents locally."""

    _docs: Union[_MemoryDocuments, _MappedDocuments]

    @property
    def num_docs(self) -> int:
        return len(self._docs)

    def document(self, doc_id: str) -> Document:
        """The whole document `doc_id`; raises `DocumentNotFoundError`."""
        row = self._docs.row_of(check_doc_id(doc_id))
        if row is None:
            raise DocumentNotFoundError(f"unknown document id {doc_id!r}")
        return self._docs[row]

    def access(self, doc_id: str, page: int = 0, page_chars: Optional[int] = None) -> Page:
        page_chars = self.page_chars if page_chars is None else page_chars
        check_page(page)
        check_page_chars(page_chars)
        return paginate(self.document(doc_id), page, page_chars)

    def close(self) -> None:
        self._docs.close()


def _topk_rows(scores, topk: int, block: int = 64):
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


# ----------------------------------------------------------------------------------------------
# BM25
# ----------------------------------------------------------------------------------------------

INDEX_MANIFEST = "mempo_index.json"
BM25_FORMAT = "mempo.bm25"
BM25_FORMAT_VERSION = 1


class BM25Retriever(_LocalRetriever):
    """BM25 over a local corpus (bm25s, Lucene BM25, default k1=1.5, b=0.75; title and text indexed
    together); build in memory, save, and reload.

    Scores are BM25 sums over the query's terms (a repeated query term counts again); documents
    sharing no term with the query are never returned, so a query may get fewer than topk hits.
    Safe to call from several threads at once (all state is read-only after construction).
    """

    name = "bm25"

    def __init__(self, bm25, documents: Union[_MemoryDocuments, _MappedDocuments], tokenizer: Tokenizer, *,
                 page_chars: int = DEFAULT_PAGE_CHARS, source: Optional[dict] = None):
        self._bm25 = bm25
        self._vocab = bm25.vocab_dict
        self._docs = documents
        self.tokenizer = tokenizer
        self.page_chars = check_page_chars(page_chars)
        self.source = source  # the corpus file it was built from: {"size", "mtime_ns", "sha256"}, or None

    @classmethod
    def build(cls, documents: Iterable[Document], *, tokenizer: Optional[Tokenizer] = None, k1: float = 1.5,
              b: float = 0.75, method: str = "lucene", page_chars: int = DEFAULT_PAGE_CHARS,
              source: Optional[dict] = None) -> "BM25Retriever":
        """Index `documents` (kept in memory); raises `CorpusError` if empty, duplicated, or term-less."""
        import bm25s  # reason: as numpy (bm25s imports it)

        tokenizer = tokenizer or Tokenizer()
        store = _MemoryDocuments(documents)
        if len(store) == 0:
            raise CorpusError("cannot index an empty corpus")
        vocab: dict[str, int] = {}     # index term -> term id
        word_ids: dict[str, int] = {}  # word (before stop words and stemming) -> term id, -1 = stop word
        token_ids = []
        for doc in store:
            words = tokenizer.words(doc.title + "\n" + doc.text)
            try:
                ids = [word_ids[w] for w in words]
            except KeyError:
                for w in words:
                    if w not in word_ids:
                        term = tokenizer.term(w)
                        word_ids[w] = -1 if term is None else vocab.setdefault(term, len(vocab))
                ids = [word_ids[w] for w in words]
            token_ids.append(list(filter((-1).__ne__, ids)))
        if not vocab:
            raise CorpusError("the corpus has no indexable terms (every document is empty or stop words)")
        bm25 = bm25s.BM25(k1=k1, b=b, method=method)
        bm25.index((token_ids, vocab), create_empty_token=False, show_progress=False)
        return cls(bm25, store, tokenizer, page_chars=page_chars, source=source)

    def save(self, index_dir: PathLike) -> Path:
        """Write the index and its documents to `index_dir` (created; an older index there is replaced).

        Layout: ``bm25s/`` (the bm25s arrays and vocabulary), ``documents.jsonl`` +
        ``documents.offsets.npy`` (the documents in index order and their byte offsets, read through
        a memory map on load), ``ids.json``, and ``mempo_index.json`` (format, tokenizer, BM25
        parameters, document count, the corpus file's size, mtime and SHA-256 when built from a
        file), written last: a directory without it is not an index.
        """
        index_dir = Path(index_dir)
        index_dir.mkdir(parents=True, exist_ok=True)
        manifest_path = index_dir / INDEX_MANIFEST
        if manifest_path.exists():
            manifest_path.unlink()  # the directory is not a valid index until the new manifest lands
        self._bm25.save(str(index_dir / "bm25s"), show_progress=False)
        num_docs = _save_documents(self._docs, index_dir)
        import bm25s  # reason: as numpy (bm25s imports it)

        manifest = {
            "format": BM25_FORMAT, "format_version": BM25_FORMAT_VERSION, "num_docs": num_docs,
            "tokenizer": self.tokenizer.to_json(),
            "bm25": {"k1": self._bm25.k1, "b": self._bm25.b, "method": self._bm25.method},
            "corpus": self.source, "bm25s_version": getattr(bm25s, "__version__", "unknown"),
        }
        tmp = manifest_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, manifest_path)
        return index_dir

    @staticmethod
    def read_manifest(index_dir: PathLike) -> Optional[dict]:
        """The manifest of a saved BM25 index in `index_dir`, or None if the directory holds none."""
        path = Path(index_dir) / INDEX_MANIFEST
        if not path.is_file():
            return None
        try:
            manifest = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise CorpusError(f"{path}: damaged index manifest ({type(error).__name__}); rebuild the index") from None
        if not isinstance(manifest, dict):
            raise CorpusError(f"{path}: damaged index manifest (not a JSON object); rebuild the index")
        if manifest.get("format") != BM25_FORMAT:
            raise CorpusError(f"{path}: not a mempo BM25 index (format {manifest.get('format')!r})")
        if manifest.get("format_version") != BM25_FORMAT_VERSION:
            raise CorpusError(f"{path}: index format version {manifest.get('format_version')} is not "
                              f"{BM25_FORMAT_VERSION}; rebuild the index")
        return manifest

    @classmethod
    def load(cls, index_dir: PathLike, *, mmap_arrays: bool = True,
             page_chars: int = DEFAULT_PAGE_CHARS) -> "BM25Retriever":
        """Reload an index written by `save`; documents are always read through a memory map.

        `mmap_arrays` memory-maps the BM25 arrays too (low resident memory, shared page cache).
        """
        import bm25s  # reason: as numpy (bm25s imports it)

        index_dir = Path(index_dir)
        manifest = cls.read_manifest(index_dir)
        if manifest is None:
            raise CorpusError(f"{index_dir}: no saved index ({INDEX_MANIFEST} missing)")
        store = None
        try:
            bm25 = bm25s.BM25.load(str(index_dir / "bm25s"), mmap=mmap_arrays, show_progress=False)
            store = _MappedDocuments(index_dir / "documents.jsonl", index_dir / "documents.offsets.npy",
                                     index_dir / "ids.json")
            if len(store) != manifest["num_docs"] or bm25.scores["num_docs"] != manifest["num_docs"]:
                raise CorpusError(f"{index_dir}: document count does not match the manifest (index corrupted)")
            tokenizer = Tokenizer.from_json(manifest["tokenizer"])
        except Exception as error:  # bm25s / numpy / json errors name no index; say which and how to fix it
            if store is not None:
                store.close()
            if isinstance(error, CorpusError):
                raise
            where = getattr(error, "filename", None) or index_dir
            detail = " ".join(str(error).split())[:200]
            raise CorpusError(f"{where}: damaged BM25 index in {index_dir} ({type(error).__name__}: {detail}); "
                              f"rebuild it (serve-retriever --rebuild)") from None
        return cls(bm25, store, tokenizer, page_chars=page_chars, source=manifest.get("corpus"))

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
        queries = check_queries(queries)
        topk = check_topk(topk)
        results = []
        for query in queries:
            term_ids = [self._vocab[t] for t in self.tokenizer(query) if t in self._vocab]
            if not term_ids:
                results.append([])
                continue
            scores = self._bm25.get_scores_from_ids(term_ids)
            hits = []
            for row in _topk_rows(scores, topk):
                doc = self._docs[int(row)]
                hits.append(Hit(doc.id, doc.title, doc.text, float(scores[row])))
            results.append(hits)
        return results


def _corpus_file_info(path: PathLike) -> dict:
    stat = os.stat(path)
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": corpus_fingerprint(path)}


def _same_corpus_file(path: PathLike, recorded: Optional[dict]) -> bool:
    """Whether `path` is the file an index was built from: same size and mtime, else same SHA-256."""
    if not recorded:
        return False
    stat = os.stat(path)
    if stat.st_size != recorded.get("size"):
        return False
    return stat.st_mtime_ns == recorded.get("mtime_ns") or corpus_fingerprint(path) == recorded.get("sha256")


@register_retriever("bm25")
def load_or_build_bm25(corpus: Optional[PathLike] = None, index_dir: Optional[PathLike] = None, *,
                       documents: Optional[Iterable[Document]] = None, rebuild: bool = False,
                       tokenizer: Optional[Tokenizer] = None, page_chars: int = DEFAULT_PAGE_CHARS,
                       mmap_arrays: bool = True, log: Optional[Callable[[str], None]] = None) -> BM25Retriever:
    """Open a BM25 retriever: load `index_dir` if it holds an index for this corpus, else build.

    - `index_dir` with a saved index and no `corpus`: load it.
    - `index_dir` with a saved index and a `corpus` file: load it if it was built from that file
      (same size and modification time, or else same SHA-256), else rebuild from the file and
      overwrite the index (reported through `log`).
    - no saved index (or `rebuild`): build from `corpus` (a jsonl path) or `documents`, then save to
      `index_dir` when given (and reload it memory-mapped, so serving uses little memory).
    `log` receives one-line progress messages (e.g. ``print`` to stderr); None stays silent.
    """
    say = log or (lambda message: None)
    if corpus is not None and documents is not None:
        raise ValueError("give either corpus (a path) or documents, not both")
    if corpus is not None and not os.path.isfile(corpus):
        raise CorpusError(f"{corpus}: corpus file not found")
    if index_dir is not None and not rebuild:
        manifest = BM25Retriever.read_manifest(index_dir)
        if manifest is not None:
            if corpus is None or _same_corpus_file(corpus, manifest.get("corpus")):
                started = time.perf_counter()
                retriever = BM25Retriever.load(index_dir, mmap_arrays=mmap_arrays, page_chars=page_chars)
                say(f"loaded BM25 index {index_dir} ({retriever.num_docs} documents) in "
                    f"{time.perf_counter() - started:.1f} s")
                return retriever
            say(f"index {index_dir} was built from another corpus file; rebuilding it from {corpus}")
    if corpus is None and documents is None:
        where = f" in {index_dir}" if index_dir is not None else ""
        raise CorpusError(f"no saved index{where} and no corpus to build one from")
    started = time.perf_counter()
    source = _corpus_file_info(corpus) if corpus is not None else None
    docs = iter_corpus(corpus) if corpus is not None else documents
    retriever = BM25Retriever.build(docs, tokenizer=tokenizer, page_chars=page_chars, source=source)
    say(f"built BM25 index over {retriever.num_docs} documents in {time.perf_counter() - started:.1f} s")
    if index_dir is not None:
        retriever.save(index_dir)
        retriever.close()
        retriever = BM25Retriever.load(index_dir, mmap_arrays=mmap_arrays, page_chars=page_chars)
        say(f"saved BM25 index to {index_dir}")
    return retriever


# ----------------------------------------------------------------------------------------------
# Dense (optional extra)
# ----------------------------------------------------------------------------------------------

@register_retriever("dense")
class DenseRetriever(_LocalRetriever):
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

        self._docs = _MemoryDocuments(documents)
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

    def search(self, queries: Sequence[str], topk: int = DEFAULT_TOPK) -> list[list[Hit]]:
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
        results = []
        for query_rows, query_scores in zip(rows, scores):
            hits = []
            for row, score in zip(query_rows, query_scores):
                if row < 0:
                    continue
                doc = self._docs[int(row)]
                hits.append(Hit(doc.id, doc.title, doc.text, float(score)))
            results.append(hits)
        return results
